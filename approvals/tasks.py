"""Celery tasks: one line each."""

from celery import shared_task

from . import services


@shared_task(name="approvals.tasks.expire_approvals", ignore_result=True)
def expire_approvals() -> None:
    services.expire_due()
