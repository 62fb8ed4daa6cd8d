"""The managed layers as code and as pages: set_rules / get_rules per layer, a two-person
change to the organization's layer, and a log-only rule that records what it would have
done, decides nothing, shows on the analytics page and is made active in one click."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from audit.models import AuditEvent
from dispatcher.policy import managed
from dispatcher.policy.models import LayerProposal, LayerVersion, PolicyLayer
from teams import services as team_services
from tests.policy.conftest import start_session, submit
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db


def _file(tmp_path: Path, document: Any) -> str:
    path = tmp_path / f"{unique('rules')}.json"
    path.write_text(json.dumps(document))
    return str(path)


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


ORG = {
    "max_mode": "standard",
    "allow": ["read_file"],
    "ask": [{"rule": "run_command(terraform apply *)", "approvals": 2}],
    "deny": ["read_file(**/.env)", {"rule": "run_command(curl *)", "log_only": True}],
}


def test_set_rules_and_get_rules_round_trip_the_organizations_layer(tmp_path: Path) -> None:
    out = _run("set_rules", "--org", _file(tmp_path, ORG), "--reason", "baseline")
    assert out.strip() == "Saved the organization's policy as v1."
    assert json.loads(_run("get_rules", "--org")) == ORG
    again = _run("set_rules", "--org", _file(tmp_path, ORG), "--reason", "same")
    assert again.strip() == "The organization's policy is unchanged (v1)."
    version = LayerVersion.objects.get(layer__kind="org", version=1)
    assert (version.actor, version.reason) == ("cli", "baseline")
    event = AuditEvent.objects.filter(kind="policy.changed").get()
    assert event.payload["reason"] == "baseline" and event.payload["version"] == 1
    assert event.payload["diff"]["max_mode"] == [None, "standard"]


def test_an_organizations_change_needs_a_reason_and_valid_rules(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"needs a reason \(--reason\)"):
        _run("set_rules", "--org", _file(tmp_path, ORG))
    bad = {"max_mode": "yolo", "deny": ["read_file("], "mode": "trusted"}
    with pytest.raises(CommandError) as raised:
        _run("set_rules", "--org", _file(tmp_path, bad), "--reason", "x")
    message = str(raised.value)
    assert "Nothing was saved" in message and "use max_mode" in message
    assert "'max_mode' must be one of" in message
    assert not PolicyLayer.objects.exists()


def test_set_rules_and_get_rules_per_team_and_per_user(tmp_path: Path) -> None:
    team_services.create_team(name="payments", actor="test")
    document = {"max_mode": None, "allow": [], "ask": ["write_file(src/**)"], "deny": []}
    out = _run("set_rules", "--team", "payments", _file(tmp_path, document))
    assert out.strip() == "Saved team payments's policy as v1."
    assert json.loads(_run("get_rules", "--team", "payments")) == document
    with pytest.raises(CommandError, match="No team named 'nope'"):
        _run("get_rules", "--team", "nope")
    alice = make_user("alice-layers")
    mine = {"mode": "standard", "allow": [], "ask": [], "deny": ["write_file(*.lock)"]}
    _run("set_rules", "alice-layers", _file(tmp_path, mine))
    assert json.loads(_run("get_rules", "alice-layers")) == mine
    with pytest.raises(CommandError, match="'max_mode' belongs in the organization's"):
        _run("set_rules", "alice-layers", _file(tmp_path, {**mine, "max_mode": "standard"}))
    assert alice.permission_profile.deny == ["write_file(*.lock)"]


def test_a_two_person_change_waits_for_another_org_admin(
    tmp_path: Path, settings: Any, client: Client
) -> None:
    settings.HARNESS_POLICY_TWO_PERSON = True
    ann = make_user("ann-org-admin", groups=("admin",))
    bob = make_user("bob-org-admin", groups=("admin",))
    change = {"deny": ["run_command(terraform destroy *)"]}
    with pytest.raises(CommandError, match="proposed by an org admin"):
        _run("set_rules", "--org", _file(tmp_path, change), "--reason", "no destroy")
    out = _run(
        "set_rules",
        "--org",
        _file(tmp_path, change),
        "--reason",
        "no destroy",
        "--by",
        ann.username,
    )
    proposal = LayerProposal.objects.get()
    assert f"proposal {proposal.pk}" in out
    assert managed.layer_version(None) == 0  # nothing applies yet
    assert AuditEvent.objects.filter(kind="policy.proposed").count() == 1
    # The proposer cannot accept their own, by command or by page.
    with pytest.raises(CommandError, match="another org admin must accept it"):
        _run("accept_policy_proposal", str(proposal.pk), "--by", ann.username)
    client.force_login(ann)
    page = client.get("/permissions/policy/")
    assert page.status_code == 200 and b"You proposed it" in page.content
    client.post(f"/permissions/policy/proposals/{proposal.pk}/accept")
    assert managed.layer_version(None) == 0
    # A team admin is no org admin.
    team = team_services.create_team(name="infra", actor="test")
    carol = make_user("carol-team-admin")
    team_services.add_member(team=team, user=carol, role="admin", actor="test")
    client.force_login(carol)
    client.post(f"/permissions/policy/proposals/{proposal.pk}/accept")
    assert managed.layer_version(None) == 0
    # Another org admin accepts it on the page (CSRF enforced).
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(bob)
    assert strict.post(f"/permissions/policy/proposals/{proposal.pk}/accept").status_code == 403
    client.force_login(bob)
    page = client.get("/permissions/policy/")
    assert b"Accept and apply" in page.content and b"no destroy" in page.content
    response = client.post(f"/permissions/policy/proposals/{proposal.pk}/accept")
    assert response.status_code == 302
    assert managed.layer_document(None)["deny"] == ["run_command(terraform destroy *)"]
    version = LayerVersion.objects.get(layer__kind="org")
    assert (version.actor, version.accepted_by, version.reason) == (
        "user:ann-org-admin",
        bob,
        "no destroy",
    )
    changed = AuditEvent.objects.get(kind="policy.changed")
    assert changed.actor == "user:ann-org-admin"
    assert changed.payload["accepted_by"] == "bob-org-admin"
    with pytest.raises(CommandError, match="no pending policy proposal"):
        _run("accept_policy_proposal", str(proposal.pk), "--by", bob.username)


def test_a_proposal_made_on_an_older_version_is_superseded(settings: Any) -> None:
    settings.HARNESS_POLICY_TWO_PERSON = True
    ann = make_user("ann-stale", groups=("admin",))
    bob = make_user("bob-stale", groups=("admin",))
    first = managed.set_layer(team=None, document={"deny": ["read_file"]}, actor=ann, reason="1")
    second = managed.set_layer(team=None, document={"deny": ["write_file"]}, actor=ann, reason="2")
    assert first.proposal is not None and second.proposal is not None
    managed.accept_proposal(proposal_id=second.proposal.pk, user=bob)
    assert managed.layer_version(None) == 1
    with pytest.raises(managed.StaleProfile, match="changed since proposal"):
        managed.accept_proposal(proposal_id=first.proposal.pk, user=bob)
    first.proposal.refresh_from_db()
    assert first.proposal.status == "superseded"
    assert managed.layer_document(None)["deny"] == ["write_file"]


def test_a_log_only_rule_records_decides_nothing_and_is_made_active_in_one_click(
    tmp_path: Path, client: Client
) -> None:
    fx = make_agent(mode="trusted")
    trial = {"ask": [{"rule": "write_file(src/**)", "log_only": True}]}
    _run("set_rules", "--org", _file(tmp_path, trial), "--reason", "trial asks on src")
    session_id = start_session(fx)
    call = submit(fx, session_id, "c1", "write_file", {"path": "src/a.py", "content": ""})
    # It decided nothing: trusted mode ran the call.
    assert (call.status, call.decided_by) == ("queued", "mode:trusted")
    [entry] = call.provenance["log_only"]
    assert (entry["layer"], entry["would"], entry["instead_of"]) == ("org", "ask", "allow")
    assert entry["note"] == (
        "Log-only rule 'write_file(src/**)' in the organization's ask list (org policy v1) "
        "would have asked."
    )
    other = submit(fx, session_id, "c2", "write_file", {"path": "b.txt", "content": ""})
    assert "log_only" not in other.provenance
    # The timeline shows it.
    admin = make_user(unique("admin"), groups=("admin", "auditor"))
    client.force_login(admin)
    timeline = client.get(f"/audit/sessions/{session_id}/")
    assert b"would have asked" in timeline.content
    # The analytics page shows what it would have done over live traffic.
    page = client.get("/permissions/analytics/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Would have decided 1 call; 1 of them otherwise than today (1 allow)." in text
    # One click (CSRF enforced) makes it active.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin)
    form = {"layer": "org", "action": "ask", "rule": "write_file(src/**)"}
    assert strict.post("/permissions/analytics/activate", form).status_code == 403
    response = client.post("/permissions/analytics/activate", form)
    assert response.status_code == 302
    assert managed.layer_document(None)["ask"] == ["write_file(src/**)"]
    asked = submit(fx, session_id, "c3", "write_file", {"path": "src/c.py", "content": ""})
    assert asked.status == "pending_approval"
    assert (
        asked.reason == "Rule 'write_file(src/**)' in the organization's ask list (org policy v2)."
    )


def test_a_log_only_rule_of_a_users_profile_is_made_active_by_its_admin(client: Client) -> None:
    fx = make_agent(mode="standard")
    from dispatcher.policy import profiles

    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[{"rule": "write_file(docs/**)", "log_only": True}],
        ask=[],
        deny=[],
        actor="test",
    )
    session_id = start_session(fx)
    call = submit(fx, session_id, "c1", "write_file", {"path": "docs/a.md", "content": ""})
    assert (call.status, call.decided_by) == ("pending_approval", "mode:standard")
    assert call.provenance["log_only"][0]["would"] == "allow"
    admin = make_user(unique("admin"), groups=("admin",))
    client.force_login(admin)
    layer = f"user:{fx.owner.username}"
    client.post(
        "/permissions/analytics/activate",
        {"layer": layer, "action": "allow", "rule": "write_file(docs/**)"},
    )
    owner = User.objects.get(pk=fx.owner.pk)
    assert owner.permission_profile.allow == ["write_file(docs/**)"]
    allowed = submit(fx, session_id, "c2", "write_file", {"path": "docs/b.md", "content": ""})
    assert allowed.status == "queued"


def test_the_rules_editor_keeps_a_log_only_rule_when_the_profile_is_saved(
    client: Client,
) -> None:
    from dispatcher.policy import editor, profiles

    owner = make_user(unique("owner"))
    profiles.update_profile(
        user=owner,
        mode="standard",
        allow=["read_file"],
        ask=[{"rule": "write_file(src/**)", "log_only": True}],
        deny=[],
        actor="test",
    )
    rows = editor.rows_from_profile(profiles.profile_for(owner))
    [trial] = [row for row in rows if row.action == "ask"]
    assert trial.entry == {"rule": "write_file(src/**)", "log_only": True}
    assert trial.extra_reads == "log-only: recorded, decides nothing"
    admin = make_user(unique("admin"), groups=("admin",))
    client.force_login(admin)
    page = client.get(f"/permissions/users/{owner.pk}/")
    assert b"log-only: recorded, decides nothing" in page.content
    # The text form holds it as one line of JSON, and saving that text keeps it.
    line = '{"rule": "write_file(src/**)", "log_only": true}'
    assert line.replace('"', "&quot;").encode() in page.content
    client.post(
        f"/permissions/users/{owner.pk}/",
        {"mode": "standard", "allow": "read_file", "ask": line, "deny": "", "version": "2"},
    )
    saved = profiles.profile_for(owner)
    assert saved.version == 2 and saved.ask == () and saved.trial[0].rule == "write_file(src/**)"


def test_the_simulator_and_the_backtest_read_the_layers(tmp_path: Path) -> None:
    from dispatcher import simulation
    from dispatcher.policy import profiles

    fx = make_agent(mode="trusted")
    session_id = start_session(fx)
    submit(fx, session_id, "c1", "write_file", {"path": "src/a.py", "content": ""})
    _run(
        "set_rules",
        "--org",
        _file(tmp_path, {"ask": ["write_file(src/**)"], "max_mode": "standard"}),
        "--reason",
        "review source",
    )
    result = simulation.simulate(
        user=fx.owner, tool="write_file", arguments={"path": "src/b.py", "content": ""}
    )
    assert (result.action, result.layer, result.mode) == ("ask", "org v1", "standard")
    assert result.reason.startswith("Rule 'write_file(src/**)' in the organization's ask list")
    # Under the organization's ask (and ceiling), the owner's own mode changes nothing:
    # without the layers, trusted -> standard would turn the past write from allow to ask.
    proposed = profiles.proposed_profile(fx.owner, "standard", [], [], [])
    test = simulation.backtest(user=fx.owner, proposed=proposed)
    assert test.checked == 1 and test.changes == []


def test_a_person_changes_only_the_layers_their_role_reaches() -> None:
    payments = team_services.create_team(name="payments", actor="test")
    infra = team_services.create_team(name="infra", actor="test")
    dana = make_user("dana-payments-admin")
    team_services.add_member(team=payments, user=dana, role="admin", actor="test")
    saved = managed.set_layer(team=payments, document={"deny": ["write_file"]}, actor=dana)
    assert saved.layer is not None and saved.layer.version == 1
    with pytest.raises(managed.NotAllowed, match="Only an admin of team infra"):
        managed.set_layer(team=infra, document={"deny": ["write_file"]}, actor=dana)
    with pytest.raises(managed.NotAllowed, match="Only an org admin"):
        managed.set_layer(team=None, document={"deny": ["write_file"]}, actor=dana, reason="x")
    assert not PolicyLayer.objects.filter(team=infra).exists()
    assert managed.layer_version(None) == 0


def test_pending_proposals_are_listed_by_the_command(tmp_path: Path, settings: Any) -> None:
    settings.HARNESS_POLICY_TWO_PERSON = True
    make_user("erin-org-admin", groups=("admin",))
    change = _file(tmp_path, {"ask": ["write_file"]})
    _run("set_rules", "--org", change, "--reason", "ask writes", "--by", "erin-org-admin")
    listing = _run("accept_policy_proposal")
    assert "by erin-org-admin" in listing and "ask writes" in listing and "on v0" in listing
