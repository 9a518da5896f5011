"""The importer: the only service that writes TrialRecords to the ledger.

    app.py       composition root: FastStream batched pull consumer, JetStreamBus,
                 MongoLedger; applies each message's verdict (apply_settle)
    handlers.py  the decisions, against the EventBus and Ledger ports: decode, build,
                 write, announce (ResultImported), and one verdict per message
    jobdir.py    `trialbus import` of a Harbor job folder (optionally announced)
    folders.py   stored trial archives unpacked into the importer's job folders
    records.py   assembly of a TrialRecord from one trial's files, over
    trial_files.py  those files on disk, or as just unpacked (bytes kept in memory),
    reads.py     bounded, never-raising file reads that follow no link
                 (services.common.folder_reads),
    salvage.py   field-by-field salvage of a malformed result.json, and
    scoring.py   the scoring rule (whether a reward counts; the main reward)
    __main__.py  `python -m services.importer`

A bug while building one record naks only that message (settle_error's bug delay);
once the message has been delivered BUG_MAX_DELIVERIES (5) times the importer writes
an acknowledged partial record with error_type "ImporterError" naming the exception
instead: never a lost trial, never a stuck batch (services/importer/handlers.py).
"""
