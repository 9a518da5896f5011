"""The words around the numbers on docs/performance.md.

Numbers in the tables come from the run; the explanations here come from profiling
(py-spy on the service processes, cProfile in process) during development, and say
so where they quote a figure that the run does not measure itself.
"""

from __future__ import annotations

TITLE = """
# Performance

trialbus measured against what users would run instead, on one machine: `make bench`
(about an hour) writes this page and `benchmarks/results.json`. Every number below
is from the runs described under "This run" (each section says when it ran, with
which command, under what load); the code is in
`benchmarks/` (one module per benchmark). Read the targets as targets: where a
number misses one, the section says where the time goes and what would fix it.
"""

MISSES_ROWS: list[tuple[str, str, str, str]] = [
    (
        "overhead: median <= +5 %, every run <= +10 %",
        "+10.1 % (runs +18.6, -16.4, +13.3); in other sittings +4.4 % and, on this "
        "stop's code, +15.7 % (+19.5, +0.8, +20.8)",
        "Bare Harbor's own job time moves 19-28 s between sittings, more than the bar; "
        "per trial, 123-133 ms pass before Harbor's trial starts, about 59 ms of it "
        "Harbor's `Trial.create` hashing the task's content (py-spy)",
        "hand Harbor the task digest trialbus already holds (Harbor 0.25's `Trial` takes "
        "no such argument; its deprecation of `Task.checksum` points at a trial lock, "
        "`TrialLock.task.digest`); ten runs a sitting to settle a 5 % bar",
    ),
    (
        "capacity: >= 0.95 at 10,000 waiting trials on 1/2/4/8 runners",
        "0.47 (0.42-0.51 over this page's 12 runs, 3 per size); every trial started once",
        "7.5-8.5 ms of stack CPU per trial (runners 3-4, importer 1.6-2.7, nats-server "
        "1.1-1.3, ledger 0.6): 10,000 trials are 75-85 CPU-seconds on two cores, paid in "
        "the bursts of starts and of endings around the trials' 30 s",
        "0.95 at this size needs about 0.4 ms of non-ledger CPU per trial here, or "
        "runners on cores of their own (as a fleet has them); on the runner: fewer round "
        "trips per ending (the runner's profile below: deleting the uploaded trial folder"
        " is 29 % of its active samples, packing and uploading it 23 %: a trial folder's "
        "disk work, which real trials pay once per minutes-long run)",
    ),
    (
        "pipeline: >= 0.75 of the slowest ceiling",
        "0.13 (203 trials/s against the ledger's 1,567 documents/s)",
        "the same CPU per trial: runner 3.9 ms, importer 2.0, ledger 1.2, nats-server "
        "0.8, watcher 0.4 (this page's run), seven processes on two cores; profiled "
        "(py-spy, this page's run): the importer spends 48 % of its active samples "
        "unpacking each trial's archive into the Harbor job folder, 25 % in batch "
        "plumbing, 11 % writing the ledger; the runner 29 % deleting uploaded trial "
        "folders, 23 % packing and uploading them",
        "the job folder written apart from the record (the record is built from the "
        "archive in memory already): by a writer thread after the ledger write, or on "
        "demand; then a second importer process on the same durable, and the ledger on "
        "cores of its own (MongoDB)",
    ),
    (
        "import: >= 2,000 trials/s",
        "1,311 trials/s (in process 1,526); 1,036 on this stop's code at load 5 "
        "(ledger ceiling 1,282)",
        "the ledger's insert rate sets the pace (1,340 documents/s raw in the same run); "
        "building a record is 0.35-0.39 ms of CPU",
        "real MongoDB for large imports (`--mongo-url` measures it beside); records built"
        " in a process pool",
    ),
    (
        "latency: p50 <= 3 ms, idle stack",
        "4.8 ms observed, 3.1 ms the runner's part; 5.3 / 3.4 ms on this stop's code",
        "the publish, stream write and delivery (about 1.4 ms, three loopback round "
        "trips), the stored-ending read and the first attempt's write, and TrialStarted's"
        " trip back to the observer (1.7 ms)",
        "skip the stored-ending read on a message's first delivery, once it is proven "
        "that no other message can carry the same run",
    ),
    (
        "fleet: p50 <= 3 ms, p99 <= 25 ms with 1,000 runner connections",
        "3.8 / 296 ms (one connection: 1.9 / 2.7 ms); 6.5 / 550 ms on this stop's code",
        "1,000 idle runners renew three class polls a second: 2,800 requests/s, 0.4 core "
        "of nats-server and 0.8 of the simulated runners; a trial that reaches a loop "
        "busy renewing waits its turn",
        "a longer idle window (5 s cut the idle CPU fourfold in a trial) with polls ended"
        " by the runner's drain; one pull per runner for all classes",
    ),
    (
        "ledger: every report read <= 200 ms at 1,000,000 records",
        "257 ms (a new process's experiment page); list 12 ms, status 6 ms, kept "
        "leaderboard 13 ms, report 29 ms",
        "a new process's first page view renders the kept view of a 10,000-trial "
        "experiment; the uncached leaderboard (3.4 s) is a scan of its records on "
        "SecantusDB",
        "a quiet re-run (taken at load 5-16); the leaderboard from write-time sums (the "
        "`tally` branch: 3,288 -> 256 ms uncached) once its doubled write cost is "
        "affordable (MongoDB)",
    ),
    (
        "scheduling (issue 14): urgent trials behind batch ones <= 1.10",
        "1.12; 1.07 (1.10, 1.06, 1.07) on this stop's code, which meets the bar",
        "the first urgent start waits for the next preemption look (0.5-1.5 s, a random "
        "phase per runner), and two runners preempt at different looks; one trial length "
        "is 20 % of B's 10 s, so the lag shows in B's last wave",
        "preempt when an urgent message reaches a full runner instead of at the periodic look",
    ),
]
"""The targets this page misses: target, measured, where the time goes, next step."""

MISSES = (
    """
## Targets missed: where the time goes, what is next

Each target this page misses, with what its profile says and the next step (the
benchmark's section has the measurements behind each line). Two things hold for all
of them: the machine has two cores, shared by every process of the stack (and, in
busy sittings, by other work), and SecantusDB, the embedded ledger, is a Python
server whose bulk write rate (1,340-1,570 documents/s in these sittings) is itself
below the import target.

| target | measured | where the time goes | next step |
|---|---|---|---|
"""
    + "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in MISSES_ROWS)
    + """
"On this stop's code": the benchmarks this stop did not re-render were run again on
its final code (2026-11-27 03:27-03:49, `python -m benchmarks --only
overhead,latency,fleet,submit,import,objects,dispatch,dashboard,scheduling --runs 3`;
load average 0.7-6.1 before each, the stack's own previous benchmark). Every figure
of that sitting: overhead +15.7 % (runs +19.5, +0.8, +20.8); submit 0.78 s (met);
import 1,036 trials/s (in process 1,184; ledger ceiling 1,282); latency p50 5.3 ms,
p99 14.4 ms, runner's part 3.4 ms; objects 7.3 ms (met); dispatch ratio 0.17 (met);
dashboard first paint 312 ms (met); scheduling 1.07 (met; behind a non-preemptible A
1.41); fleet p50 6.5 ms and p99 550 ms with 1,000 connections (one connection: 2.4 /
5.7 ms). The sections below keep the earlier sitting, whose prose cites its numbers;
the two sittings differ by the machine's scatter (nothing in these paths changed but
the importer's filter and refactors that run the same operations), which is itself
the reason a 5 % overhead bar cannot be settled with three runs here.
"""
)

METHOD = """
## How the numbers are kept honest

- **Same inputs.** One description of the trials (`benchmarks/workload.py`) is written
  both as the trialbus manifest and as the Harbor JobConfig for `harbor run -c`: same
  task folders, agents, repetitions and concurrency, same environment (trialbus's
  bubblewrap `LocalEnvironment`, by import path, cwd = the repository) and the same
  kind of sandbox folder on the same disk. After each pair of runs the two sides'
  reward sums are compared; a difference fails the benchmark.
- **No cached work.** Each measurement gets an emptied data folder: a new
  nats-server store, a new ledger, new job and sandbox folders, new experiment ids.
  Warm-ups are separate experiments (trialbus) or separate jobs (Harbor) and are
  never timed: on both sides they build the environment's per-task layer cache, and
  on trialbus they make every runner import Harbor once, as a long-lived `trialbus up`
  has. What is shared between runs: the Python bytecode cache and the OS page cache.
- **Same environment.** Both sides run with `HARBOR_TELEMETRY=0`: at the end of every
  `harbor run` Harbor's telemetry imports litellm and tries to reach PostHog, which
  costs seconds here (no network); the overhead benchmark measures one `harbor run`
  with it on (figure `harbor_process_wall_telemetry_on`). trialbus's runner uses
  Harbor's Trial API, which sends no telemetry. `LITELLM_LOCAL_MODEL_COST_MAP=True`
  stops litellm from fetching its cost map if anything imports it. This machine sets
  `PYTHONDONTWRITEBYTECODE` and the venv has no `.pyc` files, so every Python process
  would recompile each module it imports; both sides share one bytecode cache
  (`PYTHONPYCACHEPREFIX=.trialbus/pycache`), as any normal install has.
- **What is timed.** Harbor: its own job time (`started_at` -> `finished_at` in the
  job's result.json), which excludes the CLI's interpreter start; the whole process
  (`harbor_process_wall`) is reported beside it. trialbus: from the start of submit
  (read and validate the manifest, expand, publish) to the arrival of the last
  ResultImported at a JetStream ordered consumer in the benchmark process, on a stack
  that is already up (its start-up is reported beside it).
- **CPU.** Harbor: `wait4` resource usage of the `harbor` process, which includes
  every child it reaped (bwrap, bash, verifiers). trialbus: user + system time, and
  that of reaped children, of every stack process (`/proc/<pid>/stat`: nats-server,
  ledger, importer, watcher, submitter, runners) plus the benchmark process, over the
  timed window.
- **Runs.** Median of 3 runs in full mode; the two sides alternate so a change in the
  machine's load hits both. The machine has 2 cores and is shared: the load average
  before each benchmark is recorded, and the page says when the machine was busy.
"""

KEY_PEERS: dict[str, list[str]] = {
    "overhead": [
        "harbor_wall",
        "trialbus_wall",
        "harbor_trials_per_s",
        "trialbus_trials_per_s",
        "harbor_cpu_ms_per_trial",
        "trialbus_cpu_ms_per_trial",
    ],
    "capacity": [
        "efficiency_1r",
        "efficiency_2r",
        "efficiency_4r",
        "efficiency_8r",
        "started_more_than_once_8r",
        "redeliveries_8r",
    ],
    "pipeline": [
        "fraction_of_slowest_ceiling",
        "jetstream_publish_ceiling",
        "jetstream_consume_ceiling",
        "ledger_bulk_upsert_ceiling",
    ],
    "submit": ["expand_s", "publish_s", "raw_publish_s"],
    "import": ["in_process_rate", "ledger_bulk_upsert_ceiling", "mongodb_cli_rate"],
    "latency": ["observed_p99", "dispatch_p50", "kv_create_rtt_p50"],
    "objects": ["harbor_archive_bytes", "instant_ms_per_trial", "harbor_raw_put_ceiling"],
    "ledger": [
        "experiment_ids_ms",
        "status_ms",
        "records_for_ms",
        "leaderboard_ms",
        "leaderboard_cached_ms",
        "report_cached_ms",
        "load_s",
        "disk_mib",
    ],
    "dispatch": ["before_busy_p50", "now_busy_p50", "idle_ratio"],
    "dashboard": ["ttfb_ms", "cold_fcp_ms", "cold_ttfb_ms", "html_kib"],
    "fleet": [
        "observed_p99_1000c",
        "dispatch_p50_1000c",
        "observed_p50_1c",
        "idle_msgs_per_s_1000c",
        "fetch_failures_1000c",
    ],
    "live": ["one_at_a_time_ms", "speedup", "redraw_ms"],
    "scheduling": [
        "finished_ratio",
        "nonpreempt_completion_ratio",
        "preempted_lost",
        "preempted_counted",
        "a_trials_wasted",
        "share_deviation",
    ],
    "handoff": ["alone_s", "mixed_s", "handoffs_per_trial"],
}
"""The figures shown in the summary table (all figures are in each section)."""

LIMITS: dict[str, str] = {
    "overhead": """
**Where the time goes.** Quick trials are not CPU-bound at concurrency 8 on an idle
2-core machine: a nop or oracle trial spends most of its 0.5-1 s in Harbor's phases
(environment start, agent, verifier) and in starting sandboxed processes (bwrap,
bash), so the wall time is about trial latency x trials / trials in flight. Both
sides' trials take the same time (the trials' own result.json: 0.58 s vs 0.56 s mean
in one run of this benchmark), and the CPU per trial differs by less than a tenth.
The difference is how many trials are in flight: Harbor's job keeps about 7.2 of its
8 slots busy, a trialbus runner about 5.5. Timestamps added to the runner during
development show why: between taking a trial from the work stream and handing it to
Harbor, the runner checks cancellation, takes the experiment-wide concurrency lease
(three KV round trips, because lease keys are reused and re-creating a purged key is a
failed create, a get and an update), counts the attempt (a get and a create) and
publishes TrialStarted: six sequential round trips, 2.7 ms on an idle runner (see
the latency section) but a median 126 ms per trial while eight Harbor trials run in
the same process, because every await waits for an event loop that is busy with the
other trials' Harbor work. Settling (TrialCompleted, ack, lease release) adds ~13 ms.
That is about a quarter of a 0.46 s trial during which the slot runs nothing. Live
log publishing costs nothing measurable (same throughput with
`TRIALBUS_PUBLISH_LOGS=false`). On a busy machine the runner also competes for the
two cores with nats-server, the importer, the watcher and the ledger, which widens
the gap further.

**Done since this was written** (issue 12, see "dispatch"): one KV write per lease and
first attempt, the ending check beside the lease, TrialStarted published beside the
executor, and trials in their own processes. **Added since**, on every trial: its
folder packed, stored, fetched and unpacked through the object store, and the start
path's team limits, share marks and preemption registry. One quiet run at the end of
2026-11-26 measured +60.6 % (the paragraph above describes the earlier profile).

**Profile of 2026-11-26, evening (load 5-20, so CPU per trial and per-trial phase
times, not rates).** Per-trial timestamps (TrialStarted, Harbor's own started_at /
finished_at, TrialCompleted, ResultImported) and py-spy on the runner showed the
runner's loop is not the bottleneck (its own CPU: ~14 ms per trial; it keeps 7.4-7.7
of 8 slots taken). The cost was in the trial processes: each is forked from the
runner's forkserver, and everything a trial imports or builds on first use was paid
again in every one of them: 32 modules (dirhash and scantree for Harbor's task hash
alone ~250 ms of import time, pyseccomp, Harbor's single-step trial, its built-in
agents) and the sandbox's seccomp filter. A trial's process, with its bwrap and
shell children, took 320-354 ms of CPU against ~150 ms for a later trial in one
long-lived process (Harbor's case). The forkserver now does that once
(services.runner.forkserver_preload ``TRIAL_FIRST_USE``): 168-206 ms per trial
process, and 200 trials at concurrency 8 in 37.5-56.9 s against 65.1-73.5 s before,
same sitting, load ~10 (runs alternated; a later one at load 3-8: 29.0 s). A
`--runs 1` overhead run right after, load 4.6 -> 7.4, measured -31 % (Harbor 54.7 s,
trialbus 37.6 s): under heavy load a single `harbor run` process shares one core's
worth of Python between its eight trials, while trialbus's trial processes are
scheduled on their own. The next one, load 5.9 -> 9.0, measured **+39.0 %** (Harbor
22.5 s with 7.55 of 8 slots busy, trialbus 31.3 s; no importer stall in it). A trial
profiled at that load: Harbor's own 0.87 s, plus 170 ms from TrialStarted to Harbor's
start (the fork, the child's set-up, Harbor's Trial.create), 55 ms from Harbor's end
to TrialCompleted and 45 ms until the slot's next trial starts: ~0.27 s a trial
during which the slot runs no Harbor work. Forking the next trial's process while the
slot's current trial still runs would overlap most of the first of these.

**Fixed: the importer's 10 s stalls (issue 12).** The importer sometimes recorded a
trial exactly its ack_wait (10 s) late while the trials around it passed in ~0.15 s,
in 4 of 5 profiled runs; when it hit one of the last trials it added ~10 s to this
benchmark's wall time, and the 3-run sitting of 19:43 (+57.9 %, +47.1 %, +3.8 %)
swung by exactly that. The cause was FastStream 0.7.8's batched pull: it fills a batch
with several fetches and stops only at ``nats.errors.TimeoutError``, while nats-py
2.16 raises the builtin ``TimeoutError`` when a fetch's window ends before its
lingering pull; the exception left the loop, the messages already fetched for the
batch were dropped, FastStream restarted the loop silently, and they came back one
ack_wait later. The importer's and watcher's subscriptions are now wrapped so every
fetch timeout reaches the loop as the error it expects
(``faststream_consumer.keep_batches_on_timeout``; tests/integration/
test_batch_timeouts.py plants the builtin timeout on a real nats-server, and FastStream's
own subscriber, the control, loses the batch). Figure `importer_redeliveries`
(deliveries minus messages on the importer's durable) counts them: in one busy sitting
(load 8-14) the wrap on, off, on, off gave 0, 25, 0 and 4; in this page's three runs, 0.

**Also applied since the evening profile.** A trial's process sends its ending before
its event loop's teardown, and the runner returns on it and reaps the process in the
background: Harbor's end to the slot's release went from 41-46 ms to 9-13 ms (p50, per
trial, alternated at load 2-8). The trial's local folder is set aside by one rename
and deleted off the slot, so the verdict and the ack no longer wait for a worker
thread's ``rmtree`` (17-32 ms p50 under load, the rename 0.09 ms). **Tried, not
kept:** forking the next trial's process while the slot's current trial runs (the idea
above): it saved the fork (92 -> 14 ms) but not the time to Harbor's start (284 vs 285
ms median, 7 alternated pairs at load 8-11): on two busy cores it moved CPU work, it
removed none.

**Against the issue's bars** (median <= +5 %, every run <= +10 %; the page measured
against +10 % before): missed in this page's sitting (2026-11-27 00:48, load 1.6
before): +10.1 % (+18.6, -16.4, +13.3), Harbor's own job time 23.0 s median, and met in
the sitting just before it (00:29, load 5.8 before, left by the capacity runs):
+4.4 % (+2.7, +4.4, +5.8), Harbor 28.0 s. One run at -16.4 % and the next at +13.3 %
show that three runs a sitting cannot settle a 5 % bar on this machine: bare Harbor's
job time alone moves 19-28 s between sittings. The page keeps the quieter sitting.

**What is left** (the sitting of 2026-11-26 21:31, load 1.2 -> 2.0): +12.6 %,
+23.6 % and +3.0 %, no importer redelivery in any, so the stall no longer explains the
spread; the gap is now the slots' own dead time and the stack's CPU beside Harbor's
on two cores (trialbus's services take about 33 ms of CPU per trial, on the cores
Harbor's trials use). A per-trial timeline taken after this sitting (same code, load
0-3, 200 trials; two runs measured +1.4 % and -11.4 % against bare Harbor, whose own
job time moved 19-27 s between sittings) shows where a slot's time goes: of 8 slots
held, 6.1 run Harbor's trials (0.72-0.80 s each, in their own processes). Per trial,
TrialStarted to Harbor's start is 123-133 ms (p50): the fork 27 ms and 14 ms until the
child runs, the child's environment and policy 9 ms, and Harbor's ``Trial.create``
59 ms, most of it Harbor's own per-trial work (the task's content hash for the trial
lock, the task's load and its path checks; 3.5 ms of it, models pydantic built on
first use, the forkserver now builds once); Harbor's end to TrialCompleted 35-41 ms;
TrialCompleted to the slot's next start 30-39 ms. **Next step:** the content hash
Harbor computes per trial is the same for every trial of a task, which trialbus
already names by checksum; Harbor has no way to be handed it. Harbor's telemetry, left on,
still costs bare Harbor more than the gap (figure `harbor_process_wall_telemetry_on`).
""",
    "capacity": """
**Where the time goes.** A waiting trial costs no CPU, so this measures the runner's
orchestration alone: when N trials arrive at once, each handler makes its round
trips before its trial starts (ending check, lease, attempt counter, TrialStarted)
and after it ends (folder upload: pack, object info, chunk, meta; stored ending;
TrialCompleted; ack; lease release), all N at the same moment. On two shared cores
the requests queue in the runner's event loop and at nats-server, and nats-py's
request timeout (5 s) expires before the answer comes: the handler then settles
"runner error; trial will be redelivered" (nak), and the message comes back later.
No trial is run twice for it (the figures `started_more_than_once_*`: the stored
ending and the attempt counter catch a redelivered message whose trial already
started or ended), but every redelivery costs a full round of requests again, and
the wall time stretches from S + N / ceiling to several times that. Several runner
processes split the burst (fewer requests per event loop) but not the server's queue.

The redeliveries with several runners come without a single runner error: they are
hand-backs. The experiment's limit here is N slots for N trials, and a lease is
taken by probing at most 64 slot keys from a random start; once most slots are
held, a trial's 64 probes find none free (with 10 of 2,000 free, three times in four)
and the trial is handed back for 0.5-2 s, again and again. In the runners' logs of
one 8-runner run the 2,000 trials ended over 33 s instead of within a second or two:
that spread of the starts, not the import, is the gap between wall and ideal (the
importer recorded the last trial 0.1 s after it ended).

**Fixed (issue 12):** admission control in the runner, one write per lease and per
first attempt, no lease where the limit cannot bind, and TrialStarted beside the
executor ("Orchestration cost" below has the change and the before/after figures):
no redelivery remains at any runner count.

**Second pass (issue 12): a timeline of each trial.** When each trial's TrialStarted,
TrialCompleted and ResultImported happened (their ``occurred_at``), one run per size:

- 8 runners, 62.3 s: 1,999 trials started within 1.5 s, one at 32.1 s. Its work
  message had reached a runner whose 250 slots were full, into the subscription's
  buffer, after the fetch that asked for it had given up (nats-py's fetch stops at
  its 50 ms window; under load the server's replies to a batch pull come later). The
  runner fetches for free slots only, so the message waited for that runner's first
  trial to end, and the experiment for its 30 s. The runner now sweeps that buffer
  four times a second: such a message takes a free slot, or goes back to the stream
  at once (a nak: it counts in ``redeliveries_*``, never as an attempt). In one later
  8-runner run at load 15, one runner handed 34 of them back, each a 30 s stall before.
- 1 runner, 47.7 s: the trials ended between 30.2 and 32.8 s, and every TrialCompleted
  went out between 37.2 and 37.6 s. The 2,000 endings (pack, object put, stored
  ending, TrialCompleted, ack) advanced in lockstep on the runner's loop, each round
  trip queued behind all the others', so the importer got the whole burst at its end
  (last ResultImported at 47.7 s). Endings now take turns, as many at once as
  admission lets start (32): TrialCompleted goes out from the first trial's end on,
  and the importer records beside the runner.

What is left is CPU on two cores. The whole stack spends 7.5-8.5 ms of CPU per trial
here (runners 3-4, importer 1.6-2.7, nats-server 1.1-1.3, ledger 0.6), most of it
after the trials end: the importer and the ledger alone, 4.5-6.5 s for 2,000 trials,
before the runners' endings. With two cores that is several seconds after S however
the work is ordered: wall about S + 5-6 s on a quiet machine, efficiency about 0.85,
where 2 and 4 runners were. 0.95 needs the CPU per ending (runner, importer, ledger)
cut to about a third, or more cores than the stack's own two.

**At the issue's size, 10,000 trials** (this section's run, 2026-11-27 00:13, load
average 0-4, `TRIALBUS_BENCH_CAPACITY=10000:30:1,2,4,8`; `make bench-scale` runs it).
The first attempt found a limit: a runner's concurrency was bounded at 4,096, below
the 10,000 a manifest may ask, so the one-runner point refused to start; the bound is
now `MAX_CONCURRENT_TRIALS` (10,000) for both. Every trial started once at every size,
no runner logged an error, and memory stayed at 19.5-24.8 KiB per trial in flight
(one runner holding all 10,000: 250 MiB). Wall time was 59-80 s for an ideal of
35-37 s (efficiency 0.47-0.59 over this run's four sizes and six more runs at 2 and
8 runners in the same sitting, four of them with the fetch cap below), against
412 s and trials started up to 7 times in the issue's run. The gap is the CPU model
above, scaled: 10,000 trials at about 7 ms of stack CPU each are 70 CPU-seconds,
35 s of two cores, paid around the trials' 30 s. Hand-backs (`redeliveries_*`,
never counted as attempts) ranged 0-839 per run with several runners: a runner's
next fetch is answered beside the late replies of the previous one, and the extras
go back to the stream. Capping a fetch at 256 messages was tried and measured,
alternated with the code as it is: hand-backs 0 and 112 against 839 and 59 at 2
runners, 45 and 38 against 371 and 93 at 8, efficiency within the same spread; not
kept, since the runs' own scatter is as large as the difference.

**This page's run (2026-11-27 02:31, load average 1.0 before it; three runs per
size, after the importer's durable was narrowed to the events it acts on):**
efficiency 0.48 / 0.42 / 0.49 at one runner, 0.50 / 0.51 / 0.50 at two, 0.47 / 0.50
/ 0.47 at four, 0.47 / 0.47 / 0.50 at eight (wall 70-88 s for ideals of 35-38 s);
every trial started once, no runner error, 0-536 hand-backs, 19.7-25.7 KiB per trial
in flight. The importer's narrower durable did not move it: the importer is not what
bounds this benchmark. The pipeline section's profile says what does: half of the
runner's and the importer's work here is the trial folder's disk work (written,
packed, deleted, fetched, unpacked), paid by all 10,000 trials within seconds of
each other at the end of their 30 s.
""",
    "objects": """
**Where the time goes.** Packing is a deterministic tar + gzip in the runner
(a thread); `NatsObjectStore.put` first asks for the stored object's info (an
idempotent re-upload of the same bytes is skipped), then nats-py's put asks again
(to replace an older version), publishes the chunks and the meta entry, each
acknowledged: four round trips for a small folder, which is why it costs about
twice the plain put beside it. The importer's get is the object's info and one
direct get per 128 KiB chunk; unpacking writes a new trial's files straight into its
folder (a redelivered trial's through a staging folder swapped into place; the figures
here predate that, see the pipeline section). For Harbor-sized folders the whole path is a few
milliseconds per trial, small against a trial's minutes; the 1 MB agent folder shows
the cost growing with the bytes (compression and the chunks).

**Since applied:** the results bucket is opened with `new_names` (trial archives are
keyed by run and attempt, so a put almost always finds its name free): its put writes
the chunks, then the meta entry on condition that the name holds none, and looks the
name up only when the server refuses (an upload retried after an unconfirmed put).
One JetStream API request fewer per trial folder: client 0.58 -> 0.45 ms and
nats-server 0.52 -> 0.31 ms of CPU per put (measured alone; the tasks bucket keeps the
lookup, figures above are the looked-up put). Unpacking straight into the final folder
when no folder of that trial exists yet is done (the pipeline section's importer A/B).
""",
    "ledger": """
**Fixed (issue 12).** The experiment list (`experiment_ids`) used to group every
record of every experiment (`$group` over the whole collection, to find experiments
without metadata): it grew with the ledger, not with the page. It now reads the
`experiments` collection alone, newest first through an index on (`created_at`,
`experiment_id`): every write of records keeps a document for its experiment (an
imported Harbor job gets one without metadata), and ledgers written before get theirs
from a one-time backfill at the first start (figure `listing_backfill_s`: one scan,
then `ledger_meta` remembers it). `status` used to load every record of the
experiment; it now reads the experiment's *tally* (counts by state and the spend) from
that same document, kept by every `upsert_records`: the new record's tally added, the
replaced record's subtracted, each replacement pinned to the stored version whose
tally it subtracts, so a replay adds nothing and a record replaced by a better one
counts once (services/common/adapters/mongo_experiments.py; contract tests against
the real server in tests/integration/test_ledger_tally_contract.py). Both read one
small document per experiment, so they stay flat at a million records (the list reads
one document per experiment: 100 at a million records of 100 x 10,000). In one busy
sitting (load average 11-15, same sizes, 2026-11-26 12:31 and 12:53): list 18,740 ms
-> 10 ms, status 6,347 ms -> 20 ms; with 100 experiments of 1,000 trials (the 100
listing documents of a million-record ledger of 100 x 10,000), list 5 ms and status
6 ms (13:29, same load). The per-record tally adds about 0.2 KiB to each
document (4.58 -> 4.81 KiB/record) and each write batch two small updates of the
experiment's document (a mark before, the sums after).

**Where the time goes (the rest).** SecantusDB is a MongoDB-wire server written in
Python: each document a query returns is read, decoded and re-encoded in Python, so a
report of a 10,000-trial experiment costs seconds on this machine whatever the
indexes (the query plan is already an index scan on experiment_id, then a FETCH of
every document and an in-memory SORT by trial_id; the time is the fetch). A count
fetches the documents too (SecantusDB has no covered queries or count scans), as does
an aggregation: measured on 10,000 records, `$group` by state took 1.5 s and a
projection of six fields 2.5 s against 3.2 s for whole documents. So neither a
server-side aggregation nor projections can bring a 10,000-trial leaderboard or report
to 200 ms on the embedded ledger (projections were measured, not adopted: the report
uses most of the record, and turning records into TrialRecords is a smaller part of
the time than the server's fetch). Per-experiment reads touch one experiment's
records through the experiment_id index, so they cost the same at a million records
as at 100,000. The new indexes make MongoDB answer `records_for` without an in-memory
sort and `scored_trial_ids` from the index alone (covered); on SecantusDB they bring
no measurable gain (A-B-A, two sittings) and each costs every write a further index
entry (`load_rate_after` against `load_rate`, not settled under a moving load); if
the embedded ledger's write rate matters more than MongoDB's reads, keep only
(experiment_id, trial_id).

**At a million records** (the issue's size: 100 experiments x 10,000 trials,
`TRIALBUS_BENCH_LEDGER=100:10000`, the run this section shows; 2026-11-26 20:55,
load average 16 at the start and 5-14 through it, other engineers' tests and
benchmarks beside it). The load took 879 s (1,137 records/s) and 2,545 MiB of disk
(2.6 KiB a record: SecantusDB's files compress better at this size than the 4.7 KiB
of the 100,000-record run); today's indexes took 143 s to build on the loaded ledger,
the listing backfill 170 s. What reads one small document stays flat, as designed:
the experiment list 12 ms and status 6 ms (100 experiments), the cached and kept
leaderboard and report 1-29 ms. The per-experiment reads that fetch an experiment's
10,000 records (`records_for`, `leaderboard`, `report`: 3.1-4.1 s) cost what they cost
at 100,000 records in a quieter sitting (2.3-3.2 s): they touch one experiment
through its index, whatever the ledger's size. The headline, the kept experiment page
read by a new process, measured 257 ms here (166-297 ms) against 85 ms at 100,000
records: it reads one ``derived`` document of 85 KiB by an indexed lookup, which
should not grow with the ledger, so the load of this sitting is the likely cause;
not proven (a quiet re-run of this size would tell, and did not fit this session).
The writes with today's indexes (`load_rate_after`, 381 records/s against 1,137
before them) are the price named above, larger at this size.

**Applied: a report cache (issues 12 and 13).** The HTTP API (and the dashboard it
serves) keeps what it computes from an experiment's records, never the records: the
leaderboard rows, the report, the experiment page's view (the report, the progress
counts, the recorded ids, the first and last times, every row of the trial table,
which the page shows 100 at a time) and the experiments list's progress, in one LRU
bounded by an estimate of the bytes held (`TRIALBUS_REPORT_CACHE_MIB`, 256 MiB; a
10,000-trial page is about 8.8 MiB with every row, its report 2.9 MiB, its
leaderboard 0.02 MiB). Entries are keyed by the
experiment's content version (`Ledger.experiment_version`): the experiment document's
`_id` and `tally_version`, which every write batch bumps in the update that marks the
experiment before its records change and again in the commit after, and a metadata
upsert in the update that changes the metadata; while a batch's mark is live the
version is None and nothing is kept. The version is read before the records, so an
entry is never older than its key; an old entry is never asked for again. Contract
tests run against the fake and SecantusDB
(tests/integration/test_report_cache_contract.py: a write changes the next read, a
read or another experiment's write does not change the version; a ledger whose
version does not move serves the stale report, the negative control). Figures
`leaderboard_cached` and `report_cached`: the same reads through a cache holding the
current version, one small document read instead of 10,000 records (a few ms against
2-4 s). Concurrent misses of one key share one build (a page and its live feed opened
together read the ledger once).

**Not applied: projections.** Measured again on 10,000 records (four alternating
rounds, load average 1.6-3): whole documents 1,535 ms median, an inclusion projection
of the fields the leaderboard and page use 1,370 ms, an exclusion projection (no
artifacts, checksums, bookkeeping) 2,195 ms; decoding into raw BSON instead of dicts
saved about a tenth. SecantusDB applies projections in Python, after fetching the
document, so they save little or cost more; the report would need a second record
model for partial documents. On MongoDB a projection would cut the bytes sent (about
40 % of a record is artifacts and checksums); with the cache, only a miss pays.

**Applied: the values kept in the ledger (issues 12 and 13).** A new process (a
one-shot CLI `leaderboard` / `report`, the API after a restart) had no cache and read
every record. What `queries.derived` computes is now also kept in the ledger, in a
`derived` collection (`Ledger.keep_derived` / `stored_derived`; MongoLedger's
services/common/adapters/mongo_derived.py, the fake's dict), one document per
(experiment, kind): the value as zlib-compressed JSON (each kind's codec in
services/reports/stored.py; no pickle), under a token made of the experiment's content
version, a format number and a fingerprint of the code that builds the values.
`derived` reads the version, then the cache, then the ledger's document, and only then
the records; a computed value is written back (best effort: a failed, refused, too
large or slow write is logged and the answer returned). A write to the experiment moves
its version, so the kept value is never found again and the next read computes and
replaces it: the collection holds one document per experiment and kind, never old
versions. Contract tests against the fake and SecantusDB
(tests/integration/test_derived_store_contract.py: a new adapter reads no record; a
write makes the next read compute; a pinned version serves the stale value, the
negative control; one document per kind; a failing, damaged or oversized value never
costs the answer). Figures `*_stored` (a new `MongoLedger` per sample, no cache, the
value kept), against the miss figures `leaderboard` / `report` of the same sitting
(what the commit before paid on every CLI read): leaderboard 2,309 ms -> 13.5 ms,
report 3,183 ms -> 35.6 ms, the experiment page's view 85 ms (2026-11-26 16:33, load
average 8 falling to 3); in a busier sitting (16:14, load average 13-15) 3,726 ->
12.9 ms, 11,542 -> 49.5 ms and 271 ms. The page's view is the slowest: it holds every
trial row (2 MB of JSON at 10,000 trials), decoded in Python. Sizes kept at 10,000
trials: leaderboard 1.1 KiB, report 14 KiB, page view 85 KiB (synthetic records
compress well; real ones less, and 100,000 trials make about 12 MB of JSON for the
page view, still under the 15 MiB a document may hold: a value over it is not kept,
and is computed as before).

**What is left.** The first read after each write still reads every record (a miss:
2.3-11.5 s at 10,000 trials in these sittings), once per content version however many
processes ask; a live experiment changes version with every import batch.

Tried and not taken (stop 21): the leaderboard's per-row sums kept in the tally as
status's counts are (every reward as a count per value, exact float sums as integer
pieces, added and subtracted by the same atomic update; rows proven equal to the full
computation on random histories). At 10,000 records the first leaderboard read after a
write went from 3,288 ms to 256 ms, but the experiment document's update per import
batch went from 0.15 s to 2.0 s on the embedded ledger (hundreds of `$inc` fields):
4,000 records in the importer's batches of 200 took 7.0 s instead of 4.0 s (load
average 8-11). The importer's throughput is the headline target, so the write path was
kept. A cheaper next step: read only the records changed since the kept version (a
per-record write sequence), so a miss costs the batch, not the experiment. On MongoDB, where the
200 ms target applies (`--mongo-url`), the indexes above serve the records' read. The
embedded ledger is for development and small teams.
""",
    "dispatch": """
**What it shows.** The runner's start path now (`now_*`: the coordinator's calls in
the handler's order, two round trips before the trial starts: the ending check
together with the lease, then the attempt counter) against the one it replaced
(`before_*`: seven in sequence, replayed with the old KV calls). On an idle loop that
is the difference between the latency benchmark's dispatch p50 and the plain round
trip beside it; on a busy loop every sequential await waits for the loop again, so
the saving multiplies (the overhead benchmark's slots wait on exactly that while
Harbor's synchronous work holds the loop).
""",
    "pipeline": """
**Where the time goes with the object store in the path** (profiled 2026-11-26 for
issue 12: py-spy at 200 Hz on the runner, the importer and the watcher through a whole
10,000-trial run, CPU per process from /proc; the machine was shared, load average
9-16, so read shares and CPU times, not rates). Each trial's folder is packed and
stored by the runner and fetched and unpacked by the importer, and a trial costs the
stack about 8 ms of CPU (figure `cpu_ms_per_trial`; medians of the runs below): runner
~3 ms, importer ~2.2-2.5, ledger ~1.5, nats-server ~0.8, watcher ~0.35, the submitting
client 0.15. Two cores give at most 2 / 8 ms = 250 trials/s with perfect overlap,
which is what the quiet run measured (227): the pipeline is CPU-bound, and the slowest
ceiling (the ledger's bulk upsert, measured with the ledger alone on the machine)
cannot be approached while six processes share two cores; 0.75 of it (about 1,450
trials/s) needs under 1.4 ms of CPU per trial in total, a fifth of today's.

- **Runner** (half its busy samples in worker threads, half on the event loop):
  deleting the local trial folder once its ending is published (`shutil.rmtree`,
  about a quarter: unlink and rmdir system calls) and packing it (about a quarter);
  on the loop, the handler's round trips (KV reads and writes, acknowledged
  publishes; nats-py draws a fresh inbox from `os.urandom` for each request, 6 % of
  loop time), the instant executor's own file writes (a fifth of loop time: the
  benchmark's stand-in for Harbor), reading result.json for the spend account (7 %).
- **Importer** (80 % of its busy samples in worker threads): unpacking the archive
  into the job folder (mkdtemp, mkdir, writes, renames: file-system calls) 55-70 %,
  building the record from the unpacked files 15 %, threads handing results back to
  the loop 10 %. On the busy machine it was the serial stage: in the profiled run the
  runner settled its last trial 103 s before the importer's last batch (one batch at
  a time, about 1.8 s per 180 messages, waiting mostly on the disk).
- **Watcher**: idle 80 % of its samples. **nats-server**: about 20 requests and 4
  events per trial; the object store's share fell with the changes below.

**Fixed while measuring** (issue 12; in-process A/B of the object-store path, old
and new code alternating, three rounds each, medians, client CPU per trial):
1. One meta lookup per put: `NatsObjectStore.put` looked the object up, then
   nats-py's put looked it up again. The adapter now writes the object itself in
   nats-py's format (chunks on a fresh nuid, the meta entry with a rollup, a replaced
   object's chunks purged): lookup + chunks + meta, 3 round trips instead of 4; the
   importer reads the meta by direct get (no JetStream API request). Put 0.75 -> 0.50
   ms, get 0.42 -> 0.34 ms; nats-server per Harbor-sized put 0.53 -> 0.33 ms.
2. `pack_trial` read every file with `read(cap)`, which allocates the whole 32 MiB cap
   per file (~0.1 ms each): now the size first, the rest only if the file grew. Pack
   0.44 -> 0.37 ms (instant folder), 2.4 -> 2.1 ms (Harbor-shaped).
3. The importer resolved three paths per trial (a `realpath` is an lstat per path
   component) and unpacked twice-staged; it now resolves an experiment's job folder
   once, unpacks a new trial straight into place (staging only to replace a
   redelivered one), and unpacks and builds the record in one worker-thread hand-off
   (there were two): 0.73 -> 0.60 ms per instant trial.
Together the instant trial's object-store path went from 2.34 to 1.80 ms of client
CPU (pack + put + get + unpack). The pipeline itself, one run at a time, old and new
code alternating in one busy sitting (load average 4-12; `--only pipeline --runs 1`;
CPU medians in ms per trial):

| | trials/s per run | median | CPU/trial (range) | runner | importer | ledger | nats |
|---|---|---|---|---|---|---|---|
| before | 87, 50, 109, 56, 86, 106 | 86 | 8.4 ms (7.7-10.8) | 3.0 | 2.5 | 1.5 | 0.83 |
| after | 108, 95, 91, 129 | 101 | 7.7 ms (6.8-8.6) | 2.9 | 2.2 | 1.4 | 0.74 |

About 8 % less CPU per trial, within the scatter of single runs on a shared machine;
the profile moved as expected (packing fell from a quarter of the runner's busy
samples to a sixth, path resolution from 16 % of the importer's to 3 %). In the
unprofiled runs the importer kept up (its last batch 1-8 s after the runner's last
trial), so the runner's CPU paces the pipeline there.

**Considered, not done:** an inline path for small folders (the archive in
TrialCompleted) would save the put and the get, but the record's
`artifacts.archive`, `trialbus export` and `harbor view` of an exported job read the
bucket: the importer would have to store it there, the same cost moved, and the
event's size limit would need a second contract. Cheaper compression is no lever
(level 1 saves 20 us on an instant folder's 10 KiB tar), nor hashing (microseconds).

**Fixed while measuring, the importer** (issue 12, second round). The record is
built from the archive the importer has just unpacked instead of from the unpacked
folder read back: unpacking keeps the bytes of the files the record reads
(`RECORD_FILES`: result.json, config.json, the verifier's reward.json and
reward.txt, the runner's manifest) and knows every entry's kind and size; the one
record builder reads through a `TrialFiles` (the folder on disk for `trialbus
import`, `ArchiveFiles` in the importer), which answers as the disk would, down to
each diagnostic's text (tests/unit/test_record_sources.py builds both ways on the
bad-input corpus, the real Harbor trials and shapes only an archive can take). The
unpack makes fewer system calls: a new trial goes straight into its folder (created
exclusively, removed on a refusal; only a redelivery stages and swaps, and two
deliveries of one trial take turns), each folder is made once (it was a `mkdir` per
parent per file), files are written with `os.write` (no buffered file objects), the
staging folder is no longer `realpath`-ed (only links need it, and trial archives
hold none), and an experiment's job folder and marker are checked once, not per
trial. In-process A/B (`python -m benchmarks.ab_importer`: old and new checkouts
alternating, CPU per trial of unpacking and building the record, each child's
quickest 50-trial block, median of 3 rounds; the records of both are identical,
digest for digest): instant trial 1.03 -> 0.65 ms, Harbor-shaped trial 1.93 ->
1.61 ms (the final code, load average 9-10; two earlier sittings, load 8-17: instant
1.16 -> 0.58 and 1.02 -> 0.84 ms, Harbor-shaped 2.02 -> 1.65 ms). The pipeline, one
run at a time, old and new alternating in one busy sitting (`--only pipeline --runs
1`, load average 4-17 before the runs; the code before its last change, writing
relative to the trial folder's fd, which costs an open and a close per trial and is
in the final A/B above):

| | trials/s per run | importer CPU/trial | all processes CPU/trial | load before |
|---|---|---|---|---|
| before | 134, 78 | 1.89, 1.80 ms | 7.0, 7.0 ms | 3.8, 14.0 |
| after | 74, 64 | 1.53, 1.55 ms | 7.2, 8.3 ms | 9.8, 10.3 |

The importer's CPU per trial fell by about a sixth (1.85 -> 1.54 ms, medians); the
rates and the totals followed the machine's load (the runner's and the ledger's CPU
per trial rose with it in the second pair, with no change to their code), so they
say nothing about this change. What is left of the unpack is the file system's own
work, creating each file and folder (13 inodes and directory entries for a
Harbor-shaped trial, most of the unpack's time on a loaded machine), and Python's
tarfile parsing (about 0.4 ms for a Harbor-shaped archive); the rest of the
importer's 1.5 ms is its bus and ledger clients (decoding events, fetching archives,
upserts, ResultImported).

**Third round** (issue 12, 2026-11-26 23:20-23:55; py-spy again, then five changes,
each measured on a driver of `benchmarks.stack`: a fresh stack, a warm-up, one
experiment of 4,000 instant trials, CPU per process from /proc, base and branch
alternated, eight pairs, load average 2.8-8.7 from other engineers' tests):
1. The results bucket's put writes its meta entry on condition that the name is new
   and looks it up only when it is not (objects section): one JetStream API request
   fewer per trial.
2. The runner deletes the trial folders set aside by a burst of endings in one
   worker-thread call (`TrialFolders.discard_all`), not one hand-off per trial: the
   loop's CPU per folder 0.14 -> 0.011 ms in batches of 20.
3. The importer reads a message's delivery count only when a failed record needs it
   (nats-py's `metadata` parses the ack subject and a timestamp: 4-5 % of the
   importer's loop samples).
4. The runner awaits a run's stored-ending read alone when no slot is to be taken
   beside it (a `gather` made three tasks per trial).
5. The importer announces a batch's ResultImported events through the pipelined
   `publish_many` (each still acknowledged): 0.084 -> 0.042 ms per event.

| CPU per trial, medians of 8 | runner | importer | nats-server | all processes | trials/s |
|---|---|---|---|---|---|
| before | 3.46 ms | 1.96 ms | 0.84 ms | 7.73 ms | 167 |
| after | 3.14 ms | 1.75 ms | 0.66 ms | 6.95 ms | 216 |

About a tenth less CPU per trial; the rates follow the machine's load more than the
code. Tried and dropped: binding the runner's logger once (no gain), reusing the
packed result.json for the spend account (15 us), encoding a run's ending once
(20 us, a new port argument).

**Applied (issue 12, fourth round): the importer's durable takes only the events it
acts on** (`filter_subjects` for ExperimentSubmitted, ExperimentCompleted,
TrialCompleted and TrialFailed; an existing durable is narrowed in place by
`trialbus provision` / `up`). Its deliveries fell by two thirds (982 -> 359 messages
for the same quick run: TrialStarted and its own ResultImported no longer reach it),
but its CPU per trial hardly moved (2.1 -> 1.95 ms, within the scatter): the skipped
messages were cheap. This page's profile says where the importer's and the runner's
time goes instead (py-spy at 100 Hz for 25 s of one 10,000-trial run, share of the
active samples; 2026-11-27 03:21, quiet machine):

| process | where | share |
|---|---|---|
| importer | unpacking each trial's archive into the job folder (tar, gzip, writes) | 48 % |
| importer | batch plumbing (FastStream's pull loop and middlewares, decoding) | 25 % |
| importer | the ledger write (PyMongo) | 11 % |
| importer | building records; NATS; the job's result.json | 5 %; 5 %; 3 % |
| runner | deleting the uploaded trial folder (`rmtree`, in a worker thread) | 29 % |
| runner | packing the folder and putting it in the object store | 23 % |
| runner | publishes, acks and KV requests of the trial's ending | 13 % |
| runner | the benchmark's instant executor writing the folder | 10 % |
| runner | admission (ending check, lease, attempt) | 8 % |

So in this benchmark, where trials cost nothing, half of what the importer and the
runner do is a trial folder's disk work: written, packed, deleted, fetched and
unpacked again. A real trial pays the same once per minutes-long run.

**Next steps** (largest expected gain first): write the job folder apart from the
record (the record is built from the archive in memory already; a writer thread
after the ledger write, or unpacking on demand when a job folder is read), then a
second importer process on the same durable consumer; for the runner, the folder's
deletion batched into one `rm` of many set-aside folders, measured against `rmtree`.

The text below predates the object store (development profile, quiet machine):

**Where the time goes** (py-spy on each service, per-process CPU from the run). With
trials that cost nothing, every trial still costs the stack about 3-4 ms of CPU
across processes (figure `cpu_ms_per_trial`, split by process in the
`cpu_ms_per_trial_*` figures): the runner ~1.4 ms (about five KV round trips for the
lease and attempt counter, two acknowledged publishes, the ack, the instant executor's
file writes), the importer ~0.8 ms (decoding events, reading result.json, validating
it into a record, hashing it), the ledger ~0.5 ms, nats-server ~0.4 ms and the
watcher ~0.25 ms. On two cores that caps the pipeline near 2 / 3.5 ms, about
500-600 trials/s even with perfect overlap; 1,000 trials/s needs under 2 ms of CPU
per trial in total. The serial stage is the importer: FastStream hands it one batch
at a time (200 events, of which only the TrialCompleted third yields records; it also
receives TrialStarted and its own ResultImported), and a batch is read, built,
written and announced in turn.

**Fixed while measuring** (each found by profiling this benchmark):
1. The watcher loaded every record of an experiment from the ledger on each batch of
   events (quadratic in the experiment's size: seconds per batch at 10,000 trials, and
   it stalled SecantusDB, a single-process server, for everyone). It now keeps a
   per-experiment tally of ResultImported events and asks the ledger only when the
   tally says the experiment may be complete (plus a periodic exact re-check, for
   several watchers). Ledger CPU in this benchmark dropped from ~23 s to ~3 s per
   6,000 trials.
2. MongoLedger inserts a batch first and upserts only the trials already stored: a
   plain insert is 3-4x cheaper than the conditional upsert on SecantusDB (2,790 vs
   815 documents/s measured here with real records).
3. The importer published a batch's ResultImported events one after another, each
   waiting for its acknowledgement; they now go out together.

**What would fix the rest:** give the importer only the events it uses (a consumer
with `filter_subjects` for ExperimentSubmitted, TrialCompleted and TrialFailed: two
thirds of its messages are skipped today); build records in a process pool or in a
second importer process (the durable consumer shares the work); and, for the
ledger, real MongoDB
(SecantusDB is a Python server: its raw bulk-upsert rate, measured beside, is the
slowest ceiling by far).
""",
    "submit": """
**Where the time goes.** Validation is milliseconds. Expanding 10,000 trials is one
pydantic model per trial (the agent, compute and retry specs are validated again for
each) plus a sha256 over the trial's identity: ~40 us per trial. Publishing is one
acknowledged JetStream publish per trial with its dedup id; the same payloads through
plain nats-py `publish_async` (figure `raw_publish_s`) show how much of it is the
client library and the server: most. **Fixed while measuring:** `publish_many`
started one task per message behind an asyncio semaphore, and waking the next of
10,000 waiters scans the waiters (1.4 million `Future.done()` calls per submit); a
fixed pool of workers now shares one iterator. **What would fix the rest:** reuse the
validated specs when building each TrialRequested, and a batched publish (JetStream
atomic batch publish, or fewer, larger work messages).
""",
    "import": """
**Where the time goes** (py-spy of `trialbus import` of a 2,000-trial Harbor job
folder, 2026-11-26, load average 4-9; CPU per trial from `benchmarks.ab_importer
--mode jobdir`). A CLI import has a fixed cost of about 4 s whatever its size (a
1-trial import took 4.0-4.7 s, a 2,000-trial one 4.9-7 s): about 3 s waiting for
NATS (the benchmark points NATS_URL at a closed port, as on a machine without
`trialbus up`; the command probes NATS to announce ResultImported, and nats-py keeps
retrying a refused connection until the probe's 3 s timeout) and about 1 s of
interpreter start and imports (nats-py and aiohttp, pymongo, Harbor's models). Per
trial, building the record is 0.35-0.39 ms of CPU (the folder scan, bounded reads,
validating result.json against Harbor's schema, the record's size check), unchanged
by the importer's rework (one record builder, now through `FolderFiles`; same records,
digest for digest); in process the ledger's write sets the pace (the client's CPU is
about half of the wall time). So the CLI figure is the ledger's insert rate plus the
fixed 4 s: 10,000 trials at about 1,300/s in process take 7.5 s, and the probe alone
is 3 of the CLI's 17 s. **Since fixed** (services/submitter/connections.py):
`try_open_nats` gives up at once when every server refuses the TCP connection (a
plain connect before nats-py's, which retried it until the timeout), so an import
without a running stack no longer waits 3 s; the CLI's fixed cost left is the
interpreter start and imports (about 1 s: the CLI and in-process rates of this
page's run, 1,311 and 1,526 trials/s, differ by that). **Fixed while measuring:**
the ledger write is an insert for new trials (see the pipeline section), which is
why the import can beat the raw bulk-*upsert* ceiling measured beside it (the raw
insert rate of SecantusDB, about 2,800 documents/s in development, is the ceiling
for a fresh import); and the next batch's files are read while the ledger writes the
current batch (different processes, so on two cores they overlap; 990 -> 1,390
trials/s in one development
comparison). **What would fix the rest:** build records in a process pool (the work
is pure Python under one GIL), fewer filesystem calls per trial, and real MongoDB
for large imports (run with `--mongo-url` to measure it beside).
""",
    "latency": """
**Where the time goes** (timestamps added to the runner during development, load
average 3, median of 40 trials): from the TrialRequested publish to the runner's
fetch returning it, 1.4 ms (the idle runner's pull request waits at the server, so
this is the publish, the stream write and the delivery); from there to the trial's
handler, 0.4 ms; the cached cancellation check, nothing; the experiment's
concurrency lease plus the attempt counter, 2.7 ms. Those are about five KV round
trips: the lease keys are reused, and creating a key that was purged takes a failed
create, a get and an update; the attempt counter is a get and a create. The plain
round trips measured beside it (`kv_create_rtt_p50`, `kv_get_rtt_p50`) show what
each costs on an idle server. The observed figure adds the TrialStarted publish and
its delivery to the observer.

**The p99 (fixed).** About one sample in twenty used to wait 0.5-0.75 s (p99 686 ms
on 2026-11-26 before the fix, same machine and load): the runner fetched up to its
free slots (`fetch(batch=4, timeout=1.0)`), and nats-py's batch fetch, once it has
sent a long-poll, returns only when the batch is full or the window closes, so a lone
trial delivered into it waited out the rest of the 1-second window. The runner
(`services/runner/consumer.py`) now pulls one message when idle (nats-py's
single-message fetch returns the moment the message arrives; its 1 s expiry only sets
how often an idle runner renews its pull request, so no busy polling), and only after
a pull found work asks for all its free slots, with a 50 ms window. Measured with
this benchmark on a loaded machine (load average 4-6): p99 686 ms -> 17 ms, max
715 ms -> 19 ms, p50 unchanged (6.0 -> 6.2 ms).

**Fixed (issue 12):** one write per lease and per first attempt, the ending check
beside the lease, and the trial started without waiting for TrialStarted's
acknowledgement ("Orchestration cost" below).

**Against the issue's bar** (p50 <= 3 ms; this page measured against 5 ms before, and
called 4.7 ms met): missed. In this page's sitting (2026-11-27 00:51) the runner's own part
(`dispatch_p50`, publish to the runner's `occurred_at`) was 3.1 ms and the observed
median 4.8 ms; the other 1.7 ms is TrialStarted's trip back to the observer, through
the stream. What is left of the runner's part on an idle stack is the publish, the
stream write and the delivery (about 1.4 ms, three loopback round trips of 0.3-0.4 ms
each plus the server's work), the stored-ending read and the first attempt's write
(two more), and the handler's hand-offs on the event loop. **Next step:** one round
trip fewer per start, by skipping the stored-ending read for a work message on its
first delivery, once it is proven that no other message can carry the same run
(a resumed or retried run is published under a run id of its own, which would have
to hold on every path); below that, the p50 is the bus's own.
""",
    "dashboard": """
**Applied: the report cache (issue 13).** The page reads the experiment through the
report cache of the ledger section: the first load after the API starts (`cold_*`)
reads the 10,000 records from the ledger, validates them into TrialRecords and builds
the page's view (the report: leaderboard, causes, pass@k, the task x agent matrix,
cost; the progress counts; then the first 500 rows of the trial table, now all its
rows, shown 100 a page); every later load, and every live update, of an experiment
whose records did not change is served from the cache: one read of its content
version, then the templates (about 420 KiB of HTML then: the 500 x 4 matrix and 500
trial rows). Same sitting, same load (2026-11-26
15:46-15:50, load average 7-9), the commit before the cache against this one: warm
first paint 10,068 ms -> 856 ms, time to first byte 9,744 ms -> 276 ms; an earlier
sitting of this commit at load average 5: 728 ms and 308 ms. The first load is not
faster (cold first paint 7,612 ms before, 8,988 ms after; 5,204 ms at load average
5): it does the same work. Where it goes: the records' fetch from SecantusDB (2-4 s
at 10,000 records, see the ledger section), their validation (0.5-1.8 s), then the
view (0.9-1.9 s: the report's bootstrap intervals, pass@k and the matrix). The page's
HTML is byte for byte the size it was (418 KiB), and the JSON endpoints, the CLI and
the pages read through the same `queries.derived`, so their numbers still agree
(tests/integration/test_dashboard_outcomes.py, test_http_api.py).

**Applied: the page's view kept in the ledger, the trial table paged (issues 12 and
13).** The view the page is built from is kept in the ledger by content version (the
ledger section): a new API process (`restart_*`: the first load after a restart, its
cache empty, the view kept by the process before) reads one document instead of
10,000 records. The trial table shows 100 rows a page (`?page=N`, plain links, the
live feed sends the page shown). Measured against the commit before, each side a
fresh stack, on a machine shared with other engineers' tests (2026-11-26 16:14-16:32,
load average 8-13, which moved by a factor of two between sittings): the first load
of a new API process 9,472 and 14,908 ms before (two sittings) -> 1,744, 640 and
912 ms (three sittings; time to first byte 962, 261 and 667 ms); the page's HTML
442 -> 333 KiB (400 trial rows fewer); warm first paint 904 and 636 ms before ->
588, 380 and 528 ms. The first read of an experiment nobody computed yet (`cold_*`)
does what it did, plus packing and writing the value: 14.5, 4.0 and 3.9 s (before:
9.5 and 14.9 s; the spread is the machine's load). Where the restart's time goes:
the view's document (85 KiB compressed, 2 MB of JSON at 10,000 trials, most of it
the 10,000 rows) decoded in Python, then the templates.

**What is left:** the first read after each write still reads the records (a live
experiment changes version with every import batch: its page is computed again after
each batch, once, however many browsers or processes watch it). The restart's decode
could shrink further by keeping only the visible page's rows decoded.
""",
    "scheduling": """
**Two variants of the priority scenario.** The headline runs team A's 10,000-trial
sweep as an operator would run one that must yield, `compute.preemptible: true`; the
`nonpreempt_` figures are the same scenario with A not opted in. B alone starts its
trials in waves: every slot at once, then each slot again as its trial ends.

**Behind a preemptible A** a full runner looks at the heavier classes' pending count
once a second (each look 0.5-1.5 s, docs/scheduling.md "preemption"), stops one of A's
trials per waiting urgent trial, and owes the freed slots to urgent: B gets the whole
fleet within one look and then runs in waves as alone (`b_completion_model_s`: the
wait plus the waves). What B still pays is `b_first_start_added_s`, the look and the
stop. A's trials that are stopped go back to the queue at once and start again later:
`preempted_trials` (and the hand-backs: one per preempted trial, since a class a
runner preempted yields its free slots while a heavier class waits; before that rule
a trial started by batch's 1-in-9 share was preempted again, 28 hand-backs for 20
trials), checked from the events and the ledger:
every one recorded and scored (`preempted_lost` 0), every start at attempt 1, no
failure but the non-final `cancelled` / `Preempted` hand-backs, records of 1 attempt
(`preempted_counted` 0). What A loses is `a_trials_lost`: its completions short of its
rate before, over B's run and a while after. B's own trials of the same length are the
slot time A lends (`urgent_trials`); `a_trials_wasted` is the rest, the partial runs
preemption throws away (about half a trial per preempted trial) plus slots left idle.
**What still keeps B above 10 %**: the first start waits for the next preemption
look (0.5-1.5 s, a random phase per runner), and the two runners preempt at different
looks, so one runner's first wave is up to a look behind the other's; one trial
length is 20 % of B's 10 s, so that lag shows in B's last wave. Slots freed by B's own
trials no longer go 1 in 9 to batch: a class a runner preempted yields them while a
heavier class waits (docs/scheduling.md "preemption"), so `b_share_of_starts` is 1.

**Behind a non-preemptible A**, two things add up. (1) **The first start waits for a
slot to free**: nothing stops a running batch trial, so B waits for the next A trial
to end, plus up to 1 s during which a busy runner has not looked at its other classes
again (`LOOK_AGAIN_S`). (2) **B then trickles in**: the slots free one by one as A's
trials end, and the runners' weighted round robin gives urgent 8 of every 9 starts
(`nonpreempt_b_share_of_starts` against the rule's 0.889), so batch is not starved.
The model (`scheduling_math.trickle_s`) estimates (2) at U / (share x slots / S) + S;
with every start (share 1) and no wait it is still one trial length over the waves
alone: **no weight meets 10 % without preemption** at these sizes. A's throughput
is lent, not lost (`nonpreempt_a_trials_wasted` near 0).

**Shares.** Two batch teams queue a deep sweep each, team-a (share 1) first, team-b
(share 3) second; fair share (the quotas file's `share`) holds team-a back to its
quarter. The cost is hand-backs: the work stream is first in, first out, so a team
over its share has its trials delivered and handed back until its turn, and a freed
slot takes due redeliveries before new messages, each holding the slot while it is
handed back (`share_deliveries_per_s` against `share_starts_per_s`: deliveries per
start). With a 0.2-1 s hand-back alone, a loaded runner (quick mode, load average
17) made 60 deliveries per start, kept 5.1 of 8 slots busy and gave team-a 0.36-0.46
of the starts; at full size on a quieter machine (load 4-6) 10 per start, 19.4 of 20
slots and 0.250. The hand-back span now widens with the team's queue so its trials
come back about 50 a second (services/runner/fair_share.py `hand_back_span`):
`share_slots_busy` and the deliveries show what that leaves.
""",
    "fleet": """
**Fixed while measuring (issue 12): past 512 idle runners, the rest were refused.**
Every idle runner keeps one pull request open on each class durable of its pool, and
nats-server holds at most 512 of them per consumer by default. With 1,000 runner
connections the default class's durable held 512 (``num_waiting`` 512 of
``max_waiting`` 512, read from the server during the run); the server answered every
other request with 409, and nats-py's single-message fetch then waits out its window
with no request at the server: those runners could take no work, without a log line
(a test that planted a limit of 1 saw a refused runner poll about once a second per
class, no faster). The runners' durables are now
made with room for 16,384 waiting requests (services/runner/durables.py
``MAX_WAITING``; tests/integration/test_runner_durable_waiting.py holds 600 pullers,
its control made as before holds 512). nats-server refuses to change the limit of an
existing durable, so a durable made before this version keeps 512: a runner or
`trialbus provision` logs a warning naming it, and the fix (delete it while nothing
of the pool is queued or running; the next start makes it anew). Two runs in one busy
sitting (load average 7-14, 1,000 connections), before and after: p50 24.0 -> 15.7
ms, p99 2,420 -> 857 ms; the load moved between them, so this is no measure of the
change's own effect on latency.

**Where the rest goes.** The target is the idle stack's (issue 12: p50 <= 3 ms, p99
<= 25 ms; the page measured against 5 ms before). In this page's sitting (2026-11-27
00:48, load 1.6-3.9) the median with 1,000 connections was 3.8 ms (1.9 ms with one)
and the p99 296 ms (2.7 ms with one); in the sitting before (2026-11-26 21:35, load
1-2) 4.7 and 374 ms. An idle runner renews each class's pull request once a
second (``IDLE_FETCH_TIMEOUT_S``), so 1,000 idle runners with three classes send the
server about 3,000 requests a second doing nothing (figure `idle_msgs_per_s_1000c`:
2,796) and that costs, idle, 0.4 of a core in nats-server and 0.8 in the four
processes of simulated runners: on two shared cores, a trial whose message reaches a
loop busy renewing polls waits its turn, which is the tail. (Spread over real runner
machines the runners' share leaves this machine; the server's stays.) Tried in a
busy sitting (load 6-11), against the 1 s window's run just before: a 5 s renewal
window cut the idle requests to 600 a second and the fleet's idle CPU about four times (0.4 -> 0.1
cores), p50 5.8 ms and p99 460 ms; not adopted yet, because a stopping runner waits
out its polls in flight (up to the window) before it hands their messages back.
**Next step:** a longer idle window with polls ended by the runner's drain, and one
pull request per runner for all classes of a pool (a multi-filter consumer per runner
would lose the shared durable's queue order).
""",
}

BEFORE_AFTER_ROWS: list[tuple[str, str, str, str]] = [
    (
        "dispatch latency p99 (idle stack)",
        "551 ms",
        "5.9 ms (quiet sitting, 2026-11-26 10:41); 17-32 ms in busy sittings",
        "idle runners pull one message (consumer.py); the start path below",
    ),
    (
        "dispatch latency p50",
        "4.4 ms",
        "observed 4.8 ms, the runner's part 3.1 ms (2026-11-27 00:48, load 1.6-3.9; the "
        "issue's bar, 3 ms, missed); 4.85 -> 3.24 ms before/after the handler change in "
        "one busy sitting",
        "the handler change (one write per lease and first attempt, ending check beside "
        "the lease, TrialStarted beside the executor)",
    ),
    (
        "waiting trials in flight",
        "10,000 on 4 runners: efficiency ~0.09, trials started up to 7 times",
        "10,000 on 1/2/4/8 runners (the issue's size, 2026-11-27 02:31, load 1-3, three "
        "runs per size): efficiency 0.42-0.51 (medians 0.48/0.50/0.47/0.47), wall 70-88 s "
        "for ideals of 35-38 s, every trial started once, no runner error, 0-536 "
        "hand-backs, 20-26 KiB per trial in flight; 0.48-0.54 the sitting before; "
        "2,000 on 1/2/4/8: 0.81/0.87/0.85/0.84 (2026-11-26 21:36, load 1-3; 0-3 "
        "hand-backs); before the handler change 0.47/0.49/0.49/0.45 with 22-379 "
        "redeliveries (one sitting)",
        "admission bound, no lease where the limit cannot bind, fewer round trips; then "
        "the late-delivery sweep (a full runner held a message 30 s) and endings bounded "
        "like admission; a runner may hold 10,000 trials (the bound was 4,096); the gap "
        "left is about 7 ms of stack CPU per trial on two cores",
    ),
    (
        "pipeline, instant trials",
        "793 trials/s, ~3.5 ms CPU per trial",
        "203 trials/s (192-212; 2026-11-27 02:50, right after the capacity runs; the "
        "ledger's ceiling 1,567 docs/s, 0.13 of it), 190 and 301 trials/s in the two "
        "sittings before, 227-281 in earlier quiet ones; 6.2-8.9 ms of stack CPU per "
        "trial",
        "the object store is in the path (pack/put/get/unpack): runner 2.8-3.1 ms and "
        "importer 2.1-2.4 ms CPU per trial; one lookup per put, direct-get reads, one "
        "resolution per job folder and a read by size in packing took its path from "
        "2.34 to 1.80 ms per trial; a third round (conditional put, batched folder "
        "deletion, lazy delivery counts, pipelined announcements) 7.73 -> 6.95 ms; the "
        "importer's durable narrowed to its four event types (two thirds fewer "
        "deliveries, its CPU per trial 2.1 -> 1.95 ms); a profile of both processes",
    ),
    (
        "trial folder through the object store",
        "(shared disk)",
        "6.6 ms per Harbor-shaped trial (7 KB packed), 3.8 ms instant, "
        "115 ms for a 1 MB agent folder",
        "new objects benchmark",
    ),
    (
        "ledger reports at 100,000 and 1,000,000 records",
        "not measured",
        "experiment list 18.7 s -> 10 ms, status 6.3 s -> 20 ms (one busy sitting); "
        "records of a 10,000-trial experiment 1.5-8.4 s on SecantusDB (load-dependent); "
        "through the HTTP API's report cache, leaderboard 1-4 ms and report 1-3 ms once "
        "computed; a new process (CLI, restarted API) with the value kept in the ledger: "
        "leaderboard 2,309 -> 13.5 ms, report 3,183 -> 35.6 ms, page view 85 ms "
        "(2026-11-26 16:33, load average 3-8; 12.9 / 49.5 / 271 ms at load average 15); "
        "at 1,000,000 records (load 5-16): list 12 ms, status 6 ms, kept leaderboard "
        "13 ms, report 29 ms, page 257 ms; load 879 s, 2,545 MiB",
        "list from the experiments collection (listing documents, one-time backfill); "
        "status from a tally kept at write time; two indexes added for MongoDB; a "
        "report cache keyed by the experiment's content version; its values kept in the "
        "ledger under that version (`derived`)",
    ),
    (
        "dashboard experiment page, 10,000 trials",
        "first paint 9.1 s, time to first byte 8.6 s",
        "warm: first paint 380-588 ms (the commit before the cache: 10,068 ms); a new API "
        "process: 0.64-1.74 s (before: 9.5-14.9 s; load average 8-13); HTML 442 -> "
        "333 KiB",
        "the page's view from the report cache, and kept in the ledger for a new process; "
        "the trial table paged (100 rows)",
    ),
    (
        "submit 10,000 trials",
        "0.65 s",
        "0.72 s in process (publish 0.41 s against a 0.35 s raw floor), 1.9 s for the CLI "
        "(quiet sitting); 9.5 s in a busy sitting before the fix",
        "pipelined acknowledged publishes (js_pipeline.py) and one encoding per trial for "
        "the size check",
    ),
    (
        "overhead vs bare Harbor",
        "+15.6 % median (+29.1, +4.7, +15.6; full mode, 200 trials)",
        "+10.1 % median (+18.6, -16.4, +13.3; 2026-11-27 00:48, load 1.6) and +4.4 % "
        "(+2.7, +4.4, +5.8; 00:29, load 5.8) in two sittings of the same code; +21.7 % "
        "(+12.6, +23.6, +3.0; 2026-11-26 21:31); +51.3 % the sitting before, with the "
        "importer's 10 s stalls",
        "the importer's batches kept on nats-py's builtin timeout (FastStream's loop "
        "dropped them: 10 s stalls); a slot freed on its trial's ending; folders deleted "
        "off the slot; the forkserver's warm state (CPU per trial process 335 -> 205 ms)",
    ),
    (
        "1,000 runner connections (simulated, the runner's own pull loop)",
        "not measured",
        "dispatch p50 3.8 ms, p99 296 ms (one connection: 1.9 / 2.7 ms; 2026-11-27 "
        "00:52); 4.7 / 374 ms the sitting before; idle, 2,796 requests/s and 0.4 core of "
        "nats-server (2026-11-26 21:35, load 1-2)",
        "runner durables hold 16,384 waiting pulls (nats-server's default 512 refused "
        "the others); new fleet benchmark",
    ),
]
"""Issue 12's before/after table (benchmark, before, now, what changed)."""

BEFORE_AFTER = (
    """
## Before and after (issue 12)

"Before" is the issue's quiet full run (2026-11-26); "now" is this page's sittings:
one quiet (load average 0.6 before it, one run each of capacity, pipeline, submit,
latency and dispatch), the others on the same kind of machine but busy (load
average 4-12 from other engineers' tests), where ratios, counts and CPU times
compare, not wall-clock rates.

| benchmark | before | now | what changed |
|---|---|---|---|
"""
    + "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in BEFORE_AFTER_ROWS)
    + "\n"
)

ORCHESTRATION = """
## Orchestration cost: what dominates a trial now

Per trial the runner makes, in sequence, before the trial starts: the ending check
(KV get), the experiment's lease (a KV create on a slot key that the previous trial
released by purge: nats-py's create fails on the purge marker, reads it and updates,
three round trips), the attempt counter (KV get, then create) and the TrialStarted
publish, awaited: seven round trips, each also a wait for the runner's event loop.
After it ends: pack the folder and store it (object info twice, chunks, meta entry:
four round trips), store the ending (KV create), publish TrialCompleted, ack the work
message (awaited), release the lease (KV purge). While it runs: every 15 s a
keep-alive, a lease renewal and a fresh cancellation read. The importer adds the
object's get (two round trips) and the unpack. On an idle stack each round trip is
a fraction of a millisecond (figures `kv_create_rtt_p50`, `jetstream_publish_rtt_p50`);
what makes them expensive is the loop they wait on (Harbor's synchronous work in the
overhead benchmark, thousands of handlers at once in the capacity benchmark) and
their number. The object store moved the folder from a shared disk to the bus: a few
milliseconds per Harbor-sized trial (objects benchmark), not what dominates.

**Applied** (services/runner/handlers.py, services/runner/attempt.py and
services/common/adapters/nats_kv.py), as proposed on this page before:

1. Lease and attempt in one write each: `acquire` takes a slot by one
   `update(key, holder, last=0)` per probe (succeeds only on a slot key with no
   message at all) and `release` removes the key's messages by a subject purge of the
   leases stream (no marker left behind; runners have that one STREAM.PURGE right,
   on the leases stream only); `next_attempt` writes first (one round trip for a first
   attempt; get + update only for a retry). The ending check and the lease are
   awaited together; the cancel, pause, stop and budget flags are cached reads.
2. The trial starts while TrialStarted's publish is in flight; it is awaited before
   the trial's ending is stored and published (consumers still see TrialStarted
   first), and if it fails the run is stopped at once and handed back.
3. Admission: at most `TRIALBUS_ADMISSION` (32) handlers per runner between "message
   taken" and "executor started"; a burst of thousands waits there with its message
   kept alive, never in KV requests that time out into redeliveries.
4. No lease when the limit cannot bind: the work message carries the submission's
   trial count (`experiment_trials`), and a runner takes no slot when it is at most
   `n_concurrent_trials`.

Not done: a per-runner cache of released slot keys for experiments whose limit binds
(near saturation a probe can still miss every free slot and hand the trial back).

Measured before and after in one sitting (2026-11-26, load average 4-8 from other
engineers' tests; `python -m benchmarks --only capacity,latency --runs 1` on the
commit before and after the change, 2,000 trials of 30 s):

| | before | after |
|---|---|---|
| efficiency, 1 / 2 / 4 / 8 runners | 0.47 / 0.49 / 0.49 / 0.45 | 0.69 / 0.76 / 0.74 / 0.79 |
| redeliveries, 1 / 2 / 4 / 8 runners | 332 / 379 / 290 / 22 | 0 / 0 / 0 / 0 |
| trials started twice | 0 | 0 |
| dispatch p50 / p99 (latency benchmark, idle stack) | 4.85 / 21.0 ms | 3.24 / 17.1 ms |

The capacity gap left (wall 40-45 s for an ideal 31-33 s) is the start and end of
2,000 trials at once on two shared cores: per trial still the ending read, the
attempt write and TrialStarted before, and pack + object put (four round trips), the
stored ending, TrialCompleted and the ack after.
"""

SCALING = """
## What one 2-core machine can and cannot show about many machines

It can show how much orchestration one runner process and one set of central
services sustain (capacity: thousands of waiting trials in flight; pipeline: how many
trials per second the central services record), and whether splitting the same
trials over more runner processes changes that. It cannot show: network round trips
between machines (here every round trip is loopback, where a LAN adds a fraction of
a millisecond to each of the ~20 round trips of a trial's lifecycle); a replicated
NATS cluster (R3 streams acknowledge a publish only after a quorum stored it, which
adds a round trip to every publish and KV call); a MongoDB replica set with majority
writes instead of single-node SecantusDB; or independent hardware (here the runners
and every central service share two cores with other engineers' tests, so a burst's
requests queue behind each other, which a fleet of separate machines would not do).
A many-machine figure needs the stack on several hosts; these benchmarks run
against any NATS and ledger URLs, and `infra/stack.py` accepts them.
"""

REPRODUCE = """
## Reproducing

```
make bench                       # every benchmark, 3 runs each (about an hour); writes this page
make bench-quick                 # tiny sizes, 1 run (~1.5 min); writes .trialbus/bench-quick/
make bench-scheduling            # issue 14's scheduling simulation, 1 run (~4-5 min), merged in
.venv/bin/python -m benchmarks --only pipeline,latency --runs 5
.venv/bin/python -m benchmarks --only import --mongo-url mongodb://host:27017
.venv/bin/python -m benchmarks --only capacity,ledger --merge   # re-run two, keep the rest
TRIALBUS_BENCH_CAPACITY=10000:30:1,2,4,8 .venv/bin/python -m benchmarks --only capacity --runs 1
TRIALBUS_BENCH_LEDGER=100:10000 .venv/bin/python -m benchmarks --only ledger --runs 1
```

Options: `--only NAMES`, `--runs N`, `--merge` (keep the other benchmarks of the
results file), `--mongo-url URL` (or `TRIALBUS_BENCH_MONGO_URL`:
also import into real MongoDB), `--work-dir`, `--results`, `--doc`. The quick mode
runs in the test suite (`tests/integration/test_benchmarks_quick.py`), which checks
that every benchmark reports sane numbers, not that targets are met. For stable
numbers run on an otherwise idle machine; each section records the load average
before it. Profiling the services while a benchmark runs: `py-spy record -p PID`
(install it with `uv tool install py-spy`; it is not a project dependency).
"""
