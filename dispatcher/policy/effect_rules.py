"""Effect rules: allow a command by what its preview shows it does, not by its text
(docs/rules.md, "Effect rules"; issue 36).

    effect(write: build/**, network: none)
    effect(write: build/** dist/**, exit: 0)

An effect rule sits in an allow list. Clauses, comma-separated, each at most once:

- `write: PATTERN...` (required): gitignore-style patterns relative to the workspace,
  separated by spaces; every path the effect creates, changes, deletes or re-modes must
  match one (a directory matches when a pattern matches what it holds), and so must the
  other name of every hard link it makes.
- `network: none` (the default, and the only value): the preview did not try the network.
- `exit: 0`: the previewed command exited 0.

It only ever turns an ask that came from the mode (standard mode asking for a command
no rule named) into an allow: a deny or ask rule, the unreadable-command ask, a quorum
and every guard still decide first. And it allows only an effect that can be applied
(no limit hit, no network tried): since the previewed effect is what Harness applies,
the rule holds exactly for what happens.

`decide(ctx, decision, effect)` is the one hook the decision path calls (admission,
after the preview); parsing and matching live here alone.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec

from dispatcher.policy.context import CallContext, Decision, Layer
from dispatcher.tools import sandbox_git

NAME = "effect"
_RULE = re.compile(r"^\s*effect\s*\((.*)\)\s*$", re.DOTALL)
_CLAUSE = re.compile(r"^\s*(write|network|exit)\s*:\s*(.*?)\s*$", re.DOTALL)
PROBE = "harness-probe-8f2c"


class EffectRuleError(ValueError):
    """An effect rule that cannot be read; the message names the rule and the problem."""


@dataclass(frozen=True)
class EffectRule:
    text: str
    write: tuple[str, ...]
    exit_zero: bool = False

    @functools.cached_property
    def spec(self) -> pathspec.PathSpec[Any]:
        return pathspec.PathSpec.from_lines("gitignore", self.write)

    def allows(self, effect: dict[str, Any]) -> bool:
        """Whether the effect document (preview.Effect.document(), with `appliable`) is
        inside this rule."""
        if not effect.get("appliable") or effect.get("network_attempted"):
            return False
        if self.exit_zero and effect.get("exit_status") != 0:
            return False
        return all(self._covers(change) for change in effect.get("changes", []))

    def _covers(self, change: dict[str, Any]) -> bool:
        if change.get("link") is not None and not self._covers({"path": change["link"]}):
            return False  # a hard link: a write to one name is a write to the other
        path = str(change.get("path", ""))
        if not path or path.startswith("/") or path == ".." or path.startswith("../"):
            return False
        named = path.rsplit("/", 1)[-1]
        if sandbox_git.guarded_path(path) or (named == ".git" and change.get("kind") != "dir"):
            return False  # what makes git run programs: only a person approves a write to it
        if change.get("kind") == "symlink" and ".git" in path.split("/")[:-1]:
            # git writes through one (`.git/COMMIT_EDITMSG -> ~/.bashrc`: a person's
            # commit wrote its message there), and Harness applies it outside the sandbox
            return False
        if self.spec.match_file(path):
            return True
        return change.get("kind") == "dir" and bool(self.spec.match_file(f"{path}/{PROBE}"))


def is_effect_rule(text: object) -> bool:
    return isinstance(text, str) and text.strip().startswith(NAME) and bool(_RULE.match(text))


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> EffectRule:
    """Read `effect(...)`; raise EffectRuleError naming what is wrong."""
    found = _RULE.match(text)
    if found is None:
        raise EffectRuleError(f"Rule '{text}' is not an effect rule: write 'effect(write: ...)'.")
    seen: dict[str, str] = {}
    for clause in found.group(1).split(","):
        part = _CLAUSE.match(clause)
        if part is None:
            raise EffectRuleError(
                f"Effect rule '{text.strip()}': '{clause.strip()}' is not a clause; use "
                "'write: PATTERNS', 'network: none' or 'exit: 0'."
            )
        key, value = part.group(1), part.group(2)
        if key in seen:
            raise EffectRuleError(f"Effect rule '{text.strip()}' names '{key}' twice.")
        seen[key] = value
    if not seen.get("write"):
        raise EffectRuleError(
            f"Effect rule '{text.strip()}' has no 'write:' patterns: name where the "
            "command may write (e.g. 'write: build/**')."
        )
    if seen.get("network", "none") != "none":
        raise EffectRuleError(
            f"Effect rule '{text.strip()}': 'network' can only be 'none' (a preview has none)."
        )
    if seen.get("exit", "0") != "0":
        raise EffectRuleError(f"Effect rule '{text.strip()}': 'exit' can only be 0.")
    patterns = tuple(seen["write"].split())
    for pattern in patterns:
        if pattern.startswith("/") or ".." in pattern.split("/") or pattern.startswith("!"):
            raise EffectRuleError(
                f"Effect rule '{text.strip()}': '{pattern}' must be a pattern inside the "
                "workspace (relative, no '..', no '!')."
            )
    try:
        pathspec.PathSpec.from_lines("gitignore", patterns)
    except ValueError as error:
        raise EffectRuleError(f"Effect rule '{text.strip()}': {error}") from None
    return EffectRule(text.strip(), patterns, exit_zero="exit" in seen)


def problems(action: str, text: str) -> list[str]:
    """What the rule validator reports for an effect rule in the `action` list."""
    if action != "allow":
        return [f"{action}: Effect rule '{text.strip()}' can only be an allow rule."]
    try:
        parse(text)
    except EffectRuleError as error:
        return [f"{action}: {error}"]
    return []


def matching(texts: Iterable[str], effect: dict[str, Any]) -> str | None:
    """The first effect rule of `texts` that allows `effect`, or None (unreadable
    effect rules never allow)."""
    for text in texts:
        if not is_effect_rule(text):
            continue
        try:
            rule = parse(text)
        except EffectRuleError:
            continue
        if rule.allows(effect):
            return rule.text
    return None


def _in_git_directory(workspace: Path | str, effect: dict[str, Any]) -> bool:
    """Whether a change of `effect` writes what git reads of a directory of the workspace
    that is a git directory to git by its own names, or becomes one by the change
    (`sandbox_git.in_git_directory`: `src/HEAD` beside `src/objects/` and `src/refs/`, and
    the `src/config` an earlier run left with core.pager ran at the person's `git log` in
    `src/`). Applied outside the sandbox, no check after a run follows it."""
    paths = [
        str(path)
        for change in effect.get("changes", [])
        for path in (change.get("path"), change.get("link"))
        if path
    ]
    # (all together: `git init --bare x` with a hook makes `x` one with no path alone)
    return sandbox_git.makes_git_directory(Path(workspace), paths)


def decide(
    ctx: CallContext, decision: Decision, effect: dict[str, Any], layers: Iterable[Layer]
) -> Decision | None:
    """An allow in place of `decision` (an ask) when an effect rule in the allow list of
    one of the call's policy `layers` (organization, team, owner: dispatcher.policy.layers.
    stack, top first) allows the previewed `effect`, else None. Only an ask that came from
    the mode can be lifted: an ask or deny rule of any layer, a quorum or the
    unreadable-command ask stand (they decided before the mode)."""
    if decision.action != "ask" or not decision.by.startswith("mode:"):
        return None
    if sandbox_git.unguardable(ctx.workspace) is not None:
        return None  # its git configuration reads what the effect could write: a person decides
    if _in_git_directory(ctx.workspace, effect):
        return None  # what git reads of a bare repository in the work tree, or its HEAD
    for layer in layers:
        rule = matching(layer.allow, effect)
        if rule is None:
            continue
        reason = (
            f"Effect rule '{rule}' in {layer.whose} allow list ({layer.label}): the previewed "
            "effect only writes where it allows, and that effect is what is applied."
        )
        return Decision(
            "allow",
            f"rule:allow:{rule}",
            reason,
            rule=rule,
            layer=layer.key,
            layer_version=layer.version,
        )
    return None
