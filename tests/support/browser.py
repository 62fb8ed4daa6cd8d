"""Debian's chromium for the browser tests, and signing in through the real form."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def login(page: object, base_url: str, username: str) -> None:
    """Sign in through the real login form (password is 'pw-' + username, see make_user)."""
    page.goto(f"{base_url}/accounts/login/")  # type: ignore[attr-defined]
    page.fill("#password-sign-in input[name=login]", username)  # type: ignore[attr-defined]
    page.fill("#password-sign-in input[name=password]", "pw-" + username)  # type: ignore[attr-defined]
    page.click("#password-sign-in button[type=submit]")  # type: ignore[attr-defined]
    page.wait_for_load_state()  # type: ignore[attr-defined]
