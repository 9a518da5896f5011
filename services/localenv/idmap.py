"""Idmapped views of host folders, for sandboxes whose root is an unprivileged host uid.

With ``TRIALBUS_SANDBOX_USERNS=shifted`` root inside a sandbox is host uid ``base``
(``shift``). The host's /usr, /etc and /var (the overlays' lower layers) belong to host
uid 0, which such a namespace does not map: root inside could neither change them nor
have overlayfs copy them up (apt-get, pip, useradd fail). An idmapped mount of each,
mapping host uid N to ``base + N``, shows them to the sandbox as its own root's, while
the files on disk stay untouched.

util-linux 2.38 has no ``X-mount.idmap``, so the mounts are made here with the new
mount API through ``ctypes``: ``open_tree(OPEN_TREE_CLONE)``, ``mount_setattr`` with
``MOUNT_ATTR_IDMAP`` and a user namespace holding the mapping, ``move_mount`` onto the
target folder. Run as host root inside the sandbox's private mount namespace (before
the uid is dropped), so the views vanish with the sandbox and never show on the host.

This file is run as a script (``python -I idmap.py BASE COUNT SRC DST [SRC DST ...]``)
by the sandbox's start command: it imports nothing of trialbus.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# x86_64 and aarch64 share these numbers (the new mount API came after the split).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_AT_FDCWD = -100
_CLONE_NEWUSER = 0x10000000


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mapping_userns(base: int, count: int) -> int:
    """A file descriptor of a user namespace mapping 0..count-1 to base..base+count-1.

    A child process creates it and waits; this (root) process writes the maps and
    keeps the namespace by its descriptor once the child is gone.
    """
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only unshares and waits
        code = 0
        try:
            os.close(ready_r)
            os.close(done_w)
            _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        except OSError:
            code = 1
        os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("the mapping namespace's process failed to unshare")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 {base} {count}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def idmapped_view(source: str, target: str, userns_fd: int) -> None:
    """Mount an idmapped clone of ``source`` (its own mount only) on ``target``."""
    syscall = _libc.syscall
    tree = _check(
        syscall(
            _SYS_OPEN_TREE,
            _AT_FDCWD,
            source.encode(),
            ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        ),
        f"open_tree({source})",
    )
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP, userns_fd=userns_fd)
        _check(
            syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                ctypes.c_uint(_AT_EMPTY_PATH),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            ),
            f"mount_setattr({source}, MOUNT_ATTR_IDMAP): the file system may not support "
            "idmapped mounts",
        )
        _check(
            syscall(
                _SYS_MOVE_MOUNT,
                tree,
                b"",
                _AT_FDCWD,
                target.encode(),
                ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
            ),
            f"move_mount({source} -> {target})",
        )
    finally:
        os.close(tree)


def main(argv: list[str]) -> int:
    """``BASE COUNT SRC DST [SRC DST ...]``: one idmapped view per pair."""
    if platform.machine() not in ("x86_64", "aarch64") or len(argv) < 4 or len(argv) % 2:
        print(f"idmap: unsupported machine or arguments: {argv}", file=sys.stderr)
        return 2
    base, count = int(argv[0]), int(argv[1])
    userns = mapping_userns(base, count)
    try:
        for source, target in zip(argv[2::2], argv[3::2], strict=True):
            idmapped_view(source, target, userns)
    except OSError as exc:
        print(f"idmap: {exc}", file=sys.stderr)
        return 1
    finally:
        os.close(userns)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
