"""Root inside as an unprivileged host uid: the local environment's ``userns=shifted``.

Each invariant is checked on a real sandbox with the switch on and, as its negative
control, with it off (the default identity map, where root inside is host uid 0).
Needs root (under CI=true a missing prerequisite fails the test, tests/conftest.py).
"""

from __future__ import annotations

import io
import os
import secrets
import zipfile
from pathlib import Path

from services.localenv.shift import DEFAULT_BASE
from tests.support.sandbox_env import UBUNTU, EnvFactory, needs_sandbox, running, sh

SHIFTED = {"userns": "shifted"}


@needs_sandbox
async def test_root_inside_is_an_unprivileged_host_uid(make_env: EnvFactory) -> None:
    for kwargs, uid_map, host_uid in (
        (SHIFTED, f"0 {DEFAULT_BASE} 65536", DEFAULT_BASE),
        ({}, "0 0 4294967295", 0),  # control: the default identity map
    ):
        env = make_env(**kwargs)
        async with running(env):
            assert " ".join((await sh(env, "cat /proc/self/uid_map")).split()) == uid_map
            assert " ".join((await sh(env, "cat /proc/self/gid_map")).split()) == uid_map
            assert await sh(env, "id -u") == "0"
            # What the trial writes the runner (host root) still reads, owned by the map.
            await sh(env, "echo from-inside > /logs/agent/out.txt && mkdir -p /logs/verifier/v")
            await sh(env, "echo 1 > /logs/verifier/v/reward.txt")
            out = env.trial_paths.agent_dir / "out.txt"
            assert out.read_text() == "from-inside\n"
            assert os.stat(out).st_uid == host_uid, kwargs
            reward = env.trial_paths.verifier_dir / "v" / "reward.txt"
            assert (reward.read_text(), os.stat(reward).st_uid) == ("1\n", host_uid)
            # A user of the image maps into the range as well.
            await sh(env, "useradd -u 4321 tb-user && install -d -o tb-user /logs/agent/u")
            await sh(env, "su tb-user -c 'touch /logs/agent/u/f'")
            assert os.stat(env.trial_paths.agent_dir / "u" / "f").st_uid == host_uid + 4321


@needs_sandbox
async def test_a_host_root_0600_file_is_refused_to_root_inside(make_env: EnvFactory) -> None:
    token = secrets.token_hex(12)
    for kwargs, refused in ((SHIFTED, True), ({}, False)):
        env = make_env(**kwargs)
        async with running(env):
            # A host root file of mode 0600 in a folder bound into the trial.
            secret = env.trial_paths.agent_dir / "host-secret"
            secret.write_text(token)
            os.chown(secret, 0, 0)
            secret.chmod(0o600)
            got = await env.exec("cat /logs/agent/host-secret")
            # Root inside holds its capabilities over its own files all the same.
            assert await sh(env, "touch /tmp/f && chown 1234 /tmp/f && stat -c %u /tmp/f") == (
                "1234"
            )
        if refused:
            assert got.return_code != 0 and "Permission denied" in (got.stderr or ""), got
            assert token not in (got.stdout or "")
        else:  # control: host uid 0 inside reads it
            assert got.return_code == 0 and got.stdout == token, got


def _wheel() -> bytes:
    """A one-module wheel (pip installs it offline)."""
    files = {
        "tb_userns_probe.py": "VALUE = 'installed'\n",
        "tb_userns_probe-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: tb-userns-probe\nVersion: 1.0\n"
        ),
        "tb_userns_probe-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files)
    files["tb_userns_probe-1.0.dist-info/RECORD"] = (
        record + "tb_userns_probe-1.0.dist-info/RECORD,,\n"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


DEB_BUILD = (
    "mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/share/tb-userns-probe"
    " && echo ok > /tmp/pkg/usr/share/tb-userns-probe/ok"
    " && printf 'Package: tb-userns-probe\\nVersion: 1.0\\nArchitecture: all\\n"
    "Maintainer: trialbus <t@example.invalid>\\nDescription: probe\\n' > /tmp/pkg/DEBIAN/control"
    " && dpkg-deb --build /tmp/pkg /tmp/tb-userns-probe.deb >/dev/null"
)


@needs_sandbox
async def test_packages_and_users_install_as_shifted_root(make_env: EnvFactory) -> None:
    # Build (RUN steps) and trial (exec) both change the host's lower layers: the
    # dpkg database, /usr, /etc/passwd. Offline: a local .deb and a local wheel.
    dockerfile = (
        f"{UBUNTU}COPY tb_userns_probe-1.0-py3-none-any.whl /opt/\n"
        f"RUN useradd -m builder && {DEB_BUILD} && apt-get install -y /tmp/tb-userns-probe.deb\n"
    )
    env = make_env(dockerfile, **SHIFTED)
    (env.environment_dir / "tb_userns_probe-1.0-py3-none-any.whl").write_bytes(_wheel())
    async with running(env):
        assert " ".join((await sh(env, "cat /proc/self/uid_map")).split()).startswith("0 100000")
        assert await sh(env, "dpkg-query -W -f '${Status}' tb-userns-probe") == (
            "install ok installed"
        )
        uid, owner = (await sh(env, "id -u builder; stat -c %u /home/builder")).split()
        assert uid == owner != "0"
        await sh(
            env,
            "pip install --no-index --break-system-packages --no-cache-dir "
            "/opt/tb_userns_probe-1.0-py3-none-any.whl",
        )
        assert await sh(env, "python3 -c 'import tb_userns_probe as m; print(m.VALUE)'") == (
            "installed"
        )
        await sh(env, "apt-get remove -y tb-userns-probe >/dev/null")
        assert await sh(env, "test -e /usr/share/tb-userns-probe || echo gone") == "gone"
        await sh(env, "useradd -m trialist && passwd -d trialist >/dev/null")
        assert await sh(env, "su trialist -c 'id -un'") == "trialist"
    # Nothing of it reached the host.
    assert not Path("/usr/share/tb-userns-probe").exists()
    assert "trialist" not in Path("/etc/passwd").read_text()
