"""S11 and S12 with an OAuth access token instead of the agent's bearer token
(BENCH_TOKEN_KIND=oauth): the same agent, a token issued for the bench server's /mcp/ and
hooks API (agentauth), so the two kinds of token can be compared run against run."""

from __future__ import annotations

import os

from bench.run import django_script

MINT_SCRIPT = """
import sys, datetime, django
django.setup()
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application
from agentauth import tokens
from agentauth.models import AgentToken
from dispatcher import agents
bearer, url = sys.argv[1], sys.argv[2]
agent = agents.authenticate_token(bearer)
app, _ = Application.objects.get_or_create(
    client_id="bench-client",
    defaults={"name": "bench", "client_type": "public", "authorization_grant_type": "authorization-code",
              "redirect_uris": "http://127.0.0.1/cb", "client_secret": "", "hash_client_secret": False},
)
token = tokens.new_access_token(None)
access = AccessToken.objects.create(
    user=agent.owner, application=app, token="", token_checksum=tokens.checksum(token),
    expires=timezone.now() + datetime.timedelta(hours=2), scope="agent",
    resource=[url + "/mcp/", url + "/api/v1/hooks/"],
)
AgentToken.objects.create(access_token=access, agent=agent)
print(token)
"""


def kind() -> str:
    return os.environ.get("BENCH_TOKEN_KIND", "bearer")


def token_for(env: dict[str, str], bearer: str, url: str) -> str:
    """The token a scenario presents: the bearer token, or (BENCH_TOKEN_KIND=oauth) an
    OAuth access token of the same agent for the server at `url`."""
    if kind() != "oauth":
        return bearer
    return django_script(env, MINT_SCRIPT, bearer, url).strip().splitlines()[-1]
