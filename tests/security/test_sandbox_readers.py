"""Host-side readers never follow a trial's (or a task author's) links to host files,
never block on a FIFO and never read without bound."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest

from services.localenv.errors import DockerfileBuildError, LocalEnvironmentError
from services.localenv.hostio import copy_file
from tests.support.sandbox_env import EnvFactory, needs_sandbox, running, sh

pytestmark = needs_sandbox


@pytest.fixture
def host_secret(tmp_path: Path) -> tuple[Path, str]:
    token = secrets.token_hex(10)
    secret_dir = tmp_path / "host-only"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text(token)
    return secret_dir, token


async def test_copy_globs_do_not_follow_links_out_of_the_context(
    make_env: EnvFactory, host_secret: tuple[Path, str]
) -> None:
    folder, token = host_secret
    ok = make_env(
        "FROM ubuntu:24.04\nCOPY files* /in/\n",
        files={"files/a.txt": "a"},
        links={"files-secret": str(folder / "secret.txt")},
    )
    async with running(ok):
        # The link is copied as a link: inside, it points at a path that does not exist.
        assert await sh(ok, "readlink /in/files-secret") == str(folder / "secret.txt")
        assert token not in await sh(ok, "cat /in/files-secret 2>/dev/null || true")
        assert await sh(ok, "cat /in/a.txt") == "a"  # negative control
    through_dir = make_env("FROM ubuntu:24.04\nCOPY linked/* /in/\n", links={"linked": str(folder)})
    with pytest.raises(DockerfileBuildError, match="outside the build context"):
        await through_dir.start(force_build=False)
    await through_dir.stop(delete=True)


async def test_an_uploaded_folder_brings_links_not_host_files(
    make_env: EnvFactory, host_secret: tuple[Path, str], tmp_path: Path
) -> None:
    folder, token = host_secret
    tests = tmp_path / "task-tests"
    tests.mkdir()
    (tests / "test.sh").write_text("echo hi\n")
    (tests / "data").symlink_to(folder / "secret.txt")
    (tests / "dir").symlink_to(folder)
    os.mkfifo(tests / "pipe")
    env = make_env()
    async with running(env):
        with pytest.raises(LocalEnvironmentError, match="FIFO"):
            await asyncio.wait_for(env.upload_dir(tests, "/tests"), timeout=30)
        (tests / "pipe").unlink()
        await env.upload_dir(tests, "/tests")
        seen = await sh(env, "cat /tests/test.sh; cat /tests/data /tests/dir/* 2>/dev/null || true")
        assert "echo hi" in seen and token not in seen


async def test_links_planted_in_bound_folders_are_gone_before_the_host_reads(
    make_env: EnvFactory, host_secret: tuple[Path, str]
) -> None:
    folder, token = host_secret
    env = make_env()
    async with running(env):
        await sh(
            env,
            f"ln -s {folder}/secret.txt /logs/verifier/reward.txt && "
            f"ln -s {folder} /logs/agent/dir && mkfifo /logs/artifacts/pipe && "
            "ln -s inside.txt /logs/agent/ok-link && echo 1 > /logs/agent/inside.txt && "
            "cp /bin/sh /logs/agent/sh && chmod 4755 /logs/agent/sh",
        )
        paths = env.trial_paths
        with pytest.raises(FileNotFoundError):
            (paths.verifier_dir / "reward.txt").read_text()
        assert not os.path.lexists(paths.agent_dir / "dir")
        assert not os.path.lexists(paths.artifacts_dir / "pipe")
        assert (paths.agent_dir / "sh").stat().st_mode & 0o6000 == 0
        # Negative control: a link that stays inside the folder is left alone.
        assert (paths.agent_dir / "ok-link").read_text() == "1\n"
        out = paths.trial_dir / "download"
        await sh(env, f"mkdir -p /app/d && ln -s {folder} /app/d/host && echo x > /app/d/f")
        await env.download_dir("/app/d", out)
        assert not os.path.lexists(out / "host") and (out / "f").read_text() == "x\n"
        assert token not in "".join(p.read_text() for p in out.rglob("*") if p.is_file())


async def test_a_fifo_or_endless_file_in_the_trial_does_not_hang_a_download(
    make_env: EnvFactory, tmp_path: Path
) -> None:
    env = make_env()
    async with running(env):
        await sh(env, "mkfifo /app/pipe && truncate -s 20M /app/big")
        with pytest.raises(LocalEnvironmentError, match="FIFO"):
            await asyncio.wait_for(env.download_file("/app/pipe", tmp_path / "p"), timeout=30)
    big = tmp_path / "big"
    big.write_bytes(b"")
    os.truncate(big, 20 * 1024 * 1024)
    with pytest.raises(LocalEnvironmentError, match="larger than"):
        copy_file(big, tmp_path / "copy", limit=1024 * 1024)
