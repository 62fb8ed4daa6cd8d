"""A live Harness that signs agents in: a daphne beside the session's live stack (same
database, Redis and Celery worker) whose outbound door trusts the test CA of a client
metadata document server on another loopback port; and a person who consents over HTTP."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.live import LiveStack, daphne, free_port
from tests.support.oauth import DocumentServer

_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')
_FIRST_TEAM = re.compile(r'<select name="team"[^>]*>\s*<option value="(\d+)"')


@dataclass
class OAuthStack:
    url: str
    documents: DocumentServer
    env: dict[str, str]


@contextmanager
def oauth_daphne(
    live: LiveStack, documents: DocumentServer, tmp: Path, **extra: str
) -> Iterator[OAuthStack]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **live.env,
        "HARNESS_OUTBOUND_ALLOW": "127.0.0.1",
        "HARNESS_OUTBOUND_CA_FILE": str(documents.ca_file),
        "HARNESS_PUBLIC_URL": url,
        **extra,
    }
    with daphne(env, port, tmp / f"oauth-daphne-{port}.log"):
        yield OAuthStack(url=url, documents=documents, env=env)


class Person:
    """Someone signed in to Harness over HTTP (the sign-in form, allauth's, with its CSRF token)."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30)
        page = self.http.get("/accounts/login/")
        token = dict(_HIDDEN.findall(page.text))["csrfmiddlewaretoken"]
        answer = self.http.post(
            "/accounts/login/",
            data={"login": username, "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": base_url + "/accounts/login/"},
        )
        assert answer.status_code == 302, answer.text[:500]

    def consent(self, authorization_url: str, mode: str = "", allow: bool = True) -> str:
        """Open the authorization URL, approve (or deny) on the consent page; the URL the
        browser is sent back to (the client's redirect URI with code, state and iss)."""
        page = self.http.get(authorization_url)
        assert page.status_code == 200, page.text[:1000]
        self.last_page = page.text
        form = {name: html.unescape(value) for name, value in _HIDDEN.findall(page.text)}
        if mode:
            form["mode"] = mode
        if team := _FIRST_TEAM.search(page.text):
            form["team"] = team.group(1)
        if allow:
            form["allow"] = "Authorize"
        path = urlsplit(authorization_url).path
        answer = self.http.post(path, data=form, headers={"Referer": str(page.url)})
        assert answer.status_code == 302, answer.text[:1000]
        return answer.headers["location"]

    def approve_device(self, user_code: str, mode: str = "") -> str:
        page = self.http.get("/oauth/device/")
        token = dict(_HIDDEN.findall(page.text))["csrfmiddlewaretoken"]
        data = {"user_code": user_code, "action": "accept", "csrfmiddlewaretoken": token}
        if team := _FIRST_TEAM.search(page.text):
            data["team"] = team.group(1)
        if mode:
            data["mode"] = mode
        answer = self.http.post("/oauth/device/", data=data, headers={"Referer": str(page.url)})
        assert answer.status_code == 200, answer.text[:1000]
        return answer.text


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def team_member() -> Any:
    """A person who is a member of a new team (consent needs one), committed."""
    from teams.services import add_member, create_team
    from tests.support.factories import make_user, unique

    person = make_user(unique("dev"))
    team = create_team(name=unique("team"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    return person
