"""Print the table of the latest battery figures: `python -m tests.battery.report [FILE]`.

Exits 1 when a figure failed its pass criterion (skipped rows do not fail the table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.battery.figures import OUT_DIR


def latest() -> list[Path]:
    files = sorted(OUT_DIR.glob("figures-*.json"), key=lambda p: p.stat().st_mtime)
    return files[-1:]


def table(document: dict[str, object]) -> tuple[str, bool]:
    rows = [("id", "figure", "value", "pass criterion", "result")]
    ok = True
    for figure in document["figures"]:  # type: ignore[attr-defined]
        passed = figure["passed"]
        result = "skipped" if passed is None else ("pass" if passed else "FAIL")
        ok &= passed is not False
        rows.append(
            (figure["id"], figure["figure"], str(figure["value"]), figure["criterion"], result)
        )
    widths = [min(70, max(len(r[i]) for r in rows)) for i in range(5)]
    lines = [" | ".join(cell[:70].ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines), ok


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or latest()
    if not paths:
        print(f"No figures in {OUT_DIR}: run `make battery` first.")
        return 1
    ok = True
    for path in paths:
        document = json.loads(path.read_text())
        machine = document["machine"]
        print(
            f"{path.name}: {document['date']}, scale {document['scale']}, {document['backend']}, {document['seconds']} s"
        )
        print(f"machine: nproc {machine['nproc']}, {machine['cpu']}; {machine['uname']}")
        text, passed = table(document)
        print(text)
        ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
