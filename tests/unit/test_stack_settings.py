"""How ``trialbus up`` sorts the shell's settings (infra.stack_settings); the running
stack taking them is tests/integration/test_up_settings.py."""

from __future__ import annotations

from pathlib import Path

from infra.stack_settings import (
    CLIENT_ONLY,
    PREFIX,
    STACK_OWNED,
    service_setting_names,
    shell_settings,
)

CWD = Path("/home/op/bench")


def test_service_settings_are_passed_and_relative_paths_made_absolute() -> None:
    sorted_ = shell_settings(
        {
            "TRIALBUS_QUOTAS_FILE": "quotas.yaml",
            "TRIALBUS_POLICY_FILE": "/etc/trialbus/policy.yaml",
            "TRIALBUS_TASKS_ROOT": "",  # empty: passed as it is (the setting's None)
            "TRIALBUS_API_DATASET_REGISTRIES": "harbor,relative.json",  # not a path field
            "TRIALBUS_ADMISSION": "8",
            "OPENAI_API_KEY": "sk-never-sorted",
        },
        CWD,
    )
    assert sorted_.passed == {
        "TRIALBUS_ADMISSION": "8",
        "TRIALBUS_API_DATASET_REGISTRIES": "harbor,relative.json",
        "TRIALBUS_POLICY_FILE": "/etc/trialbus/policy.yaml",
        "TRIALBUS_QUOTAS_FILE": "/home/op/bench/quotas.yaml",
        "TRIALBUS_TASKS_ROOT": "",
    }
    assert sorted_.owned == sorted_.unknown == {}
    assert sorted_.lines() == [
        "settings from this shell, for every service: TRIALBUS_ADMISSION, "
        "TRIALBUS_API_DATASET_REGISTRIES, TRIALBUS_POLICY_FILE, TRIALBUS_QUOTAS_FILE, "
        "TRIALBUS_TASKS_ROOT"
    ]


def test_what_the_stack_decides_and_unknown_names_are_not_passed_and_said() -> None:
    sorted_ = shell_settings(
        {
            "NATS_URL": "nats://prod:4222",
            "TRIALBUS_CONCURRENCY": "64",
            "TRIALBUS_METRICS_PORT": "9100",
            "TRIALBUS_QUOTA_FILE": "q.yaml",
            "TRIALBUS_ZZZ": "1",
            "TRIALBUS_STACK_FILE": "elsewhere.json",
        },
        CWD,
    )
    assert sorted_.passed == {}
    assert sorted_.lines() == [
        "not passed: NATS_URL (the stack runs its own nats-server)",
        "not passed: TRIALBUS_CONCURRENCY (give trialbus up --concurrency)",
        "not passed: TRIALBUS_METRICS_PORT (one port for the importer, watcher and every "
        "runner would collide: the API serves /metrics on its own port)",
        "not passed: TRIALBUS_QUOTA_FILE is no setting of any trialbus service; "
        "did you mean TRIALBUS_QUOTAS_FILE?",
        "not passed: TRIALBUS_ZZZ is no setting of any trialbus service",
    ]


def test_a_shell_without_trialbus_settings_says_nothing() -> None:
    assert shell_settings({"HOME": "/root", "PATH": "/bin"}, CWD).lines() == []


def test_every_name_the_lists_hold_is_one_a_service_reads() -> None:
    # A setting renamed in services.common.settings must not leave a stale entry here
    # (the stack would pass the new name through, as no setting it decides).
    known = service_setting_names()
    owned = {n for n in STACK_OWNED if n.startswith(PREFIX)}
    assert owned <= known.keys(), owned - known.keys()
    assert not CLIENT_ONLY & known.keys()
