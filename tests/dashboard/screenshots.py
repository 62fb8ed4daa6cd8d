"""`make screenshots`: docs/dashboard.md's pictures of a session's timeline, from a real
demo run.

Runs `manage.py run_demo --auto-approve` in a throwaway data directory (the embedded
default: SQLite and a Redis of its own), so the pictures show the demo agent's real calls
as the real pipeline decided them and the demo's reviewer approved them; signs in as that
reviewer in Debian's chromium (Playwright) at a laptop's and a phone's size, takes the
timeline and one approved call opened, then stops the demo as Ctrl-C does.

    python -m tests.dashboard.screenshots docs/img
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
SIZES = {1366: 900, 390: 844}
REVIEWER = "reviewer"  # run_demo's reviewer, password the same
AUDIT_TRAIL = re.compile(r"Audit trail: (\S+)")
STARTUP = 300  # seconds for migrations, daphne, two workers and the demo's twelve calls


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_demo(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["HARNESS_DATA_DIR"] = str(data_dir)
    argv = [sys.executable, "manage.py", "run_demo", "--auto-approve", "--port", str(port)]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The demo's output, line by line (None at its end), read on a thread of its own."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def session_url(lines: queue.Queue[str | None]) -> str:
    """The demo session's timeline, once the demo has run and the server still serves."""
    url, seen = "", []
    deadline = time.monotonic() + STARTUP
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            raise SystemExit("run_demo ended early:\n" + "".join(seen[-40:]))
        seen.append(line)
        found = AUDIT_TRAIL.search(line)
        url = found.group(1) if found else url
        if line.startswith("Still serving") and url:
            return url
        if "UNEXPECTED" in line:
            raise SystemExit("A demo scenario did not end as expected:\n" + "".join(seen[-40:]))


def sign_in(page: Any, base: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#password-sign-in input[name=login]", REVIEWER)
    page.fill("#password-sign-in input[name=password]", REVIEWER)
    page.click("#password-sign-in button[type=submit]")
    page.wait_for_load_state()


def take(browser: Any, url: str, out: Path, width: int) -> None:
    """The timeline, and the demo's approved write opened, at `width`."""
    base = url.split("/audit/")[0]
    context = browser.new_context(viewport={"width": width, "height": SIZES[width]})
    try:
        page = context.new_page()
        sign_in(page, base)
        page.goto(url)
        page.locator("#live-state.on").wait_for(timeout=10000)  # the socket is open
        page.screenshot(path=str(out / f"timeline-{width}.png"), full_page=True)
        write = page.locator("article.audit-call", has_text="write_file").first
        write.locator("summary").click()
        write.locator("text=What the reviewer saw").wait_for(timeout=5000)
        page.screenshot(path=str(out / f"timeline-open-{width}.png"), full_page=True)
    finally:
        context.close()


def stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C: run_demo stops daphne, its workers and its Redis itself."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="Where the pictures go (docs/img).")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="harness-demo-"))
    proc = start_demo(data_dir, free_port())
    try:
        url = session_url(lines_of(proc))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for width in SIZES:
                    take(browser, url, out, width)
            finally:
                browser.close()
    finally:
        stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"Timeline pictures of {url} written to {out}.")


if __name__ == "__main__":
    main()
