"""compose.yaml mounts only what the generator writes, and holds no secret in clear.

Parsed with PyYAML (merge keys resolved), checked against a real run of
infra/compose_config.py in a temporary folder standing for ``.trialbus/compose``.
Each check returns the problems it finds; every check is also run on a copy of the
file with one flaw planted, so a check that finds nothing can be trusted.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.compose_config import CONTAINER_TLS, LEDGER_USER, NODES, write_compose_config
from infra.nats_auth import load_credentials

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ".trialbus/compose/"
"""Where compose.yaml expects the generator's folder, relative to the project."""
BY_HAND = {GENERATED + "api-tokens.yaml"}
"""Written by `trialbus api-token`, not compose-config (it prints the token once)."""
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|CREDENTIAL", re.IGNORECASE)
SERVICE_ROLES = {"submitter": "submitter", "runner": "runner", "importer": "importer"}
SERVICE_ROLES |= {"watcher": "watcher", "nats-init": "admin"}


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("project") / GENERATED
    write_compose_config(folder, service_uid=None)
    return folder


def host_sources(doc: dict[str, Any]) -> list[str]:
    """Every host file or folder compose.yaml names (bind mounts, secrets, env files)."""
    found = [str(s["file"]) for s in (doc.get("secrets") or {}).values()]
    for service in doc["services"].values():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith(("./", "/")):
                found.append(source)
        found += [str(f) for f in service.get("env_file") or []]
    return [s.removeprefix("./") for s in found]


def unknown_sources(doc: dict[str, Any], generated: Path) -> list[str]:
    """Sources neither in the repository nor written by the generator."""
    problems = []
    for source in host_sources(doc):
        if source.startswith(GENERATED):
            if source in BY_HAND:
                continue
            if not (generated / source.removeprefix(GENERATED)).exists():
                problems.append(f"{source}: not written by compose-config")
        elif not (ROOT / source).exists():
            problems.append(f"{source}: not in the repository")
    return problems


def secrets_in_clear(doc: dict[str, Any]) -> list[str]:
    """Environment values that are, or carry, a secret."""
    problems = []
    for name, service in doc["services"].items():
        env = service.get("environment") or {}
        for key, value in env.items():
            text = "" if value is None else str(value)
            if re.search(r"://[^/@\s]*@", text):
                problems.append(f"{name}.{key}: user info in a URL")
            if SECRET_NAME.search(key) and text and not text.startswith("/run/"):
                problems.append(f"{name}.{key}: a secret value (give a file path instead)")
    return problems


def test_compose_mounts_only_generated_or_repository_files(generated: Path) -> None:
    doc = _compose()
    assert unknown_sources(doc, generated) == []
    flawed = copy.deepcopy(doc)
    flawed["services"]["runner"]["env_file"] = ["./.trialbus/compose/typo.env"]
    assert unknown_sources(flawed, generated) == [
        ".trialbus/compose/typo.env: not written by compose-config"
    ]


def test_compose_holds_no_secret_in_clear() -> None:
    doc = _compose()
    assert secrets_in_clear(doc) == []
    flawed = copy.deepcopy(doc)
    flawed["services"]["importer"]["environment"]["LEDGER_URL"] = "mongodb://u:pw@mongo:27017"
    flawed["services"]["mongo"]["environment"]["MONGO_INITDB_ROOT_PASSWORD"] = "hunter2"
    found = {problem.split(":")[0] for problem in secrets_in_clear(flawed)}
    # (importer's environment is shared through a YAML anchor: others show it too)
    assert {"importer.LEDGER_URL", "mongo.MONGO_INITDB_ROOT_PASSWORD"} <= found


def test_nats_nodes_and_clients_agree_with_the_generated_files(generated: Path) -> None:
    doc = _compose()
    services = doc["services"]
    for node in NODES:
        svc = services[node]
        mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in svc["volumes"]}
        config = svc["command"][-1]
        folder = mounts[str(Path(config).parent)]
        text = (generated / folder.removeprefix("./" + GENERATED) / Path(config).name).read_text()
        # The TLS files the generated config names are the ones mounted (not the CA key).
        for path in re.findall(r'(?:cert|key|ca)_file: "([^"]+)"', text):
            assert path.startswith(CONTAINER_TLS) and path in mounts, path
            assert "ca-key" not in mounts[path]
        assert f'server_name: "{node}"' in text
    for name, role in SERVICE_ROLES.items():
        svc = services[name]
        assert all(u.startswith("tls://") for u in svc["environment"]["NATS_URL"].split(","))
        assert (
            svc["environment"]["TRIALBUS_NATS_CREDENTIALS"] == "/run/secrets/nats-credentials.json"
        )
        targets = {s["target"]: s["source"] for s in svc["secrets"] if isinstance(s, dict)}
        source = doc["secrets"][targets["nats-credentials.json"]]["file"]
        cred = load_credentials(generated / source.removeprefix("./" + GENERATED), role)
        # The file names its CA relative to itself: ca.pem is mounted beside it.
        assert cred.ca_file is not None and cred.ca_file.name in targets
        assert doc["secrets"][targets[cred.ca_file.name]]["file"].endswith("nats-auth/ca.pem")
    # Least privilege: the runner gets no ledger credentials.
    assert "env_file" not in services["runner"]


def test_mongo_requires_authentication(generated: Path) -> None:
    mongo = _compose()["services"]["mongo"]
    assert "--keyFile" in mongo["command"]
    assert mongo["environment"]["MONGO_INITDB_ROOT_PASSWORD_FILE"].startswith("/run/")
    init = (ROOT / "infra/mongo/init-ledger-user.js").read_text()
    assert f'user: "{LEDGER_USER}"' in init
    url = (generated / "ledger.env").read_text().split("LEDGER_URL=", 1)[1].strip()
    assert url.startswith(f"mongodb://{LEDGER_USER}:") and "authSource=trialbus" in url
