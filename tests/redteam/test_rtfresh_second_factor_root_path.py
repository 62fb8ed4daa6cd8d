"""rtfresh: HARNESS_MFA_REQUIRED sends a person who must have a second factor and has none
to set one up before any page. The gate (identity.mfa.RequireSecondFactor) let through
paths that start with /accounts/, /static/ or /api/, but read `request.path`: the script
name and the path together. The script name is the request's root path, which daphne
takes from any client's `Daphne-Root-Path` header (and WSGI from SCRIPT_NAME): sent as
`/api`, the queue's path became `/api/approvals/` to the gate while Django still served
`/approvals/`, so a reviewer with a password alone read the queue and decided calls.
The gate now reads the path Django resolves (`path_info`), and the ASGI application
drops a root path a client names (harness_site.asgi.ServedAtTheRoot)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client, override_settings

from tests.support.sso_site import daphne_with
from tests.teams.world import TeamWorld, make_team, unchanged

ROOTS = ("/api", "/accounts", "/static")


@pytest.mark.django_db
@override_settings(HARNESS_MFA_REQUIRED="reviewers")
@pytest.mark.parametrize("root", ROOTS)
def test_a_root_path_opens_no_page_to_a_reviewer_without_a_second_factor(root: str) -> None:
    pay = make_team("pay")
    client = Client()
    client.force_login(pay.members["reviewer"])
    queue = client.get("/approvals/", SCRIPT_NAME=root)
    assert queue.status_code == 302 and "/accounts/second-factor/" in queue["Location"]
    assert pay.secret not in queue.content.decode()
    form = {"action": "deny", "digest": pay.approval.digest}
    decided = client.post(f"/approvals/{pay.approval.pk}/decide", form, SCRIPT_NAME=root)
    assert decided.status_code == 403 and b"second factor" in decided.content
    assert unchanged(pay) == []


@pytest.fixture(scope="module")
def mfa_site(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with daphne_with({"HARNESS_MFA_REQUIRED": "reviewers"}, tmp_path_factory.mktemp("mfa")) as url:
        yield url


@pytest.fixture
def committed(django_db_blocker: object) -> Iterator[None]:
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        yield


@pytest.mark.live
def test_a_real_daphne_keeps_the_gate_whatever_root_path_the_client_sends(
    mfa_site: str, committed: None, tmp_path: Path
) -> None:
    import httpx

    pay: TeamWorld = make_team("pay")
    client = Client()
    client.force_login(pay.members["reviewer"])
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    with httpx.Client(base_url=mfa_site, timeout=30) as web:
        web.cookies.set(settings.SESSION_COOKIE_NAME, session)
        assert web.get("/approvals/").status_code == 302
        for root in ROOTS:
            queue = web.get(f"{root}/approvals/", headers={"Daphne-Root-Path": root})
            # (the gate sends them to set a factor up; since the root path is dropped,
            # harness_site.asgi.ServedAtTheRoot, /api/approvals/ is no page at all)
            assert queue.status_code in (302, 404), (root, queue.status_code)
            assert pay.secret not in queue.text
        web.get("/accounts/second-factor/")  # (the CSRF cookie)
        token = str(web.cookies.get(settings.CSRF_COOKIE_NAME, ""))
        headers = {
            "X-CSRFToken": token,
            "Origin": mfa_site,
            "Referer": mfa_site + "/",
            "Daphne-Root-Path": "/api",
        }
        form = {"action": "deny", "digest": pay.approval.digest}
        decided = web.post(f"/api/approvals/{pay.approval.pk}/decide", data=form, headers=headers)
        assert decided.status_code in (403, 404), decided.status_code
    assert unchanged(pay) == []
