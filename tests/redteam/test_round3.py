"""Red-team, round 3: attacks on b73677b (a preview's program runs under `timeout
--foreground`, so stopping a preview early kills it) and ec436be (a team admin's analytics
suggest rules only for people wholly within their teams). Each test is an attack; it
passes when the attack fails."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.utils import timezone

from dispatcher import agents
from dispatcher.models import Agent, AgentSession, ToolCall
from dispatcher.policy import managed, profiles
from dispatcher.policy.profiles import profile_for
from dispatcher.tools import preview, sandbox, workspace_lock
from dispatcher.tools.run_command import scrubbed_environment
from teams.models import Team
from teams.services import add_member
from tests.support.factories import make_user, unique
from tests.teams.world import TeamWorld, make_team, org_client
from tests.tools.support import require_bwrap

# --- Previews: nothing a previewed program starts outlives the preview ------------------

LIMIT = 3  # HARNESS_PREVIEW_TIMEOUT in these attacks
SLACK = 2 + 4  # `timeout -k 2`, then the tar, the cgroup's removal and a busy machine


@pytest.fixture
def workspace(settings: Any, tmp_path: Path) -> Iterator[Path]:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW_TIMEOUT = LIMIT
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    root = tmp_path / "workspaces"
    settings.HARNESS_WORKSPACE_ROOT = root
    mine = root / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("alpha\nbeta\n")
    (mine / "src").mkdir()
    (mine / "src" / "a.py").write_text("print('a')\n")
    yield mine


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    found: dict[str, tuple[int, int, bytes]] = {}
    for top, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(top, name)
            info = path.lstat()
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, data)
    return found


def _marked(mark: str) -> list[int]:
    """Processes of this machine whose command line or environment holds `mark`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                if mark.encode() in Path(f"/proc/{entry}/{part}").read_bytes():
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


def _gone(mark: str, within: float = 10) -> bool:
    """Whether every process marked `mark` is gone within `within` seconds (a killed
    process disappears once the kernel has reaped it)."""
    deadline = time.monotonic() + within
    while _marked(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _attack(workspace: Path, script: str, mark: str) -> tuple[preview.Effect, float]:
    """Preview `sh -c script` (RT3MARK=mark in its environment, the mark in its argv);
    returns the effect and the wall-clock seconds the preview took to return."""
    before = _tree(workspace)
    started = time.monotonic()
    with workspace_lock.held(workspace):
        effect = preview.run_preview(
            ["env", f"RT3MARK={mark}", "sh", "-c", script, mark],
            cwd=workspace,
            workspace=workspace,
            env=scrubbed_environment(workspace),
        )
    took = time.monotonic() - started
    preview.discard(effect.store)
    assert _tree(workspace) == before  # the preview wrote nothing of the workspace
    return effect, took


def _mark() -> str:
    return f"rt3{uuid.uuid4().hex[:12]}"


# Each: a program that tries to keep running past its preview. Those whose main process
# exits at once end the preview at once (bwrap's pid 1 ends, and the PID namespace with
# it); the others run into the time limit.
ESCAPES = {
    "ignores_sigterm_and_sighup": (
        "trap '' TERM HUP INT QUIT USR1; while :; do sleep 0.2; done",
        "time",
    ),
    "python_ignores_every_catchable_signal": (
        "exec python3 -c 'import signal,time\n"
        "for s in signal.valid_signals():\n"
        "    try: signal.signal(s, signal.SIG_IGN)\n"
        "    except (OSError, ValueError): pass\n"
        "while True: time.sleep(0.2)'",
        "time",
    ),
    "setsid_fork_then_exit": ("setsid -f sh -c 'trap \"\" TERM HUP; sleep 60'; exit 0", ""),
    "setsid_fork_then_wait": ("setsid -f sh -c 'trap \"\" TERM HUP; sleep 60'; sleep 60", "time"),
    "nohup_background_then_exit": ("nohup sleep 60 >/dev/null 2>&1 & exit 0", ""),
    "subshell_background_keeps_stdout": ("(trap '' TERM HUP; sleep 60) & exit 0", ""),
    "python_double_fork_daemon": (
        "python3 -c 'import os,time\n"
        "if os.fork(): os._exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): os._exit(0)\n"
        'os.chdir("/")\n'
        "for fd in range(3): os.close(fd)\n"
        "time.sleep(60)'; sleep 60",
        "time",
    ),
    "exec_under_another_name": ("exec bash -c 'exec -a innocent sleep 60'", "time"),
    "blocks_reading_a_fifo": ("mkfifo /tmp/f; cat /tmp/f", "time"),
    "blocks_reading_stdin": ("cat; sleep 60", "time"),
    "closes_stdout_and_keeps_running": ("exec >&- 2>&-; trap '' TERM; sleep 60", "time"),
    "stops_itself": ("sleep 60 & kill -STOP $$; sleep 60", "time"),
    "output_past_the_cap_then_ignores_sigterm": (
        "trap '' TERM HUP; head -c 9000000 /dev/zero; sleep 60",
        "output",
    ),
    "daemon_writes_past_the_cap_after_the_parent_exited": (
        "setsid -f sh -c 'sleep 0.3; head -c 9000000 /dev/zero; sleep 60'; sleep 60",
        "output",
    ),
    # (the shell's own `sleep` may find the pids limit reached and end it at once, "Cannot
    # fork": the sandbox ends with it; either way nothing outlives the preview)
    "fork_bomb_under_the_pids_limit": (
        "b() { b | b & }; b; sleep 60",
        "time or exit",
    ),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_a_previewed_program_does_not_outlive_its_preview(workspace: Path, name: str) -> None:
    script, limit = ESCAPES[name]
    mark = _mark()
    effect, took = _attack(workspace, script, mark)
    if limit == "time":
        assert effect.limit == "time", effect
        assert took < LIMIT + SLACK, took
    elif limit == "time or exit":
        assert effect.limit in ("time", ""), effect
        assert took < LIMIT + SLACK, took
    elif limit == "output":
        assert effect.limit == "output", effect
        assert took < LIMIT, took  # stopped for its output at once, not at the time limit
    else:
        assert effect.limit == "", effect
        assert took < LIMIT, took  # the main process's exit ends the sandbox at once
    assert _gone(mark), (name, _marked(mark))


def test_a_background_child_of_a_normal_run_is_killed_with_it(workspace: Path) -> None:
    """sandbox.run (run_command's real run) is unaffected: a daemon it starts dies when
    the program exits, and a program that ignores SIGTERM dies at the time limit."""
    mark = _mark()
    env = scrubbed_environment(workspace)
    limits = sandbox.Limits(timeout=20, output_chars=10_000)
    argv = ["env", f"RT3MARK={mark}", "sh", "-c", "setsid -f sleep 60; echo started", mark]
    done = sandbox.run(argv, workspace=workspace, cwd=workspace, env=env, limits=limits)
    assert (done.returncode, done.output.strip()) == (0, "started")
    assert _gone(mark)

    mark = _mark()
    argv = ["env", f"RT3MARK={mark}", "sh", "-c", "trap '' TERM; sleep 60", mark]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        sandbox.run(
            argv,
            workspace=workspace,
            cwd=workspace,
            env=env,
            limits=sandbox.Limits(timeout=2, output_chars=100),
        )
    assert time.monotonic() - started < 2 + SLACK
    assert _gone(mark)

    (workspace / "out.txt").unlink(missing_ok=True)
    done = sandbox.run(
        ["sh", "-c", "echo written > out.txt; cat out.txt"],
        workspace=workspace,
        cwd=workspace,
        env=env,
        limits=limits,
    )
    assert done.output.strip() == "written"
    assert (workspace / "out.txt").read_text() == "written\n"  # a real run writes


def test_a_preview_that_ends_normally_still_reports_its_exit(workspace: Path) -> None:
    """--foreground changed nothing of a program that ends by itself: its status, its
    output and its effect are as before."""
    mark = _mark()
    effect, took = _attack(workspace, "echo hi; echo new > made.txt; exit 3", mark)
    assert (effect.exit_status, effect.limit, effect.output.strip()) == (3, "", "hi")
    assert [c["path"] for c in effect.changes] == ["made.txt"]
    assert took < LIMIT


def test_the_scan_sees_a_previewed_program_while_it_runs(workspace: Path) -> None:
    """The attacks above mean something: their mark is found while the program runs (as
    the sandbox user, in its own PID namespace), and gone once the preview has returned."""
    mark = _mark()
    seen: list[list[int]] = []

    def watch() -> None:
        deadline = time.monotonic() + LIMIT
        while time.monotonic() < deadline and not seen:
            if found := _marked(mark):
                seen.append(found)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    effect, took = _attack(workspace, "trap '' TERM; setsid -f sleep 60; sleep 60", mark)
    watcher.join()
    assert seen and seen[0], "the mark was never seen: the scan would find nothing"
    assert effect.limit == "time" and took < LIMIT + SLACK
    assert _gone(mark)


# --- Analytics: a team admin learns nothing of, and changes nothing for, an outsider -----

ANALYTICS = "/permissions/analytics/"
APPLY = "/permissions/analytics/apply"
ACTIVATE = "/permissions/analytics/activate"
FORM_USER = re.compile(r'name="user" value="(\d+)"')


def _agent_in(team: Team, owner: User) -> Agent:
    agent, _ = agents.create_agent(owner=owner, name=unique("rt3-agent"), team=team, actor="t")
    return agent


def _approved(agent: Agent, word: str, times: int = 6) -> str:
    """`times` calls of `agent` running `make <word>`, each approved by a reviewer 9 s
    after it asked (what analytics suggests an allow rule for); the rule it suggests."""
    session = AgentSession.objects.create(
        agent=agent,
        team_id=agent.team_id,
        mode="standard",
        workspace=str(django_settings.HARNESS_WORKSPACE_ROOT),
    )
    start = timezone.now() - timedelta(hours=3)
    calls, times_at = [], []
    for i in range(times):
        at = start + timedelta(minutes=i)
        times_at.append(at)
        calls.append(
            ToolCall(
                session=session,
                tool_use_id=uuid.uuid4().hex,
                name="run_command",
                raw_arguments="{}",
                arguments={"argv": ["make", word]},
                digest="",
                dialect="native",
                batch_id=uuid.uuid4(),
                batch_index=0,
                status="completed",
                decision="allow",
                decided_by="user:rt3-reviewer",
                created_at=at,
                queued_at=at + timedelta(seconds=9),
                finished_at=at + timedelta(seconds=10),
            )
        )
    ToolCall.objects.bulk_create(calls)
    for call, at in zip(calls, times_at, strict=True):  # created_at is auto_now_add
        ToolCall.objects.filter(pk=call.pk).update(created_at=at)
    return f"run_command(make {word})"


def _private_rules(person: User, marker: str) -> int:
    """Give `person` a rule only they have and a few versions; the version now."""
    for i in range(3):
        profiles.update_profile(
            user=person,
            mode="standard",
            allow=[f"read_file({marker}-{i}/**)"],
            ask=[],
            deny=[],
            actor="test",
        )
    return profile_for(person).version


def _superuser(name: str) -> User:
    person = make_user(name, mode="standard")
    User.objects.filter(pk=person.pk).update(is_superuser=True)
    return User.objects.get(pk=person.pk)


def _outsiders(pay: TeamWorld, infra: TeamWorld) -> dict[str, User]:
    """People with an agent in pay whose rules pay's admin does not manage."""
    both = make_user(unique("both"), mode="standard")
    add_member(team=pay.team, user=both, role="reviewer", actor="test")
    add_member(team=infra.team, user=both, role="auditor", actor="test")
    return {
        "org_admin": make_user(unique("boss"), groups=("admin",), mode="standard"),
        "org_reviewer": make_user(unique("orgrev"), groups=("reviewer",), mode="standard"),
        "superuser": _superuser(unique("root")),
        "member_of_two_teams": both,
        "owner_of_an_agent_in_another_team": infra.agent.owner,
    }


@pytest.mark.django_db
def test_a_team_admin_is_suggested_nothing_for_people_outside_their_teams() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    admin = pay.client("admin")
    outsiders = _outsiders(pay, infra)
    rules, versions, markers = {}, {}, {}
    for kind, person in outsiders.items():
        markers[kind] = f"rt3-private-{uuid.uuid4().hex[:8]}"
        versions[kind] = _private_rules(person, markers[kind])
        rules[kind] = _approved(_agent_in(pay.team, person), f"o{uuid.uuid4().hex[:6]}")
    own = make_user(unique("own"), mode="standard")
    add_member(team=pay.team, user=own, role="auditor", actor="test")
    own_rule = _approved(_agent_in(pay.team, own), f"p{uuid.uuid4().hex[:6]}")

    page = admin.get(ANALYTICS)
    assert page.status_code == 200
    text = page.content.decode()
    # The control: pay's own person gets their suggestion, with a click that works.
    assert set(FORM_USER.findall(text)) == {str(own.pk)}
    assert own_rule in text
    for kind, person in outsiders.items():
        assert markers[kind] not in text, kind  # their rules
        assert f"for {person.get_username()}</span>" not in text, kind  # no suggestion
        # pay's calls are still counted in the pattern list (pay's own traffic)...
        assert f"<td>{person.get_username()}</td><td><code>{rules[kind]}</code>" in text, kind
    # ...and no form carries an outsider's profile version.
    offered = re.findall(r'name="version" value="(\d+)"', text)
    assert offered == [str(profile_for(own).version)]

    for kind, person in outsiders.items():
        for version in (versions[kind], versions[kind] + 1, 0):
            form = {"user": person.pk, "rule": rules[kind], "action": "allow"}
            answer = admin.post(APPLY, {**form, "version": version})
            assert answer.status_code == 403, (kind, answer.status_code)
            assert "now v" not in answer.content.decode()  # no version read back
        after = profile_for(person)
        assert after.version == versions[kind], kind
        assert rules[kind] not in after.allow, kind
    # Someone of infra alone is not even found.
    stranger = infra.members["reviewer"]
    form = {"user": stranger.pk, "rule": "read_file", "action": "allow", "version": 0}
    assert admin.post(APPLY, form).status_code == 404
    assert admin.post(APPLY, {**form, "user": 10**9}).status_code == 404
    # The control: applying pay's own suggestion works.
    form = {"user": own.pk, "rule": own_rule, "action": "allow"}
    assert admin.post(APPLY, {**form, "version": profile_for(own).version}).status_code == 302
    assert own_rule in profile_for(own).allow


@pytest.mark.django_db
def test_an_agent_moved_to_another_team_leaves_its_calls_with_its_former_team() -> None:
    """Its calls are its sessions' team's record (AgentSession.team, docs/teams.md "Moving
    an agent"): counted in the former team's pattern list, never in the new team's, and
    suggested to no one whose reach holds the calls but not the person."""
    pay, infra = make_team("pay"), make_team("infra")
    mover = make_user(unique("mover"), mode="standard")
    agent = _agent_in(pay.team, mover)
    rule = _approved(agent, f"m{uuid.uuid4().hex[:6]}")
    assert f'name="user" value="{mover.pk}"' in pay.client("admin").get(ANALYTICS).content.decode()
    agents.transfer_agent(agent=agent, team=infra.team, actor="test")
    text = pay.client("admin").get(ANALYTICS).content.decode()
    assert rule in text  # pay's traffic, still pay's
    assert f'name="user" value="{mover.pk}"' not in text  # the mover is infra's now
    answer = pay.client("admin").post(
        APPLY, {"user": mover.pk, "rule": rule, "action": "allow", "version": 0}
    )
    assert answer.status_code in (403, 404) and rule not in profile_for(mover).allow
    # infra's admin manages the mover now, but reads none of the calls made for pay.
    theirs = infra.client("admin").get(ANALYTICS).content.decode()
    assert rule not in theirs and f'name="user" value="{mover.pk}"' not in theirs
    # An agent moved into pay: its history stays infra's.
    owner = infra.agent.owner
    incoming = _agent_in(infra.team, owner)
    moved_rule = _approved(incoming, f"i{uuid.uuid4().hex[:6]}")
    agents.transfer_agent(agent=incoming, team=pay.team, actor="test")
    assert moved_rule not in pay.client("admin").get(ANALYTICS).content.decode()
    assert moved_rule in infra.client("admin").get(ANALYTICS).content.decode()


def _log_only_everywhere(pay: TeamWorld, infra: TeamWorld) -> dict[str, tuple[str, str]]:
    """A log-only rule in infra's layer, in an infra person's rules and in an org admin's
    rules (layer, rule), each with a call that recorded it."""
    tag = uuid.uuid4().hex[:8]
    infra_rule = f"run_command(deploy-{tag} *)"
    managed.set_layer(
        team=infra.team,
        document={"deny": [{"rule": infra_rule, "log_only": True}]},
        actor="cli",
    )
    owner_rule = f"write_file(infra-owner-{tag}/**)"
    profiles.update_profile(
        user=infra.agent.owner,
        mode="standard",
        allow=[{"rule": owner_rule, "log_only": True}],
        ask=[],
        deny=[],
        actor="test",
    )
    boss = make_user(unique("boss"), groups=("admin",), mode="standard")
    boss_rule = f"write_file(boss-{tag}/**)"
    profiles.update_profile(
        user=boss,
        mode="standard",
        allow=[{"rule": boss_rule, "log_only": True}],
        ask=[],
        deny=[],
        actor="test",
    )
    own = make_user(unique("own"), mode="standard")
    add_member(team=pay.team, user=own, role="auditor", actor="test")
    own_rule = f"write_file(own-{tag}/**)"
    profiles.update_profile(
        user=own,
        mode="standard",
        allow=[{"rule": own_rule, "log_only": True}],
        ask=[],
        deny=[],
        actor="test",
    )
    return {
        "own": (f"user:{own.get_username()}", own_rule),
        "infra_layer": (f"team:{infra.team.name}", infra_rule),
        "infra_owner": (f"user:{infra.agent.owner.get_username()}", owner_rule),
        "org_admin": (f"user:{boss.get_username()}", boss_rule),
    }


@pytest.mark.django_db
def test_a_team_admins_analytics_show_no_other_teams_or_outsiders_log_only_rules() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    planted = _log_only_everywhere(pay, infra)
    text = pay.client("admin").get(ANALYTICS).content.decode()
    shown = [kind for kind, (layer, rule) in planted.items() if rule in text or layer in text]
    assert shown == ["own"]  # pay's own person's, and nobody else's
    # The organization's page shows them all.
    org = org_client("admin").get(ANALYTICS).content.decode()
    assert all(rule in org for _, rule in planted.values())


@pytest.mark.django_db
def test_a_team_admin_cannot_make_an_outsiders_log_only_rule_active() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    planted = _log_only_everywhere(pay, infra)
    admin = pay.client("admin")
    changed = []
    for kind in ("infra_owner", "org_admin"):
        layer, rule = planted[kind]
        person = User.objects.get(username=layer.removeprefix("user:"))
        before = profile_for(person).version
        admin.post(ACTIVATE, {"layer": layer, "action": "allow", "rule": rule})
        if profile_for(person).version != before or rule in profile_for(person).allow:
            changed.append(kind)
    assert changed == []
    # The control: pay's own person's log-only rule is pay's admin's to make active.
    layer, rule = planted["own"]
    admin.post(ACTIVATE, {"layer": layer, "action": "allow", "rule": rule})
    own = User.objects.get(username=layer.removeprefix("user:"))
    assert rule in profile_for(own).allow


@pytest.mark.django_db
def test_activate_tells_a_team_admin_nothing_of_outsiders() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    planted = _log_only_everywhere(pay, infra)
    admin = pay.client("admin")
    layer, rule = planted["infra_owner"]

    def told(layer: str, rule: str) -> tuple[int, str]:
        answer = admin.post(ACTIVATE, {"layer": layer, "action": "deny", "rule": rule}, follow=True)
        notices = re.findall(r'<p class="notice[^"]*">(.*?)</p>', answer.content.decode())
        return answer.status_code, " ".join(notices).replace(layer.removeprefix("user:"), "NAME")

    missing = rule + "-not-there"
    nobody = told(f"user:{unique('nobody')}", missing)
    somebody = told(layer, missing)
    assert nobody == somebody, (nobody, somebody)
    assert told(layer, rule) == nobody  # nor whether the rule is there
    assert nobody[0] in (403, 404)


@pytest.mark.django_db
def test_a_team_admin_cannot_make_another_teams_or_the_orgs_log_only_rule_active() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    planted = _log_only_everywhere(pay, infra)
    layer, rule = planted["infra_layer"]
    before = managed.layer_document(infra.team)
    pay.client("admin").post(ACTIVATE, {"layer": layer, "action": "deny", "rule": rule})
    assert managed.layer_document(infra.team) == before
    org_rule = f"run_command(org-{uuid.uuid4().hex[:6]} *)"
    managed.set_layer(
        team=None,
        document={"deny": [{"rule": org_rule, "log_only": True}]},
        actor="cli",
        reason="trial",
    )
    org_before = managed.layer_document(None)
    answer = pay.client("admin").post(
        ACTIVATE, {"layer": "org", "action": "deny", "rule": org_rule}, follow=True
    )
    assert "Only an org admin" in answer.content.decode()
    assert managed.layer_document(None) == org_before
