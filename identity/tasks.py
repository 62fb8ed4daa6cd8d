"""Celery tasks: one line each."""

from celery import shared_task

from . import notify


@shared_task(name="identity.tasks.notify_break_glass", ignore_result=True, time_limit=120)
def notify_break_glass(event_id: str) -> None:
    notify.notify_break_glass(int(event_id))
