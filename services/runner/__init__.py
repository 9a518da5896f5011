"""The runner: takes TrialRequested work and runs each trial with an Executor.

    app.py              composition root: connect, JetStreamBus, NatsCoordinator, the
                        executor named by settings, the handler and the pull loop
    handlers.py         the decisions, against the EventBus, Coordinator and Executor
                        ports: run the admitted attempt (heartbeat, cancellation, hand
                        back), then publish and return one verdict per message
    admission.py        the start path: admission, flags, guards, fair share, "run
                        already ended", slot leases, attempt count, TrialStarted
    endings.py          a run ends once: an ending stored, then published
    policy.py           pure: outcome + attempt + retry policy -> events and verdict
    consumer.py         nats-py adapter: the slot-bound pull loop, in_progress()
                        keep-alive, verdicts applied, hand back on drain
    live_logs.py        core-NATS adapter of the live-output LogSink (best effort)
    harbor_executor.py  the Executor over Harbor's Python API, one process per trial
    isolation.py        the trial processes: forked from a pre-imported forkserver,
                        reported over a pipe, stopped on cancellation
    trial_process.py    what a trial's process runs: Harbor's Trial, live output, outcome
    forkserver_preload.py  the forkserver's set-up (offline price list, imports, signals)
    __main__.py         `python -m services.runner`

Benchmarks and fault tests select benchmarks.instant_executor by import path; it is
not part of this package.
"""
