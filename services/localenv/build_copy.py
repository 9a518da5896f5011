"""COPY and ADD steps of a Dockerfile build: files of the build context into the layer.

Nothing is read through a link out of the context: a glob match must lie in it, a
matched link is copied as a link, FIFOs and devices are refused and each file is
bounded (``hostio``); ADD unpacks local tar archives (``tarfile``'s "tar" filter).
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

from services.localenv.dockerfile import CopyStep
from services.localenv.errors import LocalEnvironmentError
from services.localenv.hostio import copy_file, copy_tree
from services.localenv.sandbox import Sandbox
from services.localenv.users import lookup_group, lookup_user


def copy_step(step: CopyStep, context: Path, sandbox: Sandbox) -> None:
    """Carry out one COPY/ADD step into the build's sandbox (``--chown``, ``--chmod``)."""
    owner = _owner(step.chown, sandbox.root) if step.chown else None
    mode = int(step.chmod, 8) if step.chmod else None
    written: list[Path] = []
    if step.content is not None:
        dest = sandbox.resolve(step.dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(step.content)
        written.append(dest)
    else:
        ctx = context.resolve()
        for pattern in step.sources:
            matches = (
                sorted(ctx.glob(pattern.lstrip("/"))) if any(c in pattern for c in "*?[") else []
            )
            if not matches:
                src = (ctx / pattern.lstrip("/")).resolve()
                if not src.is_relative_to(ctx):
                    raise LocalEnvironmentError(f"{pattern} is outside the build context")
                if not src.exists():
                    raise LocalEnvironmentError(f"{pattern}: not found in the build context {ctx}")
                matches = [src]
            for src in matches:
                # A glob walks through linked folders: the match must lie in the context.
                if not Path(os.path.realpath(src.parent)).is_relative_to(ctx):
                    raise LocalEnvironmentError(f"{src} is outside the build context")
                written += _copy_one(src, step, sandbox)
    for path in written:
        for p in [path, *(path.rglob("*") if path.is_dir() and not path.is_symlink() else [])]:
            if owner is not None:
                os.lchown(p, *owner)
            if mode is not None and not p.is_symlink():
                p.chmod(mode)


def _copy_one(src: Path, step: CopyStep, sandbox: Sandbox) -> list[Path]:
    """Copy one context entry; a link is copied as a link (never read through), FIFOs
    and devices are refused, each file is bounded (``hostio``)."""
    dest = sandbox.resolve(step.dest)
    kind = os.lstat(src).st_mode
    if step.add and stat.S_ISREG(kind) and tarfile.is_tarfile(src):
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(src) as tar:
            tar.extractall(dest, filter="tar")
        return [dest]
    if stat.S_ISDIR(kind):
        return copy_tree(src, dest)
    if step.dest_is_dir or dest.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        dest = dest / src.name
    copy_file(src, dest)
    return [dest]


def _owner(chown: str, root: Path) -> tuple[int, int]:
    user, _, group = chown.partition(":")
    uid, gid, _ = lookup_user(root, user)
    if group:
        gid = lookup_group(root, group)
    return uid, gid
