"""The battery's figures: every row records what it measured against its pass criterion.

Each pytest run that ran battery tests writes them to var/battery/figures-<timestamp>.json
(`write`); `python -m tests.battery.report` prints the table of the latest file.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "var" / "battery"

FIGURES: list[dict[str, Any]] = []
SEEDS: dict[str, int] = {}


def scale() -> str:
    value = os.environ.get("HARNESS_BATTERY_SCALE", "ci").strip().lower()
    return "full" if value == "full" else "ci"


def record(row: str, figure: str, value: Any, criterion: str, passed: bool, **detail: Any) -> bool:
    """Note one figure (and print it, so a failing run still shows what it measured)."""
    entry = {
        "id": row,
        "figure": figure,
        "value": value,
        "criterion": criterion,
        "passed": bool(passed),
        "scale": scale(),
        **({"detail": detail} if detail else {}),
    }
    FIGURES.append(entry)
    _flush()
    print(f"FIGURE {row}: {figure} = {value} ({criterion}) {'PASS' if passed else 'FAIL'}")
    return bool(passed)


def skipped(row: str, figure: str, why: str) -> None:
    """A row that could not run here (a missing feature or backend): in the table, marked."""
    FIGURES.append(
        {
            "id": row,
            "figure": figure,
            "value": None,
            "criterion": why,
            "passed": None,
            "scale": scale(),
        }
    )
    _flush()


def machine() -> dict[str, str]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=False)
    return {
        "nproc": str(os.cpu_count()),
        "uname": uname.stdout.strip(),
        "cpu": cpu,
        "python": platform.python_version(),
    }


_RUN: dict[str, Any] = {}


def begin(backend: str, started: float) -> None:
    """Name this run's file; every figure is written to it as soon as it is recorded, so
    an interrupted run keeps what it measured."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
    _RUN.update(
        backend=backend,
        started=started,
        path=OUT_DIR / f"figures-{stamp}-{backend}-{os.getpid()}.json",
    )


def _flush() -> None:
    if _RUN:
        write(_RUN["backend"], _RUN["started"])


def write(backend: str, started: float) -> Path | None:
    if not FIGURES:
        return None
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
    path = _RUN.get("path") or OUT_DIR / f"figures-{stamp}-{backend}-{os.getpid()}.json"
    document = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scale": scale(),
        "backend": backend,
        "seconds": round(time.time() - started, 1),
        "machine": machine(),
        "seeds": SEEDS,
        "figures": FIGURES,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path
