"""What makes a secret key not a secret: shared by settings (which refuses to start) and
the start-up checks (which name it)."""

from __future__ import annotations

# Keys published in this repository (an old embedded default, the test suite's key).
KNOWN_KEYS = frozenset(
    {
        "insecure-dev-key-only-for-the-embedded-default",
        "test-secret-key-not-for-production",
    }
)
MIN_LENGTH = 50
MIN_UNIQUE_CHARACTERS = 5


def weak_secret_key(key: str) -> str:
    """Why `key` is not a real secret ("is a known constant", ...), or "" when it may be.
    Django's own rule (security.W009) plus the keys this repository publishes."""
    if key in KNOWN_KEYS:
        return "is a constant published in Harness's source"
    if key.startswith("django-insecure"):
        return "is Django's insecure placeholder"
    if len(key) < MIN_LENGTH or len(set(key)) < MIN_UNIQUE_CHARACTERS:
        return f"is shorter than {MIN_LENGTH} characters or repeats too few of them"
    return ""
