from __future__ import annotations

import pytest

from tests.audit.flush import keep_audit_log_on_flush


@pytest.fixture(autouse=True, scope="session")
def _flush_keeps_the_audit_log() -> None:
    keep_audit_log_on_flush()
