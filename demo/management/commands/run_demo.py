"""`manage.py run_demo`: the whole stack on one machine, a demo agent, and a clean Ctrl-C.

Migrates, creates the demo reviewer (reviewer / reviewer) and a demo agent with a fresh
token, starts daphne and a Celery worker with beat (each in its own process group), runs
the scripted demo agent, then keeps serving until Ctrl-C or SIGTERM. On the way out it
stops every process it started and, when it started it, the embedded Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import roles
from demo import agent as demo_agent
from dispatcher import agents
from dispatcher.management.commands._hook_settings import DEFAULT_WAIT
from dispatcher.management.commands.claude_code_settings import hook_settings
from dispatcher.models import Agent
from dispatcher.policy import profiles
from dispatcher.tools.sources import services as sources
from dispatcher.tools.sources.models import McpServer

ROOT = Path(__file__).resolve().parents[3]
REVIEWER = "reviewer"
OWNER = "demo"
AGENT_NAME = "demo-agent"
HOOK_SCRIPT = "dispatcher/gateways/hook_command.py"  # stdlib only: runs without installing
DEMO_MCP_SERVER = "demo"


class Stop(Exception):
    """Raised by the signal handlers to unwind into the cleanup."""


def _starttime(pid: int | str) -> int | None:
    """A process's start time in clock ticks since boot (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def started_embedded_redis(data_dir: Path) -> bool:
    """Whether this process started the embedded Redis (settings did, on import).

    The server daemonizes, so it is not our child: compare its start time with ours.
    """
    try:
        pid = int((data_dir / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    theirs, ours = _starttime(pid), _starttime("self")
    return theirs is not None and ours is not None and theirs >= ours


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Command(BaseCommand):
    help = "Start daphne, a Celery worker and the demo agent; Ctrl-C stops everything."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-wait", action="store_true", help="Stop everything once the demo has run."
        )
        parser.add_argument(
            "--auto-approve",
            action="store_true",
            help=f"Approve the demo's pending calls as '{REVIEWER}' instead of in the browser.",
        )

    def handle(self, *args: Any, port: int, no_wait: bool, auto_approve: bool, **opts: Any) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        data_dir = Path(settings.DATA_DIR)
        own_redis = bool(getattr(settings, "EMBEDDED_REDIS", False)) and started_embedded_redis(
            data_dir
        )
        if _port_open(port):
            raise CommandError(f"Port {port} is in use; pass --port.")

        def on_signal(signum: int, frame: object) -> None:
            raise Stop(signal.Signals(signum).name)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        ok = True
        try:
            url, token, logs = self.start(data_dir, own_redis, port)
            ok = demo_agent.run(
                url,
                token,
                out=self.stdout,
                auto_approve_as=REVIEWER if auto_approve else None,
            )
            self.connect_claude_code(url, token, data_dir)
            if not no_wait:
                self.serve(url, token, logs)
        except Stop as exc:
            self.say(f"\n{exc}: stopping.")
        finally:
            self.shutdown(data_dir if own_redis else None)
            for s, handler in previous.items():
                signal.signal(s, handler)
        if not ok:
            raise CommandError("Some demo scenarios did not end as expected.")

    def start(self, data_dir: Path, own_redis: bool, port: int) -> tuple[str, str, Path]:
        """Migrate, make the demo's people and agent, start daphne and both workers: the
        URL, the demo agent's token and where the logs go."""
        self.say(f"Data directory: {data_dir}")
        if getattr(settings, "EMBEDDED_REDIS", False):
            who = "started by run_demo" if own_redis else "already running, left alone"
            pidfile = data_dir / "redis.pid"
            pid = pidfile.read_text().strip() if pidfile.exists() else "?"
            self.say(f"Embedded Redis: {settings.REDIS_URL} (pid {pid}, {who})")
        call_command("migrate", interactive=False, verbosity=0)
        token, workspace = self.prepare()
        logs = data_dir / "demo-logs"
        logs.mkdir(parents=True, exist_ok=True)
        url = f"http://127.0.0.1:{port}"
        self.start_daphne(port, logs)
        # Two lanes, as in production (docs/operations.md): tools, and the rest.
        self.start_worker(logs, data_dir, settings.CELERY_TASK_DEFAULT_QUEUE)
        self.start_worker(logs, data_dir, settings.HARNESS_CELERY_BACKGROUND_QUEUE)
        self.say("")
        self.say(f"Harness is up at {url}")
        self.say(f"  Reviewer dashboard: {url}/approvals/  (sign in as reviewer / reviewer)")
        self.say(f"  Demo agent workspace: {workspace}")
        self.say(f"  Logs: {logs}")
        self.say("")
        return url, token, logs

    def serve(self, url: str, token: str, logs: Path) -> None:
        """Keep serving until Ctrl-C (Stop) or until a process exits."""
        self.say("")
        self.say(f"Still serving {url} (the demo agent token: {token}).")
        self.say("Press Ctrl-C to stop everything.")
        while True:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited ({proc.returncode}); see {logs}.")
            time.sleep(1)

    def say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    # --- Set-up ---------------------------------------------------------------------------

    def prepare(self) -> tuple[str, str]:
        """The demo reviewer and a demo agent with a fresh token; returns (token, workspace)."""
        users = get_user_model()
        reviewer, _ = users.objects.get_or_create(username=REVIEWER)
        reviewer.set_password(REVIEWER)
        reviewer.is_staff = True
        reviewer.is_active = True
        reviewer.save()
        # The demo login has every role, so that one sign-in shows every screen.
        for role in sorted(roles.ROLES):
            roles.grant_role(user=reviewer, role=role, actor="run_demo")
        owner, _ = users.objects.get_or_create(username=OWNER)
        if not owner.has_usable_password():
            owner.set_unusable_password()
            owner.save()
        # Standard mode, and one step-up rule: approving that write needs a passkey.
        profiles.update_profile(
            user=owner,
            mode="standard",
            allow=[],
            ask=[demo_agent.STEP_UP_RULE],
            deny=[],
            actor="run_demo",
        )
        for old in Agent.objects.filter(owner=owner, name=AGENT_NAME, is_active=True):
            agents.revoke_agent(agent=old, actor="run_demo")
        self.register_demo_mcp_server()
        workspace = Path(settings.DATA_DIR) / "demo-workspace"
        agent, token = agents.create_agent(
            owner=owner, name=AGENT_NAME, workspace=str(workspace), actor="run_demo"
        )
        self.say(
            f"Reviewer login: {REVIEWER} / {REVIEWER}; demo agent '{agent.name}' "
            f"(prefix {agent.token_prefix}) owned by '{OWNER}', standard mode."
        )
        return token, agent.workspace

    def connect_claude_code(self, url: str, token: str, data_dir: Path) -> None:
        """Write Claude Code settings for the demo and print the command that uses them."""
        hook = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / HOOK_SCRIPT))}"
        path = data_dir / "claude-code-demo-settings.json"
        path.write_text(json.dumps(hook_settings(url, hook, DEFAULT_WAIT), indent=2) + "\n")
        self.say("")
        self.say("Connect a local Claude Code to this demo (from a project directory):")
        self.say(
            f"  mkdir -p .claude && cp {shlex.quote(str(path))} .claude/settings.local.json "
            f"&& HARNESS_TOKEN={token} claude"
        )
        self.say("  Its tool calls then appear in the reviewer dashboard (docs/claude-code.md).")

    def register_demo_mcp_server(self) -> None:
        """The bundled upstream MCP server, registered afresh (its tools pinned as they are)."""
        if McpServer.objects.filter(name=DEMO_MCP_SERVER).exists():
            sources.remove_server(name=DEMO_MCP_SERVER, actor="run_demo")
        script = ROOT / "demo" / "mcp_server.py"
        _, report = sources.add_server(
            name=DEMO_MCP_SERVER,
            actor="run_demo",
            command=[sys.executable, str(script)],
            trust_annotations=True,
            timeout=30,
        )
        tools = ", ".join(f"{DEMO_MCP_SERVER}__{name}" for name in report.unchanged)
        self.say(f"Upstream MCP server '{DEMO_MCP_SERVER}' registered: {tools}.")

    # --- Processes ------------------------------------------------------------------------

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HARNESS_DATA_DIR"] = str(settings.DATA_DIR)
        env["HARNESS_CELERY_QUEUE"] = settings.CELERY_TASK_DEFAULT_QUEUE
        env["HARNESS_CELERY_BACKGROUND_QUEUE"] = settings.HARNESS_CELERY_BACKGROUND_QUEUE
        env["DJANGO_SETTINGS_MODULE"] = os.environ.get(
            "DJANGO_SETTINGS_MODULE", "harness_site.settings"
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def spawn(self, name: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: Ctrl-C reaches only us
            )
        self.procs.append((name, proc))
        self.say(f"Started {name} (pid {proc.pid}); log {log}")
        return proc

    def start_daphne(self, port: int, logs: Path) -> None:
        log = logs / "daphne.log"
        proc = self.spawn(
            "daphne",
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "harness_site.asgi:application",
            ],
            log,
        )
        deadline = time.monotonic() + 60
        while not _port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CommandError(f"daphne did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def start_worker(self, logs: Path, data_dir: Path, queue: str) -> None:
        """A worker on one lane; the background lane's also runs beat (its jobs go there)."""
        background = queue == settings.HARNESS_CELERY_BACKGROUND_QUEUE
        log = logs / ("worker-background.log" if background else "worker.log")
        start = log.stat().st_size if log.exists() else 0
        # Three execution processes: HARNESS_MAX_RUNNING_PER_OWNER's default leaves one of
        # them for another person, so the demo's person runs two calls at once.
        processes = "2" if background else "3"
        argv = [sys.executable, "-m", "celery", "-A", "harness_site", "worker", "-c", processes]
        argv += ["-l", "INFO", "-Q", queue, "-n", f"{queue}@%h"]
        argv += ["--without-gossip", "--without-mingle"]
        if background:
            argv += ["-B", "-s", str(data_dir / "celerybeat-schedule")]
        proc = self.spawn(f"celery worker ({queue})", argv, log)
        deadline = time.monotonic() + 60
        while "ready." not in log.read_bytes()[start:].decode(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CommandError(f"the Celery worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def shutdown(self, redis_dir: Path | None) -> None:
        """Terminate every process group we started, kill what lingers, stop our Redis."""
        # A second Ctrl-C during the cleanup must not abort it.
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{name} did not stop in time; killing it.")
            # Whatever is left in its group (pool children, beat) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.say(f"Stopped {name} (pid {proc.pid}).")
        if redis_dir is not None:
            from harness_site import embedded_redis

            embedded_redis.stop(redis_dir)
            self.say("Stopped the embedded Redis.")
