"""Checkpoints: signed chain heads kept outside the database.

A checkpoint line records that at `time` chain `chain` had `seq` events ending in `hash`,
signed with the audit key (audit.signing): one JSON object per line,

    {"chain": "...", "seq": 12, "hash": "...", "time": "2026-01-01T12:00:00+00:00",
     "signature": "hmac-sha256:<key id>:<hex>"}

Each run appends one line per chain whose head changed since the file's last line (a
few minutes of overlap, so that a transaction that committed late is not missed), or
every chain with `all_chains`. `verify_audit --against FILE` then requires every
checkpointed event to still be in the log with that hash: a chain rewritten (hashes and
heads recomputed) or cut short since a checkpoint is detected even by someone who could
write the database. A head whose own signature does not verify is never checkpointed:
a forged head is reported, not laundered into the file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from floor import outbound

from . import signing
from .models import AuditChain, CheckpointRun

logger = logging.getLogger(__name__)

# How far before the file's last checkpoint a head may have changed and still be written
# again: covers transactions whose events were timed before the run but committed after it.
OVERLAP = timedelta(minutes=10)
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    chain: str
    seq: int
    hash: str
    time: str
    signature: str = ""

    def signed(self) -> Checkpoint:
        signature = signing.sign(CHECKPOINT, self.chain, self.seq, self.hash, self.time)
        return Checkpoint(self.chain, self.seq, self.hash, self.time, signature)

    def mismatch(self) -> signing.Mismatch | None:
        return signing.check(self.signature, CHECKPOINT, self.chain, self.seq, self.hash, self.time)

    def line(self) -> str:
        fields = {"chain": self.chain, "seq": self.seq, "hash": self.hash, "time": self.time}
        return json.dumps({**fields, "signature": self.signature}, separators=(",", ":")) + "\n"


@dataclass
class Run:
    """What one checkpoint run wrote, and the heads it refused to sign."""

    written: list[Checkpoint] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def take(*, since: datetime | None = None, chain: str | None = None) -> Run:
    """Signed checkpoints of the current heads (changed since `since`, when given)."""
    heads = AuditChain.objects.order_by("chain")
    if since is not None:
        heads = heads.filter(last_at__gte=since)
    if chain is not None:
        heads = heads.filter(chain=chain)
    now = timezone.now().isoformat()
    run = Run()
    rows = heads.values_list("chain", "last_seq", "last_hash", "head_signature")
    for name, seq, head_hash, signature in rows.iterator(chunk_size=2000):
        mismatch = signing.check(signature, "head", name, seq, head_hash)
        if mismatch is not None:
            run.refused.append(f"chain {name} seq {seq}: its head is {mismatch}")
            continue
        run.written.append(Checkpoint(name, seq, head_hash, now).signed())
    return run


def write(path: Path, *, all_chains: bool = False, url: str = "", chain: str | None = None) -> Run:
    """Append this run's checkpoints to `path` (and POST them to `url`, if given); only
    `chain`'s when given. Each run, failed or not, replaces `path`'s `CheckpointRun` row
    (what the overview shows); a head refused counts as a failed run.

    Raises OSError when the file cannot be written and outbound.OutboundRefused when the URL
    refuses them (after the file was written).
    """
    try:
        run = _append(path, all_chains=all_chains, url=url, chain=chain)
    except Exception as error:
        _record(path, url, error=f"{type(error).__name__}: {error}")
        raise
    refused = f"{len(run.refused)} heads did not verify and were not signed" if run.refused else ""
    _record(path, url, run=run, error=refused)
    return run


def _append(path: Path, *, all_chains: bool, url: str, chain: str | None) -> Run:
    since = None if all_chains else _last_time(path)
    run = take(since=since - OVERLAP if since else None, chain=chain)
    text = "".join(checkpoint.line() for checkpoint in run.written)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        fcntl.flock(out, fcntl.LOCK_EX)  # two runs at once append whole runs, in turn
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    if url and text:
        post(url, text)
    return run


def _record(path: Path, url: str, *, run: Run | None = None, error: str = "") -> None:
    """Replace `path`'s CheckpointRun row with this run's outcome."""
    try:
        newest = _last_time(path)
    except OSError:
        newest = None  # unreadable: the row says why the run failed
    parts = urllib.parse.urlsplit(url) if url else None
    CheckpointRun.objects.update_or_create(
        path=str(path)[:500],
        defaults={
            "url": f"{parts.scheme}://{parts.hostname}" if parts and parts.hostname else "",
            "finished_at": timezone.now(),
            "succeeded": run is not None and not error,
            "written": len(run.written) if run else 0,
            "refused": len(run.refused) if run else 0,
            "error": error[:500],
            "last_checkpoint_at": newest,
        },
    )


def last_run() -> CheckpointRun | None:
    """The configured destination's last run (None: never run against it)."""
    return CheckpointRun.objects.filter(path=str(settings.HARNESS_CHECKPOINT_PATH)[:500]).first()


def run_configured() -> Run:
    """The beat job: HARNESS_CHECKPOINT_PATH, and HARNESS_CHECKPOINT_URL when set. A head
    that does not verify is logged as an error (and not signed)."""
    run = write(Path(settings.HARNESS_CHECKPOINT_PATH), url=settings.HARNESS_CHECKPOINT_URL)
    for refusal in run.refused:
        logger.error("audit checkpoint refused a head: %s", refusal)
    return run


def post(url: str, text: str) -> None:
    """POST the lines through the outbound door (floor.outbound: address policy, no
    redirects, timeouts). Raises ValueError for a URL that is not http(s),
    OutboundRefused for a refused or failed request or an answer other than 2xx."""
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"HARNESS_CHECKPOINT_URL must be an http(s) URL, not '{url[:40]}'.")
    answer = outbound.send(
        "POST", url, content=text.encode(), headers={"Content-Type": "application/x-ndjson"}
    )
    if not 200 <= answer.status < 300:
        raise outbound.OutboundRefused(f"HTTP {answer.status}")


def _last_time(path: Path) -> datetime | None:
    """The time of the file's last checkpoint (None for a missing or empty file)."""
    try:
        with path.open("rb") as lines:
            lines.seek(0, os.SEEK_END)
            size = lines.tell()
            lines.seek(max(0, size - 4096))
            tail = lines.read().decode("utf-8", errors="replace").strip().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(tail):
        try:
            return datetime.fromisoformat(json.loads(line)["time"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def read(path: Path) -> Iterator[Checkpoint]:
    """The checkpoints in `path`, in order. Raises ValueError naming a malformed line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data: Any = json.loads(line)
                yield Checkpoint(
                    chain=str(data["chain"]),
                    seq=int(data["seq"]),
                    hash=str(data["hash"]),
                    time=str(data["time"]),
                    signature=str(data.get("signature", "")),
                )
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number} is not a checkpoint line: {error}") from error
