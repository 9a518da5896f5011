"""Trial folders put in a results bucket as a runner stores them, for importer tests.

A runner packs a finished trial folder (``pack_trial``: links and special files left
out, listed in the archive's manifest) and stores it; the TrialCompleted it publishes
names the object. Tests that feed the importer directly do the same here.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from nats.js import JetStreamContext

from schemas.events import TrialCompleted
from schemas.objects import ObjectRef
from schemas.subjects import Topology
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.common.archive import pack_trial


def file_members(data: bytes) -> dict[str, bytes]:
    """The regular files of a stored trial folder (a gzipped tar), by member name."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def store_trial(
    js: JetStreamContext, topology: Topology, experiment_id: str, folder: Path
) -> ObjectRef:
    """Pack ``folder`` and put it in ``topology``'s results bucket (created if missing)."""
    store = await NatsObjectStore.open(js, topology.results_bucket, create=BucketSettings())
    return await store.put(f"{experiment_id}/{folder.name}/1.tar.gz", pack_trial(folder).data)


async def completed_from(
    js: JetStreamContext, topology: Topology, experiment_id: str, folder: Path
) -> TrialCompleted:
    """The TrialCompleted a runner publishes for ``folder`` (trial id = folder name)."""
    ref = await store_trial(js, topology, experiment_id, folder)
    return TrialCompleted(
        experiment_id=experiment_id, trial_id=folder.name, result=ref, trial_name=folder.name
    )
