"""No published secret (issue 31): a fresh embedded install generates its own secret key,
keeps it (mode 0600) beside the audit key, and a link forged with any key in the source
does not decide; links without a login refuse to start on a key that is not a secret."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import signing

from approvals.links import SALT
from harness_site.secret_key import KNOWN_KEYS

# Separate processes on a fresh data directory: the same on both backends.
pytestmark = [pytest.mark.backend_independent, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parent.parent

# What a process of a fresh install does with a link an agent signed itself: the call id
# and digest from its own API answer, approval ids counted up, the superuser as recipient.
READ_FORGED = """
import sys, django
django.setup()
from django.conf import settings
from approvals import links
try:
    links.read(sys.argv[1])
except links.LinkRefused as refused:
    print("REFUSED", refused.status, refused)
else:
    print("ACCEPTED")
print("KEY", settings.SECRET_KEY)
"""


def fresh_install(data_dir: Path, **extra: str) -> dict[str, str]:
    """The embedded default on `data_dir`, with no HARNESS_SECRET_KEY."""
    drop = {"DATABASE_URL", "REDIS_URL", "HARNESS_SECRET_KEY", "HARNESS_SQLITE_PATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="harness_site.settings",
        HARNESS_DATA_DIR=str(data_dir),
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def forged(key: str) -> str:
    payload = {"a": 1, "c": "00000000-0000-0000-0000-000000000001", "d": "0" * 64}
    payload |= {"u": 1, "v": "approve", "e": 2_000_000_000, "n": "f" * 32}
    return signing.dumps(payload, key=key, salt=SALT, compress=True)


@pytest.mark.parametrize("key", sorted(KNOWN_KEYS))
def test_a_link_forged_with_a_published_key_fails_on_a_fresh_embedded_install(
    tmp_path: Path, key: str
) -> None:
    env = fresh_install(tmp_path / "data", HARNESS_LINKS_REQUIRE_LOGIN="false")
    result = run(READ_FORGED, env, forged(key))
    assert result.returncode == 0, result.stderr
    assert "REFUSED 400 This link is not valid: it was altered" in result.stdout
    assert f"KEY {key}\n" not in result.stdout


def test_the_generated_key_is_kept_owner_only_and_stable_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = fresh_install(data)
    code = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
    first = run(code, env)
    assert first.returncode == 0, first.stderr
    key_file = data / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert first.stdout.strip() == key and len(key) == 64 and key not in KNOWN_KEYS
    second = run(code, env)
    assert second.stdout.strip() == key  # read back, not made again
    other = run(code, fresh_install(tmp_path / "other")).stdout.strip()
    assert other != key


@pytest.mark.parametrize(
    "key", ["test-secret-key-not-for-production", "django-insecure-abc" * 4, "short-but-set"]
)
def test_links_without_login_refuse_to_start_on_a_key_that_is_not_a_secret(
    tmp_path: Path, key: str
) -> None:
    env = fresh_install(
        tmp_path / "data", HARNESS_LINKS_REQUIRE_LOGIN="false", HARNESS_SECRET_KEY=key
    )
    result = run("import django; django.setup()", env)
    assert result.returncode != 0
    assert "HARNESS_LINKS_REQUIRE_LOGIN is false" in result.stderr
    assert "HARNESS_SECRET_KEY" in result.stderr
    strong = fresh_install(
        tmp_path / "data",
        HARNESS_LINKS_REQUIRE_LOGIN="false",
        HARNESS_SECRET_KEY="Zq8" + os.urandom(32).hex(),
    )
    assert run("import django; django.setup()", strong).returncode == 0


def test_the_check_names_every_setting_that_weakens_a_promise(tmp_path: Path) -> None:
    env = fresh_install(
        tmp_path / "data",
        HARNESS_SECRET_KEY="test-secret-key-not-for-production",
        HARNESS_SANDBOX="off",
        HARNESS_SANDBOX_NETWORK="true",
        HARNESS_DEBUG="true",
        HARNESS_ALLOW_DESTRUCTIVE="true",
        HARNESS_OUTBOUND_ALLOW="127.0.0.1:8025,10.0.0.0/8,hooks.internal",
    )
    (tmp_path / "data").mkdir()
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    for check_id in ("W001", "W003", "W011", "W012", "W013", "W014"):
        assert f"harness.{check_id}" in out, out
    assert "harness.W015" not in out  # self-approval: named before going live only
    for forbid, named in (("false", True), ("true", False)):
        deploy = subprocess.run(
            [sys.executable, "manage.py", "check", "--deploy"],
            cwd=ROOT,
            env={**env, "HARNESS_FORBID_SELF_APPROVAL": forbid},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ("harness.W015" in deploy.stdout + deploy.stderr) is named, deploy.stdout
    assert all(entry in out for entry in ("127.0.0.1:8025", "10.0.0.0/8", "hooks.internal"))
    bad = fresh_install(tmp_path / "data", HARNESS_OUTBOUND_ALLOW="http://x")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "harness.E001" in result.stderr
