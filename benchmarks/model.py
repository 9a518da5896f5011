"""The capacity model on docs/performance.md, computed from the run's own figures.

What a fleet of ``FLEET`` concurrent trials of ``TRIAL_MINUTES`` minutes asks of the
central services, against what one NATS node and one ledger node sustained in this
run. Every input is a figure of the report (or a stated assumption); a benchmark
missing from the report leaves its lines out.
"""

from __future__ import annotations

from typing import Any

FLEET = 10_000
TRIAL_MINUTES = 10.0
HEARTBEAT_S = 15.0  # RunnerSettings.heartbeat_s default
EVENTS_PER_TRIAL = 4  # TrialRequested, TrialStarted, TrialCompleted, ResultImported
# Per heartbeat of each trial: in_progress() on the work message, the lease renewal
# (KV put) and the fresh cancellation check (KV get).
REQUESTS_PER_HEARTBEAT = 3
# Before a trial starts: ending check, lease (3 on a reused slot), attempt (2), publish.
REQUESTS_TO_START = 7
# After it ends: object info + put (info, chunk, meta), ending create, publish, ack,
# release; the importer's get (info, chunk) and its ResultImported publish.
REQUESTS_TO_END = 12


def _figures(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for b in report.get("benchmarks", []):
        if "error" in b:
            continue
        out[b["name"]] = {p["name"]: p["value"] for p in b["peers"]}
        out[b["name"]]["_value"] = b["value"]
        out[b["name"]].update(
            {k: v for k, v in b.get("config", {}).items() if isinstance(v, int | float)}
        )
    return out


def render(report: dict[str, Any]) -> str:
    """The model's markdown section (empty when the run has none of its inputs)."""
    f = _figures(report)
    rate = FLEET / (TRIAL_MINUTES * 60)
    beats = FLEET / HEARTBEAT_S * REQUESTS_PER_HEARTBEAT
    lifecycle = rate * (REQUESTS_TO_START + REQUESTS_TO_END)
    lines = [
        "## Capacity model: a 10,000-trial fleet on paper",
        "",
        f"Assumptions: {FLEET:,} trials in flight, each {TRIAL_MINUTES:g} minutes (an LLM "
        f"agent trial), so {rate:.1f} trials start and end per second; heartbeats every "
        f"{HEARTBEAT_S:g} s. Per trial: {EVENTS_PER_TRIAL} events on the bus, about "
        f"{REQUESTS_TO_START} requests before it starts and {REQUESTS_TO_END} after it ends, "
        f"and {REQUESTS_PER_HEARTBEAT} per heartbeat (keep-alive, lease renewal, cancel "
        "check). Requests per second the fleet asks of NATS: "
        f"{lifecycle:,.0f} for starts and ends, **{beats:,.0f} for heartbeats**: at this "
        "scale the heartbeats, not the trials' lifecycles, are the bus's load.",
        "",
        "| what | the fleet needs | one node sustained here | headroom |",
        "|---|---|---|---|",
    ]
    pipe = f.get("pipeline", {})
    if "jetstream_publish_ceiling" in pipe:
        ceiling = pipe["jetstream_publish_ceiling"]
        need = beats + lifecycle + rate * EVENTS_PER_TRIAL
        lines.append(
            f"| NATS acknowledged requests | {need:,.0f}/s | {ceiling:,.0f}/s (acked publishes, "
            f"pipelined) | {ceiling / need:.1f}x |"
        )
    if "ledger_bulk_upsert_ceiling" in pipe:
        ceiling = pipe["ledger_bulk_upsert_ceiling"]
        lines.append(
            f"| ledger record writes | {rate:.1f}/s | {ceiling:,.0f}/s (SecantusDB bulk "
            f"upsert) | {ceiling / rate:,.0f}x |"
        )
    obj = f.get("objects", {})
    if obj.get("agent_archive_bytes") and obj.get("agent_raw_put_ceiling"):
        size = obj["agent_archive_bytes"]
        ceiling = obj["agent_raw_put_ceiling"]
        lines.append(
            f"| trial folders into the object store | {rate:.1f}/s, {rate * size / 2**20:.1f} "
            f"MiB/s ({size / 1024:,.0f} KiB each, agent-shaped) | {ceiling:,.0f}/s | "
            f"{ceiling / rate:,.0f}x |"
        )
    ledger = f.get("ledger", {})
    if "disk_mib" in ledger and "records" in ledger:
        per = ledger["disk_mib"] * 2**20 / ledger["records"]
        lines.append(
            f"| ledger disk | {per / 1024:.1f} KiB per record: {per * 1e6 / 2**30:.1f} GiB per "
            "million trials | | |"
        )
    cap = f.get("capacity", {})
    per_trial = [v for k, v in cap.items() if k.startswith("kib_per_trial_in_flight_")]
    if per_trial:
        kib = max(per_trial)
        lines.append(
            f"| runner memory per trial in flight | {kib:,.0f} KiB: "
            f"{FLEET * kib / 2**20:.1f} GiB for the fleet (trialbus's share only; the "
            "trials' own sandboxes come on top) | | |"
        )
    if per_trial and cap.get("trials"):
        slots = int(cap["trials"])
        procs = -(-FLEET // slots)
        lines += [
            "",
            f"Machines, on paper: one NATS node and one ledger node (MongoDB) for the "
            f"central services; for trialbus's own part of the runners, {procs} runner "
            f"processes of {slots:,} slots (the most one process held in flight in the "
            f"capacity benchmark without starting a trial twice), "
            f"{FLEET * max(per_trial) / 2**20:.1f} GiB in all: one machine. The "
            "trials' sandboxes (containers, agents) decide the real count of runner "
            "machines; trialbus adds little to each.",
        ]
    lines += [
        "",
        "Reading it: one NATS node and one ledger node carry the completions of such a "
        "fleet many times over; what must be sized is the number of requests per trial in "
        "flight (heartbeats: one lease renewal and one cancellation read per trial, where "
        "one per runner would do) and, on the runners' side, the trials' own sandboxes. "
        "The capacity benchmark above shows the other limit: how many trials one runner "
        "can take at once before its own requests time out.",
        "",
    ]
    return "\n".join(lines)
