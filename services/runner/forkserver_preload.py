"""Set-up of the runner's trial forkserver: importing this module IS the set-up.

Imported by one process only: the multiprocessing forkserver that
services.runner.isolation starts (``set_forkserver_preload``), before it forks any
trial. Every trial process is a fork of that state, so what happens here is paid once
per runner instead of once per trial, and never on the runner's event loop:

- litellm reads its price list from the package (``LITELLM_LOCAL_MODEL_COST_MAP``)
  instead of downloading it. On a host without network its first import otherwise
  retries the download with sleeps (~7 s), and a stale remote list is not what a
  trial should be priced with anyway. A value the operator set is kept.
- Harbor's trial machinery and the local environment are imported, so a trial starts
  in milliseconds. (services.runner.isolation adds the LLM agent stack, litellm and
  terminus-2, to the preload when the runner's first trial names a model.)
- The runner's environment, which the forkserver keeps for its trials (each cuts its
  own down: services.runner.trial_env), leaves the block ``/proc/<pid>/environ``
  shows, where a trial's code could read it in its parent.
- SIGTERM and SIGINT are ignored: the stack signals the runner's whole process group
  when it stops, and the forkserver must outlive the runner's drain (its trials
  report through it). It exits when the runner does (multiprocessing's alive pipe).
"""

from __future__ import annotations

import importlib
import os
import signal

from services.runner.trial_env import hide_exec_environment

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
hide_exec_environment()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)

for _module in (
    "harbor.trial.trial",
    "services.localenv.environment",
    "services.runner.trial_process",
):
    importlib.import_module(_module)
