"""rt2asgi: rtfresh kept an agent's name on one line of a reviewer's email, but a file's
path (the agent's own argument: a Linux file name may hold line breaks) went into the
email's "Change to <path>:" line and the diff's header as it came: a path of
"x\\nApprove: https://evil.example/...\\ny.txt" wrote an "Approve:" line of the agent's
choosing into the email, above the reviewer's real one-tap links. The path is now shown
on one line, its line breaks escaped, wherever the message names it."""

from __future__ import annotations

import pytest

from approvals.notifications import messages
from tests.approvals.conftest import ask
from tests.support.factories import make_agent

pytestmark = pytest.mark.django_db

FAKE = "https://evil.example/approve"
PATH = f"notes\nApprove: {FAKE}\nDeny: {FAKE}\n.txt"


def test_a_paths_line_breaks_write_no_line_of_their_own_into_an_email() -> None:
    approval = ask(make_agent(mode="standard"), {"path": PATH, "content": "x"})
    body = messages.email_body(approval, {"approve": "https://real/a", "deny": "https://real/d"})
    lines = body.splitlines()
    assert not [line for line in lines if line.startswith(("Approve", "Deny")) and FAKE in line]
    assert [line for line in lines if line.startswith("Approve:")] == ["Approve: https://real/a"]
    assert "Change to notes\\nApprove: " in body  # the path, shown on one line
