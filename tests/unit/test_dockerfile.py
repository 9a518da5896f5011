"""The WORKDIR the local environment reads from a task's Dockerfile."""

from __future__ import annotations

import pytest

from services.localenv.dockerfile import workdir_from_dockerfile


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        pytest.param("FROM ubuntu:24.04\nWORKDIR /app\n", "/app", id="absolute"),
        pytest.param("FROM x\nWORKDIR /app\nRUN make\nWORKDIR /srv\n", "/srv", id="last-wins"),
        pytest.param("FROM x\nWORKDIR /app\nWORKDIR src\n", "/app/src", id="relative-joins"),
        pytest.param("WORKDIR /app/\nWORKDIR src/\nWORKDIR lib\n", "/app/src/lib", id="slashes"),
        pytest.param("FROM x\nWORKDIR src\n", "/src", id="relative-from-root"),
        pytest.param("WORKDIR /a/b\nWORKDIR ../c\n", "/a/c", id="dotdot-normalized"),
        pytest.param("WORKDIR /a/./b//c/\n", "/a/b/c", id="absolute-normalized"),
        pytest.param("FROM x\nWORKDIR \\\n    /app\n", "/app", id="continuation"),
        pytest.param("FROM x\nWORKDIR /app\\\n", "/app", id="trailing-backslash-at-eof"),
        pytest.param(
            "RUN apt-get update && \\\n    apt-get install -y curl\nWORKDIR /opt/w\n",
            "/opt/w",
            id="after-continued-run",
        ),
        pytest.param("RUN echo \\\n    WORKDIR /fake\n", None, id="inside-a-continued-run"),
        pytest.param("# WORKDIR /commented\nFROM x\n", None, id="comment"),
        pytest.param("FROM x\n  # WORKDIR /x\nWORKDIR /real\n", "/real", id="indented-comment"),
        pytest.param("workdir /lower\n", "/lower", id="lowercase-instruction"),
        pytest.param("   WORKDIR    /spaced   \n", "/spaced", id="surrounding-space"),
        pytest.param('WORKDIR "/with space"\n', "/with space", id="quoted"),
        pytest.param("FROM x\nRUN true\n", None, id="none"),
        pytest.param("", None, id="empty"),
        pytest.param("WORKDIR\n", None, id="no-argument"),
        pytest.param("WORKDIRS /nope\n", None, id="similar-word"),
        pytest.param("ENV WORKDIR=/env\n", None, id="env-named-workdir"),
    ],
)
def test_workdir_from_dockerfile(dockerfile: str, expected: str | None) -> None:
    assert workdir_from_dockerfile(dockerfile) == expected


def test_crlf_line_endings() -> None:
    assert workdir_from_dockerfile("FROM x\r\nWORKDIR \\\r\n /app\r\n") == "/app"
