"""Celery tasks: one line each."""

from celery import shared_task

from dispatcher.agents import NOTIFY_VOIDED_TASK

from . import notify, services


@shared_task(name=services.NOTIFY_BREAK_GLASS_TASK, ignore_result=True, time_limit=120)
def notify_break_glass(event_id: str) -> None:
    notify.notify_break_glass(int(event_id))


@shared_task(name="identity.tasks.end_stale_sign_ins", ignore_result=True, time_limit=120)
def end_stale_sign_ins() -> None:
    services.end_stale_sign_ins()


@shared_task(name=NOTIFY_VOIDED_TASK, ignore_result=True, time_limit=120)
def notify_token_voided(event_id: str) -> None:
    notify.notify_token_voided(int(event_id))
