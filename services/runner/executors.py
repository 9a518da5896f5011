"""A runner's executor when ``TRIALBUS_EXECUTOR`` names one other than Harbor.

``module:factory`` is imported and called with the runner's settings before the runner
connects, and what it returns is checked against the Executor port
(services/common/ports.py): a ``name`` and a ``version`` (strings) and an ``async
run(request, attempt, on_log)``. A setting that fails any of this stops the runner at
start with exit code 2 and a message naming the setting and the fault, like a broken
policy file. Before, a factory that returned the wrong thing was found only when the
first trial ran, and every trial of the pool then ended as a runner crash.
"""

from __future__ import annotations

import inspect

from services.common.ports import Executor
from services.common.service import load_factory
from services.common.settings import RunnerSettings

HARBOR = "harbor"


class ExecutorSettingError(ValueError):
    """``TRIALBUS_EXECUTOR`` names no usable executor."""


def executor_problems(candidate: object) -> list[str]:
    """What ``candidate`` lacks of the Executor port (empty: nothing)."""
    problems = [
        f"no {attr} string"
        for attr in ("name", "version")
        if not isinstance(getattr(candidate, attr, None), str)
    ]
    run = getattr(candidate, "run", None)
    if not inspect.iscoroutinefunction(run):
        problems.append("no async run(request, attempt, on_log)")
    else:
        signature = inspect.signature(run)
        try:
            signature.bind(None, 1, None)
        except TypeError:
            names = ", ".join(signature.parameters)
            problems.append(f"run({names}) is not run(request, attempt, on_log)")
    return problems


def custom_executor(settings: RunnerSettings) -> Executor | None:
    """The executor ``settings.executor`` names, made and checked (None: Harbor's,
    which the runner builds once it is connected). Raises ExecutorSettingError."""
    spec = settings.executor
    if spec == HARBOR:
        return None
    where = f"TRIALBUS_EXECUTOR={spec!r}"
    module, _, attr = spec.partition(":")
    try:
        factory = load_factory(spec)
    except ValueError:
        raise ExecutorSettingError(f"{where}: expected {HARBOR!r} or 'module:factory'") from None
    except ImportError as exc:
        raise ExecutorSettingError(f"{where}: cannot import {module!r}: {exc}") from None
    except AttributeError:
        raise ExecutorSettingError(f"{where}: module {module!r} has no {attr!r}") from None
    try:
        made = factory(settings)
    except Exception as exc:  # the operator's code: any fault is reported
        raise ExecutorSettingError(
            f"{where}: {attr}(settings) raised {type(exc).__name__}: {exc}"
        ) from exc
    problems = executor_problems(made)
    if problems:
        raise ExecutorSettingError(
            f"{where}: {attr}(settings) returned a {type(made).__name__} object, not an executor: "
            f"{'; '.join(problems)} (services/common/ports.Executor)"
        )
    return made  # type: ignore[return-value]  # checked above, structurally
