"""``trialbus submit`` refuses a priority class the installation lacks, before it
connects to anything, naming the file, the field and the classes there are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.errors import ManifestError
from services.common.settings import SubmitterSettings
from services.submitter.commands import prepare_file, submit_and_wait
from services.submitter.handlers import check_priority_class
from tests.support.manifests import nop_manifest


def _settings(**options: Any) -> SubmitterSettings:
    # Nothing listens there: a submission that got as far as connecting would fail.
    return SubmitterSettings(
        nats_url="nats://127.0.0.1:9", ledger_url="mongodb://127.0.0.1:9", **options
    )


def _manifest(folder: Path, priority_class: str | None) -> Path:
    compute: dict[str, object] = {"environment": "local", "n_concurrent_trials": 1}
    if priority_class is not None:
        compute["priority_class"] = priority_class
    return nop_manifest(folder, "classes", agents=1, repetitions=1, concurrency=1, compute=compute)


async def test_an_unknown_class_is_refused_before_connecting(tmp_path: Path) -> None:
    path = _manifest(tmp_path, "vip")
    settings = _settings()
    with pytest.raises(ManifestError) as refused:
        await submit_and_wait(settings, path, wait=False, timeout_s=1, progress=None)
    message = str(refused.value)
    assert message.startswith(f"{path}: compute.priority_class: unknown priority class 'vip'")
    assert "urgent, normal, batch" in message
    # Negative control: the installation that has the class accepts the manifest.
    vip = _settings(priority_classes="vip=9,normal=3")
    assert check_priority_class(await prepare_file(path, None), vip.classes) == "vip"


async def test_an_unnamed_class_is_the_default_one(tmp_path: Path) -> None:
    prepared = await prepare_file(_manifest(tmp_path, None), None)
    settings = _settings(default_priority_class="batch")
    assert check_priority_class(prepared, settings.classes) == "batch"
