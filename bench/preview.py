"""Previews (issue 36): what a preview costs beside a plain sandboxed run, on a small and
a 10,000-file workspace, and what applying a previewed effect costs beside running the
command again.

    python -m bench.preview [--pairs 5] [--quick]      # also `make bench` (key: preview)

In-process, against the real sandbox (bwrap, as configured) and kernel overlayfs; no
database. Each pair runs B then P on the same workspace:

- S-P1 / S-P2 (small: 20 files; large: 10,000 files in 100 directories): B is the command
  run in the sandbox as run_command runs it (sandbox.run); P is its preview
  (preview.run_preview: namespace, overlay, the same sandbox, the effect read and hashed,
  the workspace fingerprinted). Target: a preview costs at most 3x a plain run on the
  small workspace (informational on the large one: the fingerprint walks every entry).
- S-P3 (large workspace): B is running the command again; P is applying its previewed
  effect (the fingerprint checked, the changed paths hashed, the upper layer written).
  Informational: for a command this small the fingerprint walk of 10,000 entries is most
  of the apply, and it is the price of "nothing changed since the preview".

The command writes one line to build/stamp and changes one 20-line file with sed -i, so
both sides do real work in the workspace. Disk per preview (the kept upper layer) is
printed with the medians.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.run import Result, machine_line, print_result

COMMAND = ["sh", "-c", "mkdir -p build && date +%N > build/stamp && sed -i s/line/LINE/ d0/f0.txt"]


def _workspace(root: Path, name: str, files: int) -> Path:
    workspace = root / name
    for i in range(files):
        directory = workspace / f"d{i // 100}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{i}.txt").write_text(f"line {i}\n" * 20)
    return workspace


def _timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return (time.perf_counter() - started) * 1000


def scenario_preview(pairs: int, quick: bool) -> list[Result]:
    """S-P1, S-P2, S-P3 (see the module docstring). Needs Django set up and the sandbox."""
    from django.conf import settings

    from dispatcher.tools import preview, preview_apply, sandbox, workspace_lock
    from dispatcher.tools.run_command import scrubbed_environment

    problem = sandbox.probe() if sandbox.mode() == "bwrap" else "HARNESS_SANDBOX is off"
    if problem is not None:
        print(f"\n  previews: skipped ({problem})")
        return []
    root = Path(tempfile.mkdtemp(prefix="harness-bench-preview-"))
    settings.HARNESS_WORKSPACE_ROOT = root
    limits = sandbox.Limits(timeout=30, output_chars=settings.HARNESS_OUTPUT_LIMIT)
    results = []
    disk: dict[str, list[int]] = {}
    try:
        for label, files in (("small (20 files)", 20), ("large (10,000 files)", 10_000)):
            workspace = _workspace(root, f"w{files}", files)
            env = scrubbed_environment(workspace)
            target = ("<= 3.0x", 3.0) if files == 20 else ("informational", 1e9)
            result = Result(
                f"S-P{1 if files == 20 else 2}: preview vs plain sandboxed run, {label}",
                "ms",
                False,
                *target,
            )

            def plain(w: Path = workspace, e: dict[str, str] = env) -> object:
                return sandbox.run(COMMAND, workspace=w, cwd=w, env=e, limits=limits)

            def previewed(
                w: Path = workspace, e: dict[str, str] = env, label: str = label
            ) -> object:
                with workspace_lock.held(w):
                    effect = preview.run_preview(COMMAND, cwd=w, workspace=w, env=e)
                disk.setdefault(label, []).append((Path(effect.store) / "upper.tar").stat().st_size)
                preview.discard(effect.store)
                return effect

            plain()
            previewed()  # warm both
            for _ in range(pairs):
                result.b.append(_timed(plain))
                result.p.append(_timed(previewed))
            result.notes.append(
                f"kept upper layer per preview: {statistics.median(disk[label]):,.0f} bytes "
                "(tar; the tmpfs it came from is gone with the namespace)"
            )
            results.append(result)
        large = root / "w10000"
        env = scrubbed_environment(large)
        apply_result = Result(
            "S-P3: apply a previewed effect vs run the command again, large (10,000 files)",
            "ms",
            False,
            "informational",
            1e9,
        )
        for _ in range(pairs):
            apply_result.b.append(
                _timed(
                    lambda: sandbox.run(COMMAND, workspace=large, cwd=large, env=env, limits=limits)
                )
            )
            with workspace_lock.held(large):
                effect: preview.Effect = preview.run_preview(
                    COMMAND, cwd=large, workspace=large, env=env
                )
                apply_result.p.append(_timed(functools.partial(preview_apply.apply, effect, large)))
            preview.discard(effect.store)
        results.append(apply_result)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    import django

    django.setup()
    print(machine_line())
    for result in scenario_preview(args.pairs, args.quick):
        print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
