"""Effect rules: `effect(write: build/**, network: none)` allows a command whose previewed
effect only writes under build/ (and applies that effect); one that also touches src/
asks. Parsing and validation say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution, simulation
from dispatcher.models import AgentSession, Preview, Status, ToolCall
from dispatcher.policy import effect_rules, profiles, rules
from tests.approvals.conftest import start_session
from tests.support.factories import AgentFixture
from tests.tools.support import require_bwrap

pytestmark = pytest.mark.django_db

RULE = "effect(write: build/**, network: none)"


def test_parses_and_validates() -> None:
    rule = effect_rules.parse("effect(write: build/** dist/*.tgz, exit: 0)")
    assert rule.write == ("build/**", "dist/*.tgz") and rule.exit_zero
    assert rules.validate_rules({"allow": [RULE]}) == []
    problems = rules.validate_rules(
        {"allow": ["effect(network: none)", "effect(write: /etc/**)"], "deny": [RULE]}
    )
    assert any("has no 'write:' patterns" in p for p in problems)
    assert any("'/etc/**' must be a pattern inside the workspace" in p for p in problems)
    assert any(p.startswith("deny: Effect rule") and "only be an allow rule" in p for p in problems)
    with pytest.raises(effect_rules.EffectRuleError, match="'network' can only be 'none'"):
        effect_rules.parse("effect(write: build/**, network: any)")


def _effect(*paths: str, **more: Any) -> dict[str, Any]:
    changes = [{"path": p, "change": "created", "kind": "file"} for p in paths]
    return {"changes": changes, "appliable": True, "network_attempted": False, **more}


def test_matches_only_effects_inside_its_patterns() -> None:
    rule = effect_rules.parse(RULE)
    assert rule.allows(_effect("build/a.o", "build/sub/b.o"))
    assert rule.allows({**_effect(), "changes": [{"path": "build", "kind": "dir"}]})
    assert not rule.allows(_effect("build/a.o", "src/main.c"))
    assert not rule.allows(_effect("build/a.o", network_attempted=True))
    assert not rule.allows(_effect("build/a.o", appliable=False))
    assert not rule.allows(_effect("../build/a.o"))


def test_a_pattern_reads_as_in_a_path_rule() -> None:
    """Effect rules read their patterns as path rules do (pathspec's `gitignore` style):
    `out/*` covers what lies directly in out/, not out/sub/deeper (with the deprecated
    `gitwildmatch` style it covered every depth, wider than the same pattern in
    `write_file(out/*)`)."""
    rule = effect_rules.parse("effect(write: out/*)")
    assert rule.allows(_effect("out/a.o"))
    assert not rule.allows(_effect("out/sub/deeper"))
    assert rules.path_spec("out/*").match_file("out/a.o")
    assert not rules.path_spec("out/*").match_file("out/sub/deeper")


@pytest.fixture
def previewing(settings: Any, agent: AgentFixture) -> AgentFixture:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = True
    profiles.update_profile(
        user=agent.owner, mode="standard", allow=[RULE], ask=[], deny=[], actor="test"
    )
    return agent


def _submit(fx: AgentFixture, session_id: str, call_id: str, script: str) -> dict[str, Any]:
    body = {
        "calls": [
            {"id": call_id, "name": "run_command", "arguments": {"argv": ["sh", "-c", script]}}
        ]
    }
    response = Client().post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code in (200, 202), response.content
    return dict(response.json()["calls"][0])


def test_allows_a_build_under_build_and_asks_for_one_touching_src(
    previewing: AgentFixture,
) -> None:
    session_id = start_session(previewing)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "src").mkdir()
    (workspace / "src" / "main.c").write_text("int main(void) { return 0; }\n")

    built = _submit(previewing, session_id, "b1", "mkdir -p build && cp src/main.c build/main.o")
    assert built["status"] == "queued"
    call = ToolCall.objects.get(pk=built["id"])
    assert call.decided_by == f"rule:allow:{RULE}"
    assert "Effect rule" in call.reason
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED
    assert (workspace / "build" / "main.o").read_text() == "int main(void) { return 0; }\n"
    assert Preview.objects.get(call=call).outcome == "applied"

    touching = _submit(
        previewing, session_id, "b2", "mkdir -p build && echo x > build/y && echo // >> src/main.c"
    )
    assert touching["status"] == "pending_approval"
    assert not (workspace / "build" / "y").exists()
    offline = _submit(previewing, session_id, "b3", "getent hosts example.com > build/ip || true")
    assert offline["status"] == "pending_approval"  # tried the network: never by an effect rule


def test_the_backtest_reads_effect_rules_over_recorded_previews(previewing: AgentFixture) -> None:
    session_id = start_session(previewing)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "src").mkdir()
    (workspace / "src" / "main.c").write_text("int x;\n")
    _submit(previewing, session_id, "b1", "mkdir -p build && cp src/main.c build/main.o")
    touching = _submit(previewing, session_id, "b2", "echo // >> src/main.c")
    assert touching["status"] == "pending_approval"
    proposed = profiles.snapshot_of(
        {"mode": "standard", "allow": ["effect(write: build/** src/**)"], "ask": [], "deny": []}
    )
    result = simulation.backtest(user=previewing.owner, proposed=proposed)
    changed = {str(change.call.pk): change for change in result.changes}
    assert list(changed) == [touching["id"]]
    after = changed[touching["id"]].after
    assert after.action == "allow" and after.rule == "effect(write: build/** src/**)"


def test_an_effect_rule_in_the_teams_layer_allows_and_names_its_layer(
    settings: Any, agent: AgentFixture
) -> None:
    from dispatcher.policy import managed

    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = True
    profiles.update_profile(
        user=agent.owner, mode="standard", allow=[], ask=[], deny=[], actor="test"
    )
    team = agent.agent.team
    managed.set_layer(team=team, document={"allow": [RULE]}, actor="cli")
    session_id = start_session(agent)
    built = _submit(agent, session_id, "t1", "mkdir -p build && echo ok > build/out")
    assert built["status"] == "queued"
    call = ToolCall.objects.get(pk=built["id"])
    assert call.decided_by == f"rule:allow:{RULE}"
    assert f"team {team.name}'s allow list (team {team.name} policy v" in call.reason
    assert call.provenance["layer"] == f"team:{team.name}"
    # Without the team's rule the same command asks.
    managed.set_layer(team=team, document={"allow": []}, actor="cli")
    again = _submit(agent, session_id, "t2", "mkdir -p build && echo ok > build/out2")
    assert again["status"] == "pending_approval"
