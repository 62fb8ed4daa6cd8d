"""Notification channels: tell reviewers where they are (a webhook, Slack, email, Web
Push) that a call asks, with one-tap links made for each of them, and again when it is
decided. Sending runs in Celery tasks after the ask has committed: a failing channel is
logged, shown in the dashboard and retried, never a reason to lose or delay the call.
See docs/notifications.md.
"""
