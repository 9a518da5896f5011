"""The built image of a task: a cached overlay layer, built once per task checksum.

A layer is what ``docker build`` would produce, kept as overlayfs upper folders::

    <cache>/<key>/fs/root   changes to / (WORKDIR folders, COPY targets, /opt, ...)
    <cache>/<key>/fs/usr    changes to the host's /usr   (apt-get, pip, the venv)
    <cache>/<key>/fs/etc    changes to the host's /etc
    <cache>/<key>/fs/var    changes to the host's /var   (dpkg's database, apt lists)
    <cache>/<key>/image.json   ENV, WORKDIR, USER and the base's Python binding
    <cache>/<key>/build.log    the replayed Dockerfile's log, step by step

Trials mount these folders read-only as the middle layer of their overlays (host
folder below, the trial's own upper folder above), so a repetition starts without
rebuilding. The key hashes the task's environment folder (Harbor's content
checksum), the resolved base, the lent tools and the host's package database, so
changing any of them builds a new layer. Concurrent trials of one task (in one or
several runner processes) wait on a lock file; one builds, the rest reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from services.localenv import masks

LAYER_FORMAT = 2
"""2: host secrets masked in every layer (services.localenv.masks)."""
HOST_TOPS = ("usr", "etc", "var")
FS_TOPS = ("root", *HOST_TOPS)
_LOCK_POLL_S = 0.1


@dataclass(slots=True)
class ImageConfig:
    """The configuration a built image gives its containers."""

    base: str
    base_description: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    python_prefix: str | None = None
    """Host interpreter folder bound read-only at the same path (python:3.X bases)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ImageConfig:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True, slots=True)
class Layer:
    """A built layer on disk."""

    path: Path
    config: ImageConfig

    def fs(self, top: str) -> Path:
        return self.path / "fs" / top

    @property
    def log_path(self) -> Path:
        return self.path / "build.log"


def host_fingerprint() -> str:
    """Changes whenever the host's installed packages change (the layers' lower folders)."""
    parts = []
    for name in ("/var/lib/dpkg/status", "/etc/os-release"):
        with contextlib.suppress(OSError):
            st = os.stat(name)
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    parts.append(f"euid0:{os.geteuid() == 0}")
    parts.append(f"masks:{masks.fingerprint()}")
    return ";".join(parts)


def layer_key(**inputs: object) -> str:
    """The cache key of a layer: a hash over everything that shapes it."""
    blob = json.dumps({"format": LAYER_FORMAT, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


Builder = Callable[[Path], Awaitable[ImageConfig]]
# Layers are immutable once built: their configuration is read once per process.
_KNOWN_LAYERS: dict[Path, Layer] = {}


class LayerCache:
    """Layers under one folder; ``get`` builds a missing one under a lock."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Layer | None:
        """The finished layer for ``key``, if there is one (remembered per process)."""
        path = self.path_for(key)
        known = _KNOWN_LAYERS.get(path)
        if known is not None and path.is_dir():
            return known
        try:
            layer = Layer(path, ImageConfig.from_json((path / "image.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
        _KNOWN_LAYERS[path] = layer
        return layer

    async def get(self, key: str, build: Builder) -> tuple[Layer, bool]:
        """The layer for ``key`` and whether this call built it.

        ``build(tmp)`` fills a fresh folder and returns the image configuration; the
        folder is renamed into place only when the build succeeded.
        """
        found = self.lookup(key)
        if found is not None:
            return found, False
        self.root.mkdir(parents=True, exist_ok=True)
        with await _locked(self.root / f"{key}.lock"):
            found = self.lookup(key)
            if found is not None:
                return found, False
            tmp = self.root / f".build-{key}-{uuid.uuid4().hex[:8]}"
            try:
                config = await build(tmp)
                (tmp / "image.json").write_text(config.to_json())
                tmp.rename(self.path_for(key))
            finally:
                if tmp.exists():
                    await asyncio.to_thread(remove_tree, tmp)
            return Layer(self.path_for(key), config), True


class _FileLock:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> _FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


async def _locked(path: Path) -> _FileLock:
    """An exclusive lock on ``path``, polled so that a cancelled waiter leaves no holder."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return _FileLock(fd)
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL_S)
    except BaseException:
        os.close(fd)
        raise


def remove_tree(path: Path) -> None:
    """Remove a sandbox or build folder (overlay work folders have mode 000 entries)."""

    def onexc(func: Callable[..., object], p: str, exc: BaseException) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        with contextlib.suppress(OSError):
            func(p)

    for _ in range(3):
        if not path.exists() and not path.is_symlink():
            return
        shutil.rmtree(path, onexc=onexc)
        if path.exists():
            time.sleep(0.05)
