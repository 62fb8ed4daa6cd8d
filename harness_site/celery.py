"""The Celery app. Workers: `celery -A harness_site worker`."""

import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, task_postrun, task_prerun, worker_init

from floor import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
# A worker that loses Redis while it holds a prefetched message must not exit (kombu 5.7).
broker.install()

app = Celery("harness")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect  # type: ignore[untyped-decorator]
@task_postrun.connect  # type: ignore[untyped-decorator]
def _release_connections(task: Any = None, **kwargs: Any) -> None:
    """What Django does around a request: return the connection to this process's pool
    (CONN_MAX_AGE=0), or drop it when it broke. See CELERY_DB_REUSE_MAX in settings.
    Not for a task run eagerly in the caller's process (it may be inside a transaction)."""
    from django.db import close_old_connections

    if task is not None and getattr(task.request, "is_eager", False):
        return
    close_old_connections()


@worker_init.connect  # type: ignore[untyped-decorator]
@beat_init.connect  # type: ignore[untyped-decorator]
def _start_embedded_redis(**kwargs: Any) -> None:
    """A worker or beat on the embedded default starts its Redis (settings never do)."""
    from harness_site.embedded_redis import start_if_embedded

    start_if_embedded()


@worker_init.connect  # type: ignore[untyped-decorator]
def _preload(**kwargs: Any) -> None:
    """A worker loads, before its first task, what the apps import where first used (the
    MCP SDK, the shell parser): see dispatcher.preload."""
    from dispatcher import preload

    preload.load()
