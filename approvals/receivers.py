"""The approvals app's side of the dispatcher's signals (dispatcher never imports approvals)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from dispatcher.notify import approval_requested

from . import services


@receiver(approval_requested)
def record_request(sender: Any, call: Any, presentation: dict[str, Any], **kwargs: Any) -> None:
    services.open_request(call=call, presentation=presentation)
