"""Bench-only settings: the real settings, plus bench URLs (baseline views) mounted beside the real ones.

Nothing infrastructural changes here: B and P share DATABASES, pool, Redis, middleware.
"""

from harness_site.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
