"""S11 and S12 with an OAuth access token instead of the agent's bearer token
(BENCH_TOKEN_KIND=oauth): the same agent, a token issued for the bench server's /mcp/ and
hooks API (agentauth), so the two kinds of token can be compared run against run.

`python -m bench.oauth [ROUNDS]` measures the one step the token kind changes, in
process: mcp_http.authenticate with an MCP session (one query either way), bearer and
OAuth interleaved round by round (DATABASE_URL names the database to use)."""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

MINT_SCRIPT = """
import sys, django
django.setup()
from bench.oauth import mint
print(mint(sys.argv[1], sys.argv[2]))
"""


def mint(bearer: str, url: str) -> str:
    """An OAuth access token (two hours) of the agent holding `bearer`, for `url`'s /mcp/
    and hooks API, as the token endpoint would store it (Django must be set up)."""
    import datetime

    from django.utils import timezone
    from oauth2_provider.models import AccessToken, Application

    from agentauth import tokens
    from agentauth.models import AgentToken
    from dispatcher import agents

    agent = agents.authenticate_token(bearer)
    assert agent is not None
    app, _ = Application.objects.get_or_create(
        client_id="bench-client",
        defaults={
            "name": "bench",
            "client_type": "public",
            "authorization_grant_type": "authorization-code",
            "redirect_uris": "http://127.0.0.1/cb",
            "client_secret": "",
            "hash_client_secret": False,
        },
    )
    token = tokens.new_access_token(None)
    access = AccessToken.objects.create(
        user=agent.owner,
        application=app,
        token="",
        token_checksum=tokens.checksum(token),
        expires=timezone.now() + datetime.timedelta(hours=2),
        scope="agent",
        resource=[url + "/mcp/", url + "/api/v1/hooks/"],
    )
    AgentToken.objects.create(access_token=access, agent=agent)
    return token


def kind() -> str:
    return os.environ.get("BENCH_TOKEN_KIND", "bearer")


def token_for(env: dict[str, str], bearer: str, url: str) -> str:
    """The token a scenario presents: the bearer token, or (BENCH_TOKEN_KIND=oauth) an
    OAuth access token of the same agent for the server at `url`."""
    if kind() != "oauth":
        return bearer
    from bench.run import django_script

    return django_script(env, MINT_SCRIPT, bearer, url).strip().splitlines()[-1]


def authenticate_cost(rounds: int, per_round: int = 200) -> str:
    import django

    django.setup()
    from django.contrib.auth.models import User

    from dispatcher import agents
    from dispatcher.gateways import mcp_http

    owner = User.objects.create_user("auth-bench-" + uuid.uuid4().hex[:8])
    agent, bearer = agents.create_agent(owner=owner, name="auth-bench", actor="bench")
    url = "http://127.0.0.1:8000"
    tokens = {"bearer": bearer, "oauth": mint(bearer, url)}
    sessions = {
        kind: agents.start_session(agent=agent, client="mcp", external_id=uuid.uuid4().hex)
        for kind in tokens
    }
    samples: dict[str, list[float]] = {kind: [] for kind in tokens}
    for round_ in range(rounds + 1):
        for kind, token in tokens.items():
            started = time.perf_counter()
            for _ in range(per_round):
                _, known = mcp_http.authenticate(token, sessions[kind].external_id, url + "/mcp/")
                assert known is not None
            if round_:  # the first round warms up
                samples[kind].append((time.perf_counter() - started) / per_round * 1e6)
    ratios = sorted(o / b for o, b in zip(samples["oauth"], samples["bearer"], strict=True))
    return (
        f"authenticate with an MCP session (one query): bearer "
        f"{statistics.median(samples['bearer']):.0f} us, OAuth "
        f"{statistics.median(samples['oauth']):.0f} us; OAuth/bearer per round: median "
        f"{statistics.median(ratios):.3f} [min {ratios[0]:.3f}, max {ratios[-1]:.3f}], "
        f"{rounds} rounds of {per_round}"
    )


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    print(authenticate_cost(int(sys.argv[1]) if len(sys.argv) > 1 else 15))
