"""Client ID Metadata Documents fetched through Harness's one outbound door
(floor.outbound): the same address policy as every other request Harness makes (a
document at a loopback, private or metadata address is refused unless
HARNESS_OUTBOUND_ALLOW lists it), no redirects, the door's timeout, and a small cap on
the answer; a redirect URI in plain http is refused unless it is a loopback one.
django-oauth-toolkit validates what comes back (the document's client_id is
its own URL, a public client, its redirect URIs) and caches it."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from oauth2_provider.cimd import CIMDError, _effective_max_age, _validate_client_id_url
from oauth2_provider.settings import oauth2_settings

from floor import outbound


class DoorFetcher:
    """CIMD_METADATA_FETCHER: `fetch(client_id)` -> (metadata, max_age) or CIMDError."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        _validate_client_id_url(client_id)
        limit = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
        try:
            answer = outbound.send(
                "GET",
                client_id,
                headers={"Accept": "application/json"},
                timeout=float(oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS),
                limit=limit,
            )
        except outbound.OutboundRefused as refused:
            raise CIMDError(f"client metadata document not fetched: {refused}") from None
        if answer.status != 200:
            raise CIMDError(f"client metadata document answered HTTP {answer.status}")
        media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json" and not (
            media.startswith("application/") and media.endswith("+json")
        ):
            raise CIMDError("client metadata document is not JSON")
        try:
            data = json.loads(answer.body)
        except ValueError:
            raise CIMDError("client metadata document is not valid JSON") from None
        if not isinstance(data, dict):
            raise CIMDError("client metadata document is not a JSON object")
        uris = data.get("redirect_uris")
        for uri in uris if isinstance(uris, list) else []:
            if isinstance(uri, str) and not redirect_allowed(uri):
                raise CIMDError(
                    f"client metadata document names the redirect URI {uri[:200]!r}: a "
                    "redirect must be https, or http on the loopback interface (127.0.0.1, "
                    "[::1], localhost)"
                )
        return data, _effective_max_age(answer.headers.get("cache-control"))


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def redirect_allowed(uri: str) -> bool:
    """https anywhere; plain http only to the loopback interface (RFC 8252 7.3, RFC 9700
    2.6): an authorization code never crosses a network in the clear. Other schemes are
    django-oauth-toolkit's to refuse (ALLOWED_REDIRECT_URI_SCHEMES).

    White space is refused anywhere (django-oauth-toolkit stores a client's redirect URIs
    as one space-separated text: `https://a/cb http://evil/cb` was stored as two URIs), and
    a plain http URI naming its host in a way a browser reads differently from Python's
    urlsplit is refused: a backslash (`http://evil\\@127.0.0.1/`, evil's host to a
    browser) or user information (`@`)."""
    if any(c.isspace() for c in uri):
        return False
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return False
    if parts.scheme.lower() != "http":
        return True
    if "\\" in uri or "@" in parts.netloc:
        return False
    return host in LOOPBACK_HOSTS
