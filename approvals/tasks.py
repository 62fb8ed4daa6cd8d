"""Celery tasks: one line each."""

from celery import shared_task

from . import asks, services
from .notifications import services as notifications
from .notifications.senders import DeliveryFailed


@shared_task(name="approvals.tasks.expire_approvals", ignore_result=True)
def expire_approvals() -> None:
    services.expire_due()


@shared_task(name="approvals.tasks.escalate_approvals", ignore_result=True)
def escalate_approvals() -> None:
    asks.escalate_due()


@shared_task(name=notifications.PLAN_ESCALATION_TASK, ignore_result=True, time_limit=120)
def notify_escalation(approval_id: int) -> None:
    notifications.notify_escalation(approval_id)


@shared_task(name=notifications.PLAN_ASK_TASK, ignore_result=True, time_limit=120)
def notify_ask(approval_id: int) -> None:
    notifications.notify_ask(approval_id)


@shared_task(name=notifications.PLAN_OUTCOME_TASK, ignore_result=True, time_limit=120)
def notify_outcome(call_id: str) -> None:
    notifications.notify_outcome(call_id)


# Retried with exponential backoff (2 s, 4 s, ... at most 5 minutes, with jitter) while the
# channel fails; services.deliver records each attempt and gives up after MAX_ATTEMPTS.
@shared_task(
    name=notifications.DELIVER_TASK,
    ignore_result=True,
    time_limit=60,
    autoretry_for=(DeliveryFailed,),
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=notifications.MAX_ATTEMPTS - 1,
)
def deliver(delivery_id: str) -> None:
    notifications.deliver(delivery_id)
