"""A Harbor environment that imitates a task's Docker image on this host, without Docker.

Selected in a manifest with ``compute.environment: local`` (or by its import path
``services.localenv.environment:LocalEnvironment``). It is for TRUSTED tasks only:
the sandbox keeps a trial's files, processes and network apart from the host and
from sibling trials, but it is not a security boundary against hostile code (see
docs/local-environment.md).

``start`` does what ``docker build`` + ``docker run`` would:

1. read environment/Dockerfile (``dockerfile.plan_build``) and map its FROM onto
   the host (``images.resolve_base``); refuse what cannot be imitated;
2. get the task's built layer from the cache, replaying the Dockerfile once per
   task checksum (``layers`` + ``builder``);
3. start the trial's sandbox (``sandbox``): per-trial overlays over the layer and
   the host's /usr, /etc and /var, a private pid/network/ipc/uts namespace, Harbor's
   log folders bound in, the task's CPU and memory limits (``limits``), and the
   lent test tools (``tools``).

``exec`` runs each command in that sandbox (processes persist between commands, as
in ``docker exec``); ``stop`` kills everything the trial started and removes its
folders unless ``keep_sandbox`` is set.

Environment options (``compute.environment_kwargs``): ``scratch_dir`` (per-trial
folders), ``cache_dir`` (built layers; default ``<scratch_dir>/.layers``),
``keep_sandbox``, ``base_images`` (extra FROM mappings), ``python_interpreters``
(version -> interpreter path), ``build_args`` (Dockerfile ARG values),
``test_tools`` (lend uv/uvx and host Pythons; default true), ``ca_env`` (point
SSL_CERT_FILE and friends at the host's CA bundle; default true), ``pids_limit``
(processes per trial and per build, default 4096), ``build_memory_mb`` (memory of a
Dockerfile build; default none), ``hidden_paths`` (host paths no trial or build may
see: the runner passes its own credentials and data folders, docs/security.md),
``seccomp`` (refuse the system calls no task needs, ``seccomp``; default true: a
manifest can turn it off only where the runner's policy lists the key),
``disk_mb`` (the trial's disk quota, default 10240, 0 = none; the task's
``storage_mb`` lowers it: ``disk``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode

from schemas.manifest import LOCAL_ALLOWLIST
from services.common.task_variables import COMPOSE_FILES
from services.localenv import egress
from services.localenv.builder import BuildRequest, build_layer
from services.localenv.disk import DiskQuota, QuotaGuard
from services.localenv.dockerfile import BuildPlan, RunStep, plan_build
from services.localenv.egress import Allowlist, EgressProxy
from services.localenv.errors import (
    DockerfileBuildError,
    ExecTimeoutError,
    LocalEnvironmentError,
    SandboxStartError,
    UnsupportedEnvironmentError,
)
from services.localenv.hostio import copy_file, copy_tree, private_dir, sweep_bound_folder
from services.localenv.images import BaseImage, host_interpreters, resolve_base
from services.localenv.layers import (
    HOST_TOPS,
    ImageConfig,
    Layer,
    LayerCache,
    host_fingerprint,
    layer_key,
    remove_tree,
)
from services.localenv.limits import TrialCgroup
from services.localenv.sandbox import Sandbox
from services.localenv.shift import make_dir, parse_userns, shift_tree
from services.localenv.spec import BWRAP, Bind, Overlay, SandboxSpec, missing_host_tools
from services.localenv.stale import LAYERS_NAME, default_scratch
from services.localenv.task_fit import compose_refusal, environment_refusals
from services.localenv.tools import TOOLS_BIN, Toolbox
from services.localenv.users import lookup_user

__all__ = [
    "DockerfileBuildError",
    "ExecTimeoutError",
    "LocalEnvironment",
    "LocalEnvironmentError",
    "SandboxStartError",
    "UnsupportedEnvironmentError",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_ENV_NAMES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
_HOSTNAME = "trial"
DEFAULT_PIDS_LIMIT = 4096
"""Processes (threads included) one trial or build may hold: a fork bomb stops there."""
DEFAULT_DISK_MB = 10240
"""What one trial may write (file system and log folders) unless told otherwise."""


class LocalEnvironment(BaseEnvironment):  # type: ignore[misc]  # Harbor ships no types
    """Harbor BaseEnvironment over bubblewrap, overlayfs and namespaces on the local host."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Instance state read by ``capabilities`` must exist before Harbor's __init__.
        self._keep_sandbox = bool(kwargs.pop("keep_sandbox", False))
        scratch = kwargs.pop("scratch_dir", None)
        self._scratch = Path(scratch) if scratch else default_scratch()
        cache = kwargs.pop("cache_dir", None)
        self._cache = LayerCache(Path(cache) if cache else self._scratch / LAYERS_NAME)
        self._base_images: dict[str, str] = dict(kwargs.pop("base_images", None) or {})
        self._interpreters: dict[str, str] = dict(kwargs.pop("python_interpreters", None) or {})
        self._build_args: dict[str, str] = dict(kwargs.pop("build_args", None) or {})
        self._lend_tools = bool(kwargs.pop("test_tools", True))
        self._ca_env = bool(kwargs.pop("ca_env", True))
        pids = int(kwargs.pop("pids_limit", DEFAULT_PIDS_LIMIT) or 0)
        self._pids_limit = pids if pids > 0 else None
        build_memory = kwargs.pop("build_memory_mb", None)
        self._build_memory_mb = int(build_memory) if build_memory else None
        self._hidden = tuple(Path(p) for p in kwargs.pop("hidden_paths", None) or ())
        self._seccomp = kwargs.pop("seccomp", True) is not False
        # Root inside as an unprivileged host uid (``shift``); off unless the runner says.
        self._userns_base = parse_userns(
            kwargs.pop("userns", None), kwargs.pop("userns_base", None)
        )
        disk = int(kwargs.pop("disk_mb", DEFAULT_DISK_MB) or 0)
        self._disk_mb = disk if disk > 0 else None
        self._guard: QuotaGuard | None = None
        self._egress: EgressProxy | None = None
        # Bind Harbor's log folders straight into the sandbox: no copies back and forth.
        kwargs.setdefault("auto_mounting", True)
        super().__init__(*args, **kwargs)
        self._root = self._scratch / f"{self.session_id}-{uuid.uuid4().hex[:8]}"
        self._sandbox: Sandbox | None = None
        self._image = ImageConfig(base="", base_description="")
        self._toolbox: Toolbox | None = None
        self._workdir = "/"

    # -- identity and capabilities -------------------------------------------------
    @staticmethod
    def type() -> str:
        return "trialbus-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        allowlist = egress.enforceable()
        return EnvironmentCapabilities(
            disable_internet=True,
            mounted=True,
            dynamic_network_policy=True,
            network_allowlist=allowlist,
            network_allowlist_hostnames=allowlist,
            network_allowlist_wildcard_hostnames=allowlist,
            network_allowlist_ipv4_addresses=allowlist,
            network_allowlist_ipv6_addresses=allowlist,
            network_allowlist_ipv4_cidrs=allowlist,
            network_allowlist_ipv6_cidrs=allowlist,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @classmethod
    def preflight(cls) -> None:
        missing = missing_host_tools(network=True)
        if missing:
            raise SystemExit(
                f"the local environment needs {', '.join(missing)}: "
                "apt-get install bubblewrap slirp4netns util-linux (or run `make setup`)"
            )

    def _validate_definition(self) -> None:
        # The Dockerfile and compose checks run in start(), so that Harbor records the
        # failure in the trial's result. What task.toml asks that no sandbox here has
        # is refused now, as not retryable (Harbor's own checks, which run next, raise
        # a RuntimeError that reads as a transient infrastructure failure).
        refusals = environment_refusals(self.task_env_config)
        if refusals:
            raise UnsupportedEnvironmentError("; ".join(refusals))

    def validate_network_policy_support(self, network_policy: NetworkPolicy | None = None) -> None:
        try:
            super().validate_network_policy_support(network_policy)
        except ValueError as exc:
            # Harbor's ValueError would be retried as a transient infrastructure failure.
            raise UnsupportedEnvironmentError(
                f"{exc} (the local environment enforces an allowlist only on a runner "
                f"running as root, which offers {LOCAL_ALLOWLIST!r})"
            ) from None

    @property
    def _network_enabled(self) -> bool:
        return bool(self._network_policy.network_mode == NetworkMode.PUBLIC)

    @property
    def _network_ever(self) -> bool:
        """Whether some phase of the trial has the network (then slirp4netns is needed,
        and /etc/resolv.conf names its DNS from the start)."""
        policies = [self._network_policy, *self._phase_network_policies]
        return any(p.network_mode == NetworkMode.PUBLIC for p in policies)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        # Harbor switches phases (setup, agent, verifier) through set_network_policy,
        # which has refused what cannot be enforced (validate_network_policy_support).
        sandbox = self._sandbox
        if sandbox is None:
            raise LocalEnvironmentError("the sandbox is not started: no network policy to apply")
        mode = network_policy.network_mode
        await sandbox.set_network(mode == NetworkMode.PUBLIC)
        allowlist = None
        if mode == NetworkMode.ALLOWLIST:
            allowlist = Allowlist.of(network_policy.allowed_hosts)
            if self._egress is None:
                self._egress = EgressProxy(self.logger)
                await self._egress.start(sandbox.pid)
        if self._egress is not None:
            await self._egress.allow(allowlist)
        self.logger.debug("local environment: network %s", mode.value)

    @property
    def _egress_env(self) -> dict[str, str]:
        """The proxy variables while the phase's policy is an allowlist."""
        allowlist = self._network_policy.network_mode == NetworkMode.ALLOWLIST
        return self._egress.env if allowlist and self._egress is not None else {}

    # -- definition ----------------------------------------------------------------------
    def _plan(self) -> BuildPlan:
        """The task's Dockerfile as a build plan (or a bare base for a prebuilt image)."""
        for name in COMPOSE_FILES:
            if (self.environment_dir / name).exists():
                raise UnsupportedEnvironmentError(compose_refusal(name))
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.is_file():
            return plan_build(
                dockerfile.read_text(), build_args=self._build_args, where=str(dockerfile)
            )
        image = self.task_env_config.docker_image
        if image:
            return BuildPlan(base=str(image), base_line=0)
        return BuildPlan(base="debian", base_line=0, notes=["no Dockerfile: the host system"])

    def _layer_key(self, plan: BuildPlan, base: BaseImage) -> str:
        python = base.python
        return layer_key(
            environment=self.environment_id,
            base=plan.base,
            python=(python.executable, python.prefix) if python else None,
            tools=self._toolbox.fingerprint if self._toolbox else None,
            host=host_fingerprint(),
            build_args=sorted(self._build_args.items()),
            # Only when shifted, so that the identity map's keys stay what they were.
            **({"userns_base": self._userns_base} if self._userns_base is not None else {}),
        )

    async def _get_layer(self, plan: BuildPlan, base: BaseImage) -> Layer:
        needs_network = any(isinstance(s, RunStep) for s in plan.steps)
        missing = missing_host_tools(network=needs_network or self._network_ever)
        if missing:
            raise LocalEnvironmentError(
                f"the local environment needs {', '.join(missing)} on this host: "
                "apt-get install bubblewrap slirp4netns util-linux (or run `make setup`)"
            )
        request = BuildRequest(
            plan=plan,
            base=base,
            context=self.environment_dir,
            base_env=self._default_env("/root"),
            binds=self._toolbox.binds if self._toolbox else (),
            seed_uv_home=self._toolbox is not None,
            empty_dir=self._empty_dir(),
            network=needs_network,
            timeout_sec=self.task_env_config.build_timeout_sec,
            pids_limit=self._pids_limit,
            memory_mb=self._build_memory_mb,
            hidden=self._hidden,
            seccomp=self._seccomp,
            disk_mb=self._disk_mb,
            userns_base=self._userns_base,
        )

        async def build(tmp: Path) -> ImageConfig:
            self.logger.info("local environment: building %s (%s)", self.environment_name, tmp.name)
            try:
                return await build_layer(request, tmp, self.logger)
            except DockerfileBuildError as exc:
                kept = self._keep_build_log(tmp / "build.log")
                message = str(exc).replace(str(tmp / "build.log"), str(kept))
                raise DockerfileBuildError(message, kept) from None

        key = self._layer_key(plan, base)
        layer, built = await self._cache.get(key, build)
        if built:
            await asyncio.to_thread(
                shutil.copyfile,
                layer.log_path,
                self.trial_paths.trial_dir / "environment-build.log",
            )
        return layer

    def _keep_build_log(self, log: Path) -> Path:
        dest: Path = self.trial_paths.trial_dir / "environment-build.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if log.is_file():
            shutil.copyfile(log, dest)
        else:
            dest.write_text("(no build log was written)\n")
        return dest

    def _empty_dir(self) -> Path:
        empty = self._cache.root / ".empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        """Build (or reuse) the task's layer and start the trial's sandbox."""
        if shutil.which(BWRAP) is None:
            raise LocalEnvironmentError(
                "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
            )
        if self._userns_base is not None and os.geteuid() != 0:
            raise LocalEnvironmentError(
                "userns: shifted needs a runner running as root (only root maps a range "
                "of host uids); unset TRIALBUS_SANDBOX_USERNS or run the runner as root"
            )
        # Trial and layer files are root's, setuid bits included: no other host user
        # may reach them (the overlays' folders cannot be mounted nosuid on the host).
        for folder in (self._scratch, self._cache.root):
            await asyncio.to_thread(private_dir, folder)
        plan = self._plan()
        base = resolve_base(
            plan.base,
            overrides=self._base_images,
            interpreters=self._interpreters,
            where=str(self.environment_dir / "Dockerfile"),
        )
        if self._lend_tools:
            self._toolbox = await asyncio.to_thread(
                _toolbox, self._cache.root, tuple(sorted(self._interpreters.items()))
            )
        layer = await self._get_layer(plan, base)
        self._image = layer.config
        self._workdir = str(self.task_env_config.workdir or layer.config.workdir or "/")
        self._guard = await self._disk_guard()
        self._sandbox = Sandbox(self._trial_spec(layer), self.logger)
        await self._sandbox.start()
        if self._network_policy.network_mode == NetworkMode.ALLOWLIST:
            await self._apply_network_policy(self._network_policy)
        if self._guard is not None:
            self._guard.start()
        make_dir(self._sandbox.resolve(self._workdir), self._userns_base)

    def _shift(self, path: Path) -> None:
        """Hand what the host wrote for the trial to root inside (shifted only)."""
        if self._userns_base is not None:
            shift_tree(path, self._userns_base)

    async def _disk_guard(self) -> QuotaGuard | None:
        """The trial's disk quota: the smaller of ``disk_mb`` and the task's storage_mb."""
        limits = [m for m in (self._disk_mb, self._effective_storage_mb) if m]
        if not limits:
            return None
        private_dir(self._root)
        bound = [
            Path(m["source"])
            for m in self._mounts
            if m["type"] == "bind" and not m.get("read_only")
        ]
        quota = await asyncio.to_thread(DiskQuota.open, self._root, min(limits), bound, self.logger)
        return QuotaGuard(quota, self._end_sandbox, self.logger)

    async def _end_sandbox(self) -> None:
        if self._sandbox is not None:
            await self._sandbox.stop()

    def _trial_spec(self, layer: Layer) -> SandboxSpec:
        root = self._root
        private_dir(root)
        rw = self._guard.quota.writable_root(root) if self._guard is not None else root
        overlays = [Overlay("/", (layer.fs("root"),), rw / "upper/root", rw / "work/root")]
        overlays += [
            Overlay(
                f"/{top}",
                (layer.fs(top), Path(f"/{top}")),
                rw / "upper" / top,
                rw / "work" / top,
            )
            for top in HOST_TOPS
        ]
        etc = rw / "upper" / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        # Files Docker writes for every container.
        (etc / "hostname").write_text(f"{_HOSTNAME}\n")
        (etc / "hosts").write_text(
            f"127.0.0.1\tlocalhost {_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        if self._network_ever:
            (etc / "resolv.conf").write_text("nameserver 10.0.2.3\n")
        self._shift(etc)
        binds = [
            Bind(Path(m["source"]), str(m["target"]), bool(m.get("read_only")))
            for m in self._mounts
            if m["type"] == "bind"
        ]
        for b in binds:
            b.source.mkdir(parents=True, exist_ok=True)
            if not b.read_only:
                self._shift(b.source)  # the trial writes its logs there as root inside
        if self._toolbox is not None:
            binds += self._toolbox.binds
        prefix = layer.config.python_prefix
        if prefix and not any(b.target == prefix for b in binds):
            binds.append(Bind(Path(prefix), prefix, read_only=True))
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        cgroup = TrialCgroup.create(
            root.name, cpus=cpus, memory_mb=memory, pids=self._pids_limit, logger=self.logger
        )
        return SandboxSpec(
            state_dir=root / "state",
            overlays=overlays,
            binds=binds,
            network=self._network_enabled,
            hostname=_HOSTNAME,
            cgroup=cgroup,
            memory_rlimit_mb=memory if cgroup is None and memory else None,
            pids_rlimit=self._pids_limit if cgroup is None or not cgroup.pids_limited else None,
            helpers_root=self._cache.root / ".exec-helpers",
            hidden=self._hidden,
            seccomp=self._seccomp,
            userns_base=self._userns_base,
        )

    async def stop(self, delete: bool) -> None:
        """Kill every process of the trial; remove its folders unless asked to keep them."""
        egress, self._egress = self._egress, None
        if egress is not None:
            await egress.stop()
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.stop()
        guard, self._guard = self._guard, None
        if guard is not None:
            # Unmounted before the folders go (keep_sandbox keeps the image file).
            await guard.close(keep_image=not delete or self._keep_sandbox)
        if delete and not self._keep_sandbox:
            await asyncio.to_thread(remove_tree, self._root)

    # -- file transfer -----------------------------------------------------------------
    def _path(self, sandbox_path: str) -> Path:
        if self._sandbox is None or not self._sandbox.running:
            raise LocalEnvironmentError("file transfer before start() or after stop()")
        return self._sandbox.resolve(sandbox_path)

    # Transfers go through ``hostio``: links are copied as links (an uploaded task
    # folder cannot pull host files in; a downloaded one cannot point host readers
    # at host files), FIFOs and devices are refused, each file is bounded.
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        dest = self._path(target_path)
        # A single file named by Harbor or an agent's configuration (the operator's
        # side, e.g. a linked auth.json) is followed, as before; task folders go
        # through upload_dir, where links stay links.
        source = Path(os.path.realpath(source_path))
        await asyncio.to_thread(copy_file, source, dest)
        await asyncio.to_thread(self._shift, dest)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        dest = self._path(target_dir)
        await asyncio.to_thread(copy_tree, Path(source_dir), dest)
        await asyncio.to_thread(self._shift, dest)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        src = self._path(source_path)
        await asyncio.to_thread(copy_file, src, Path(target_path), allow_link=False)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        src = self._path(source_dir)
        if not src.is_dir():
            raise FileNotFoundError(f"{source_dir} does not exist in the sandbox")
        await asyncio.to_thread(_download_tree, src, Path(target_dir), self.logger)

    # -- exec --------------------------------------------------------------------------
    def _default_env(self, home: str) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "xterm"}
        if self._ca_env and CA_BUNDLE.is_file():
            env.update(dict.fromkeys(CA_ENV_NAMES, str(CA_BUNDLE)))
        return env

    def _user(self, sandbox: Sandbox, user: str | int | None) -> tuple[int, int, str]:
        resolved = self._resolve_user(user)
        if resolved is None:
            resolved = self._image.user
        if resolved is None or resolved in ("root", 0, "0"):
            return 0, 0, "/root"
        try:
            return lookup_user(sandbox.root, resolved)
        except LocalEnvironmentError as exc:
            self.logger.warning("local environment: %s; running as root", exc)
            return 0, 0, "/root"

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        sandbox, guard = self._sandbox, self._guard
        if guard is not None and (exceeded := guard.error()) is not None:
            raise exceeded
        if sandbox is None or not sandbox.running:
            raise LocalEnvironmentError("exec before start() or after stop()")
        uid, gid, home = self._user(sandbox, user)
        full_env = {
            **self._default_env(home),
            **self._egress_env,
            **self._image.env,
            **(self._merge_env(env) or {}),
        }
        if self._toolbox is not None and TOOLS_BIN not in full_env["PATH"].split(":"):
            full_env["PATH"] = f"{full_env['PATH']}:{TOOLS_BIN}"
        workdir = cwd or self._workdir
        try:
            make_dir(sandbox.resolve(workdir), self._userns_base)
        except OSError as exc:
            self.logger.debug("local environment: cannot create %s: %s", workdir, exc)
        try:
            result = await sandbox.exec(
                ["bash", "-c", command],
                env=full_env,
                cwd=workdir,
                uid=uid,
                gid=gid,
                timeout_sec=timeout_sec,
                on_output=self._output_callback(),
            )
        except Exception as exc:
            # Ended by the quota while it ran: that, not the kill, is the reason.
            if guard is not None and (exceeded := guard.error()) is not None:
                await asyncio.to_thread(self._sweep_bound_folders)
                raise exceeded from exc
            raise
        # Harbor reads these host folders next (rewards, agent logs): a link planted
        # there must not make it read a host file. (A background process of the trial
        # may still race this; see docs/security.md.)
        await asyncio.to_thread(self._sweep_bound_folders)
        if guard is not None:
            await guard.check()
        return ExecResult(
            stdout=result.stdout or None,
            stderr=result.stderr or None,
            return_code=result.return_code,
        )

    def _sweep_bound_folders(self) -> None:
        for m in self._mounts:
            if m["type"] == "bind" and not m.get("read_only"):
                for change in sweep_bound_folder(Path(m["source"])):
                    self.logger.warning("local environment: %s", change)


@functools.lru_cache(maxsize=16)
def _toolbox(cache_root: Path, interpreters: tuple[tuple[str, str], ...]) -> Toolbox | None:
    """The lent tools, prepared once per process and cache folder."""
    return Toolbox.prepare(cache_root, host_interpreters(dict(interpreters)))


def _download_tree(src: Path, dest: Path, logger: logging.Logger) -> None:
    copy_tree(src, dest)
    for change in sweep_bound_folder(dest):
        logger.warning("local environment: downloaded %s", change)
