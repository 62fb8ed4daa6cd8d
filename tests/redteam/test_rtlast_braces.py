"""rtlast: a client path's brace alternatives were bounded (1,024 of them, 256 KiB read)
only after each group's texts were made: a pattern of one group of N items followed by M
characters made N texts of M characters first. In a 256 KiB pattern (a hook's body may
hold 1 MiB), 100,000 items and 100,000 characters were 10 GB of memory in the web
process, from one call of any agent. The bound now holds before the texts are made."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from dispatcher.tools._paths import brace_alternatives, lexical_path_violation
from tests.support.coding_agent_hooks import GEMINI_URL, gemini_decision, gemini_tool, post, sid
from tests.support.factories import make_agent

# (scaled down to 200 MB before the fix: the machine is shared)
WIDE = "{" + ",".join(["a"] * 2000) + "}" + "x" * 100_000


def test_many_alternatives_before_a_long_text_are_refused_without_making_them() -> None:
    tracemalloc.start()
    try:
        began = time.thread_time()  # CPU, not wall time: the machine may be loaded
        assert brace_alternatives(WIDE) is None
        took = time.thread_time() - began
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000, peak
    assert took < 0.5, took
    reason = lexical_path_violation(WIDE, "/home/dev/project")
    assert reason is not None and "more brace alternatives than Harness checks" in reason
    # Under the bounds, as before.
    assert brace_alternatives("{a,b}" * 10) is not None
    assert brace_alternatives("{" + ",".join(["a"] * 1000) + "}" + "x" * 200) is not None


@pytest.mark.django_db
def test_the_hook_denies_such_a_pattern() -> None:
    fx = make_agent(mode="trusted")
    body = gemini_tool(sid(), "glob", {"pattern": WIDE})
    verdict, reason = gemini_decision(post(GEMINI_URL, fx, body))
    assert verdict == "deny", reason
    assert "more brace alternatives than Harness checks" in reason
