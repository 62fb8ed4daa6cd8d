"""Celery tasks: one line each."""

from celery import shared_task

from . import checkpoints


@shared_task(name="audit.tasks.write_checkpoint", ignore_result=True, time_limit=600)
def write_checkpoint() -> None:
    checkpoints.run_configured()
