"""rt8pub: the decision pipeline (approvals.live._Publisher) leans on channels_redis's
internals, verified with its 4.3 line, while pyproject allows any 4.x. It was built for
whatever channels_redis was installed, its naming and serialization unchecked: a moved
group naming would have sent every reviewer push where no socket listens, each one
logged and lost (only a failure while building it fell back). It is now built only on the
line it was verified with (live.VERIFIED_WITH); on another the layer's own group_send
sends, and a warning says so at the first push.

And its cache of publishers (a WeakKeyDictionary keyed by the layer) held the layer in
its value: no layer was ever forgotten (every layer of an override_settings stayed)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from importlib import metadata

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import override_settings

from approvals import live
from approvals import services as approvals
from tests.approvals.conftest import closing_connections, run_async
from tests.redteam.test_rt8pub_wire import layers, pending
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db(transaction=True)


def test_another_channels_redis_line_is_sent_to_by_the_layer_itself(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The installed line differs from the verified one (as after an upgrade to 4.4, which
    pyproject allows): the layer's own group_send carries the decision's removal to the
    sockets, and the warning names both lines."""
    installed = ".".join(metadata.version("channels-redis").split(".")[:2])
    monkeypatch.setattr(live, "VERIFIED_WITH", {"channels-redis": "4.2"})
    call, approval = pending(unique("upgraded"))
    reviewer = make_user(unique("rt8pub-reviewer"), groups=("reviewer",))
    with (
        override_settings(CHANNEL_LAYERS=layers([settings.REDIS_URL])),
        caplog.at_level(logging.WARNING, logger="approvals.live"),
    ):
        assert live._publisher(get_channel_layer()) is None

        async def scenario() -> str:
            layer = get_channel_layer()
            socket = await layer.new_channel()
            await layer.group_add(live.GROUP, socket)
            await asyncio.to_thread(
                closing_connections(
                    lambda: approvals.decide(
                        approval_id=approval.pk, user=reviewer, approve=False, digest=call.digest
                    )
                )
            )
            while True:
                html = str((await asyncio.wait_for(layer.receive(socket), 10))["html"])
                if str(call.pk) in html:
                    return html

        html = run_async(scenario)
    assert f'<div id="call-{call.pk}" hx-swap-oob="delete"></div>' in html
    warned = [r.getMessage() for r in caplog.records if "verified with" in r.getMessage()]
    assert set(warned) == {
        "the channel layer's groups are sent to by its loop: channels-redis "
        f"{installed} is installed, the decision's pipeline (approvals.live) was verified "
        "with 4.2.x"
    }, warned


def test_a_layer_no_longer_used_is_forgotten() -> None:
    with override_settings(CHANNEL_LAYERS=layers([settings.REDIS_URL])):
        layer = get_channel_layer()
        assert live._publisher(layer) is not None
        live._group_send([live.team_group(0)], {"type": "queue.push", "html": "x"})
        gone = weakref.ref(layer)
        del layer
    gc.collect()
    assert gone() is None, gc.get_referrers(gone())
