"""The API documents, generated from the code: docs/openapi.json and docs/asyncapi.json.

- OpenAPI: FastAPI's schema of the submitter's HTTP API (``create_app(...).openapi()``),
  built with settings that need no server (nothing connects in ``create_app``). The
  dashboard's HTML pages are not in it (their router says ``include_in_schema=False``:
  they are pages for a browser, not an API a client programs against); the bearer
  scheme is added, on every path the guard does not leave open.
- AsyncAPI 3.0: every event of ``schemas.events.Event`` as a message whose payload is
  the model's JSON schema, on the channel its subject belongs to (schemas.subjects,
  default prefix; the work subject with its pool as a parameter), with one operation
  per service that publishes it (``send``) or receives it (``receive``). What the
  importer and watcher receive is read from their FastStream apps' own AsyncAPI
  (the subjects their brokers subscribe); the runner's nats-py consumer and the
  live views' subscriptions from the Topology filters they use; publishers from
  ``PUBLISHERS`` below (no framework declares a JetStreamBus publish).

``trialbus api-docs`` writes both; ``--check`` (and tests/unit/test_api_docs.py) fails
when the committed files differ from what the code generates. Nothing runs at import.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

__all__ = [
    "DOCS",
    "PUBLISHERS",
    "asyncapi_document",
    "event_models",
    "generate",
    "openapi_document",
    "render",
    "stale_documents",
    "write_documents",
]

PUBLISHERS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "experiment_submitted": (
        ("submitter", "a manifest is accepted (CLI `trialbus submit`, POST /experiments)"),
        ("watcher", "a Harbor job folder made outside trialbus is found"),
    ),
    "trial_requested": (("submitter", "one per trial still to run, on its pool's subject"),),
    "trial_started": (("runner", "a runner begins an attempt"),),
    "trial_log": (("runner", "live output of a running trial (core NATS, best effort)"),),
    "trial_completed": (
        ("runner", "the trial ran to a result; its folder is in the results bucket"),
        ("watcher", "a trial of an external Harbor job folder"),
    ),
    "trial_failed": (("runner", "the attempt failed (failure class, retryable or not)"),),
    "result_imported": (
        ("importer", "a trial's record was written to the ledger"),
        ("cli", "`trialbus import JOB_DIR` wrote a job folder's records"),
    ),
    "experiment_completed": (("watcher", "every trial of the experiment has a record"),),
}
"""Who publishes each event type, and when (every publish goes through an EventBus)."""

DOCS = {"openapi": "docs/openapi.json", "asyncapi": "docs/asyncapi.json"}
"""Where each document is committed, relative to the repository root."""

_PARAM_DOCS = {
    "experiment_id": "The experiment's id (schemas.ids).",
    "trial_id": "The trial's id (schemas.ids).",
    "pool": "The runner pool the manifest asked for (compute.pool; default 'default'). A "
    "manifest that names a priority class (compute.priority_class) adds it as one more "
    "token after the pool: work.{pool}.{class}.{experiment_id} (docs/scheduling.md).",
}


def event_models() -> list[type[BaseModel]]:
    """The concrete event models of the ``Event`` union, in its order."""
    from schemas.events import Event

    union = typing.get_args(Event)[0]
    return list(typing.get_args(union))


def _event_type(model: type[BaseModel]) -> str:
    default = model.model_fields["type"].default
    if not isinstance(default, str):
        raise TypeError(f"{model.__name__}.type has no literal default")
    return default


def openapi_document() -> dict[str, Any]:
    """The submitter's OpenAPI schema, with its bearer scheme on the guarded paths."""
    from services.common.settings import SubmitterSettings
    from services.submitter.app import create_app
    from services.submitter.http_security import OPEN_PATHS

    # model_construct: defaults only, never the environment (the document must not
    # depend on who generates it); no-auth on loopback needs no tokens file.
    settings = SubmitterSettings.model_construct(api_no_auth=True, http_host="127.0.0.1")
    doc = create_app(settings).openapi()
    doc.setdefault("components", {})["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (docs/security.md); the dashboard's session "
            "cookie is accepted on GET too.",
        }
    }
    for path, operations in doc["paths"].items():
        if path in OPEN_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
    return doc


def _faststream_receives(service: str) -> list[str]:
    """Subjects the service's FastStream app subscribes, from its own AsyncAPI."""
    from faststream import FastStream

    from services.common.adapters.memory import InMemoryLedger
    from services.common.settings import ImporterSettings, WatcherSettings

    app: FastStream
    if service == "importer":
        from services.importer.app import create_app as importer_app

        app = importer_app(ImporterSettings.model_construct(), ledger=InMemoryLedger())
    else:
        from services.watcher.app import create_app as watcher_app

        app = watcher_app(WatcherSettings.model_construct(), ledger=InMemoryLedger())
    spec = app.schema.to_specification().to_jsonable()
    channels = spec["channels"]
    subjects = []
    for op in spec["operations"].values():
        if op["action"] == "receive":
            name = op["channel"]["$ref"].rsplit("/", 1)[1].replace("%2A", "*")
            subjects.append(channels[name]["address"])
    return sorted(set(subjects))


def _subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: ``*`` one token, ``>`` the rest."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def _receivers() -> list[tuple[str, str, str]]:
    """(service, subject filter, how) for every subscription in the code."""
    from schemas.subjects import DEFAULT_POOL, Topology

    topo = Topology()
    found = [
        (svc, subject, f"FastStream batched pull consumer, durable {durable}")
        for svc, durable in (
            ("importer", topo.importer_durable),
            ("watcher", topo.watcher_durable),
        )
        for subject in _faststream_receives(svc)
    ]
    found.append(
        (
            "runner",
            topo.work_pool_filter(DEFAULT_POOL).replace(f".{DEFAULT_POOL}.", ".{pool}."),
            "nats-py pull consumers of its pool, one durable per priority class, fetched "
            "by weight (docs/scheduling.md): "
            f"{topo.runner_durable_for(DEFAULT_POOL)} (default pool, default class: "
            "`work.{pool}.*` and `work.{pool}.<default class>.*`), "
            f"{topo.runner_durable_for(DEFAULT_POOL)}_{{class}} (`work.{{pool}}.{{class}}.*`); "
            f"another pool's are {topo.prefix}-runners-{{pool}}[_{{class}}]",
        )
    )
    found.append(
        (
            "submitter",
            topo.event_filter("*", "{experiment_id}"),
            "ephemeral JetStream subscription: `status --follow`, the dashboard's live feed",
        )
    )
    found.append(
        (
            "submitter",
            f"{topo.prefix}.logs.*.{{trial_id}}",
            "ephemeral JetStream subscription: `trialbus logs -f`, the trial page's log tail",
        )
    )
    return found


def _address(event_type: str) -> str:
    from schemas.subjects import Topology

    topo = Topology()
    if event_type == "trial_requested":
        return f"{topo.prefix}.work.{{pool}}.{{experiment_id}}"
    if event_type == "trial_log":
        return topo.log_subject("{experiment_id}", "{trial_id}")
    return topo.event_subject(event_type, "{experiment_id}")


def _stream(event_type: str) -> str:
    from schemas.subjects import Topology

    topo = Topology()
    if event_type == "trial_requested":
        return topo.work_stream
    return topo.logs_stream if event_type == "trial_log" else topo.events_stream


def asyncapi_document() -> dict[str, Any]:
    """The event contract as an AsyncAPI 3.0.0 document (see the module docstring)."""
    from schemas.events import SCHEMA_VERSION

    models = event_models()
    _, top = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
    )
    schemas = dict(sorted(top["$defs"].items()))
    receivers = _receivers()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for model in models:
        etype, name = _event_type(model), model.__name__
        if etype not in PUBLISHERS:
            raise KeyError(f"event type {etype!r} has no entry in api_docs.PUBLISHERS")
        address = _address(etype)
        doc = (model.__doc__ or "").strip()
        messages[name] = {
            "name": name,
            "title": name,
            "summary": doc.split("\n")[0],
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
        }
        channels[etype] = {
            "address": address,
            "description": f"JetStream stream {_stream(etype)}.",
            "parameters": {
                p: {"description": _PARAM_DOCS[p]} for p in re.findall(r"{(\w+)}", address)
            },
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        ref = {"$ref": f"#/channels/{etype}"}
        msg_ref = [{"$ref": f"#/channels/{etype}/messages/{name}"}]
        for service, when in PUBLISHERS[etype]:
            operations[f"{service}.send.{etype}"] = {
                "action": "send",
                "channel": ref,
                "messages": msg_ref,
                "summary": when,
                "tags": [{"name": service}],
            }
        concrete = re.sub(r"{\w+}", "x", address)
        for service, subject, how in receivers:
            if _subject_matches(re.sub(r"{\w+}", "x", subject), concrete):
                operations[f"{service}.receive.{etype}"] = {
                    "action": "receive",
                    "channel": ref,
                    "messages": msg_ref,
                    "summary": f"{how}; filter {subject}",
                    "tags": [{"name": service}],
                }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "trialbus events",
            "version": str(SCHEMA_VERSION),
            "description": "The events trialbus services exchange over NATS JetStream "
            "(schemas/events.py), generated by services/api_docs.py; the version is "
            "the events' schema_version.",
        },
        "defaultContentType": "application/json",
        "servers": {"nats": {"host": "127.0.0.1:4222", "protocol": "nats"}},
        "channels": channels,
        "operations": dict(sorted(operations.items())),
        "components": {"messages": messages, "schemas": schemas},
    }


def render(doc: Mapping[str, Any]) -> str:
    """The committed text of a document: stable, indented JSON with a final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """Each document's repository path and its generated text."""
    return {
        DOCS["openapi"]: render(openapi_document()),
        DOCS["asyncapi"]: render(asyncapi_document()),
    }


def stale_documents(root: Path, generated: Mapping[str, str] | None = None) -> list[str]:
    """Paths under ``root`` whose committed text differs from the generated one."""
    texts = generate() if generated is None else generated
    stale = []
    for rel, text in texts.items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
    return stale


def write_documents(root: Path) -> list[str]:
    """Write every document under ``root``; return the paths that changed."""
    changed = []
    for rel, text in generate().items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(rel)
    return changed
