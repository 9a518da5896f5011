"""Which manifests the live runner pools can run (services.common.pools)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.manifest import ComputeSpec, ExperimentManifest
from schemas.runners import RunnerInfo
from services.common.pools import (
    agent_name_refusal,
    pool_refusal,
    required_capabilities,
    secret_refusal,
    task_requires_refusal,
    trial_capabilities,
)
from tests.unit.runner_support import make_request


def _runner(
    rid: str, pool: str = "default", caps: list[str] | None = None, **kw: Any
) -> RunnerInfo:
    return RunnerInfo(
        runner_id=rid, host="h", pool=pool, capabilities=caps or [], concurrency=1, **kw
    )


LOCALS = [_runner("a", caps=["local"]), _runner("b", caps=["local"])]


def test_the_default_manifest_runs_on_a_local_runner() -> None:
    assert pool_refusal(ComputeSpec(), LOCALS) is None
    # Control: no runner at all, or none able to run 'local', refuses it.
    assert pool_refusal(ComputeSpec(), []) == (
        "no live runner in pool 'default'; no runner is live (set compute.pool / "
        "compute.requires to what runs, or start a runner there)"
    )
    assert "offers 'local'" in (pool_refusal(ComputeSpec(), [_runner("c")]) or "")


def test_a_missing_capability_names_pool_need_and_what_is_live() -> None:
    compute = ComputeSpec(environment="docker", pool="gpu")
    runners = [*LOCALS, _runner("g", pool="gpu", caps=["local"], labels=["gpu"])]
    message = pool_refusal(compute, runners)
    assert message is not None
    assert message.startswith(
        "no live runner in pool 'gpu' offers 'docker'; "
        "live pools: default (local) x2, gpu (gpu, local) x1"
    )
    # Control: a docker runner in that pool makes it runnable.
    assert pool_refusal(compute, [*runners, _runner("d", pool="gpu", caps=["docker"])]) is None


def test_the_right_capabilities_in_the_wrong_pool_do_not_count() -> None:
    compute = ComputeSpec(pool="remote", requires=["gpu"])
    message = pool_refusal(compute, [_runner("a", caps=["local"], labels=["gpu"])])
    assert message is not None and message.startswith("no live runner in pool 'remote';")
    assert pool_refusal(compute, [_runner("r", "remote", ["local"], labels=["gpu"])]) is None


def test_all_requirements_must_meet_on_one_runner() -> None:
    compute = ComputeSpec(requires=["gpu"])  # and 'local', the environment
    split = [_runner("a", caps=["local"]), _runner("b", labels=["gpu"])]
    assert "offers all of 'local', 'gpu'" in (pool_refusal(compute, split) or "")
    assert pool_refusal(compute, [_runner("c", caps=["local"], labels=["gpu"])]) is None


def test_undetectable_environments_add_no_requirement() -> None:
    assert required_capabilities(ComputeSpec(environment="daytona")) == ()
    assert required_capabilities(ComputeSpec(environment="pkg.mod:Env", requires=["x"])) == ("x",)
    assert required_capabilities(ComputeSpec(requires=["local", "gpu"])) == ("local", "gpu")
    assert pool_refusal(ComputeSpec(environment="daytona"), [_runner("a")]) is None


def test_several_specs_report_every_problem() -> None:
    specs = [ComputeSpec(), ComputeSpec(pool="a"), ComputeSpec(pool="b"), ComputeSpec(pool="a")]
    message = pool_refusal(specs, LOCALS)
    assert message is not None
    assert message.count("no live runner in pool 'a'") == 1  # once per distinct need
    assert "no live runner in pool 'b'" in message and "pool 'default'" not in message


@pytest.mark.parametrize("bad", ["GPU", "has space", "x" * 40])
def test_capabilities_are_validated(bad: str) -> None:
    with pytest.raises(ValueError):
        ComputeSpec(requires=[bad])
    with pytest.raises(ValueError):
        _runner("a", caps=[bad])


def _manifest(*agents: dict[str, Any]) -> ExperimentManifest:
    return ExperimentManifest.model_validate(
        {"name": "m", "tasks": ["hello-file"], "agents": list(agents)}
    )


def test_an_agent_name_no_live_runners_harbor_ships_is_named_with_the_closest() -> None:
    shipped = ["oracle", "nop", "claude-code"]
    runners = [_runner("a", caps=["local"], harbor_agents=shipped, harbor_version="0.25.0")]
    typo = _manifest({"name": "orcale"}, {"name": "nop"}, {"name": "clade-code"})
    message = agent_name_refusal(typo, runners)
    assert message is not None
    assert message.startswith(
        "agents[0].name: 'orcale' is not an agent Harbor ships (did you mean 'oracle'? "
        "Or name the agent's class with import_path); "
    )
    # A name close to nothing lists what there is.
    assert "(Harbor's agents: claude-code, nop, oracle; or name" in (
        agent_name_refusal(_manifest({"name": "xyzzy"}), runners) or ""
    )
    assert "; agents[2].name: 'clade-code' is not an agent Harbor ships (did you mean " in message
    assert "agents[1]" not in message
    assert message.endswith("(Harbor 0.25.0 on the live runners of pool 'default')")
    # Controls: shipped names pass; an import_path agent is the runner policy's business;
    # a runner that does not say what its Harbor ships (older) is not second-guessed;
    # a runner of another pool, or one that cannot run the environment, does not count.
    assert agent_name_refusal(_manifest({"name": "oracle"}, {"name": "nop"}), runners) is None
    assert agent_name_refusal(_manifest({"import_path": "m:Agent"}), runners) is None
    assert agent_name_refusal(typo, [*runners, _runner("old", caps=["local"])]) is None
    elsewhere = _runner("x", "other", ["local"], harbor_agents=["orcale"])
    assert agent_name_refusal(typo, [*runners, elsewhere]) is not None
    # One runner of the pool shipping a name is enough (a newer Harbor there).
    newer = _runner("n", caps=["local"], harbor_agents=[*shipped, "orcale", "clade-code"])
    assert agent_name_refusal(typo, [*runners, newer]) is None


def test_an_api_key_no_live_runner_has_set_is_named_with_where_to_set_it() -> None:
    llm = {"name": "terminus-2", "model": "m", "api_key_env": ["OPENAI_API_KEY", "MY_KEY"]}
    runners = [_runner("a", caps=["local"], secrets_set=["MY_KEY"])]
    assert secret_refusal(_manifest({"name": "oracle"}, llm), runners) == (
        "agents[1].api_key_env[0]: OPENAI_API_KEY is set on no live runner of pool 'default' "
        "(a runner reads its keys from its environment when it starts: set them there, e.g. "
        "in the shell of `trialbus up`, and restart the runners)"
    )
    # Controls: one runner of the pool holding it is enough; a runner that does not say
    # (older) is not second-guessed; one of another pool, or that cannot run the
    # environment, does not count; no runner at all is pool_refusal's to say.
    holder = _runner("b", caps=["local"], secrets_set=["OPENAI_API_KEY"])
    assert secret_refusal(_manifest(llm), [*runners, holder]) is None
    assert secret_refusal(_manifest(llm), [*runners, _runner("old", caps=["local"])]) is None
    elsewhere = _runner("x", "other", ["local"], secrets_set=["OPENAI_API_KEY"])
    unable = _runner("y", caps=[], secrets_set=["OPENAI_API_KEY"])
    assert secret_refusal(_manifest(llm), [*runners, elsewhere, unable]) is not None
    assert secret_refusal(_manifest(llm), []) is None


def test_a_variable_a_task_cannot_start_without_is_checked_like_an_api_key(
    tmp_path: Path,
) -> None:
    task = tmp_path / "judged"
    task.mkdir()
    (task / "task.toml").write_text(
        '[verifier.env]\nJUDGE = "${JUDGE_KEY}"\nMODE = "${JUDGE_MODE:-strict}"\n'
        'TEXT = "key ${EMBEDDED} inside"\n'
    )
    runners = [_runner("a", caps=["local"], secrets_set=["OPENAI_API_KEY"])]
    refusal = secret_refusal(_manifest({"name": "oracle"}), runners, [("judged", task)])
    assert refusal is not None and "JUDGE_MODE" not in refusal and "EMBEDDED" not in refusal
    assert refusal is not None and refusal.startswith(
        "task judged: task.toml [verifier.env] JUDGE: JUDGE_KEY is set on no live runner of "
        "pool 'default' (a runner reads its keys"
    )
    # Controls: a template with a default, or inside a longer value, is not required
    # (Harbor resolves only a whole ${NAME} without a default, and fails without it);
    # a runner holding the variable is enough.
    holder = _runner("b", caps=["local"], secrets_set=["JUDGE_KEY"])
    oracle = _manifest({"name": "oracle"})
    assert secret_refusal(oracle, [*runners, holder], [("judged", task)]) is None


def test_a_task_s_requirement_needs_a_runner_of_the_pool_that_offers_it() -> None:
    request = make_request()
    compute = request.compute.model_copy(update={"environment": "local"})
    plain = request.model_copy(update={"compute": compute})
    allow = plain.model_copy(update={"task_requires": ["local.allowlist"]})
    assert trial_capabilities(allow) == ("local", "local.allowlist")
    refusal = task_requires_refusal([plain, allow, allow], LOCALS)
    assert refusal == (
        "task 'hello' requires 'local.allowlist' (its task.toml asks for a network allowlist, "
        "which the local environment enforces only on a runner that runs as root), and no "
        "live runner in pool 'default' offers 'local' and 'local.allowlist'; live pools: "
        "default (local) x2 (start such a runner in the pool, or leave the task out)"
    )
    root = _runner("root", caps=["local", "local.allowlist"])
    # Controls: a root runner of the pool lets it through; one of another pool does not;
    # a trial that requires nothing is never refused here.
    assert task_requires_refusal([plain, allow], [*LOCALS, root]) is None
    elsewhere = root.model_copy(update={"pool": "gpu"})
    assert task_requires_refusal([allow], [*LOCALS, elsewhere]) is not None
    assert task_requires_refusal([plain], []) is None
