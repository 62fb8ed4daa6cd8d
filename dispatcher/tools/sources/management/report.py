"""How the server commands print what a registration or refresh found."""

from typing import Any

from dispatcher.tools.sources.services import RefreshReport

LINES = {
    "unchanged": "offered as pinned",
    "returned": "offered again (back to its pinned definition)",
    "changed": "HELD: its definition changed; an admin must review it on the Tools page",
    "new": "HELD: new upstream; an admin must review it on the Tools page",
    "missing": "MISSING: no longer listed upstream",
    "unusable": "not offered (see list_mcp_servers)",
}


def write_report(out: Any, report: RefreshReport) -> None:
    for key, text in LINES.items():
        for name in getattr(report, key):
            out.write(f"  {report.server}__{name}: {text}")
