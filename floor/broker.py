"""One repair to kombu's Redis transport (kombu 5.7), installed by harness_site.celery.

When a worker loses its broker connection while it holds a prefetched message it has not
started (kombu keeps it "unacknowledged") and its consumer is waiting on Redis (BRPOP),
Celery's consumer first collects the connection: the channel's close fails on the dead
socket and is skipped, and the transport is detached. The second close then tries to put
the message back through a transport that no longer has a client and raises
AttributeError ("'NoneType' object has no attribute 'hostname'"), which Celery treats as
an unrecoverable error: the worker's main process exits, and nothing consumes any more.

Here that restore is skipped instead, with a warning. Nothing is lost by it: the message
stays in Redis's unacknowledged set when Redis survived (redelivered after the visibility
timeout), and in any case its call is still `queued` in the database, so the reconciler
re-sends it after HARNESS_REQUEUE_AFTER; the claim (a conditional update) keeps a second
delivery from running it twice. tests/dispatcher/test_broker_loss_live.py reproduces it.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis

logger = logging.getLogger(__name__)

# The line of kombu whose QoS this repairs (dispatcher.W015 warns when another is installed).
VERIFIED_WITH = {"kombu": "5.7", "celery": "5.7"}


class QoS(redis.QoS):
    def restore_unacked(self, client: Any = None) -> Any:
        transport = getattr(self.channel, "connection", None)
        if client is None and getattr(transport, "client", None) is None:
            logger.warning(
                "broker connection lost: %d prefetched message(s) not put back (the "
                "reconciler re-sends their calls)",
                len(self._delivered),
            )
            self._delivered.clear()
            return None
        return super().restore_unacked(client)  # type: ignore[no-untyped-call]


def install() -> None:
    """Use the repaired QoS for every Redis channel of this process."""
    redis.Channel.QoS = QoS
