"""Adapters: the only modules that import nats, pymongo (and, for the runner, Harbor).

- ``jetstream``: EventBus over JetStream, stream declaration, connecting.
- ``nats_kv``: Coordinator over NATS key-value buckets.
- ``mongo_ledger``: Ledger over a MongoDB-wire server (MongoDB or SecantusDB).
- ``memory``: in-memory fakes of the ports, with the same semantics, for unit tests.
"""
