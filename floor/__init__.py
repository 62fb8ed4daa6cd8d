"""The floor beneath every app: what the others stand on and that knows none of them.

- `errors.py`: ServiceError, the one exception every service raises for a request it refuses.
- `compiled.py`: fixed-shape ORM reads and writes compiled once (the hot paths' statements).
- `celery_message.py`: a call's Celery message pushed onto the Redis broker directly.
- `redis_clients.py`: this process's Redis clients, one pool per URL, and the round trip
  that sends a thread's deferrable commands (wake-ups, wait slots given back) together.
- `broker.py`: one repair to kombu's Redis transport, installed by harness_site.celery.
- `sqlite3/`: the embedded default's database backend, taking SQLite's write lock without
  its sleeping busy handler.

The fast paths here lean on library internals, so each names the library lines it was
verified against (`VERIFIED_WITH`; dispatcher.W015 warns at start-up when they differ).
Nothing here imports a project module (tests/test_layering.py).
"""
