"""7. Trial folders through the object store: what every trial's ending now costs.

Each trial's folder is packed (``services.common.archive.pack_trial``), stored in the
results bucket (``NatsObjectStore.put``, as the runner's ``TrialFolders`` does), then
fetched and unpacked into the importer's job folder (``NatsObjectStore.get`` and
``services.importer.folders.place_trial``), one trial after another, in this process,
on a fresh nats-server. Three folder shapes:

- ``instant``: what the instant executor writes (one small result.json), the
  pipeline benchmark's trials;
- ``harbor``: the files of a real Harbor oracle trial (result, config, lock, trial
  log, agent and verifier output; about 28 KB);
- ``agent``: the same plus a 1 MB agent trajectory of JSON text (an LLM agent's).

Beside it, in the same run on the same server: plain nats-py object store puts and
gets of the same archives (the ceiling), one at a time and ``CONCURRENT`` at once.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.js.api import ObjectStoreConfig

from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, median, percentile
from infra.embedded import NatsServer
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.common.archive import DEFAULT_TRIAL_CAP_BYTES, pack_trial
from services.importer.folders import place_trial

CONCURRENT = 16
SHAPES = ("instant", "harbor", "agent")
_WORDS = [
    "the",
    "agent",
    "ran",
    "a",
    "command",
    "and",
    "read",
    "its",
    "output",
    "then",
    "wrote",
    "a",
    "file",
    "to",
    "fix",
    "the",
    "test",
]


def _text(rng: random.Random, n_bytes: int) -> str:
    """Log-like text: compresses like real logs (about 4-5x), not like zeros."""
    out: list[str] = []
    size = 0
    while size < n_bytes:
        line = f"{rng.randrange(10**6):06d} " + " ".join(rng.choices(_WORDS, k=12)) + "\n"
        out.append(line)
        size += len(line)
    return "".join(out)[:n_bytes]


def make_folder(root: Path, shape: str, seed: int = 0) -> Path:
    """One finished trial's folder of ``shape`` (see the module docstring)."""
    rng = random.Random(seed)
    folder = fresh_dir(root / shape)
    result = {
        "task_name": "hello",
        "trial_name": "hello__abc",
        "verifier_result": {"rewards": {"reward": 1.0}},
        "exception_info": None,
        "started_at": "2026-11-26T00:00:00+00:00",
        "finished_at": "2026-11-26T00:00:01+00:00",
    }
    (folder / "result.json").write_text(json.dumps(result))
    if shape == "instant":
        (folder / "verifier").mkdir()
        return folder
    files = {
        "config.json": _text(rng, 1_500),
        "lock.json": _text(rng, 800),
        "trial.log": _text(rng, 16_000),
        "agent/oracle.txt": _text(rng, 2_000),
        "verifier/test-stdout.txt": _text(rng, 4_000),
        "verifier/reward.txt": "1\n",
        "artifacts/manifest.json": "[]",
    }
    if shape == "agent":
        files["agent/trajectory.json"] = json.dumps({"steps": _text(rng, 1_000_000)})
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def _ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


async def _timed(n: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await op(i)
        out.append(time.perf_counter() - t0)
    return out


async def _rate(n: int, op: Callable[[int], Awaitable[object]]) -> float:
    """Operations per second with ``CONCURRENT`` of them under way at once."""
    sem = asyncio.Semaphore(CONCURRENT)

    async def one(i: int) -> None:
        async with sem:
            await op(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


async def measure_shape(nats_url: str, folder: Path, jobs: Path, n: int) -> dict[str, float]:
    """Per-trial milliseconds and bytes for one folder shape, and the raw ceilings."""
    pack_s = []
    for _ in range(max(3, n // 10)):
        t0 = time.perf_counter()
        archive = pack_trial(folder, DEFAULT_TRIAL_CAP_BYTES)
        pack_s.append(time.perf_counter() - t0)
    data = archive.data
    nc = await nats.connect(nats_url, name="bench-objects")
    try:
        js = nc.jetstream()
        bucket = f"BENCH_{folder.name.upper()}"
        store = await NatsObjectStore.open(js, bucket, create=BucketSettings())
        refs = {}

        async def put(i: int) -> None:
            refs[i] = await store.put(f"exp/trial-{i}/1.tar.gz", data)

        put_s = await _timed(n, put)
        get_s = await _timed(n, lambda i: store.get(refs[i]))
        unpack_s = []
        for i in range(n):
            t0 = time.perf_counter()
            place_trial(jobs, "exp", f"trial-{i}", data)
            unpack_s.append(time.perf_counter() - t0)
        put_rate = await _rate(n, lambda i: store.put(f"exp/conc-{i}/1.tar.gz", data))
        get_rate = await _rate(n, lambda i: store.get(refs[i]))
        raw = await js.create_object_store(bucket + "_RAW", config=ObjectStoreConfig())
        raw_put_s = await _timed(n, lambda i: raw.put(f"r{i}", data))
        raw_get_s = await _timed(n, lambda i: raw.get(f"r{i}"))
        raw_put_rate = await _rate(n, lambda i: raw.put(f"c{i}", data))
    finally:
        await nc.close()
    return {
        "archive_bytes": float(len(data)),
        "folder_bytes": float(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())),
        "pack_ms": _ms(pack_s),
        "put_ms": _ms(put_s),
        "put_p99_ms": 1000 * percentile(put_s, 99),
        "get_ms": _ms(get_s),
        "unpack_ms": _ms(unpack_s),
        "put_rate": put_rate,
        "get_rate": get_rate,
        "raw_put_ms": _ms(raw_put_s),
        "raw_get_ms": _ms(raw_get_s),
        "raw_put_rate": raw_put_rate,
    }


def run(ctx: Context) -> BenchResult:
    n = 8 if ctx.quick else 200
    per_run: list[dict[str, dict[str, float]]] = []
    for r in range(ctx.runs):
        ctx.log(f"objects run {r + 1}/{ctx.runs}: {n} trial folders per shape")
        run_dir = ctx.path(f"objects-{r}")
        with NatsServer(fresh_dir(run_dir) / "nats") as server:
            per_run.append(
                {
                    shape: asyncio.run(
                        measure_shape(
                            server.url,
                            make_folder(run_dir / "folders", shape),
                            run_dir / "jobs",
                            n if shape != "agent" else max(5, n // 10),
                        )
                    )
                    for shape in SHAPES
                }
            )

    def med(shape: str, key: str) -> float:
        return median([r[shape][key] for r in per_run])

    def cost(r: dict[str, dict[str, float]], shape: str) -> float:
        s = r[shape]
        return s["pack_ms"] + s["put_ms"] + s["get_ms"] + s["unpack_ms"]

    peers: list[Figure] = []
    for shape in SHAPES:
        peers += [
            Figure(f"{shape}_archive_bytes", med(shape, "archive_bytes"), "bytes", "packed"),
            Figure(f"{shape}_folder_bytes", med(shape, "folder_bytes"), "bytes", "on disk"),
            Figure(
                f"{shape}_ms_per_trial",
                median([cost(r, shape) for r in per_run]),
                "ms",
                "pack + put + get + unpack, one at a time",
            ),
            Figure(f"{shape}_pack_ms", med(shape, "pack_ms"), "ms", "runner: pack_trial"),
            Figure(f"{shape}_put_ms", med(shape, "put_ms"), "ms", "runner: NatsObjectStore.put"),
            Figure(f"{shape}_put_p99_ms", med(shape, "put_p99_ms"), "ms"),
            Figure(f"{shape}_get_ms", med(shape, "get_ms"), "ms", "importer: NatsObjectStore.get"),
            Figure(f"{shape}_unpack_ms", med(shape, "unpack_ms"), "ms", "importer: place_trial"),
            Figure(f"{shape}_raw_put_ms", med(shape, "raw_put_ms"), "ms", "plain nats-py put"),
            Figure(f"{shape}_raw_get_ms", med(shape, "raw_get_ms"), "ms", "plain nats-py get"),
            Figure(
                f"{shape}_put_rate",
                med(shape, "put_rate"),
                "objects/s",
                f"NatsObjectStore.put, {CONCURRENT} at once",
            ),
            Figure(
                f"{shape}_raw_put_ceiling",
                med(shape, "raw_put_rate"),
                "objects/s",
                f"plain nats-py put, {CONCURRENT} at once",
            ),
            Figure(
                f"{shape}_get_rate",
                med(shape, "get_rate"),
                "objects/s",
                f"NatsObjectStore.get, {CONCURRENT} at once",
            ),
        ]
    return BenchResult(
        name="objects",
        title="Trial folder through the object store (Harbor-shaped trial): pack, put, get, unpack",
        value=median([cost(r, "harbor") for r in per_run]),
        unit="ms",
        target=10.0,
        target_op="<=",
        runs=[cost(r, "harbor") for r in per_run],
        peers=peers,
        config={"trials_per_shape": n, "concurrent": CONCURRENT, "runs": ctx.runs},
    )
