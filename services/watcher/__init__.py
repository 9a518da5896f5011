"""The watcher: announces ExperimentCompleted, and the trials of Harbor jobs made by hand.

app.py       composition root: FastStream batched pull consumer, JetStreamBus,
             MongoLedger, the re-check and jobs-folder timers; applies verdicts
handlers.py  the decisions, against the EventBus and Ledger ports: the Watcher
             (completion checks, external job scan) and one verdict per message
logic.py     pure helpers: RecordTally, completion_of, finished_external_jobs
__main__.py  `python -m services.watcher`
"""
