"""The rules editor's rows: one rule per row (action, tool, specifier), to and from a
profile's lists and a posted form, each row checked as the server checks it on save.

A rule list entry is a string (`run_command(npm test *)`) or, for entries that carry more
than their rule (a quorum ask: `{"rule": ..., "approvals": 2, "group": ...}`), an object
with a "rule" key: a row keeps such an entry's other keys (`extra`) and gives them back on
save, so the editor never drops what it does not show. Reads and checks only; saving is
`profiles.update_profile`'s.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.http import QueryDict

from dispatcher.policy import rules
from dispatcher.policy.context import Profile
from dispatcher.tools.base import Tool
from dispatcher.tools.registry import all_tools

ACTIONS = rules.ACTIONS  # deny, then ask, then allow: the order they are applied in
BLANK_ROWS = 1
MAX_ROWS = 500
# Hand-picked examples for the built-in tools; others get examples from their schema.
EXAMPLES: dict[str, list[str]] = {
    "run_command": ["npm test *", "git status", "git diff *", "rm *", "curl *"],
    "write_file": ["src/**", "docs/*.md", "content:*BEGIN PRIVATE KEY*"],
    "read_file": ["src/**", "*.md", ".env"],
    "delete_file": ["build/**", "*.tmp"],
    "list_directory": ["src/**", "."],
    "search_files": ["src/**", "pattern:*password*"],
}


def rule_text(entry: Any) -> str:
    """The rule of a list entry, whatever its shape (a string, or an object's "rule")."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping):
        return str(entry.get("rule", ""))
    return str(entry)


def entry_extra(entry: Any) -> dict[str, Any]:
    """What an object entry carries beside its rule (empty for a string)."""
    if isinstance(entry, Mapping):
        return {str(k): v for k, v in entry.items() if k != "rule"}
    return {}


@dataclass
class Row:
    action: str
    tool: str
    specifier: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    key: str = field(default_factory=lambda: secrets.token_hex(4))
    problems: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        tool, spec = self.tool.strip(), self.specifier.strip()
        return f"{tool}({spec})" if spec else tool

    @property
    def blank(self) -> bool:
        return not self.tool.strip() and not self.specifier.strip()

    @property
    def entry(self) -> str | dict[str, Any]:
        return {"rule": self.text, **self.extra} if self.extra else self.text

    @property
    def extra_json(self) -> str:
        return json.dumps(self.extra, sort_keys=True) if self.extra else ""

    @property
    def extra_reads(self) -> str:
        """The extra keys as a person reads them ("needs 2 approvals from group leads")."""
        if not self.extra:
            return ""
        parts = []
        if "approvals" in self.extra:
            who = f" from group {self.extra['group']}" if "group" in self.extra else ""
            parts.append(f"needs {self.extra['approvals']} approvals{who}")
        elif "group" in self.extra:
            parts.append(f"asks group {self.extra['group']}")
        if self.extra.get("log_only") is True:
            parts.append("log-only: recorded, decides nothing")
        skip = ("approvals", "group", "log_only")
        others = {k: v for k, v in self.extra.items() if k not in skip}
        parts += [f"{k}: {json.dumps(v)}" for k, v in sorted(others.items())]
        return ", ".join(parts)


def split_rule(text: str) -> tuple[str, str]:
    """`Tool(spec)` as (tool, spec); text that does not read as a rule stays whole in the
    tool field, so the check names it exactly as typed."""
    try:
        rule = rules.parse_rule(text)
    except rules.RuleError:
        return text, ""
    return rule.tool, rule.specifier or ""


def rows_from_lists(lists: Mapping[str, Iterable[Any]]) -> list[Row]:
    rows = []
    for action in ACTIONS:
        for entry in lists.get(action, []) or []:
            tool, spec = split_rule(rule_text(entry))
            rows.append(Row(action, tool, spec, entry_extra(entry)))
    return rows


def profile_entries(profile: Profile, action: str) -> list[Any]:
    """One list of `profile` as entries: quorum ask rules as their objects (the profile
    keeps their texts in `ask` and the requirement in `quorum`), and log-only rules (kept
    in `trial` only) as `{"rule", "log_only": true}` after the active ones, so saving the
    rows keeps both."""
    quorum = {q.rule: q for q in profile.quorum} if action == "ask" else {}
    entries: list[Any] = []
    for text in getattr(profile, action):
        q = quorum.get(text)
        if q is None:
            entries.append(text)
        elif q.groups:
            entries.append(
                {"rule": q.rule, "approvals": [{"group": g, "count": n} for g, n in q.groups]}
                | ({"step_up": list(q.step_up)} if q.step_up else {})
            )
        else:
            entries.append(
                {"rule": q.rule, "approvals": q.approvals}
                | ({"group": q.group} if q.group else {})
                | ({"step_up": list(q.step_up)} if q.step_up else {})
            )
    entries += [{"rule": t.rule, "log_only": True} for t in profile.trial if t.action == action]
    return entries


def rows_from_profile(profile: Profile) -> list[Row]:
    return rows_from_lists({a: profile_entries(profile, a) for a in ACTIONS})


def rows_from_post(data: QueryDict) -> list[Row]:
    """The posted rows (parallel lists rule_action, rule_tool, rule_spec, rule_extra,
    rule_key), blank rows dropped. An unknown action or an extra that is not a JSON object
    becomes a problem on its row, never an error page."""
    fields = [data.getlist(f"rule_{name}") for name in ("action", "tool", "spec", "extra", "key")]
    count = min(max((len(f) for f in fields[:3]), default=0), MAX_ROWS)
    rows = []
    for i in range(count):
        action, tool, spec, extra_text, key = (f[i] if i < len(f) else "" for f in fields)
        row = Row(action.strip(), tool.strip(), spec.strip(), key=key[:16] or secrets.token_hex(4))
        if row.blank:
            continue
        if row.action not in ACTIONS:
            row.problems.append(f"Choose deny, ask or allow for '{row.text}'.")
        if extra_text:
            try:
                extra = json.loads(extra_text)
            except ValueError:
                extra = None
            if isinstance(extra, dict):
                row.extra = {k: v for k, v in extra.items() if k != "rule"}
            else:
                row.problems.append(f"The settings kept with '{row.text}' are unreadable.")
        rows.append(row)
    return rows


def lists_from_rows(rows: Iterable[Row]) -> dict[str, list[Any]]:
    lists: dict[str, list[Any]] = {action: [] for action in ACTIONS}
    for row in rows:
        if row.action in lists:
            lists[row.action].append(row.entry)
    return lists


def check_rows(rows: list[Row], tools: Sequence[Tool] | None = None) -> list[Row]:
    """Each row's problems, as `rules.validate_rules` words them on save (naming the
    pattern). Returns the rows, checked."""
    tools = tools if tools is not None else all_tools()
    for row in rows:
        if row.action in ACTIONS and not row.problems:
            row.problems = rules.validate_rules({row.action: [row.text]}, tools)
    return rows


def examples(tool: Tool) -> list[str]:
    """Specifiers worth copying for `tool`: hand-picked for built-ins, else from its schema."""
    if tool.name in EXAMPLES:
        return EXAMPLES[tool.name]
    out = []
    if tool.command_argument:
        out += ["make test", "git status *"]
    if tool.path_arguments:
        out += ["src/**", "*.md"]
    params = list(tool.parameters.get("properties", {}))
    if params:
        out.append(f"{params[0]}:*")
    return out


def tool_choices(rows: Iterable[Row], tools: Sequence[Tool] | None = None) -> list[dict[str, Any]]:
    """The registry's tools (or `tools`: those serving a team admin's teams) with their
    examples, plus any tool a saved rule names that the registry no longer has (so such a
    rule shows, and is flagged, rather than vanishing)."""
    registered = tools if tools is not None else all_tools()
    choices = [
        {"name": t.name, "examples": examples(t), "registered": True, "kind": _kind(t)}
        for t in registered
    ]
    known = {t.name for t in registered}
    for row in rows:
        if row.tool and row.tool not in known:
            choices.append({"name": row.tool, "examples": [], "registered": False, "kind": ""})
            known.add(row.tool)
    return choices


def _kind(tool: Tool) -> str:
    if tool.command_argument:
        return "a command pattern: words, a trailing ' *' for any arguments"
    if tool.path_arguments:
        return "a path pattern, gitignore-style, relative to the workspace"
    return "param:glob on one of its parameters"
