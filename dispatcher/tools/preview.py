"""Previews: a `run_command` run in the real sandbox over a copy-on-write view of the
workspace, whose effect a reviewer sees and Harness later applies instead of running
the command again (docs/security.md, "Previews"; issue 36).

`run_preview(argv, cwd=..., workspace=..., store=...)` returns an `Effect`:

- The command runs in the same sandbox as a real run (sandbox.sandbox_command: the same
  binds, seccomp filter, cgroups, rlimits, setpriv to the sandbox user), inside a private
  mount and network namespace of its own (`unshare --mount --net`, Harness being root; a
  user namespace as well when it is not). There a size-capped tmpfs holds the upper and
  work directories of a kernel overlayfs over the workspace (the very directory Harness
  judged and holds: NAMESPACE_SCRIPT), which the sandbox binds at the workspace's own
  path, so the program sees the workspace at its usual path, every hidden path covered as
  in a real run, and every write lands in the tmpfs. The workspace itself is never written.
- The network namespace holds only loopback: the program has no network. Whether it
  tried is read from the namespace's own counters (/proc/net/snmp OutNoRoutes, v4 and
  v6): a connect or a DNS query towards any address but loopback finds no route.
- Limits: HARNESS_PREVIEW_TIMEOUT seconds of wall-clock time (coreutils `timeout`, then
  SIGKILL; `--foreground`, so it stays in the process group Harness kills when it stops
  a preview early, for its output, and the program with it), HARNESS_PREVIEW_MAX_BYTES for everything written (the tmpfs size, and the
  largest file), MAX_ENTRIES inodes in the tmpfs (empty files and directories cost it
  no bytes: 50,000 of them in 5 s made an 80 MiB tar and a 22 s admission), a bound on
  the kept tar (`prlimit --fsize`), and the usual output cap.
- After the program ends, still inside the namespace, the upper layer is written as a
  tar stream (whiteouts and opaque directories included) to a file in `store`, which
  Harness keeps until the call ends; the tmpfs and the overlay vanish with the namespace,
  whatever happens to the worker (the kernel drops them), so no upper layer outlives a
  preview. `Effect` is then read from that tar against the untouched workspace.

Kernel overlayfs or fuse-overlayfs (Debian's 1.10), measured on the development machine
(2 cores, ext4, kernel 6.18; a workspace of 10,000 files of 160 bytes in 100
directories; median of 5 runs of mount + work + tar of the upper layer, in a private
mount namespace):

    work                         plain   kernel (root)   kernel (userns)   fuse-overlayfs
    nothing (`true`)             0.8 ms      14 ms           8 ms              10 ms
    read every file (`cat`)      160 ms     301 ms         338 ms            1011 ms
    `sed -i` on 100 files          -        131 ms         128 ms             304 ms

Kernel overlayfs costs the same to set up and is 2.3 to 3.4 times faster under load,
needs no FUSE device in the sandbox host and no daemon to clean up: chosen.

What the effect is compared with later (`Effect.fingerprint`): every entry of the
workspace by kind, mode, size, mtime, ctime and inode (a program outside the sandbox
cannot change a file's content without changing its ctime), what git reads from outside
it (`git_outside.outside_state`: /etc/gitconfig, a linked worktree's main repository's
configuration and hooks, its HEAD, index and the refs HEAD names, an included file, a
program a configuration names outside the workspace), and the content hash of every
path the preview changed. Harness cannot see which files a program only read
(overlayfs reads the lower layer with O_NOATIME), so it treats every file as read. What
the fingerprint cannot take whole (past one of its bounds, or a command line of a git
configuration only the shell reads whole) makes the effect not appliable
(`Effect.unwatched`): a change there after the approval would go unseen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from dispatcher.tools import _confined, git_outside, sandbox, sandbox_cgroups, sandbox_git
from dispatcher.tools.base import ToolError, storable_text
from dispatcher.tools.diffs import Budget, newline_lines, unified_diff

DIFF_BYTES = 256 << 10  # larger files are shown by size and hash
DIFF_TOTAL = 1 << 20  # characters of diff in one effect; past it, sizes and hashes only
# (a file's diff is shown whole or not at all: it was once cut after 400 lines, and what
# followed, applied all the same, was one grey line saying how many more there were)
LIST_CHANGES = 2000  # changes listed; more are counted
MAX_ENTRIES = 4 * LIST_CHANGES  # inodes of the upper layer's tmpfs (empty files cost no bytes)
APPLY_PATH_BYTES = 3800  # a longer path cannot be reached beneath the workspace (PATH_MAX)
ENTRY_TAR_BYTES = 8 << 10
KEPT_FACTOR = 16  # kept upper layers of all calls awaiting decisions: at most this many caps  # the kept tar's bound: the size cap plus this per entry
OPAQUE_KEYS = ("SCHILY.xattr.trusted.overlay.opaque", "SCHILY.xattr.user.overlay.opaque")
NAMESPACE_FAILED = 125

# Inside the private namespaces (sh, as root there): $0 the tmpfs mount point, $1 the
# workspace, $2 the preview's directory, $3 the size cap, $4 the time limit, $5 more
# overlay options, $6 the most inodes of the tmpfs, $7 the most bytes of the kept tar, $8
# the device and inode ("%d:%i") of the workspace Harness judged and holds open; then "--"
# and the sandbox's own launcher. The results are opened before anything is mounted, and
# closed for the program: it must never write the upper layer's tar (a tar of its
# choosing would be what is shown and applied).
#
# The workspace's path is walked once more here (a descriptor Harness opened belongs to
# its own mount namespace, and overlayfs refuses a lower layer from another one: "failed
# to clone lowerpath"), so a program that swapped a component of it for a symlink meanwhile
# (one agent's workspace nested in another's) may have led the walk elsewhere. The shell's
# working directory, once there, is held and compared with the directory judged; the
# overlay's lower layer is that held directory (/proc/self/cwd: the kernel follows the
# magic link to it, never the path again), and its upper layer takes owner and mode from
# it. A directory elsewhere ends the namespace ("workspace changed") before anything is
# mounted over it or shown. The overlay is mounted on a directory of the tmpfs, never on
# the workspace's path, and the sandbox binds it by descriptor (MERGED_FD, --bind-fd).
NAMESPACE_SCRIPT = r"""
mnt=$0; ws=$1; out=$2; cap=$3; limit=$4; opts=$5; inodes=$6; tarcap=$7; held=$8; shift 9
exec 5>"$out/upper.tar" 6>"$out/facts" 7>"$out/net" || exit 125
mount -t tmpfs -o "size=$cap,nr_inodes=$inodes,mode=0700" harness-preview "$mnt" || exit 125
mkdir "$mnt/upper" "$mnt/work" "$mnt/merged" || exit 125
cd -P "$ws" && [ "$(stat -c %d:%i .)" = "$held" ] || { echo "workspace changed" >&6; exit 125; }
chown --reference=. "$mnt/upper" && chmod --reference=. "$mnt/upper" || exit 125
mount -t overlay harness-preview \
  -o "lowerdir=/proc/self/cwd,upperdir=$mnt/upper,workdir=$mnt/work,index=off,metacopy=off$opts" \
  "$mnt/merged" || exit 125
cd / && exec 8<"$mnt/merged" || exit 125
ip link set lo up 2>/dev/null
timeout --foreground -k 2 "$limit" "$@" 5>&- 6>&- 7>&-
echo "status $?" >&6
stat -f -c "free %a %S %d" "$mnt" >&6
cat /proc/net/snmp /proc/net/snmp6 >&7 2>/dev/null
prlimit --fsize="$tarcap" tar -C "$mnt/upper" --xattrs --xattrs-include='trusted.overlay.*' \
  --xattrs-include='user.overlay.*' --numeric-owner -cf - . >&5 || echo "tar failed" >&6
exit 0
"""
MERGED_FD = 8  # the overlay, opened by NAMESPACE_SCRIPT, bound by bwrap (which closes it)


class PreviewUnavailable(ToolError):
    """No preview could be made here (no overlayfs, the namespace refused); nothing ran."""


_LIMITS = {
    "time": "the preview hit its time limit",
    "size": "the preview wrote more than its size cap",
    "files": "the preview made more files than it may",
    "output": "the preview wrote more output than it may",
    "memory": "the preview used more memory than it may",
    "start": "the command could not start in the preview",
}


@dataclass
class Effect:
    """What a previewed command would do. `document()` is what the reviewer sees and what
    `digest` covers; `fingerprint` (the workspace it was made over) and `store` (where
    the upper layer is kept) are Harness's own."""

    changes: list[dict[str, Any]]
    exit_status: int | None
    exit_text: str
    output: str
    network_attempted: bool
    limit: str  # "" or what stopped it: time, size, output, memory, start
    upper_sha256: str
    more_changes: int = 0
    fingerprint: str = ""
    store: str = ""
    seconds: float = 0.0
    digest: str = field(default="")
    # What the fingerprint could not take whole ("" when nothing): the reviewer is shown
    # it, and the effect is never applied (`fingerprint_with_gaps`)
    unwatched: str = ""

    def __post_init__(self) -> None:
        if not self.digest:
            self.digest = digest_of(self.document())

    def document(self) -> dict[str, Any]:
        document = {
            "changes": self.changes,
            "more_changes": self.more_changes,
            "exit_status": self.exit_status,
            "exit_text": self.exit_text,
            "output": self.output,
            "network_attempted": self.network_attempted,
            "limit": self.limit,
            "upper_sha256": self.upper_sha256,
        }
        if self.unwatched:  # (only then: an effect stored before keeps its digest)
            document["unwatched"] = self.unwatched
        return document

    @property
    def appliable(self) -> bool:
        """Whether approving may apply this effect instead of running the command."""
        if self.unappliable_change():
            return False
        return (
            not self.limit
            and not self.network_attempted
            and not self.more_changes
            and not self.unwatched
        )

    def why_not_appliable(self) -> str:
        """Why the effect is not appliable, for the reviewer (and the audit): it may name
        paths outside the workspace (`unwatched`). `not_appliable` says it for the model."""
        code, words = self.not_appliable()
        if code == "unwatched":
            return (
                "Harness cannot watch everything the command's effect depends on, so it "
                f"could not tell whether it changed after the approval: {self.unwatched}"
            )
        return self.unappliable_change() if code == "set_id_file" else words

    def not_appliable(self) -> tuple[str, str]:
        """Why the effect is not appliable, as (code, words): the audit's code and the
        model's words, fixed text that never names a path; ("", "") when it is appliable."""
        if self.limit:
            return "limit", _LIMITS.get(self.limit, f"the preview hit a limit ({self.limit})")
        if self.network_attempted:
            return (
                "network",
                "the command tried to reach the network, which a preview does not have",
            )
        if self.more_changes:
            return "more_changes", "the effect has more changes than a preview lists"
        if self.unwatched:
            return "unwatched", (
                "Harness cannot watch everything the command's effect depends on outside "
                "the workspace"
            )
        code, why = self._unappliable()
        if code == "set_id_file":  # (without the file's name)
            why = "the command made a set-user-ID or set-group-ID file, which is not applied"
        return code, why

    def unappliable_change(self) -> str:
        """Why one of the changes is never applied (Harness applies as root), or ""."""
        return self._unappliable()[1]

    def _unappliable(self) -> tuple[str, str]:
        for change in self.changes:
            if change["kind"] == "special":
                return "special_file", (
                    "the command made a special file (a FIFO or a socket), which is not applied"
                )
            mode = int(change.get("mode_after") or "0", 8)
            if change["kind"] == "file" and mode & (stat.S_ISUID | stat.S_ISGID):
                return "set_id_file", (
                    f"the command made a set-user-ID or set-group-ID file ({change['path']})"
                )
            if len(str(change["path"]).encode(errors="surrogateescape")) > APPLY_PATH_BYTES:
                return "long_path", "the command made a path longer than Harness can apply"
        return "", ""

    def counts(self) -> dict[str, int]:
        counts = {"changed": 0, "created": 0, "deleted": 0, "mode": 0, "touched": 0}
        for change in self.changes:
            if change["kind"] != "dir" or change["change"] == "mode":
                counts[change["change"]] += 1
        return counts

    def summary(self) -> str:
        """ "This command would: change 2 files, create 1, delete 1" (and the rest)."""
        return summary_of(self.document())

    def stored(self) -> dict[str, Any]:
        return {**asdict(self), "appliable": self.appliable}


def summary_of(document: dict[str, Any]) -> str:
    counts = {"changed": 0, "created": 0, "deleted": 0, "mode": 0, "touched": 0}
    for change in document.get("changes", []):
        if change.get("kind") != "dir" or change.get("change") == "mode":
            counts[str(change.get("change"))] = counts.get(str(change.get("change")), 0) + 1
    parts: list[str] = []
    words = (
        ("changed", "change"),
        ("created", "create"),
        ("deleted", "delete"),
        ("touched", "touch"),
    )
    for key, verb in words:
        if counts[key]:
            noun = " files" if not parts and counts[key] != 1 else " file" if not parts else ""
            parts.append(f"{verb} {counts[key]}{noun}")
    if counts["mode"]:
        parts.append(f"change the mode of {counts['mode']}")
    text = "This command would: " + (", ".join(parts) if parts else "change no files")
    # A one-tap link or a push carries this line alone: "create 1 file" must not hide that
    # the file is another path's too (a later write to one name writes the other) or a
    # symlink (where it leads is on the page).
    changes = document.get("changes", [])
    links = sum(1 for change in changes if change.get("link"))
    symlinks = sum(
        1 for c in changes if c.get("kind") == "symlink" and c.get("change") != "deleted"
    )
    extras = [
        f"{n} {word}{'' if n == 1 else 's'}"
        for n, word in ((links, "hard link"), (symlinks, "symlink"))
        if n
    ]
    if extras:
        text += "; it makes " + " and ".join(extras)
    if document.get("more_changes"):
        text += f" (and {document['more_changes']} more changes not listed)"
    if document.get("network_attempted"):
        text += "; it tried to reach the network (the preview has none)"
    if document.get("limit"):
        text += f"; the preview stopped at a limit ({document['limit']})"
    if document.get("unwatched"):
        text += "; it cannot be applied: Harness cannot watch all it depends on"
    return text


def digest_of(document: dict[str, Any]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def store_root() -> Path:
    return Path(settings.DATA_DIR) / "previews"


def enabled() -> bool:
    """Whether asks of run_command are previewed: the setting, and the bwrap sandbox."""
    return bool(settings.HARNESS_PREVIEW) and sandbox.mode() == "bwrap"


# --- Running ------------------------------------------------------------------------------


def run_preview(argv: list[str], *, cwd: Path, workspace: Path, env: dict[str, str]) -> Effect:
    """Preview `argv` run in `cwd` over `workspace`. The caller holds the workspace lock.

    Raises PreviewUnavailable when no preview can be made (nothing ran, nothing kept), and
    SandboxUnavailable/ToolError as sandbox.run does before anything starts.
    """
    sandbox.require_sandbox()
    # (as sandbox.run: a nested workspace swapped for a symlink is neither resolved, given
    # to the sandbox user, nor read as the preview's lower layer)
    sandbox.refuse_redirected(workspace)
    # given by the descriptor of the directory judged (sandbox.open_unredirected), held
    # open until the namespace ends (its inode number names no other directory meanwhile),
    # and compared there with what the overlay takes as its lower layer (NAMESPACE_SCRIPT)
    original = Path(os.path.abspath(workspace))
    workspace_fd = sandbox.open_unredirected(original)
    try:
        workspace = Path(os.readlink(f"/proc/self/fd/{workspace_fd}"))
        # the working directory named below the directory judged, as sandbox.run does: a
        # resolve of its path (through another agent's workspace) may meet the symlink
        inside = Path(os.path.relpath(os.path.abspath(cwd), original))
        cwd = workspace / inside if inside.parts[:1] != ("..",) else cwd.resolve()
        sandbox.refuse_exposed_state(workspace)
        sandbox.give_to_sandbox(workspace, root_fd=workspace_fd)
        return _preview(argv, cwd, workspace, workspace_fd, env)
    finally:
        os.close(workspace_fd)


def _preview(
    argv: list[str], cwd: Path, workspace: Path, workspace_fd: int, env: dict[str, str]
) -> Effect:
    """run_preview's work over the workspace held open as `workspace_fd`."""
    held = os.fstat(workspace_fd)
    timeout = float(settings.HARNESS_PREVIEW_TIMEOUT)
    cap = int(settings.HARNESS_PREVIEW_MAX_BYTES)
    limits = sandbox.Limits(
        timeout=timeout + 15,  # the namespace's own bound; `timeout` stops the program
        output_chars=int(settings.HARNESS_OUTPUT_LIMIT),
        cpu_seconds=max(1, int(timeout) + 1),
        file_bytes=cap,
        output_bytes=4 << 20,
    )
    store = store_root() / uuid.uuid4().hex
    mount_point = _mount_point(workspace)
    _refuse_past_kept_budget(cap)
    store.mkdir(mode=0o700, parents=True)
    try:
        fingerprint, gaps = fingerprint_with_gaps(workspace, root_fd=workspace_fd)
        identity = f"{held.st_dev}:{held.st_ino}"
        started = time.monotonic()
        done, oom = _run_in_namespace(
            argv, cwd, workspace, identity, store, mount_point, env, limits
        )
        seconds = time.monotonic() - started
        # the effect's `before` side is read from the directory held, never the path
        lower = Path(f"/proc/self/fd/{workspace_fd}")
        effect = _effect(done, oom, store, lower, fingerprint, seconds, timeout, cap)
        effect = _unwatched(effect, gaps)
        if not effect.appliable:  # never applied: its upper layer is not kept on disk
            shutil.rmtree(store, ignore_errors=True)
            effect.store = ""
        return effect
    except BaseException:
        shutil.rmtree(store, ignore_errors=True)
        raise


def _refuse_past_kept_budget(cap: int) -> None:
    """No new preview while the kept upper layers (one per call awaiting a decision, up
    to the cap each, times the asks every agent may have pending) fill KEPT_FACTOR caps."""
    kept = 0
    with contextlib.suppress(FileNotFoundError):
        for path in store_root().iterdir():
            with contextlib.suppress(OSError):
                kept += (path / "upper.tar").stat().st_size
    if kept > cap * KEPT_FACTOR:
        raise PreviewUnavailable(
            f"the previews kept for calls awaiting a decision already hold {kept >> 20} MiB; "
            "the command asks without one."
        )


def _mount_point(workspace: Path) -> Path:
    point = store_root() / "mnt"
    point.mkdir(mode=0o700, parents=True, exist_ok=True)
    if point.resolve().is_relative_to(workspace):
        raise PreviewUnavailable(
            "Harness's data directory lies inside the session workspace, so no preview can "
            "be made; the command asks without one."
        )
    return point.resolve()


def _namespace_prefix() -> tuple[list[str], str]:
    unshare = ["unshare", "--mount", "--net", "--propagation", "private"]
    if os.geteuid() != 0:  # kernel overlayfs in a user namespace (Linux 5.11+), whose
        # userxattr makes no redirects already (and refuses redirect_dir=off)
        return ["unshare", "--user", "--map-root-user", *unshare[1:]], ",userxattr"
    return unshare, ",redirect_dir=off"  # a renamed directory is copied, never redirected


def _run_in_namespace(
    argv: list[str],
    cwd: Path,
    workspace: Path,
    held: str,
    store: Path,
    mount_point: Path,
    env: dict[str, str],
    limits: sandbox.Limits,
) -> tuple[sandbox.Completed, bool]:
    prefix, options = _namespace_prefix()
    timeout = str(float(settings.HARNESS_PREVIEW_TIMEOUT))
    cap = str(int(settings.HARNESS_PREVIEW_MAX_BYTES))
    with (
        contextlib.ExitStack() as extras_held,
        sandbox._call_cgroups(limits) as cgroups,
        sandbox.StartReport() as report,
    ):
        extras = sandbox.hold_read_only_extras(extras_held)
        inner = sandbox._limit_command(
            limits, cgroups, exec_report=report.exec_path
        ) + sandbox.bwrap_command(
            argv,
            workspace=workspace,
            cwd=cwd,
            limits=limits,
            network=True,
            extras=extras,
            workspace_fd=MERGED_FD,
            status_fd=report.fd,
        )
        script = [*prefix, "/bin/sh", "-c", NAMESPACE_SCRIPT, str(mount_point)]
        tar_bytes = str(int(cap) + MAX_ENTRIES * ENTRY_TAR_BYTES)
        script += [str(workspace), str(store), cap, timeout, options]
        script += [str(MAX_ENTRIES), tar_bytes, held, "--", *inner]
        try:
            done = sandbox._run_process(
                script,
                cwd=store,
                env=env,
                limits=limits,
                sandboxed=True,
                pass_fds=sandbox._descriptors(extras, report.fd),
            )
        except TimeoutError:
            raise PreviewUnavailable(
                "The preview's namespace did not end in time; the command asks without one."
            ) from None
        done = report.told(done)
        oom = sandbox_cgroups.oom_killed(cgroups.memory)
    return done, oom


def _facts(store: Path) -> dict[str, str]:
    facts: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (store / "facts").read_text().splitlines():
            key, _, value = line.partition(" ")
            facts[key] = value
    return facts


def _effect(
    done: sandbox.Completed,
    oom: bool,
    store: Path,
    lower: Path,
    fingerprint: str,
    seconds: float,
    timeout: float,
    cap: int,
) -> Effect:
    """The effect of the namespace's run; `lower` names the workspace's directory as held."""
    facts = _facts(store)
    if facts.get("workspace") == "changed":
        raise PreviewUnavailable(
            "The session workspace changed while its preview was being set up "
            "(a symlink may stand on its path now: a program of the workspace it lies in "
            "may have swapped one in), so no preview was made; the command asks without one."
        )
    if "status" not in facts:
        if done.stopped_for_output:
            return _stopped(done, store, fingerprint, seconds, "output")
        raise PreviewUnavailable(
            "No preview could be made on this host (overlayfs in a private namespace: "
            f"{done.output.strip()[:300] or f'exit {done.returncode}'}); the command asks "
            "without one."
        )
    status = int(facts["status"])
    output = storable_text(done.output)  # the call's result when applied, as a run's
    limit = ""
    # (the status is the program's, from the namespace's facts: `done`'s is the script's
    # own, 0, so a sandbox that could not start was never read as one)
    start_failure = sandbox._start_failure_line(replace(done, returncode=status))
    if status == 124 and seconds >= timeout:
        limit = "time"
        status_text = f"killed at the preview's time limit ({timeout:g} s)"
    else:
        status_text = sandbox.describe_exit(status, sandboxed=True)
    free = facts.get("free", "").split()
    if len(free) >= 2 and int(free[0]) * int(free[1]) < 128 << 10 or "SIGXFSZ" in status_text:
        limit = limit or "size"
    if len(free) >= 3 and int(free[2]) < 16:
        limit = limit or "files"
    if oom:
        limit = limit or "memory"
    if done.stopped_for_output:
        limit = limit or "output"
    if start_failure is not None:
        limit = limit or "start"
    tar_path = store / "upper.tar"
    if facts.get("tar") == "failed" or not tar_path.exists():
        raise PreviewUnavailable("The preview's upper layer could not be read.")
    try:
        changes, more = read_changes(tar_path, lower)
    except (tarfile.TarError, OSError) as error:
        raise PreviewUnavailable(
            f"The preview's upper layer could not be read ({error})."
        ) from None
    return Effect(
        changes=changes,
        more_changes=more,
        exit_status=status,
        exit_text=status_text,
        output=output,
        network_attempted=_tried_network(store / "net"),
        limit=limit,
        upper_sha256=_file_sha256(tar_path),
        fingerprint=fingerprint,
        store=str(store),
        seconds=round(seconds, 3),
    )


# At most this many characters of what a fingerprint left out are kept with an effect.
UNWATCHED_CHARS = 2000


def _unwatched(effect: Effect, gaps: list[str]) -> Effect:
    """`effect`, marked not appliable when its fingerprint has `gaps` (what it could not
    take whole, said for the reviewer and the model): a change there after the approval
    would go unseen, and the old effect be applied."""
    if not gaps:
        return effect
    text = "; ".join(gaps)
    if len(text) > UNWATCHED_CHARS:
        text = text[: UNWATCHED_CHARS - 20].rstrip() + f" ... ({len(gaps)} in all)"
    return replace(effect, unwatched=text, digest="")


def _stopped(
    done: sandbox.Completed, store: Path, fingerprint: str, seconds: float, limit: str
) -> Effect:
    return Effect(
        changes=[],
        exit_status=None,
        exit_text="stopped",
        output=storable_text(done.output),
        network_attempted=False,
        limit=limit,
        upper_sha256="",
        fingerprint=fingerprint,
        store=str(store),
        seconds=round(seconds, 3),
    )


def _tried_network(path: Path) -> bool:
    """Whether anything in the namespace looked for a route it had not (v4 or v6)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    lines = [line.split() for line in text.splitlines()]
    for names, values in zip(lines, lines[1:], strict=False):
        if names[:1] == ["Ip:"] and values[:1] == ["Ip:"] and "OutNoRoutes" in names:
            with contextlib.suppress(ValueError, IndexError):
                if int(values[names.index("OutNoRoutes")]) > 0:
                    return True
    for words in lines:
        if words[:1] == ["Ip6OutNoRoutes"] and len(words) == 2 and words[1] != "0":
            return True
    return False


def discard(effect_store: str) -> None:
    """Remove a kept upper layer (idempotent). Only directories under store_root()."""
    if not effect_store:
        return
    path = Path(effect_store)
    if path.parent == store_root() and re.fullmatch(r"[0-9a-f]{32}", path.name):
        shutil.rmtree(path, ignore_errors=True)


# --- Reading the upper layer --------------------------------------------------------------


def _is_whiteout(member: tarfile.TarInfo) -> bool:
    return member.ischr() and member.devmajor == 0 and member.devminor == 0


def _is_opaque(member: tarfile.TarInfo) -> bool:
    return member.isdir() and any(member.pax_headers.get(k) == "y" for k in OPAQUE_KEYS)


def member_path(member: tarfile.TarInfo) -> str:
    """The member's path relative to the workspace ("" for the root), refused when it
    could leave it."""
    name = os.path.normpath(member.name)
    if name == ".":
        return ""
    if name.startswith(("/", "../")) or name == "..":
        raise PreviewUnavailable(f"The preview's upper layer holds a strange path {name!r}.")
    return name


def read_changes(tar_path: Path, workspace: Path) -> tuple[list[dict[str, Any]], int]:
    """Every change the upper layer makes to `workspace`, in path order (at most
    LIST_CHANGES, and the count of the rest)."""
    changes: list[dict[str, Any]] = []
    with tarfile.open(tar_path) as tar:
        members: dict[str, tarfile.TarInfo] = {}
        for member in tar.getmembers():
            rel = member_path(member)
            if rel in members:  # GNU tar of a directory names each path once; the apply
                # writes every member, so a tar that does not is never read
                raise PreviewUnavailable(f"The preview's upper layer names {rel!r} twice.")
            members[rel] = member
        # (one budget of line matching for all the effect's diffs: one each, a command
        # rewriting 300 files of crafted lines held the admitting thread about a minute)
        matching = Budget()
        for rel, member in members.items():
            changes.extend(_changes_of(rel, member, members, tar, workspace, matching))
    for change in changes:  # the effect is JSON text, its digest over UTF-8
        for key in ("path", "target", "link"):
            if isinstance(change.get(key), str) and not _is_utf8(change[key]):
                raise PreviewUnavailable(
                    f"The effect holds a file name that is not UTF-8 ({change[key]!r})."
                )
    changes.sort(key=lambda change: change["path"])
    listed = changes[:LIST_CHANGES]
    budget = DIFF_TOTAL
    for change in listed:
        if (deleted := change.pop(_DEFERRED, None)) is not None:
            change |= _content(_lower_bytes(workspace, deleted), None)
        if change.get("diff") and len(change["diff"]) > budget:
            change["diff"], change["diff_omitted"] = None, True
        elif change.get("diff"):
            budget -= len(change["diff"])
    return listed, max(0, len(changes) - LIST_CHANGES)


# A deleted file's content (size, hash, diff) is read only when it is listed: `rm -rf` of
# a tree of 20,000 files (node_modules) read and diffed every one of them at admission,
# under the workspace's lock, for an effect listing 2,000 (4 s; 200,000 files, 40 s).
_DEFERRED = "_deleted_from"


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # bytes tarfile and os kept as surrogates
        return False
    return True


def _lower(workspace: Path, rel: str) -> os.stat_result | None:
    """What the workspace holds at `rel`, never through a symlink: a path below a symlink
    (or below anything but a directory) does not exist in the workspace. Its directory is
    opened below the held one (`_directory_below`), never walked again by path: in a
    workspace nested in another agent's, that agent's program may swap a directory of it
    for a symlink to a person's tree at any moment."""
    try:
        if not rel:  # followed: `workspace` may be a held descriptor's /proc/self/fd link
            return os.stat(workspace)
        parent, name = os.path.split(rel)
        with _directory_below(workspace, parent) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if _confined.changed(error):  # a symlink on the way: below it is not the workspace
            return None
        raise


@contextlib.contextmanager
def _directory_below(workspace: Path, rel: str) -> Iterator[int]:
    """A descriptor of the directory `rel` ("" for the root) beneath the directory
    `workspace` names (a held descriptor's /proc/self/fd link stays the directory it
    holds), no symlink followed (_confined.open_below). Raises OSError: ELOOP when a
    symlink stands on the way now (`_confined.changed`), ENOENT, ENOTDIR."""
    root_fd = os.open(workspace, _confined.DIRECTORY)
    try:
        fd = _confined.open_below(root_fd, rel, _confined.DIRECTORY)
    finally:
        os.close(root_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _entries(workspace: Path, rel: str) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of each entry of the directory `rel` of the workspace, by name, read
    through its descriptor (`_directory_below`): a directory swapped for a symlink since
    it was judged one is refused (OSError ELOOP), never listed (a person's names in the
    effect). Each entry is statted while the descriptor is open (a DirEntry of a
    descriptor's scandir stats through that descriptor's number)."""
    found = []
    with _directory_below(workspace, rel) as fd, os.scandir(fd) as scan:
        for entry in scan:
            with contextlib.suppress(FileNotFoundError):
                found.append((entry.name, os.stat(entry.name, dir_fd=fd, follow_symlinks=False)))
    return sorted(found, key=lambda pair: pair[0])


def _readlink_below(workspace: Path, rel: str) -> str:
    """The target of the symlink `rel`, read through its directory's descriptor."""
    parent, name = os.path.split(rel)
    with _directory_below(workspace, parent) as fd:
        return os.readlink(name, dir_fd=fd)


@dataclass(frozen=True)
class _Large:
    """A workspace file past DIFF_BYTES: hashed as it is read, never held whole (one
    deleted or truncated file of the workspace may be any size)."""

    size: int
    sha256: str


def _lower_bytes(workspace: Path, rel: str) -> bytes | _Large:
    """A regular file of the workspace, opened with no symlink followed (_confined)."""
    with _opened_beneath(workspace, rel) as fd:
        chunks: list[bytes] = []
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            size += len(chunk)
            if size <= DIFF_BYTES:
                chunks.append(chunk)
        return b"".join(chunks) if size <= DIFF_BYTES else _Large(size, digest.hexdigest())


@contextlib.contextmanager
def _opened_beneath(workspace: Path, rel: str) -> Iterator[int]:
    """`rel` opened for reading beneath the directory `workspace` names, as
    _confined.opened does, without resolving `workspace` to a path first: a held
    descriptor's /proc/self/fd link (run_preview) stays the directory it holds."""
    root_fd = os.open(workspace, _confined.DIRECTORY)
    try:
        fd = _confined._openat2(root_fd, rel, _confined.READ, 0)
        if fd is None:
            fd = _confined._walk_open(root_fd, tuple(rel.split("/")), _confined.READ, 0)
    finally:
        os.close(root_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _size_and_sha256(data: bytes | _Large) -> tuple[int, str]:
    if isinstance(data, _Large):
        return data.size, data.sha256
    return len(data), hashlib.sha256(data).hexdigest()


def _same(before: bytes | _Large | None, after: bytes | None) -> bool:
    if isinstance(before, _Large) and after is not None:
        return _size_and_sha256(before) == _size_and_sha256(after)
    return before == after


def _changes_of(
    rel: str,
    member: tarfile.TarInfo,
    members: dict[str, tarfile.TarInfo],
    tar: tarfile.TarFile,
    workspace: Path,
    matching: Budget,
) -> Iterator[dict[str, Any]]:
    lower = _lower(workspace, rel)
    if _is_whiteout(member):
        if lower is not None:
            yield from _deleted_tree(workspace, rel, lower)
        return
    if lower is not None and not _same_kind(member, lower):
        yield from _deleted_tree(workspace, rel, lower)
        lower = None
    if member.isdir():
        if lower is None:
            yield _change(rel, "created", "dir", None, member.mode)
        elif stat.S_IMODE(lower.st_mode) != member.mode:
            yield _change(rel, "mode", "dir", stat.S_IMODE(lower.st_mode), member.mode)
        if _is_opaque(member) and lower is not None:
            yield from _hidden_by_opaque(workspace, rel, members)
        return
    if not (member.isfile() or member.islnk() or member.issym()):
        yield _change(rel, "created", "special", None, member.mode)  # a FIFO: not applied
        return
    if member.issym():
        before = _readlink_below(workspace, rel) if lower is not None else None
        if before != member.linkname:
            yield {
                **_change(rel, "changed" if before else "created", "symlink", None, None),
                "target": member.linkname,
            }
        return
    yield from _file_change(rel, member, lower, tar, workspace, matching)


def _same_kind(member: tarfile.TarInfo, lower: os.stat_result) -> bool:
    if member.isdir():
        return stat.S_ISDIR(lower.st_mode)
    if member.issym():
        return stat.S_ISLNK(lower.st_mode)
    return stat.S_ISREG(lower.st_mode)


def _change(
    rel: str, change: str, kind: str, mode_before: int | None, mode_after: int | None
) -> dict[str, Any]:
    return {
        "path": rel,
        "change": change,
        "kind": kind,
        "mode_before": _octal(mode_before),
        "mode_after": _octal(mode_after),
    }


def _when(seconds: float) -> str:
    """A modification time as the effect shows it: UTC, to the second (a tar's precision)."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _octal(mode: int | None) -> str | None:
    return None if mode is None else f"{stat.S_IMODE(mode):04o}"


def _file_change(
    rel: str,
    member: tarfile.TarInfo,
    lower: os.stat_result | None,
    tar: tarfile.TarFile,
    workspace: Path,
    matching: Budget,
) -> Iterator[dict[str, Any]]:
    link = None
    if member.islnk():  # applied as a hard link: shown with the path it shares a file with
        try:
            source = tar.getmember(member.linkname)
        except KeyError:
            raise PreviewUnavailable(
                f"The preview's upper layer links {rel!r} to a path it does not hold."
            ) from None
        link = member_path(source)
        after = _member_bytes(tar, source)
    else:
        after = _member_bytes(tar, member)
    before = _lower_bytes(workspace, rel) if lower is not None else None
    mode_before = stat.S_IMODE(lower.st_mode) if lower is not None else None
    if _same(before, after) and mode_before == member.mode and link is None:
        # Copied up with its content and mode unchanged: applying it still sets its
        # modification time (preview_apply), an effect a build tool reads, so a new one
        # is shown ("touched"), never applied unseen.
        if lower is not None and int(member.mtime) != int(lower.st_mtime):
            change = _change(rel, "touched", "file", mode_before, member.mode)
            change["mtime_before"] = _when(lower.st_mtime)
            change["mtime_after"] = _when(member.mtime)
            yield change
        return
    kind = "changed" if before is not None else "created"
    if _same(before, after) and mode_before != member.mode:
        kind = "mode"
    change = _change(rel, kind, "file", mode_before, member.mode)
    if link is not None:
        change["link"] = link
    change |= _content(before, after, matching)
    yield change


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    return handle.read() if handle is not None else b""


def _content(
    before: bytes | _Large | None, after: bytes | None, matching: Budget | None = None
) -> dict[str, Any]:
    """A file change's sizes, hashes and diff (its line matching taken from `matching`,
    the effect's: dispatcher.tools.diffs)."""
    size_before, sha256_before = _size_and_sha256(before) if before is not None else (None, None)
    size_after, sha256_after = _size_and_sha256(after) if after is not None else (None, None)
    facts: dict[str, Any] = {
        "size_before": size_before,
        "size_after": size_after,
        "sha256_before": sha256_before,
        "sha256_after": sha256_after,
    }
    old, new = _text(before), _text(after)
    same = _same(before, after)
    if old is None or new is None or same:
        facts["diff"] = None
        facts["binary"] = not same and (old is None or new is None)
        return facts
    # (bounded in time, cut at newlines only: dispatcher.tools.diffs)
    lines = list(
        unified_diff(newline_lines(old), newline_lines(new), "before", "after", budget=matching)
    )
    facts["diff"] = "".join(lines)
    facts["binary"] = False
    return facts


def _text(data: bytes | _Large | None) -> str | None:
    """Text to diff, or None: binary or larger than DIFF_BYTES. A file is binary when
    more than ODD_BYTES (at least ODD_BYTES_MIN) of its bytes are NUL or not UTF-8; fewer
    are shown escaped (`\\x00`, `\\xff`) in the diff: one NUL in a script's comment
    once made its whole change sizes and hashes only (sh runs such a script)."""
    if data is None:
        return ""
    if isinstance(data, _Large) or len(data) > DIFF_BYTES:
        return None
    valid = len(data.decode("utf-8", errors="ignore").encode())
    odd = data.count(b"\0") + len(data) - valid
    if odd > max(ODD_BYTES_MIN, len(data) * ODD_BYTES):
        return None
    return data.decode("utf-8", errors="backslashreplace").replace("\0", "\\x00")


ODD_BYTES = 0.01
ODD_BYTES_MIN = 16


def _deleted_tree(workspace: Path, rel: str, lower: os.stat_result) -> Iterator[dict[str, Any]]:
    """A deleted path; for a directory, everything in it too. Walked with a stack of its
    own: os.fwalk recurses once per level (a tree 1,200 deep raised RecursionError)."""
    yield from _deleted_one(workspace, rel, lower)
    pending = [rel] if stat.S_ISDIR(lower.st_mode) else []
    while pending:
        top = pending.pop()
        for name, info in _entries(workspace, top):
            path = os.path.join(top, name)
            yield from _deleted_one(workspace, path, info)
            if stat.S_ISDIR(info.st_mode):
                pending.append(path)


def _deleted_one(workspace: Path, rel: str, info: os.stat_result) -> Iterator[dict[str, Any]]:
    if stat.S_ISDIR(info.st_mode):
        yield _change(rel, "deleted", "dir", info.st_mode, None)
    elif stat.S_ISLNK(info.st_mode):
        yield _change(rel, "deleted", "symlink", None, None)
    elif stat.S_ISREG(info.st_mode):  # its content read once it is listed (read_changes)
        yield _change(rel, "deleted", "file", info.st_mode, None) | {_DEFERRED: rel}
    else:
        yield _change(rel, "deleted", "file", info.st_mode, None) | _content(b"", None)


def _hidden_by_opaque(
    workspace: Path, rel: str, members: dict[str, tarfile.TarInfo]
) -> Iterator[dict[str, Any]]:
    """What an opaque directory (removed and made again) drops of the lower one: the apply
    removes the whole lower directory, so a directory the upper layer made again beneath
    it (a plain one: `mkdir -p` under the opaque one) hides nothing of the lower one's
    content either; every lower path the upper layer does not name is deleted."""
    pending = [rel]  # a stack, not recursion: the upper layer may nest 8,000 deep
    while pending:
        top = pending.pop()
        for name, info in _entries(workspace, top):
            path = os.path.join(top, name)
            member = members.get(path)
            if member is None:
                yield from _deleted_tree(workspace, path, info)
            elif (
                member.isdir()
                and not _is_opaque(member)  # an opaque one lists its own (_changes_of)
                and stat.S_ISDIR(info.st_mode)
            ):
                pending.append(path)


# --- The world the preview saw --------------------------------------------------------------


def fingerprint_of(workspace: Path, *, root_fd: int | None = None) -> str:
    """`fingerprint_with_gaps`'s digest alone (an apply's check: a preview with gaps is
    never applied)."""
    return fingerprint_with_gaps(workspace, root_fd=root_fd)[0]


def fingerprint_with_gaps(workspace: Path, *, root_fd: int | None = None) -> tuple[str, list[str]]:
    """A digest of every entry of `workspace` by kind, mode, size, mtime, ctime and inode
    (Harness's hidden directories left out: the sandbox never shows them), and of what
    git reads from outside it (`git_outside.outside_state`: the main repository of a
    linked worktree, an included configuration, /etc/gitconfig). Symlinks are
    read as links, never followed. With `root_fd` (a descriptor of `workspace`, resolved)
    the walk starts at the directory it holds, never at the path, which a program may
    have redirected since (a nested workspace's preview). With it, what the digest could
    not take whole (`git_outside.outside_state_and_gaps`: past a bound, or a command line
    a configuration runs that is the shell's to read), each said for a reviewer."""
    hidden = {str(path) for path in sandbox.hidden_paths()}
    digest = hashlib.sha256()
    root = str(workspace.resolve()) if root_fd is None else str(workspace)
    # Each directory is opened below the root with no symlink followed (`_entries`), never
    # by a path through the last: a directory swapped for a symlink to / meanwhile (a
    # program of the workspace a nested one lies in) had the walk read the whole of it.
    base = Path(root) if root_fd is None else Path(f"/proc/self/fd/{root_fd}")
    pending = [""]
    dot_gits: list[str] = []  # (the `.git` entries: what they name outside, below)
    while pending:
        prefix = pending.pop()
        try:
            entries = _entries(base, prefix.rstrip("/"))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as error:
            if not _confined.changed(error):
                raise
            continue  # a symlink now where a directory was: its own entry tells them apart
        for name, info in entries:
            rel = prefix + name
            if os.path.join(root, rel) in hidden:
                continue
            digest.update(
                f"{rel}\0{info.st_mode:o} {info.st_size} {info.st_mtime_ns} "
                f"{info.st_ctime_ns} {info.st_ino}\n".encode(errors="surrogateescape")
            )
            if stat.S_ISDIR(info.st_mode):
                pending.append(rel + "/")
            if sandbox_git.fold(name) == ".git":
                dot_gits.append(rel)
    outside, gaps = git_outside.outside_state_and_gaps(Path(root), base, dot_gits)
    digest.update(outside.encode(errors="replace"))
    top_info = os.lstat(root) if root_fd is None else os.fstat(root_fd)
    digest.update(f".\0{top_info.st_mode:o} {top_info.st_mtime_ns} {top_info.st_ctime_ns}".encode())
    return digest.hexdigest(), gaps


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
