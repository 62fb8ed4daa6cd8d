"""Stage 8 listener of the policy: a search or a listing never shows what a read would not.

`hide_read_denied` is in `HARNESS_POST_EXECUTE`. For `search_files` and `list_directory`
it drops the result lines of files that one of the owner's deny or ask rules on
`read_file` names (as given or with symlinks resolved), and says how many it dropped.
Whole directories such a rule covers are refused before anything runs, by the rules
(`rules._binds_read_scope`); this catches single files inside a searched directory.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable

from dispatcher.policy.context import CallContext
from dispatcher.policy.rules import READ_SCOPE_TOOLS, READ_TOOL, read_rule_hiding

# `path:line: text`: a file name may itself hold `:12: `, so every such split is tried.
LINE_NUMBER = re.compile(r":\d+: ")


def hide_read_denied(call: CallContext, content: str) -> str:
    """`content` without the lines a read rule of any layer would deny or ask for;
    unchanged for other tools and when no layer holds such rules."""
    if call.name not in READ_SCOPE_TOOLS:
        return content
    profile = call.profile
    texts = [*profile.deny, *profile.ask]
    texts += [t for layer in profile.layers for t in (*layer.deny, *layer.ask)]
    if not any(text.strip().startswith(READ_TOOL) for text in texts):
        return content
    lines = content.split("\n")
    if call.name == "search_files":
        head, body = [], lines
        paths_of: Callable[[str], list[str]] = _search_paths
    else:
        base = posixpath.normpath(str(call.arguments.get("path", ".")))
        head, body = lines[:1], lines[1:]

        def paths_of(line: str) -> list[str]:
            name = line.rstrip("/")
            return [] if not name or line.startswith("[") else [posixpath.join(base, name)]

    kept: list[str] = []
    hidden, rule = 0, ""
    for line in body:
        found = next(
            (found for path in paths_of(line) if (found := read_rule_hiding(call, path))), None
        )
        if found is None:
            kept.append(line)
        else:
            hidden, rule = hidden + 1, found
    if not hidden:
        return content
    note = f"[{hidden} result(s) hidden: reading them is denied or needs approval ('{rule}')]"
    return "\n".join([*head, *kept, note])


def _search_paths(line: str) -> list[str]:
    """Every path a `path:line: text` result line could start with."""
    return [line[: found.start()] for found in LINE_NUMBER.finditer(line)]
