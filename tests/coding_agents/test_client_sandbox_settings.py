"""The printed settings turn on each client's own sandbox where it has one (issue 30, 3a)."""

from __future__ import annotations

import tomllib

from dispatcher.management.commands import claude_code_settings, codex_settings, gemini_settings


def test_claude_code_settings_turn_on_its_sandbox_failing_closed() -> None:
    settings = claude_code_settings.hook_settings("http://h", "harness-hook", 5)
    assert settings["sandbox"] == {
        "enabled": True,
        "failIfUnavailable": True,
        "allowUnsandboxedCommands": False,
    }


def test_codex_config_toml_sets_workspace_write_sandbox_mode() -> None:
    settings = codex_settings.hook_settings("http://h", "harness-hook", 5)
    parsed = tomllib.loads(codex_settings.as_toml(settings))
    assert parsed["sandbox_mode"] == "workspace-write"
    assert set(parsed) == {"sandbox_mode", "hooks"}


def test_gemini_settings_leave_docker_sandbox_off() -> None:
    settings = gemini_settings.hook_settings("http://h", "harness-hook", 5)
    assert set(settings) == {"hooks"}
