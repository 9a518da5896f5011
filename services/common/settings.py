"""Settings: one pydantic-settings class per service, built once and passed down.

``NATS_URL`` and ``LEDGER_URL`` point the same code at real servers; everything else
is ``TRIALBUS_*``. When neither URL is set, the CLI falls back to the embedded stack
started by ``trialbus up`` (see services.cli).
"""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, IPvAnyAddress, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.documented import fold_field_descriptions
from schemas.manifest import MAX_CONCURRENT_TRIALS
from schemas.subjects import DEFAULT_POOL, POOL_PATTERN, Topology
from services.common.priority import DEFAULT_CLASS, DEFAULT_CLASSES, PriorityClasses


class CommonSettings(BaseSettings):
    """Connection and naming settings every service shares."""

    model_config = SettingsConfigDict(
        env_prefix="TRIALBUS_",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        use_attribute_docstrings=True,
        json_schema_extra=fold_field_descriptions,
    )

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("NATS_URL", "TRIALBUS_NATS_URL"),
    )
    """Comma-separated NATS server URLs."""
    ledger_url: str = Field(
        default="mongodb://127.0.0.1:27017",
        validation_alias=AliasChoices("LEDGER_URL", "TRIALBUS_LEDGER_URL"),
    )
    """MongoDB connection string of the ledger."""
    ledger_db: str = "trialbus"
    """Ledger database name."""
    prefix: str = "trialbus"
    """Stream/subject namespace."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """JetStream replicas."""
    jobs_dir: Path = Path(".trialbus/jobs")
    """Root of the Harbor job folders."""
    nats_credentials: Path | None = None
    """A role's NATS credentials file (infra/nats_auth.py, mode 0600); every NATS connection of the
    process uses it. Unset: no authentication."""
    tasks_bucket_max_bytes: int | None = Field(default=None, ge=1)
    """Size limit of the tasks object store (task archives, stored once per task version; a few KB
    to MB each), applied when it is created. JetStream reserves a limit on the server up front, used
    or not. None: unlimited."""
    results_bucket_max_bytes: int | None = Field(default=None, ge=1)
    """Size limit of the results object store (one archive per finished trial, KB to a few MB;
    capped by runner result_cap_bytes), reserved like the tasks bucket's. A full bucket refuses
    uploads (trials wait and retry), it never drops stored results. None: unlimited."""
    results_ttl_s: float | None = Field(default=None, gt=0)
    """Age after which the server deletes stored trial folders (None: kept; records in the ledger
    stay either way, only `trialbus export` needs them)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the Prometheus exporter (/metrics, on metrics_addr) of a service that has one
    (importer, watcher, runner); None: off. The submitter serves /metrics on its API instead
    (docs/operations.md)."""
    metrics_addr: IPvAnyAddress = IPv4Address("127.0.0.1")
    """IP address the Prometheus exporter binds (it has no authentication): loopback by default;
    0.0.0.0 or :: for every interface, when only trusted scrapers can reach the port
    (docs/security.md)."""
    log_level: str = "INFO"
    log_json: bool | None = None
    """JSON logs (default: when not a TTY)."""
    priority_classes: str = DEFAULT_CLASSES
    """Priority classes and their weights, highest first by weight: 'name=weight,...'
    (docs/scheduling.md). Every process of an installation must share it: the submitter checks
    manifests against it, the admin makes one runner durable per pool and class, runners weigh their
    fetches by it."""
    default_priority_class: str = DEFAULT_CLASS
    """The class of a manifest that names none (one of priority_classes)."""

    @model_validator(mode="after")
    def _classes_parse(self) -> CommonSettings:
        self.classes  # noqa: B018 - raises a ValueError naming the problem, at start-up
        return self

    @property
    def classes(self) -> PriorityClasses:
        """The parsed priority classes (services.common.priority)."""
        return PriorityClasses.parse(self.priority_classes, self.default_priority_class)

    @property
    def topology(self) -> Topology:
        return Topology(self.prefix)

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]


class RunnerSettings(CommonSettings):
    """A runner process."""

    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENT_TRIALS)
    """Trials at once in this process."""
    ack_wait_s: float = Field(default=60.0, gt=1)
    """Redelivery after silence."""
    heartbeat_s: float = Field(default=15.0, gt=0)
    """in_progress() interval."""
    admission: int = Field(default=32, ge=1, le=4096)
    """Trials at once between 'message taken' and 'executor started' (the lease and attempt round
    trips); a burst beyond it waits with its message kept alive instead of in requests that time
    out. As many trials at once settle (folder stored, ending published): a burst of endings goes
    out in turn."""
    runner_id: str | None = None
    """Default: host-pid."""
    stop_notice_s: float | None = Field(default=None, gt=0, le=3600)
    """Seconds between SIGTERM and the machine's end (a spot instance's notice gives about 120): on
    SIGTERM the runner stops fetching, hands back at once every trial that cannot finish before then
    (not counted as an attempt), lets the others finish, and hands back the rest at the deadline.
    Unset: SIGTERM drains (trials get the drain grace to finish; docs/operations.md)."""
    pool: str = Field(default=DEFAULT_POOL, pattern=POOL_PATTERN)
    """Pool whose work this runner takes (manifests choose compute.pool)."""
    labels: list[str] = Field(default_factory=list)
    """Capabilities the operator declares (e.g. gpu), matched against a manifest's compute.requires;
    environments (local, docker) are detected."""
    nats_js_domain: str | None = None
    """JetStream domain of the hub, for a runner behind a leaf node (docs/operations.md, pools
    behind a boundary)."""
    executor: str = "harbor"
    """'harbor', or 'module:factory': a callable given these settings that returns an Executor
    (loaded by import path; benchmarks use one)."""
    publish_logs: bool = True
    """Publish live trial output."""
    fair_share: bool = True
    """Share the pool's slots between teams that wait, by the shares the submitter stored
    (docs/scheduling.md); false: first come, first served."""
    live_log_trial_bytes: int = Field(default=1 << 20, ge=0)
    """Bytes of live output published per trial attempt; past it, a notice and the count of bytes
    not published (the trial folder keeps everything)."""
    live_log_event_chars: int = Field(default=16_000, ge=64, le=200_000)
    """Characters per trial_log event; longer output is split."""
    sandbox_dir: Path | None = None
    """Scratch root of local sandboxes."""
    sandbox_disk_mb: int = Field(default=10240, ge=0)
    """Disk quota of one local-environment trial in MB (its file system and log folders); a task's
    smaller storage_mb wins. 0: no quota (docs/security.md)."""
    sandbox_userns: Literal["identity", "shifted"] = "identity"
    """Root inside a local-environment trial or build: 'identity' (host uid 0, the default) or
    'shifted' (host uid sandbox_userns_base and up: host root's files are not its own;
    docs/security.md, 'Root inside')."""
    sandbox_userns_base: int = Field(default=100000, ge=65536, le=2**32 - 1 - 65536)
    """With sandbox_userns=shifted: the host uid (and gid) of root inside; uids base..base+65535 are
    the trials'. Keep the range free of host users."""
    sandbox_hide: list[Path] = Field(default_factory=list)
    """Host paths no local-environment trial or build may see, besides the runner's own
    (hidden_from_trials); `trialbus up` adds its data folder. A JSON list."""
    policy_file: Path | None = None
    """What manifests may ask of this runner (environments and their kwargs, agents, secret names,
    endpoints; docs/security.md). Unset: the safe default."""
    work_dir: Path = Path(".trialbus/runner")
    """The runner's own disk: trial folders (jobs/) until their upload is confirmed, and the task
    cache (tasks/). Shared with no other process."""
    task_cache_bytes: int = Field(default=2 * 1024**3, ge=0)
    """Soft size budget of the task cache; least recently used tasks go first, tasks in use
    never."""
    result_cap_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """Most bytes of a trial folder stored per trial; files past it are listed in the archive's
    manifest and the record, not stored."""
    keep_trial_dirs: bool = False
    """Keep each trial folder after its archive is stored (debugging); default: deleted once the
    upload is confirmed."""

    def hidden_from_trials(self) -> list[Path]:
        """Host paths the local sandbox covers in every trial and build: the runner's
        folders (trial folders of every experiment, the task cache, sandboxes, job
        folders), its NATS credentials file, its policy file, and ``sandbox_hide``."""
        own = [self.work_dir, self.jobs_dir, self.sandbox_dir, self.nats_credentials]
        own += [self.policy_file, *self.sandbox_hide]
        return [p.resolve() for p in own if p is not None]


class ImporterSettings(CommonSettings):
    """The importer process."""

    batch_size: int = Field(default=200, ge=1, le=10_000)
    batch_timeout_s: float = Field(default=0.2, gt=0)
    retry_delay_s: float = Field(default=2.0, gt=0)
    """nak delay when the ledger is down."""


class WatcherSettings(CommonSettings):
    """The watcher process."""

    scan_interval_s: float = Field(default=2.0, gt=0)
    """Jobs folder poll interval."""
    watch_external: bool = True
    """Import job folders made by hand."""


class SubmitterSettings(CommonSettings):
    """The submitter (CLI and HTTP API).

    The HTTP API needs a tokens file unless ``api_no_auth`` is set, which it accepts
    only on a loopback address (services/submitter/http_security.py checks at start).
    """

    http_host: str = "127.0.0.1"
    """Address the HTTP API binds."""
    http_port: int = 8080
    api_tokens_file: Path | None = None
    """YAML/JSON file of token SHA-256s and the identity (user, team, admin) each acts as; mode 0600
    (services/submitter/api_tokens.py)."""
    api_no_auth: bool = False
    """Serve the HTTP API without tokens; refused unless http_host is loopback."""
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1, le=64 * 1024 * 1024)
    """Largest request body the HTTP API reads (413 beyond)."""
    api_max_task_bytes: int = Field(default=64 * 1024 * 1024, ge=1, le=1024 * 1024 * 1024)
    """Largest task archive POST /tasks reads (413 beyond); unpacked, it must also fit the task
    limits (files, bytes, compression ratio)."""
    api_allowed_hosts: str | None = None
    """Comma-separated Host header values the HTTP API answers (DNS rebinding); default: http_host,
    localhost, 127.0.0.1 and ::1. '*' turns it off."""
    tasks_root: Path | None = None
    """Task paths must stay inside this folder. Unset: a manifest posted over HTTP must stay inside
    the service's working folder, and one given to the command line may name any folder."""
    api_dataset_registries: str | None = None
    """Registries the HTTP API fetches a posted manifest's datasets from, comma-separated:
    `harbor` (Harbor's registry), http(s):// URLs of registry files, absolute paths of registry
    files on the API's host; every repository they list is fetched as `trialbus submit` would.
    Unset: the API fetches no dataset (422)."""
    dataset_cache: Path | None = None
    """Where `trialbus submit` downloads a manifest's registry datasets (Harbor's task cache
    layout, reused by later submissions). Unset: Harbor's own cache (~/.cache/harbor/tasks),
    shared with `harbor download` and `harbor run`."""
    quotas_file: Path | None = None
    """YAML/JSON file of team quotas (max_concurrent_trials, max_trials_per_day,
    max_spend_usd_per_day per team, and a default for teams not listed; services/common/quotas.py).
    Unset: no quotas."""
    cli_team: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")
    """The team whose quotas `trialbus submit` counts against, recorded as the experiment's
    submitter (`submitted_by`) as an API token's team is (the CLI has no token to name one). Unset:
    CLI submissions have no team and no quota."""
    report_cache_mib: int = Field(default=256, ge=0, le=64 * 1024)
    """Memory the HTTP API keeps computed reports in (leaderboard, report, experiment page; by
    content version, least recently used out first); 0: none."""
    check_runners: bool = True
    """Refuse a manifest no live runner can run (its pool and capabilities); off: queue it for
    runners that start later."""
