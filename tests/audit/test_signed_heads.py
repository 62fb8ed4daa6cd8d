"""Signed heads and checkpoints: a log rewritten by someone who can write the database but
does not hold the audit key is detected, also when hashes and heads are recomputed."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from audit import checkpoints, signing
from audit.models import AuditChain, AuditEvent
from audit.services import EventSpec, canonical_event, chain_hash, record_events
from audit.tasks import write_checkpoint
from audit.verify import verify_database
from tests.audit.chains import write_chain
from tests.audit.tamper import sql, triggers_disabled
from tests.audit.test_verify import run_verify

pytestmark = pytest.mark.django_db


def checkpoint(path: Path, chain: str, *extra: str) -> str:
    out: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            out.append(text)

        def flush(self) -> None:
            pass

    call_command(
        "audit_checkpoint", "--output", str(path), "--session", chain, *extra, stdout=Sink()
    )
    return "".join(out)


def rewrite(chain: str, from_seq: int, *, actor: str = "user:mallory") -> str:
    """What an attacker with write access to the database does: change the events from
    `from_seq` on, recompute every hash after them and the chain's head. Returns the new
    head hash (the head's signature cannot be recomputed without the key)."""
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    prev = events[from_seq - 2].hash if from_seq > 1 else "0" * 64
    for event in events[from_seq - 1 :]:
        canonical = canonical_event(
            chain=chain,
            seq=event.seq,
            kind=event.kind,
            actor=actor,
            subject=event.subject,
            payload=event.payload,
            created_at=event.created_at.isoformat(),
        )
        new_hash = chain_hash(prev, canonical)
        sql(
            "UPDATE audit_auditevent SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [actor, prev, new_hash, event.pk],
        )
        prev = new_hash
    AuditChain.objects.filter(chain=chain).update(last_hash=prev)
    return prev


def test_an_untouched_chain_verifies_against_its_checkpoint(tmp_path: Path) -> None:
    chain = write_chain(6)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    assert "1 chain heads appended" in checkpoint(path, chain)
    [line] = path.read_text().splitlines()
    record = json.loads(line)
    assert set(record) == {"chain", "seq", "hash", "time", "signature"}
    assert (record["chain"], record["seq"]) == (chain, 6)
    ok, output = run_verify("--session", chain, "--against", str(path))
    assert ok, output
    assert "1 checkpoints matched" in output


def test_session_checkpoints_only_that_session(tmp_path: Path) -> None:
    """--session was accepted and ignored: every chain was written (and one tampered head
    anywhere in the database failed the run)."""
    mine, other = write_chain(3)[0].chain, write_chain(3)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    assert "1 chain heads appended" in checkpoint(path, mine)
    assert [json.loads(line)["chain"] for line in path.read_text().splitlines()] == [mine]
    assert other != mine


def test_a_rewrite_with_recomputed_hashes_and_head_is_detected(tmp_path: Path) -> None:
    chain = write_chain(8)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    with triggers_disabled():
        rewrite(chain, 3)

    ok, output = run_verify("--session", chain)
    assert not ok  # the head's signature no longer matches the recomputed head
    assert "the signature does not match" in output
    ok, output = run_verify("--session", chain, "--against", str(path))
    assert not ok
    assert f"chain {chain} seq 8" in output
    assert "another hash now (the chain was rewritten since the checkpoint" in output


def test_a_truncation_back_to_an_older_signed_head_is_detected_against_a_checkpoint(
    tmp_path: Path,
) -> None:
    """The attacker keeps an old head row (validly signed) and removes the later events:
    the database alone looks consistent, the checkpoint taken since does not agree."""
    chain = write_chain(4)[0].chain
    old_head = AuditChain.objects.values("last_seq", "last_hash", "head_signature", "last_at")
    saved = old_head.get(chain=chain)
    with transaction.atomic():
        record_events(
            [EventSpec("call.received", "agent:test", "call:x", {"n": n}) for n in range(3)],
            session_id=chain,
        )
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    with triggers_disabled():
        sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq > 4", [chain])
    AuditChain.objects.filter(chain=chain).update(**saved)

    assert verify_database(chain).ok  # what a rewrite of heads can achieve without a checkpoint
    ok, output = run_verify("--session", chain, "--against", str(path))
    assert not ok
    assert "recorded seq 7" in output
    assert "the chain ends at seq 4 (truncated since the checkpoint" in output


def test_a_deleted_chain_is_detected_against_a_checkpoint(tmp_path: Path) -> None:
    chain = write_chain(3)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    with triggers_disabled():
        sql("DELETE FROM audit_auditevent WHERE chain = %s", [chain])
    AuditChain.objects.filter(chain=chain).delete()
    report = verify_database(chain, checkpoints.read(path))
    assert [p.what for p in report.problems] == [
        f"the checkpoint of {json.loads(path.read_text())['time']} recorded seq 3 with hash "
        f"{json.loads(path.read_text())['hash'][:16]}..., but no events exist"
    ]


def test_a_forged_head_signature_is_detected(tmp_path: Path) -> None:
    events = write_chain(5)
    chain = events[0].chain
    with triggers_disabled():
        sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq = 5", [chain])
    forged = f"hmac-sha256:{signing.key_id()}:" + "0" * 64
    AuditChain.objects.filter(chain=chain).update(
        last_seq=4, last_hash=events[3].hash, head_signature=forged
    )
    ok, output = run_verify("--session", chain)
    assert not ok
    assert f"chain {chain} end of chain: the head (seq 4) is the signature does not match" in output
    # A forged head is never laundered into a checkpoint.
    path = tmp_path / "checkpoints.jsonl"
    with pytest.raises(CommandError, match="1 heads do not verify"):
        checkpoint(path, chain)
    assert path.read_text() == ""


def test_an_unsigned_head_is_detected() -> None:
    chain = write_chain(2)[0].chain
    AuditChain.objects.filter(chain=chain).update(head_signature="")
    report = verify_database(chain)
    assert [p.what.split(":")[0] for p in report.problems] == ["the head (seq 2) is not signed"]


def test_an_edited_checkpoint_line_is_detected(tmp_path: Path) -> None:
    chain = write_chain(5)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    record = json.loads(path.read_text())
    record["seq"] = 3  # claim an earlier head, to hide events 4 and 5
    path.write_text(json.dumps(record) + "\n")
    ok, output = run_verify("--session", chain, "--against", str(path))
    assert not ok
    assert "the checkpoint file was edited" in output


def test_the_wrong_key_is_a_clear_error(tmp_path: Path) -> None:
    chain = write_chain(3)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    with override_settings(HARNESS_AUDIT_KEY="another-key-" + "x" * 40):
        for args in (("--session", chain), ("--session", chain, "--against", str(path))):
            ok, output = run_verify(*args)
            assert not ok
            assert "Every signature was made with another key" in output
            assert "Verify with the key the log was written with" in output
    with override_settings(HARNESS_AUDIT_KEY="short"):
        ok, output = run_verify("--session", chain)
        assert not ok
        assert "HARNESS_AUDIT_KEY is shorter than 32 characters" in output


def test_an_export_is_verified_against_a_checkpoint(tmp_path: Path) -> None:
    chain = write_chain(6)[0].chain
    path = tmp_path / "checkpoints.jsonl"
    checkpoint(path, chain)
    export = tmp_path / "export.jsonl"
    call_command("export_audit", "--session", chain, "--output", str(export), "--no-progress")
    ok, output = run_verify("--file", str(export), "--against", str(path))
    assert ok, output
    cut = export.read_text().splitlines()[:4]  # an export cut short, every line still valid
    export.write_text("\n".join(cut) + "\n")
    assert run_verify("--file", str(export))[0]  # the chain alone cannot tell
    ok, output = run_verify("--file", str(export), "--against", str(path))
    assert not ok
    assert "the chain ends at seq 4" in output


def test_runs_append_only_chains_that_changed(tmp_path: Path) -> None:
    hour_ago = timezone.now() - timedelta(hours=1)
    quiet = "00000000-0000-4000-8000-" + "0" * 11 + "1"
    with transaction.atomic():
        record_events([EventSpec("session.started", "agent:t", "", {}, hour_ago)], session_id=quiet)
    path = tmp_path / "checkpoints.jsonl"
    first = checkpoints.write(path)
    assert quiet in {c.chain for c in first.written}  # a new file: every chain
    busy = write_chain(2)[0].chain
    second = checkpoints.write(path)
    chains = {c.chain for c in second.written}
    assert busy in chains
    assert quiet not in chains  # unchanged for longer than the overlap
    assert len(path.read_text().splitlines()) == len(first.written) + len(second.written)


def test_the_beat_job_writes_the_configured_file_and_posts_to_the_url(tmp_path: Path) -> None:
    received: list[bytes] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    path = tmp_path / "beat.jsonl"
    chain = write_chain(2)[0].chain
    url = f"http://127.0.0.1:{server.server_port}/checkpoints"
    try:
        with override_settings(
            HARNESS_CHECKPOINT_PATH=str(path),
            HARNESS_CHECKPOINT_URL=url,
            HARNESS_OUTBOUND_ALLOW=[f"127.0.0.1:{server.server_port}"],
        ):
            write_checkpoint()
    finally:
        server.shutdown()
    assert chain in path.read_text()
    assert received == [path.read_bytes()]
    schedule = settings.CELERY_BEAT_SCHEDULE["audit-checkpoint"]
    assert schedule["task"] == "audit.tasks.write_checkpoint"


def test_the_checkpoint_url_goes_through_the_outbound_door(tmp_path: Path) -> None:
    """A checkpoint URL on loopback that nobody allowed is never reached; the file still
    gets its lines (it is written first) and the command says what was refused."""
    from tests.dispatcher.test_outbound import listener

    path = tmp_path / "door.jsonl"
    chain = write_chain(1)[0].chain
    with listener() as receiver, override_settings(HARNESS_OUTBOUND_ALLOW=[]):
        for url in (receiver.url + "/checkpoints", f"http://localhost:{receiver.port}/c"):
            with pytest.raises(CommandError, match="refused: a loopback address"):
                call_command("audit_checkpoint", output=path, url=url, all=True)
    assert receiver.hits == []
    assert chain in path.read_text()


@pytest.fixture
def key_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data" / "audit.key"
    with override_settings(HARNESS_AUDIT_KEY="", HARNESS_AUDIT_KEY_FILE=path):
        yield path


def test_without_the_variable_a_key_file_is_created_once_owner_only(key_file: Path) -> None:
    assert not key_file.exists()
    key = signing.audit_key()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text().strip().encode() == key
    signing._key.cache_clear()
    assert signing.audit_key() == key  # read back, not made again


def test_an_append_signs_the_head_with_the_key(key_file: Path) -> None:
    event = write_chain(1)[0]
    head = AuditChain.objects.get(chain=event.chain)
    assert head.head_signature == signing.sign_head(event.chain, 1, event.hash)
    assert head.head_signature.startswith(f"hmac-sha256:{signing.key_id()}:")


def test_the_migration_signs_heads_written_before_it() -> None:
    from importlib import import_module

    from django.apps import apps

    migration = import_module("audit.migrations.0004_head_signature")
    chain = write_chain(2)[0].chain
    AuditChain.objects.filter(chain=chain).update(head_signature="")
    migration.sign_existing_heads(apps, None)
    assert verify_database(chain).ok


def check_ids() -> set[str]:
    from django.core.checks import run_checks

    return {m.id for m in run_checks() if m.id and m.id.startswith("audit.")}


def test_start_up_checks_name_a_short_key_a_missing_one_and_an_open_key_file(
    key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with override_settings(HARNESS_AUDIT_KEY="short"):
        assert check_ids() == {"audit.E001"}
    monkeypatch.setenv("DATABASE_URL", "postgres://example/harness")
    assert "audit.W001" in check_ids()  # production without the variable
    monkeypatch.delenv("DATABASE_URL")
    signing.audit_key()
    assert check_ids() == set()
    key_file.chmod(0o644)
    assert check_ids() == {"audit.W002"}
    with override_settings(HARNESS_AUDIT_KEY="k" * 40):
        assert check_ids() == set()
