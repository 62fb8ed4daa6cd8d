"""The Celery app. Workers: `celery -A harness_site worker`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")

app = Celery("harness")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
