"""Audit event kinds only tests record (the product's own are in audit/kinds.py)."""

from audit import kinds

TEST_EVENT = kinds.register("test.event", "a test event")
TEST = kinds.register("test", "a test event")
TEST_PARALLEL = kinds.register("test.parallel", "a test event from one of many writers")
TEST_SECRET = kinds.register("test.secret", "a test event carrying a secret")
