"""How the CLI ends on each kind of trialbus error (services/cli._run): one line on
stderr and the README's exit code, never a traceback; and the HTTP API's answer to a
bucket the stack refuses."""

from __future__ import annotations

import pytest
import typer

from services import cli
from services.common import errors as E


async def _raise(exc: Exception) -> None:
    raise exc


@pytest.mark.parametrize(
    ("exc", "code", "said"),
    [
        (E.ManifestError("tasks[0]: bad"), E.EXIT_USER_ERROR, "error: tasks[0]: bad"),
        (E.LedgerUnavailable("ledger down"), E.EXIT_UNAVAILABLE, "unavailable: ledger down"),
        (
            E.ObjectAccessDenied("TRIALBUS_TASKS/x: the NATS user lacks a right"),
            E.EXIT_UNAVAILABLE,
            "refused by the stack: TRIALBUS_TASKS/x: the NATS user lacks a right",
        ),
        (E.ObjectCorrupt("sha256 differs"), E.EXIT_UNAVAILABLE, "refused by the stack: sha256"),
    ],
)
def test_each_error_is_one_line_and_its_exit_code(
    exc: Exception, code: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as ended:
        cli._run(lambda: _raise(exc))
    assert ended.value.exit_code == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_a_bug_is_not_dressed_as_one_of_them() -> None:
    # The control: an error of no listed kind still surfaces as itself.
    with pytest.raises(E.InternalError):
        cli._run(lambda: _raise(E.InternalError("an invariant broke")))


async def test_the_api_answers_a_refused_bucket_with_503_naming_the_right() -> None:
    # The HTTP side of the same fault (services/submitter/routes.ERROR_HANDLERS): before,
    # a bare 500 with nothing said.
    from services.submitter.routes import ERROR_HANDLERS

    exc = E.ObjectAccessDenied("TRIALBUS_TASKS/x: the NATS user lacks a right on bucket")
    answer = await ERROR_HANDLERS[E.ObjectAccessDenied](None, exc)  # type: ignore[arg-type]
    assert answer.status_code == 503
    assert (
        bytes(answer.body) == b'{"error":"TRIALBUS_TASKS/x: the NATS user lacks a right on bucket"}'
    )
