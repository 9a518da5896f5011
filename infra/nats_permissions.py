"""What each trialbus role may do on NATS: exact publish and subscribe allow lists.

Derived from a :class:`~schemas.subjects.Topology` (streams, subjects, durables and
buckets; a KV bucket ``b`` is the stream ``KV_b`` with subjects ``$KV.b.>``, an object
store the stream ``OBJ_b`` with ``$O.b.>``). The JetStream API is reached by publishing
requests to ``$JS.API.*`` subjects, so API rights are publish rights: each building
block below names what one nats-py call sends. infra.nats_auth turns these lists into
NATS users; docs/security-bus.md explains them and tests/security/test_bus_permissions.py
proves them against a real nats-server.

- ``admin`` owns the installation's streams, buckets and durable consumers: the only
  role that may create, update, delete or purge them (scoped to this installation's
  names, so two installations sharing a cluster cannot touch each other's).
- ``submitter`` publishes work and ExperimentSubmitted, follows events and live logs
  (the dashboard shows them), sets cancel and pause flags (and reads the pause flags
  back: ``trialbus status`` shows ``paused``), counts its teams' trials per day and
  reads their spend (``quota.>``), publishes the quotas file's limits runners enforce
  (``quota.limits``), uploads task archives, reads the
  runner registry and reads (never writes) stored trial folders (the dashboard's
  downloads).
- ``runner`` consumes work through its pool's durables only (one per priority class:
  ``classes``), publishes its run events and live logs, uses the leases / attempt-
  counter keys and its pool's runner-registry keys, tallies a team's spend
  (``quota.spend.>``; it reads, never writes, ``quota.limits``), reads tasks and
  writes results. No work, no experiment events, no cancel or pause flags, no stream
  config. A runner user is scoped to ONE pool
  (``pool=``): the default pool's is the plain ``runner`` user; another pool's is
  ``runner-<pool>``, with its own inbox, so a runner of one pool can neither fetch
  another pool's work nor read the replies (pulled messages) of another pool's runners.
  The same user serves as a leaf node's remote credential: a leaf server for a remote
  pool then carries exactly that pool's traffic across the boundary.
- ``importer`` / ``watcher`` consume events through their own durable and publish
  ResultImported / ExperimentCompleted (+ the watcher's external announcements, whose
  trial folders it stores in the results bucket).
- ``subscriber`` (CI, dashboards) reads events and logs through ephemeral consumers.

Replies (JetStream acks, API answers, pulled messages) reach a client on its inbox.
Each role gets its own inbox prefix and may subscribe only there: with the default
``_INBOX.>`` any user could subscribe to every other client's replies, pulled work
messages included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.subjects import DEFAULT_POOL, Topology, check_pool, checked_token
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses

ROLES = ("admin", "submitter", "runner", "importer", "watcher", "subscriber")
"""Every role, in the order they are written into the server config."""

API = "$JS.API"


@dataclass(frozen=True, slots=True)
class Permissions:
    """Subjects a role may publish to and subscribe to (allow lists; all else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def principal(role: str, pool: str = DEFAULT_POOL) -> str:
    """Who connects: ``role``, or ``runner-<pool>`` for a runner of another pool.

    It names the NATS user, the inbox and the credentials file. Only runners have pools.
    """
    check_role(role)
    if check_pool(pool) == DEFAULT_POOL:
        return role
    if role != "runner":
        raise ValueError(f"only runners belong to a pool; role {role!r} got pool {pool!r}")
    return f"runner-{pool}"


def user_name(topology: Topology, role: str, pool: str = DEFAULT_POOL) -> str:
    """NATS user name of ``role`` (prefixed: installations may share a cluster)."""
    return f"{topology.prefix}-{principal(role, pool)}"


def inbox_prefix(topology: Topology, role: str, pool: str = DEFAULT_POOL) -> str:
    """The only inbox ``role`` (of ``pool``) may subscribe to (its replies arrive there).

    ``runner-<pool>`` is one token, not ``runner.<pool>``: the default runner's
    ``_INBOX.<prefix>.runner.>`` must not cover another pool's replies.
    """
    return f"_INBOX.{topology.prefix}.{principal(role, pool)}"


def kv_stream(bucket: str) -> str:
    """Backing stream of a KV bucket (NATS naming)."""
    return f"KV_{bucket}"


def obj_stream(bucket: str) -> str:
    """Backing stream of an object store bucket (NATS naming)."""
    return f"OBJ_{bucket}"


def all_streams(topology: Topology) -> tuple[str, ...]:
    """Every stream of the installation, buckets' backing streams included."""
    t = topology
    return (
        t.work_stream,
        t.events_stream,
        t.logs_stream,
        kv_stream(t.leases_bucket),
        kv_stream(t.control_bucket),
        kv_stream(t.runners_bucket),
        obj_stream(t.tasks_bucket),
        obj_stream(t.results_bucket),
    )


# -- building blocks: what one nats-py call sends -----------------------------------------
def _info(*streams: str) -> list[str]:
    # js.stream_info / key_value / object_store (ensure_streams opens all three streams).
    return [f"{API}.STREAM.INFO.{s}" for s in streams]


def _durable(stream: str, durable: str) -> list[str]:
    # consumer_info (before binding), fetch (MSG.NEXT), and ack/nak/term/in_progress,
    # which are publishes to the delivered message's reply subject $JS.ACK.<s>.<c>.<...>.
    return [
        f"{API}.CONSUMER.INFO.{stream}.{durable}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _follow(stream: str) -> list[str]:
    # js.subscribe(ordered_consumer=True): finds the stream by subject (STREAM.NAMES,
    # a list of names), then creates an ephemeral push consumer on the legacy subject
    # (no name in it), which the server refuses for a durable config; flow control
    # asks the client to answer on $JS.FC.<stream>.>.
    return [f"{API}.STREAM.NAMES", f"{API}.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"]


def _kv_read(bucket: str) -> list[str]:
    # kv.get: a direct get ($JS.API.DIRECT.GET.KV_b.$KV.b.<key>) when the bucket allows
    # it, else STREAM.MSG.GET. kv.create also reads after a conflict.
    s = kv_stream(bucket)
    return [f"{API}.DIRECT.GET.{s}", f"{API}.DIRECT.GET.{s}.>", f"{API}.STREAM.MSG.GET.{s}"]


def _kv_read_keys(bucket: str, keys: str) -> list[str]:
    # Only some keys: the last-by-subject direct get names the key in its subject (the
    # buckets are provisioned with direct gets), STREAM.MSG.GET could read any key.
    return [f"{API}.DIRECT.GET.{kv_stream(bucket)}.$KV.{bucket}.{keys}"]


def _kv_write(bucket: str, keys: str = ">") -> list[str]:
    # kv.put / create / update / delete / purge all publish to $KV.<bucket>.<key>.
    return [f"$KV.{bucket}.{keys}"]


def _obj_read(bucket: str) -> list[str]:
    # NatsObjectStore.get: the meta and then the chunks by direct gets (the subject in
    # the request's body; services/common/adapters/nats_objects.py says why); its info
    # by STREAM.MSG.GET (last by subject); nats-py's own object_store.get reads the
    # chunks through an ordered consumer instead.
    s = obj_stream(bucket)
    return [
        f"{API}.STREAM.MSG.GET.{s}",
        f"{API}.DIRECT.GET.{s}",
        *_follow(s),
    ]


def _obj_write(bucket: str) -> list[str]:
    # object_store.put: looks for an existing object (STREAM.MSG.GET), publishes chunks
    # and meta to $O.<bucket>.>. Not granted: the STREAM.PURGE put sends when it
    # replaces an object or fails midway (a purge can empty the whole bucket).
    return [f"{API}.STREAM.MSG.GET.{obj_stream(bucket)}", f"$O.{bucket}.>"]


def _events(topology: Topology, *types: str) -> list[str]:
    return [f"{topology.prefix}.events.{t}.>" for t in types]


def runner_durables(
    topology: Topology,
    pool: str = DEFAULT_POOL,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> tuple[str, ...]:
    """The durables the runners of ``pool`` fetch through: one per priority class."""
    return tuple(topology.runner_durable_for(pool, classes.durable_class(c)) for c in classes.names)


def role_permissions(
    topology: Topology,
    role: str,
    pool: str = DEFAULT_POOL,
    js_domain: str | None = None,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> Permissions:
    """The exact allow lists of ``role`` for ``topology`` (a runner: of ``pool``, with a
    fetch right on its pool's durable of each of ``classes``; default: the default
    classes of services.common.priority).

    ``js_domain``: the hub's JetStream domain. A client behind a leaf node reaches the
    hub's JetStream as ``$JS.<domain>.API.>`` (nats-server does not carry the plain
    ``$JS.API.>`` across a leaf connection), so each API right is granted in that
    form too; the hub maps it back onto the same API, same streams, same durables.
    """
    principal(role, pool)  # validates both
    t = topology
    w, e, lg = t.work_stream, t.events_stream, t.logs_stream
    pub: list[str]
    if role == "admin":
        pub = [f"{API}.INFO", f"{API}.STREAM.NAMES", f"{API}.STREAM.LIST"]
        for s in all_streams(t):
            pub += [
                f"{API}.STREAM.*.{s}",  # CREATE UPDATE DELETE PURGE INFO ...
                f"{API}.STREAM.*.*.{s}",  # MSG.GET MSG.DELETE LEADER.STEPDOWN ...
                f"{API}.CONSUMER.*.{s}",  # legacy ephemeral CREATE, LIST, NAMES
                f"{API}.CONSUMER.*.{s}.>",  # CREATE (named) INFO DELETE ...
                f"{API}.CONSUMER.*.*.{s}.>",  # DURABLE.CREATE MSG.NEXT ...
                f"{API}.DIRECT.GET.{s}",
                f"{API}.DIRECT.GET.{s}.>",
                f"$JS.ACK.{s}.>",
                f"$JS.FC.{s}.>",
            ]
        for b in (t.leases_bucket, t.control_bucket, t.runners_bucket):
            pub += _kv_write(b)
        pub += [f"$O.{t.tasks_bucket}.>", f"$O.{t.results_bucket}.>", f"{t.prefix}.>"]
        sub = [f"{t.prefix}.>"]
    elif role == "submitter":
        pub = [
            t.work_wildcard,
            *_events(t, "experiment_submitted"),
            *_info(w, e, lg, kv_stream(t.leases_bucket), kv_stream(t.control_bucket)),
            *_info(kv_stream(t.runners_bucket), obj_stream(t.tasks_bucket)),
            *_follow(e),
            # The dashboard streams a trial's live log to the browser (read only).
            *_follow(lg),
            *_kv_write(t.control_bucket, "cancel.>"),
            # Read too: a retry in a cancelled experiment is refused (it would never run).
            *_kv_read_keys(t.control_bucket, "cancel.>"),
            # Pause and resume (docs/scheduling.md); the key-scoped read shows "paused".
            *_kv_write(t.control_bucket, "pause.>"),
            *_kv_read_keys(t.control_bucket, "pause.>"),
            # A submission lifts agent stops and stores the budget (runner/guards.py).
            *_kv_write(t.control_bucket, "stops.>"),
            *_kv_write(t.control_bucket, "budget.>"),
            # Team quotas: the trials-per-day tally, counted with a compare-and-set, and
            # the team spend runners tally, read at submit (services/common/quotas.py).
            *_kv_write(t.control_bucket, "quota.trials.>"),
            # The limits runners enforce, published from the quotas file (only the
            # submitter's: a runner that could write them could lift its team's quota).
            *_kv_write(t.control_bucket, "quota.limits"),
            *_kv_read_keys(t.control_bucket, "quota.>"),
            # Fair share: each experiment's team and share, read by runners and the
            # queue view (services/common/fair_share.py).
            *_kv_write(t.control_bucket, "share.>"),
            *_kv_read_keys(t.control_bucket, "share.>"),
            *_kv_read(t.runners_bucket),
            *_obj_write(t.tasks_bucket),
            # Its own tasks read back: a task given by checksum at submit and a retried
            # trial's task are read from their archives (services/submitter/
            # stored_tasks.py). No new power: it may write every task.
            *_obj_read(t.tasks_bucket),
            # The dashboard serves a trial's stored folder (redacted when packed): read
            # only, the importer's right; writing results stays the runners' and watcher's.
            *_info(obj_stream(t.results_bucket)),
            *_obj_read(t.results_bucket),
        ]
        sub = []
    elif role == "runner":
        pub = [
            *_events(t, "trial_started", "trial_completed", "trial_failed"),
            t.logs_wildcard,
            *_info(w, e, lg, *(kv_stream(b) for b in _runner_kv(t))),
            *_info(obj_stream(t.tasks_bucket), obj_stream(t.results_bucket)),
            *(right for d in runner_durables(t, pool, classes) for right in _durable(w, d)),
            *_kv_write(t.leases_bucket),
            *_kv_read(t.leases_bucket),
            # A lease is given back by a subject purge of the leases stream (no marker is
            # left, so the next take is one write; nats_kv.py). No new power: the runner
            # may already write and delete every lease key.
            f"{API}.STREAM.PURGE.{kv_stream(t.leases_bucket)}",
            *_kv_write(t.control_bucket, "runs.>"),
            # Agent stops and the experiment's running spend (runner/guards.py).
            *_kv_write(t.control_bucket, "stops.>"),
            *_kv_write(t.control_bucket, "spend.>"),
            # A team's spend tally (docs/scheduling.md). No pause flags: a right to set
            # one would be a right to lift an operator's pause too (same subject).
            *_kv_write(t.control_bucket, "quota.spend.>"),
            *_kv_read(t.control_bucket),
            *_kv_write(t.runners_bucket, f"{pool}.>"),  # schemas.runners.registry_key
            *_kv_read(t.runners_bucket),
            *_obj_read(t.tasks_bucket),
            *_obj_write(t.results_bucket),
        ]
        sub = []
    elif role == "importer":
        pub = [
            *_events(t, "result_imported"),
            *_info(w, e, lg, obj_stream(t.results_bucket)),
            *_durable(e, t.importer_durable),
            *_obj_read(t.results_bucket),
        ]
        sub = []
    elif role == "watcher":
        pub = [
            *_events(t, "experiment_completed", "experiment_submitted", "trial_completed"),
            *_info(w, e, lg, obj_stream(t.results_bucket)),
            *_durable(e, t.watcher_durable),
            # An external Harbor job's trial folders are stored like a runner's results.
            *_obj_write(t.results_bucket),
        ]
        sub = []
    else:  # subscriber
        pub = [*_info(e, lg), *_follow(e), *_follow(lg)]
        sub = []
    sub.append(f"{inbox_prefix(t, role, pool)}.>")
    if js_domain is not None:
        check_js_domain(js_domain)
        local = f"{API}."
        pub += [f"$JS.{js_domain}.API.{p[len(local) :]}" for p in pub if p.startswith(local)]
    return Permissions(tuple(dict.fromkeys(pub)), tuple(dict.fromkeys(sub)))


_DOMAIN_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def check_js_domain(domain: str) -> str:
    """Return ``domain``, or raise ValueError: it becomes a subject token."""
    return checked_token(
        domain, _DOMAIN_RE, "JetStream domain", "it is a token of the $JS.<domain>.API subjects"
    )


def _runner_kv(topology: Topology) -> tuple[str, ...]:
    return (topology.leases_bucket, topology.control_bucket, topology.runners_bucket)


def check_role(role: str) -> None:
    """Raise ValueError naming the valid roles when ``role`` is not one."""
    if role not in ROLES:
        raise ValueError(f"unknown NATS role {role!r}; expected one of {', '.join(ROLES)}")
