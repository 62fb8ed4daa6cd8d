"""Celery tasks: one line each. Messages carry ids, never objects."""

from celery import shared_task

from dispatcher import execution
from dispatcher.batches import EXECUTE_TASK


@shared_task(name=EXECUTE_TASK, ignore_result=True)
def execute_call(call_id: str) -> None:
    execution.execute_turn(call_id)  # the next owner's turn, within its cap: see batches


@shared_task(name="dispatcher.tasks.reconcile", ignore_result=True)
def reconcile() -> None:
    execution.reconcile()
