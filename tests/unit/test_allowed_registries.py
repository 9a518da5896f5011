"""``AllowedRegistries``: the registries the HTTP API may fetch datasets from
(``TRIALBUS_API_DATASET_REGISTRIES``), parsed and applied to dataset entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schemas.manifest import DatasetRef, ExperimentManifest
from services.common.errors import ManifestError
from services.submitter import datasets
from services.submitter.datasets import AllowedRegistries, DatasetsBusy, fetch_datasets_blocking

URL = "https://registry.example/registry.json"


def test_the_setting_names_harbor_urls_and_files(tmp_path: Path) -> None:
    file = tmp_path / "registry.json"
    allowed = AllowedRegistries.parse(f"harbor, {URL},{file}")
    assert allowed == AllowedRegistries(True, frozenset({URL}), frozenset({file.resolve()}))
    assert AllowedRegistries.parse("") == AllowedRegistries()
    with pytest.raises(
        ValueError, match=re.escape("'registry.json' is not a registry: write 'harbor'")
    ):
        AllowedRegistries.parse("harbor,registry.json")


@pytest.mark.parametrize(
    ("entry", "path", "refused_for"),
    [
        pytest.param({}, None, None, id="harbor-allowed"),
        pytest.param({"registry_url": URL}, None, None, id="url-allowed"),
        pytest.param({"registry_path": "r.json"}, Path("/srv/r.json"), None, id="file-allowed"),
        pytest.param({"registry_url": URL + "?x"}, None, f"registry_url '{URL}?x'", id="other-url"),
        pytest.param(
            {"registry_path": "o.json"}, Path("/srv/o.json"), "registry_path 'o.json'", id="file"
        ),
    ],
)
def test_an_entry_is_fetched_only_from_an_allowed_registry(
    entry: dict[str, str], path: Path | None, refused_for: str | None
) -> None:
    allowed = AllowedRegistries.parse(f"harbor,{URL},/srv/r.json")
    ref = DatasetRef.model_validate({"dataset": "mini@1.0", **entry})
    why = allowed.refusal(ref, path)
    if refused_for is None:
        assert why is None
    else:
        assert why is not None and why.startswith(f"the HTTP API does not fetch from {refused_for}")
    # Control: an installation that allows nothing refuses every one of them.
    assert AllowedRegistries().refusal(ref, path) is not None


def test_a_request_behind_another_s_fetch_is_told_to_come_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    manifest = ExperimentManifest.model_validate(
        {"name": "x", "tasks": [{"dataset": "mini@1.0"}], "agents": [{"name": "oracle"}]}
    )
    allowed = AllowedRegistries()  # nothing allowed: a fetch that ran would be refused
    monkeypatch.setattr(datasets, "FETCH_WAIT_S", 0.05)
    # The lock held: another request's fetch is under way.
    with datasets._FETCHING, pytest.raises(DatasetsBusy, match="try again shortly"):
        fetch_datasets_blocking(manifest, tmp_path, None, allowed)
    # Control: once it is done, the request's own fetch runs (and is refused here).
    with pytest.raises(ManifestError, match="does not fetch from Harbor's registry"):
        fetch_datasets_blocking(manifest, tmp_path, None, allowed)
