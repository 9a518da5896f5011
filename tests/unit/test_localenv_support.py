"""The local environment's pure parts: base images, paths, users, the layer cache,
cgroup set-up and how its errors are classified."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import sys
from pathlib import Path

import pytest

from services.common.failures import classify, is_retryable
from services.localenv.errors import LocalEnvironmentError, UnsupportedEnvironmentError
from services.localenv.images import resolve_base
from services.localenv.layers import ImageConfig, LayerCache, layer_key
from services.localenv.limits import TrialCgroup
from services.localenv.sandbox import resolve_in_root
from services.localenv.users import lookup_group, lookup_user

OWN_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


# -- base images ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref",
    [
        "ubuntu:24.04",
        "debian:bookworm-slim",
        "docker.io/library/ubuntu",
        "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624",
    ],
)
def test_system_images_map_to_the_host(ref: str) -> None:
    base = resolve_base(ref)
    assert base.python is None and "this host's system" in base.describe()


@pytest.mark.parametrize(
    "ref", [f"python:{OWN_PYTHON}-slim", f"python:{OWN_PYTHON}.4-bookworm", f"python:{OWN_PYTHON}"]
)
def test_python_images_get_a_host_interpreter_of_that_version(ref: str) -> None:
    # The interpreter trialbus runs on is always a candidate.
    base = resolve_base(ref)
    assert base.python is not None and base.python.version == OWN_PYTHON


def test_tbench_python_image() -> None:
    major, minor = OWN_PYTHON.split(".")
    base = resolve_base(f"ghcr.io/laude-institute/t-bench/python-{major}-{minor}:20250620")
    assert base.python is not None and base.python.version == OWN_PYTHON


def test_unknown_and_uninstalled_images_are_refused_with_the_fix() -> None:
    with pytest.raises(UnsupportedEnvironmentError, match="base_images"):
        resolve_base("node:20")
    with pytest.raises(UnsupportedEnvironmentError, match="python_interpreters"):
        resolve_base("python:3.1-slim")


def test_base_image_overrides() -> None:
    assert resolve_base("node:20", overrides={"node:*": "host"}).python is None
    mapped = resolve_base("my/img:1", overrides={"my/img:1": f"python{OWN_PYTHON}"})
    assert mapped.python is not None
    with pytest.raises(UnsupportedEnvironmentError, match=re.escape("'host' or 'python3.X'")):
        resolve_base("my/img:1", overrides={"my/img:1": "alpine"})


# -- paths inside the sandbox ---------------------------------------------------------
def test_links_resolve_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "app").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "app" / "abs").symlink_to("/etc")
    (root / "app" / "rel").symlink_to("../etc")
    (root / "app" / "up").symlink_to("../../../../..")
    (root / "loop").symlink_to("/loop")
    assert resolve_in_root(root, "/app/abs/passwd") == root / "etc" / "passwd"
    assert resolve_in_root(root, "/app/rel/x") == root / "etc" / "x"
    assert resolve_in_root(root, "/app/up/etc") == root / "etc"
    assert resolve_in_root(root, "/../../etc") == root / "etc"
    with pytest.raises(LocalEnvironmentError, match="symbolic links"):
        resolve_in_root(root, "/loop/x")
    with pytest.raises(LocalEnvironmentError, match="absolute"):
        resolve_in_root(root, "relative")


def test_users_come_from_the_sandbox_files(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\ntester:x:1001:1002::/home/tester:/bin/sh\n"
    )
    (tmp_path / "etc" / "group").write_text("root:x:0:\nstaff:x:50:\n")
    assert lookup_user(tmp_path, "tester") == (1001, 1002, "/home/tester")
    assert lookup_user(tmp_path, "1001") == (1001, 1002, "/home/tester")
    assert lookup_user(tmp_path, 4242) == (4242, 4242, "/")  # absent uids run, as in Docker
    assert lookup_user(tmp_path, "tester:staff") == (1001, 50, "/home/tester")
    assert lookup_group(tmp_path, "7") == 7
    with pytest.raises(LocalEnvironmentError, match="does not exist"):
        lookup_user(tmp_path, "ghost")


# -- layer cache --------------------------------------------------------------------------
def test_layer_key_is_stable_and_sensitive() -> None:
    assert layer_key(a=1, b="x") == layer_key(b="x", a=1)
    assert layer_key(a=1) != layer_key(a=2)


async def test_concurrent_gets_build_once(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path / "layers")
    builds = 0

    async def build(dest: Path) -> ImageConfig:
        nonlocal builds
        builds += 1
        (dest / "fs" / "root").mkdir(parents=True)
        await asyncio.sleep(0.2)
        return ImageConfig(base="b", base_description="d", env={"A": "1"}, workdir="/app")

    results = await asyncio.gather(*(cache.get("k1", build) for _ in range(3)))
    assert builds == 1
    assert sorted(built for _, built in results) == [False, False, True]
    assert {layer.config.env["A"] for layer, _ in results} == {"1"}
    assert cache.lookup("k1") is not None


async def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path / "layers")

    async def build(dest: Path) -> ImageConfig:
        dest.mkdir(parents=True)
        raise RuntimeError("RUN failed")

    with pytest.raises(RuntimeError):
        await cache.get("k2", build)
    assert cache.lookup("k2") is None
    assert [p.name for p in (tmp_path / "layers").iterdir()] == ["k2.lock"]


# -- cgroups --------------------------------------------------------------------------------
V1_RUNNER = "5:memory:/runner\n2:cpu,cpuacct:/runner\n8:pids:/runner\n0::/\n"
"""/proc/self/cgroup of a runner in /runner of each v1 hierarchy."""
V2_RUNNER = "0::/svc\n"
"""/proc/self/cgroup of a runner in /svc of the v2 hierarchy."""


def v1_tree(root: Path, *controllers: str) -> Path:
    """A cgroup v1 mount at ``root`` with the runner's folder in each of ``controllers``."""
    for ctrl in controllers:
        (root / ctrl / "runner").mkdir(parents=True)
    return root


def v2_tree(root: Path, delegated: str) -> Path:
    """A cgroup v2 mount at ``root``; the runner's trialbus folder gets ``delegated``."""
    (root / "svc" / "trialbus").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids")
    (root / "svc" / "trialbus" / "cgroup.controllers").write_text(delegated)
    (root / "svc" / "trialbus" / "cgroup.subtree_control").write_text("")
    return root


def cgroup(
    name: str,
    root: Path,
    membership: str,
    *,
    cpus: float | None = None,
    memory_mb: int | None = None,
    pids: int | None = None,
) -> TrialCgroup | None:
    """``TrialCgroup.create`` for a runner in ``membership`` of the tree at ``root``."""
    log = logging.getLogger("t")
    return TrialCgroup.create(
        name,
        cpus=cpus,
        memory_mb=memory_mb,
        pids=pids,
        logger=log,
        root=root,
        membership=membership,
    )


def test_cgroup_v1_limits(tmp_path: Path) -> None:
    cg = cgroup("t1", v1_tree(tmp_path, "memory", "cpu"), V1_RUNNER, cpus=1.5, memory_mb=64)
    assert cg is not None
    mem, cpu = cg.dirs
    assert (mem / "memory.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert f"echo $$ > {mem}/cgroup.procs" in cg.join_command()[2]


def test_cgroup_v2_needs_delegated_controllers(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, "cpu memory")
    cg = cgroup("t2", root, V2_RUNNER, cpus=2, memory_mb=128)
    assert cg is not None
    (d,) = cg.dirs
    assert (d / "cpu.max").read_text() == "200000 100000"
    assert (d / "memory.max").read_text() == str(128 * 1024 * 1024)
    (root / "svc" / "trialbus" / "cgroup.controllers").write_text("")
    assert cgroup("t3", root, V2_RUNNER, cpus=1) is None


def test_no_limits_no_cgroup(tmp_path: Path) -> None:
    log = logging.getLogger("t")
    assert TrialCgroup.create("t", cpus=None, memory_mb=None, logger=log, root=tmp_path) is None


# -- classification ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "retryable"),
    [
        ("LocalEnvironmentError", False),
        ("UnsupportedEnvironmentError", False),
        ("DockerfileBuildError", False),
        ("SandboxStartError", True),
    ],
)
def test_environment_errors_are_infrastructure(name: str, retryable: bool) -> None:
    assert classify(name) == "infrastructure"
    assert is_retryable(name) is retryable


def test_pids_limit_is_best_effort(tmp_path: Path) -> None:
    v1 = v1_tree(tmp_path / "v1", "memory", "pids")
    cg = cgroup("p1", v1, V1_RUNNER, pids=64)
    assert cg is not None and cg.pids_limited
    assert (v1 / "pids" / "runner" / "trialbus-p1" / "pids.max").read_text() == "64"
    # Without a pids hierarchy the other limits still apply, and the caller is told.
    shutil.rmtree(v1 / "pids")
    cg = cgroup("p2", v1, V1_RUNNER, memory_mb=32, pids=64)
    assert cg is not None and not cg.pids_limited and len(cg.dirs) == 1
    cg = cgroup("p3", v2_tree(tmp_path / "v2", "memory pids"), V2_RUNNER, pids=100)
    assert cg is not None and cg.pids_limited
    assert (cg.dirs[0] / "pids.max").read_text() == "100"
