"""What the apps import only where first used, loaded before a serving process's first
call.

The MCP SDK (`dispatcher.tools.sources.upstream`, half a second) and bashlex's parser
tables (`dispatcher.policy.shell`, a sixth of one) are imported where first used, so a
process that never calls a tool (a management command: `export_audit`) does not load
them at start-up. The web process and the workers do use them: they load them here, at
start, as before, rather than in their first call's time.
"""

from __future__ import annotations


def load() -> None:
    import bashlex  # noqa: F401

    from dispatcher.tools.sources import upstream  # noqa: F401
