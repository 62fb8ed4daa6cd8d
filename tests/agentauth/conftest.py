"""A live Harness that signs agents in (tests/support/oauth_live.py), once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live import LiveStack
from tests.support.oauth import document_server
from tests.support.oauth_live import OAuthStack, oauth_daphne


@pytest.fixture(scope="module")
def oauth_stack(
    live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OAuthStack]:
    tmp = tmp_path_factory.mktemp("oauth")
    with document_server(tmp) as documents, oauth_daphne(live_stack, documents, tmp) as stack:
        yield stack
