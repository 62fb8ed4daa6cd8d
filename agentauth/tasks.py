"""Celery tasks: one line each."""

from celery import shared_task

from . import services


@shared_task(name="agentauth.tasks.clear_device_codes", ignore_result=True, time_limit=120)
def clear_device_codes() -> None:
    services.clear_device_codes()
