"""Host secrets stay out of trials, though root inside is the host's uid 0.

The host is made to hold known secrets without touching the real /etc: the trial
runs from a child process in a private mount namespace where a fake /etc/shadow,
/etc/gshadow and /etc/ssh (with a host key) are bound over the real ones.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.localenv.masks import mask_host_secrets
from tests.support.sandbox_env import UBUNTU, needs_sandbox

ROOT = Path(__file__).resolve().parents[2]


def _with_planted_host_secrets(tmp_path: Path, commands: list[str]) -> tuple[str, list[Any]]:
    """Run ``commands`` in a trial whose host /etc holds a known password hash and key.

    A copy of /etc with the secrets planted is bound over /etc as a whole (overlayfs
    refuses a lower folder with mounts inside it when used from a user namespace).
    """
    token = secrets.token_hex(10)
    fake = tmp_path / "fake-etc"
    shutil.copytree("/etc", fake, symlinks=True)
    for name in ("shadow", "gshadow"):
        lines = (fake / name).read_text().splitlines()
        user, _, rest = lines[0].split(":", 2)
        lines[0] = f"{user}:$6$salt${token}:{rest}"
        (fake / name).write_text("\n".join(lines) + "\n")
    (fake / "ssh").mkdir(exist_ok=True)
    (fake / "ssh" / "ssh_host_ed25519_key").write_text(f"PRIVATE KEY {token}\n")
    (fake / "ssh" / "ssh_config").write_text("# kept\n")
    argv = [sys.executable, "-m", "tests.security.sandbox_driver", str(tmp_path / "w")]
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind {fake} /etc && exec "$@"',
            "sh",
            *argv,
            UBUNTU,
            *commands,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return token, json.loads(done.stdout.strip().splitlines()[-1])["results"]


@needs_sandbox
def test_password_hashes_and_host_keys_are_masked(tmp_path: Path) -> None:
    token, results = _with_planted_host_secrets(
        tmp_path,
        [
            "cat /etc/shadow /etc/gshadow",
            "ls -A /etc/ssh; cat /etc/ssh/ssh_host_ed25519_key 2>&1 || true",
            "useradd -m probe && grep -c '^probe:' /etc/shadow",
        ],
    )
    (_, shadow, _), (_, ssh, _), (rc, added, err) = results
    assert token not in shadow and token not in ssh
    # The users stay (an image expects them), only their password fields are locked.
    assert shadow.startswith("root:*:")
    assert "ssh_config" in ssh and "ssh_host_ed25519_key" not in ssh.split()
    # Negative control and compatibility: tools that rewrite /etc/shadow still work.
    assert rc == 0 and added.strip() == "1", err
    # The planted host secrets were really there for the host to read.
    assert token in (tmp_path / "fake-etc" / "shadow").read_text()


def test_masks_are_written_as_the_overlay_expects(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("whiteouts are device nodes: needs root")
    host = tmp_path / "host"
    (host / "etc" / "ssh").mkdir(parents=True)
    (host / "etc" / "ssl" / "private").mkdir(parents=True)
    (host / "var" / "backups").mkdir(parents=True)
    (host / "etc" / "shadow").write_text("root:$6$x$y:19000:0:99999:7:::\n#c\n")
    (host / "etc" / "ssh" / "ssh_host_rsa_key").write_text("k")
    (host / "etc" / "ssh" / "ssh_host_rsa_key.pub").write_text("p")
    (host / "etc" / "ssl" / "private" / "site.key").write_text("k")
    fs = tmp_path / "fs"
    done = mask_host_secrets(fs, host_root=host)
    assert (fs / "etc" / "shadow").read_text() == "root:*:19000:0:99999:7:::\n#c\n"
    for rel in ("ssh/ssh_host_rsa_key", "ssh/ssh_host_rsa_key.pub", "ssl/private/site.key"):
        st = (fs / "etc" / rel).lstat()
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (0, 0), rel
    assert os.getxattr(fs / "var" / "backups", "user.overlay.opaque") == b"y"
    assert "/etc/shadow" in done and "/var/backups" in done
    shutil.rmtree(fs)
