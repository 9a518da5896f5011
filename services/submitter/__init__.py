"""The submitter: takes experiments in (HTTP API and the ``trialbus`` CLI) and
publishes their trials; reads reports back through services.reports.queries.

    app.py          composition root of the HTTP API (FastAPI): connections opened in
                    its lifespan, routes mounted
    http_security.py  the HTTP API's door: Host check, token, media type and body
                    size, before any route reads the body (api_access: start-up rules)
    api_tokens.py   identities, and the 0600 tokens file of token SHA-256s
    routes.py       the HTTP routes: translate a request, call a handler or a query;
                    owner checks on resubmit and cancel
    commands.py     the CLI's operations: open connections, call a handler or a query
    connections.py  the ONE place connections are opened (NATS: bus, coordinator,
                    event feeds; the ledger), for the app and for each CLI command
    handlers.py     the decisions, against the ports: submit (uncancel + publish),
                    wait and its exit code, cancel, import of a job folder
    waiting.py      following a submission until its trials are recorded (--wait):
                    progress, failed attempts, what an interrupt leaves running
    submit.py       expanding a manifest into trials, and publishing them (resume)
    resolve.py      task entries to Harbor task folders on disk
    manifest_io.py  reading a manifest (YAML or JSON) with errors that name the field
    __main__.py     ``python -m services.submitter`` (the HTTP API)
"""
