"""The device code grant's pre-token step (settings.OAUTH2_PROVIDER)."""

from __future__ import annotations

from typing import Any

from oauth2_provider.utils import set_oauthlib_user_to_device_request_user

from agentauth.validators import device_agent, device_resource


def before_token(request: Any) -> None:
    set_oauthlib_user_to_device_request_user(request)
    device_agent(request)
    device_resource(request)
