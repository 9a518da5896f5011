"""How the local environment reads a Dockerfile into a build plan."""

from __future__ import annotations

import pytest

from services.localenv.dockerfile import (
    CopyStep,
    RunStep,
    WorkdirStep,
    parse,
    plan_build,
    split_words,
)
from services.localenv.errors import UnsupportedEnvironmentError


def test_full_plan_substitutes_args_and_env() -> None:
    plan = plan_build(
        "ARG BASE=3.12\n"
        "FROM python:${BASE}-slim\n"
        "ARG WORD=hello\n"
        'ENV GREETING="${WORD} world" DATA=/srv/data\n'
        "WORKDIR /srv\n"
        "WORKDIR app\n"
        "COPY data/ ${DATA}/\n"
        "COPY --chown=1000:1000 --chmod=755 run.sh ./bin/\n"
        "RUN echo $GREETING\n"
        'RUN ["python", "-c", "print(1)"]\n'
        "USER nobody\n"
        'CMD ["bash"]\n'
    )
    assert plan.base == "python:3.12-slim"
    assert plan.env == {"GREETING": "hello world", "DATA": "/srv/data"}
    assert plan.workdir == "/srv/app"
    assert plan.user == "nobody"
    kinds = [type(s) for s in plan.steps]
    assert kinds == [WorkdirStep, WorkdirStep, CopyStep, CopyStep, RunStep, RunStep]
    data, script = plan.steps[2], plan.steps[3]
    assert isinstance(data, CopyStep) and isinstance(script, CopyStep)
    assert (data.sources, data.dest, data.dest_is_dir) == (("data/",), "/srv/data", True)
    assert (script.dest, script.chown, script.chmod) == ("/srv/app/bin", "1000:1000", "755")
    shell, exec_form = plan.steps[4], plan.steps[5]
    assert isinstance(shell, RunStep) and isinstance(exec_form, RunStep)
    assert shell.argv == ("/bin/sh", "-c", "echo $GREETING")
    # RUN sees ARG and ENV values (ENV wins); the shell expands them, not the planner.
    assert shell.env == {"WORD": "hello", "GREETING": "hello world", "DATA": "/srv/data"}
    assert shell.workdir == "/srv/app"
    assert exec_form.argv == ("python", "-c", "print(1)")
    assert any("CMD" in note for note in plan.notes)


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a b  c", {}, ["a", "b", "c"]),
        ('"a b" c', {}, ["a b", "c"]),
        ("'$X' \"$X\" $X ${X}", {"X": "1"}, ["$X", "1", "1", "1"]),
        ("${UNSET:-dflt} ${X:-dflt} ${X:+alt} ${UNSET:+alt}", {"X": "v"}, ["dflt", "v", "alt"]),
        ("a\\ b", {}, ["a b"]),
        ("$", {}, ["$"]),
    ],
)
def test_split_words(text: str, env: dict[str, str], expected: list[str]) -> None:
    assert split_words(text, env) == expected


def test_env_legacy_form_and_previous_values() -> None:
    plan = plan_build("FROM debian\nENV A 1 2\nENV B=x C=$B\n")
    assert plan.env == {"A": "1 2", "B": "x", "C": ""}  # C sees B's value before this line


def test_shell_instruction_and_heredoc() -> None:
    plan = plan_build(
        'FROM ubuntu:24.04\nSHELL ["/bin/bash", "-c"]\nRUN <<EOF\necho one\necho two\nEOF\n'
        "RUN cat > /x <<END\nhello\nEND\n"
        "COPY <<EOF /etc/motd\nwelcome\nEOF\n"
    )
    first, second, copy = plan.steps
    assert isinstance(first, RunStep) and first.argv == ("/bin/bash", "-c", "echo one\necho two\n")
    assert isinstance(second, RunStep) and second.argv[2] == "cat > /x <<END\nhello\nEND\n"
    assert isinstance(copy, CopyStep) and copy.content == "welcome\n" and copy.dest == "/etc/motd"


def test_continuations_comments_and_line_numbers() -> None:
    instructions = parse("# c\nFROM x\n\nRUN a \\\n  # inner comment\n  && b\nWORKDIR /w\n")
    assert [(i.keyword, i.value, i.line) for i in instructions] == [
        ("FROM", "x", 2),
        ("RUN", "a && b", 4),
        ("WORKDIR", "/w", 7),
    ]


@pytest.mark.parametrize(
    ("dockerfile", "fragment"),
    [
        ("FROM a AS build\nRUN make\nFROM b\n", "multi-stage"),
        ("FROM b\nCOPY --from=build /x /x\n", "multi-stage"),
        ("FROM scratch\n", "scratch"),
        ("RUN true\n", "before FROM"),
        ("", "no FROM"),
        ("FROM b\nADD https://example.com/x.tgz /x\n", "from a URL"),
        ("FROM b\nRUN --mount=type=secret,id=t cat /run/secrets/t\n", "type=secret"),
        ("FROM b\nSHELL /bin/bash -c\n", "JSON array"),
    ],
)
def test_what_cannot_be_imitated_is_refused(dockerfile: str, fragment: str) -> None:
    with pytest.raises(UnsupportedEnvironmentError, match=fragment):
        plan_build(dockerfile, where="task/environment/Dockerfile")


def test_error_names_the_file_and_line() -> None:
    with pytest.raises(UnsupportedEnvironmentError) as info:
        plan_build("FROM a\nRUN x\nFROM b\n", where="t/Dockerfile")
    assert str(info.value).startswith("t/Dockerfile:3: a multi-stage build")


def test_cache_mounts_run_without_a_cache_and_build_args_override() -> None:
    plan = plan_build(
        "ARG V=1\nFROM debian:$V\nARG V\nARG W=2\nRUN --mount=type=cache,target=/c echo $V $W\n",
        build_args={"W": "3"},
    )
    assert plan.base == "debian:1"
    run = plan.steps[0]
    assert isinstance(run, RunStep) and run.env == {"V": "1", "W": "3"}
    assert any("cache" in note for note in plan.notes)
