"""``trialbus --help``: the list of commands a new user reads first."""

from __future__ import annotations

import re

import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from services.cli import app


def test_every_command_s_summary_reads_as_one_sentence_in_the_list() -> None:
    # Wide enough that no summary needs wrapping: a row without a command name is a
    # line break the docstring put mid-sentence.
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400"}, terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "``" not in result.output and "Thin:" not in result.output  # not the module's
    panel = result.output.split("Commands")[1]
    rows = [r.strip("│ ").rstrip() for r in panel.splitlines()[1:] if r.startswith("│")]
    assert len(rows) >= 20  # the control: the rows were found
    named = [r for r in rows if re.match(r"^[a-z][a-z-]+\s{2,}\S", r)]
    assert named == rows, [r for r in rows if r not in named]
    pause = next(r for r in rows if r.startswith("pause "))
    assert pause.endswith("queued trials wait (not started, not lost); running ones finish.")
    attach = next(r for r in rows if r.startswith("attach "))
    assert "as `status --follow`" in attach  # code as the README marks it


def test_a_command_s_page_marks_code_as_the_readme_does() -> None:
    result = CliRunner().invoke(app, ["attach", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "`status --follow`" in result.output and "``" not in result.output


def test_every_argument_and_option_says_what_it_is() -> None:
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)
    bare = [
        f"{name} {param.name}"
        for name, cmd in command.commands.items()
        for param in cmd.params
        if not getattr(param, "help", None)
    ]
    assert bare == []
    assert len(command.commands) >= 20  # the control: the commands were found
