"""The whole sign-in against a live Harness with the official MCP Python SDK's OAuth
client provider: 401 -> protected-resource metadata -> server metadata -> a client
metadata document served from another loopback port (https, allowed by
HARNESS_OUTBOUND_ALLOW) -> consent by a signed-in person over HTTP -> code -> token ->
tools/list and a call, in a session of the agent the person approved."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from agentauth.models import AgentClient
from dispatcher.models import AgentSession
from tests.mcp.conftest import run, session_id_hook, text_of
from tests.support.factories import unique
from tests.support.oauth import DocumentServer
from tests.support.oauth_live import OAuthStack, Person, query_of, team_member

pytestmark = [pytest.mark.live, pytest.mark.client_program]
CALLBACK = "http://127.0.0.1:33418/callback"


class Memory:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def provider_for(stack: OAuthStack, person: Person, client_id: str, store: Memory) -> Any:
    redirected: dict[str, str] = {}

    async def redirect_handler(url: str) -> None:
        import anyio

        # The person's browser: sign-in session, consent page, approve (blocking HTTP).
        redirected["to"] = await anyio.to_thread.run_sync(person.consent, url)

    async def callback_handler() -> AuthorizationCodeResult:
        query = query_of(redirected["to"])
        assert query["iss"] == stack.url  # RFC 9207: the issuer the metadata names
        # (the SDK checks `iss` against the issuer too)
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )

    return OAuthClientProvider(
        server_url=stack.url + "/mcp/",
        client_metadata=OAuthClientMetadata(
            redirect_uris=[AnyUrl(CALLBACK)],
            client_name="SDK Test Client",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=store,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata_url=client_id,
    )


def publish_client(documents: DocumentServer) -> str:
    return documents.client(f"/{unique('sdk')}/client.json", [CALLBACK], name="SDK Test Client")


def test_mcp_without_a_token_points_at_the_resource_metadata(oauth_stack: OAuthStack) -> None:
    response = httpx.post(
        oauth_stack.url + "/mcp/",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 401
    metadata = f"{oauth_stack.url}/.well-known/oauth-protected-resource/mcp/"
    assert f'resource_metadata="{metadata}"' in response.headers["www-authenticate"]
    assert httpx.get(metadata).json()["resource"] == oauth_stack.url + "/mcp/"


def test_the_sdk_signs_in_through_consent_and_calls_tools(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    owner = team_member()
    person = Person(oauth_stack.url, owner.username, "pw-" + owner.username)
    client_id = publish_client(oauth_stack.documents)
    store = Memory()

    async def scenario() -> tuple[list[str], str, str | None]:
        provider = provider_for(oauth_stack, person, client_id, store)
        keep, session_id = session_id_hook()
        http = httpx2.AsyncClient(
            auth=provider,
            timeout=httpx2.Timeout(30, read=120),
            event_hooks={"response": [keep]},
        )
        async with (
            http,
            streamable_http_client(oauth_stack.url + "/mcp/", http_client=http) as streams,
        ):
            read, write = streams
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = [t.name for t in (await session.list_tools()).tools]
                result = await session.call_tool("list_directory", {"path": "."})
                return tools, text_of(result), session_id()

    tools, listing, session_id = run(scenario)
    assert "read_file" in tools or "list_directory" in tools
    assert "SDK Test Client" in person.last_page and client_id in person.last_page
    assert oauth_stack.documents.fetched.count(urlsplit_path(client_id)) >= 1
    assert store.tokens is not None and store.tokens.access_token.startswith("hro_")
    link = AgentClient.objects.select_related("agent").get(owner=owner)
    session = AgentSession.objects.get(external_id=session_id)
    assert session.agent_id == link.agent_id and link.registered_via == "cimd"
    assert session.calls.get().name == "list_directory"
    assert "is empty" in listing or listing != ""


def urlsplit_path(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path
