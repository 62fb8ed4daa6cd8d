"""Permission rules: `Tool` or `Tool(specifier)` in allow / ask / deny lists (DESIGN section 3).

A specifier is read according to the tool it names:

- `param:glob` when `param` is one of the tool's parameters (`write_file(content:*TODO*)`):
  `fnmatchcase` on the argument's string value.
- a command pattern for a tool with a `command_argument` (`run_command(npm test *)`):
  words, where a trailing ` *` means "and any arguments" and `*` elsewhere means one or
  more words. Compound commands are split into parts; see `command_rule_decision`.
- a gitignore-style path pattern for a tool with `path_arguments` (`write_file(src/**)`),
  relative to the session workspace, matched against the given path and the path with
  symlinks resolved.

Matching is asymmetric on purpose, and always in the safe direction: deny and ask rules
match when *any* reading of the call matches (any part of a compound command, either the
given or the resolved path, a command name that could expand to the pattern's); allow
rules match only when *every* reading does. Nothing the parser cannot read is ever
auto-allowed.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import os
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from dispatcher.policy.context import CallContext
from dispatcher.policy.shell import (
    GLOB_CHARACTERS,
    SHELLS,
    UnreadableCommand,
    WrapperSpec,
    command_name,
    could_be,
    find_exec_commands,
    is_computed,
    option_value,
    parse_trees,
    shell_invocation,
    unwrap_chain,
    wrapper_opacity,
)
from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import Tool, command_argv

logger = logging.getLogger(__name__)

ACTIONS = ("deny", "ask", "allow")
MAX_DEPTH = 8
TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
PARAM_SPEC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(.*)$", re.DOTALL)

# Assignments that change which program runs or what it loads: a command prefixed by one
# (`LD_PRELOAD=x npm test`, `env PATH=. ls`) is never auto-allowed by a command rule.
RISKY_VARIABLES = re.compile(
    r"^(PATH|LD_\w*|DYLD_\w*|BASH_ENV|ENV|IFS|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|"
    r"PYTHONPATH|PYTHONSTARTUP|PYTHONHOME|NODE_OPTIONS|NODE_PATH|PERL5LIB|PERL5OPT|RUBYOPT|"
    r"RUBYLIB|GIT_\w*|npm_config_\w*|NPM_CONFIG_\w*|BASH_FUNC_\w*.*)="
)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Wrappers that run their operand with more rights: looked through by deny/ask rules only
# (the command guard blocks them outright).
PRIVILEGE_WRAPPERS = {"sudo": "ugChpDrtTU", "doas": "uC", "pkexec": "", "runuser": "ugGsw"}
# `su -c STRING` / `runuser [USER] -c STRING` run a shell string.
SU_SPEC = WrapperSpec("cgGsw", frozenset({"command", "session-command", "group", "shell"}))
SAFE_REDIRECT_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


class RuleError(ValueError):
    """A rule that cannot be read or does not fit its tool; the message names the rule."""


# --- parsing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One parsed rule. `specifier` is None for a bare `Tool` rule (every call of the tool)."""

    text: str
    tool: str
    specifier: str | None = None

    def matches(self, call: CallContext, action: str = "allow") -> bool:
        """Does this rule match `call` when it sits in the `action` list?

        For "deny" and "ask" any reading that matches is enough; for "allow" every
        reading must match (and an unreadable command never does).
        """
        if self.tool != call.name and self.tool not in call.tool.rule_aliases:
            return False
        strict = action == "allow"
        if self.specifier is None:
            if strict and call.tool.command_argument:
                return _command_analysis(call).unreadable is None
            return True
        kind = specifier_kind(self, call.tool)
        if kind == "param":
            return _param_matches(self, call, strict)
        if kind == "command":
            analysis = _command_analysis(call)
            pattern = command_pattern(self.specifier)
            if strict:
                if analysis.unreadable is not None:
                    return False
                parts = analysis.strict_parts
                return bool(parts) and all(_allows(pattern, part) for part in parts)
            return any(pattern.matches(part.argv, loose=True) for part in analysis.parts)
        return _path_matches(self, call, strict)


def parse_rule(text: str) -> Rule:
    """Read `Tool` or `Tool(specifier)`; raise RuleError naming the pattern when it is malformed."""
    if not isinstance(text, str):
        raise RuleError(f"Rule {text!r} is not a string.")
    raw = text.strip()
    if not raw:
        raise RuleError("Empty rule: write 'Tool' or 'Tool(specifier)'.")
    if "(" not in raw and ")" not in raw:
        name, specifier = raw, None
    else:
        name, sep, rest = raw.partition("(")
        if not sep:
            raise RuleError(f"Rule '{raw}' has ')' without '(': write 'Tool(specifier)'.")
        if not rest.endswith(")"):
            raise RuleError(
                f"Rule '{raw}' has unbalanced parentheses: it must end with ')' closing "
                f"the '(' after '{name.strip()}'."
            )
        specifier = rest[:-1]
        if _paren_depth_broken(specifier):
            raise RuleError(
                f"Rule '{raw}' has unbalanced parentheses inside its specifier '{specifier}'."
            )
        if not specifier.strip():
            raise RuleError(
                f"Rule '{raw}' has an empty specifier: write '{name.strip()}' to match every "
                f"call, or put a pattern between the parentheses."
            )
        specifier = specifier.strip()
    name = name.strip()
    if not name:
        raise RuleError(f"Rule '{raw}' has no tool name before '('.")
    if not TOOL_NAME.match(name):
        raise RuleError(f"Rule '{raw}': '{name}' is not a valid tool name.")
    return Rule(text=raw, tool=name, specifier=specifier)


def _paren_depth_broken(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return True
    return depth != 0


@functools.lru_cache(maxsize=4096)
def _cached_rule(text: str) -> Rule:
    return parse_rule(text)


def specifier_kind(rule: Rule, tool: Tool) -> str:
    """'param', 'command' or 'path': how `rule.specifier` is read for `tool`.

    Raises RuleError when the tool takes neither a path, a command nor that parameter.
    """
    assert rule.specifier is not None
    found = PARAM_SPEC.match(rule.specifier)
    properties = tool.parameters.get("properties", {})
    if found and found.group(1) in properties:
        return "param"
    if tool.command_argument:
        return "command"
    if tool.path_arguments:
        return "path"
    names = ", ".join(sorted(properties)) or "none"
    if found:
        raise RuleError(
            f"Rule '{rule.text}': '{tool.name}' has no parameter '{found.group(1)}' "
            f"(its parameters: {names})."
        )
    raise RuleError(
        f"Rule '{rule.text}': '{tool.name}' takes no path or command, so its specifier must "
        f"be 'param:glob' (its parameters: {names})."
    )


def validate_rules(
    lists: Mapping[str, Iterable[str]], tools: Sequence[Tool] | None = None
) -> list[str]:
    """Every problem in `{"allow": [...], "ask": [...], "deny": [...]}`, one message per bad rule.

    Tool names are checked against `tools` (default: the registry). Empty list = valid.
    """
    from dispatcher.tools.registry import all_tools, rule_tool

    lookup = rule_tool if tools is None else (lambda name: None)
    by_name = {tool.name: tool for tool in (all_tools() if tools is None else tools)}
    problems: list[str] = []
    if not isinstance(lists, Mapping):
        return [
            f"Rules must be a mapping of {', '.join(ACTIONS)} to lists, not {type(lists).__name__}."
        ]
    for key in lists:
        if key not in ACTIONS:
            problems.append(f"Unknown rule list '{key}': use {', '.join(ACTIONS)}.")
    for action in ACTIONS:
        texts = lists.get(action, [])
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            problems.append(
                f"The {action} rules must be a list of strings, not {type(texts).__name__}."
            )
            continue
        for text in texts:
            try:
                rule = parse_rule(text)
                tool = by_name.get(rule.tool) or lookup(rule.tool)
                if tool is None:
                    raise RuleError(
                        f"Rule '{rule.text}' names an unknown tool '{rule.tool}' "
                        f"(known tools: {', '.join(sorted(by_name))})."
                    )
                if rule.specifier is not None:
                    kind = specifier_kind(rule, tool)
                    if kind == "command":
                        command_pattern(rule.specifier, rule.text)
                    elif kind == "path":
                        path_spec(rule.specifier, rule.text)
            except RuleError as error:
                problems.append(f"{action}: {error}")
    return problems


# --- argument (param:glob) specifiers ------------------------------------------------------


def _param_matches(rule: Rule, call: CallContext, strict: bool) -> bool:
    found = PARAM_SPEC.match(rule.specifier or "")
    assert found
    name, glob = found.groups()
    if name not in call.arguments:
        return False
    value = call.arguments[name]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return fnmatch.fnmatchcase(text, glob)


# --- path specifiers ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def path_spec(specifier: str, text: str = "") -> pathspec.PathSpec[Any]:
    """A gitignore-style pattern, compiled. Negation (`!x`) is not allowed in a rule."""
    if specifier.startswith("!"):
        raise RuleError(
            f"Rule '{text or specifier}': a path pattern cannot start with '!' (negation); "
            "put the exception in another list instead."
        )
    try:
        return pathspec.PathSpec.from_lines("gitignore", [specifier])
    except Exception as error:
        raise RuleError(
            f"Rule '{text or specifier}': bad path pattern '{specifier}' ({error})."
        ) from error


def path_readings(
    tool: Tool, arguments: Mapping[str, Any], workspace: Path
) -> list[tuple[str | None, str | None, str]]:
    """For each path argument: (given path, resolved path, text), relative to the workspace.

    `given` and `resolved` are None when they leave the workspace; `text` is the given path
    with any leading `/` and `../` removed, read only by deny and ask rules. Absent
    arguments use the schema default.
    """
    readings: list[tuple[str | None, str | None, str]] = []
    properties = tool.parameters.get("properties", {})
    for name in tool.path_arguments:
        value = arguments.get(name, properties.get(name, {}).get("default"))
        if isinstance(value, str) and tool.client_executed:
            readings.append(_client_readings_of(value, workspace))
        elif isinstance(value, str):
            readings.append(_readings_of(value, workspace))
    return readings


def _readings_of(value: str, workspace: Path) -> tuple[str | None, str | None, str]:
    given = posixpath.normpath(value.replace(os.sep, "/")) if value else "."
    text = re.sub(r"^(/|\.\./)+", "", given).lstrip("~") or "."
    if "\x00" in value or value.startswith("~"):
        return None, None, text
    outside = given.startswith("/") or given == ".." or given.startswith("../")
    given_rel = None if outside else given
    try:
        root = workspace.resolve()
        resolved: str | None = (workspace / value).resolve().relative_to(root).as_posix()
    except (ValueError, OSError, RuntimeError):
        resolved = None
    return given_rel, resolved, text


def _client_readings_of(value: str, project: Path) -> tuple[str | None, str | None, str]:
    """A decide-only call's path, on the client's disk: read lexically, never resolved here."""
    relative = lexical_relative(value, project)
    text = re.sub(r"^(/|\.\./)+", "", posixpath.normpath(value or ".")).lstrip("~") or "."
    return relative, relative, relative or text


def _path_matches(rule: Rule, call: CallContext, strict: bool) -> bool:
    spec = path_spec(rule.specifier or "", rule.text)
    readings = path_readings(call.tool, call.arguments, call.workspace)
    if not readings:
        return False
    if strict:
        return all(
            given is not None
            and resolved is not None
            and spec.match_file(given)
            and spec.match_file(resolved)
            for given, resolved, _ in readings
        )
    return any(
        any(reading is not None and spec.match_file(reading) for reading in group)
        for group in readings
    )


# --- command specifiers -----------------------------------------------------------------------


@dataclass(frozen=True)
class CommandPattern:
    """Words of a command rule. A trailing `*` = any further arguments (none included);
    a `*` elsewhere = one or more words; other words are `fnmatchcase` globs on one word."""

    words: tuple[str, ...]
    open_ended: bool  # ended with ` *`

    def matches(self, argv: Sequence[str], *, loose: bool, extra_args: bool = False) -> bool:
        """Strict (allow): words literally, command name exactly as written, no computed
        words where the pattern is literal. Loose (deny/ask): a command path counts as its
        basename, a word that could expand to the pattern's word counts, and more
        arguments after an exact pattern still match."""
        if not argv or not self.words:
            return False
        argv = list(argv)
        if loose:
            argv[0] = command_name(argv[0]) or argv[0]
        open_ended = self.open_ended or loose
        if extra_args and not open_ended:
            return False
        return _match_words(self.words, tuple(argv), open_ended, loose)


def _word_matches(pattern: str, word: str, loose: bool) -> bool:
    if GLOB_CHARACTERS.search(pattern):
        if loose and (is_computed(word) or GLOB_CHARACTERS.search(word)):
            return True
        if not loose and is_computed(word):
            return False
        return fnmatch.fnmatchcase(word, pattern)
    if loose:
        return could_be(word, pattern)
    return word == pattern


@functools.lru_cache(maxsize=65536)
def _match_words(
    pattern: tuple[str, ...], words: tuple[str, ...], open_ended: bool, loose: bool
) -> bool:
    if not pattern:
        return open_ended or not words
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        # one or more words
        return any(
            _match_words(rest, words[i:], open_ended, loose) for i in range(1, len(words) + 1)
        )
    return (
        bool(words)
        and _word_matches(head, words[0], loose)
        and _match_words(rest, words[1:], open_ended, loose)
    )


@functools.lru_cache(maxsize=1024)
def command_pattern(specifier: str, text: str = "") -> CommandPattern:
    try:
        words = shlex.split(specifier)
    except ValueError as error:
        raise RuleError(
            f"Rule '{text or specifier}': command pattern '{specifier}' cannot be read ({error})."
        ) from error
    if not words:
        raise RuleError(f"Rule '{text or specifier}' has an empty command pattern.")
    if words[0] == "*":
        raise RuleError(
            f"Rule '{text or specifier}': a command pattern must start with a command name, "
            "not '*' (write 'run_command' to match every command)."
        )
    open_ended = len(words) > 1 and words[-1] == "*"
    return CommandPattern(tuple(words[:-1] if open_ended else words), open_ended)


@dataclass(frozen=True)
class Part:
    """One simple command a command line would run."""

    argv: tuple[str, ...]
    loose_only: bool = False  # seen only by deny/ask (a guess, or what sudo would run)
    extra_args: bool = False  # xargs appends words we cannot see
    not_allowable: str | None = None  # why no allow rule may match it (redirect, risky env)


@dataclass(frozen=True)
class CommandAnalysis:
    parts: tuple[Part, ...]
    unreadable: str | None = None  # why the command could not be read, if it could not

    @property
    def strict_parts(self) -> list[Part]:
        return [part for part in self.parts if not part.loose_only]


def _allows(pattern: CommandPattern, part: Part) -> bool:
    return part.not_allowable is None and pattern.matches(
        part.argv, loose=False, extra_args=part.extra_args
    )


def _command_analysis(call: CallContext) -> CommandAnalysis:
    argv = command_argv(call.tool, call.arguments)
    if argv is None:
        return CommandAnalysis((), "the command is not a list of strings")
    return analyse_command(tuple(argv))


@functools.lru_cache(maxsize=2048)
def analyse_command(argv: tuple[str, ...]) -> CommandAnalysis:
    """Split an argv (no shell) into the simple commands it would run."""
    try:
        parts = _argv_parts(list(argv), 0)
    except UnreadableCommand as error:
        return CommandAnalysis(tuple(_guess_parts(argv)), str(error))
    if not parts:
        return CommandAnalysis((), "the command is empty")
    opaque = next(
        (
            p.not_allowable
            for p in parts
            if p.not_allowable and p.not_allowable.startswith("unreadable:")
        ),
        None,
    )
    return CommandAnalysis(tuple(parts), opaque.removeprefix("unreadable: ") if opaque else None)


def _argv_parts(
    argv: list[str], depth: int, *, fed: bool = False, assignments: Sequence[str] = ()
) -> list[Part]:
    if depth > MAX_DEPTH:
        raise UnreadableCommand(f"more than {MAX_DEPTH} nested shells or wrappers")
    if not argv:
        return []
    inner, wrappers = unwrap_chain(argv)
    if not inner:
        return [Part(tuple(argv))]  # `env` alone, `command -v x`: the wrapper itself runs
    is_suffix = tuple(argv[len(argv) - len(inner) :]) == tuple(inner)
    prefix = argv[: len(argv) - len(inner)] if is_suffix else argv
    extra_args = "xargs" in wrappers
    risky = next((w for w in [*assignments, *prefix] if RISKY_VARIABLES.match(w)), None)
    not_allowable = f"sets {risky.split('=', 1)[0]}" if risky else None
    opaque = next(((w, wrapper_opacity(w)) for w in wrappers if wrapper_opacity(w)), None)
    if opaque:
        # `chroot / ls`, `npx ls`: what runs is not the `ls` an allow rule names
        not_allowable = f"runs through '{opaque[0]}': {opaque[1]}"
    name = command_name(inner[0])
    if is_computed(inner[0]) or GLOB_CHARACTERS.search(inner[0]):
        not_allowable = f"unreadable: the command name {inner[0]!r} is computed at run time"
    parts: list[Part] = []
    if name in SHELLS:
        invocation = shell_invocation(inner)
        if invocation.command_string is not None:
            # A shell running a visible string is transparent: its commands are the parts.
            nested = parse_shell(invocation.command_string, depth + 1)
            if not_allowable:
                nested = [
                    Part(p.argv, p.loose_only, p.extra_args, p.not_allowable or not_allowable)
                    for p in nested
                ]
            return nested
        if invocation.c_flag:
            raise UnreadableCommand(f"'{name} -c' without a visible command string")
        if fed and invocation.reads_stdin:
            not_allowable = f"unreadable: '{name}' reads commands from its input"
    if name == "eval" and len(inner) > 1:
        return parse_shell(" ".join(inner[1:]), depth + 1)
    parts.append(Part(tuple(inner), extra_args=extra_args, not_allowable=not_allowable))
    if name == "find":
        for exec_argv in find_exec_commands(inner):
            parts.extend(_argv_parts(exec_argv, depth + 1))
    if name in ("su", "runuser"):
        text = option_value(inner[1:], SU_SPEC, "c", "command")
        if text is None:
            text = option_value(inner[1:], SU_SPEC, "", "session-command")
        if text is not None:
            parts.extend(
                Part(p.argv, True, p.extra_args, p.not_allowable)
                for p in parse_shell(text, depth + 1)
            )
            return parts
    if name in PRIVILEGE_WRAPPERS:
        operand = _privileged_operand(inner, PRIVILEGE_WRAPPERS[name])
        if operand:
            parts.extend(
                Part(p.argv, True, p.extra_args, p.not_allowable)
                for p in _argv_parts(operand, depth + 1)
            )
    return parts


def _privileged_operand(argv: list[str], with_value: str) -> list[str]:
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[i + 1 :]
        if arg.startswith("-") and len(arg) > 1:
            i += 2 if arg[-1] in with_value and len(arg) == 2 else 1
        elif ASSIGNMENT.match(arg):
            i += 1
        else:
            return argv[i:]
    return []


def _guess_parts(argv: Sequence[str]) -> list[Part]:
    """For a command that cannot be parsed: every plausible simple command in its text,
    for deny/ask rules only. Splits on shell punctuation and tries every word as a start."""
    text = " ".join(argv)
    text = decode_ansi_c(text, strict=False)
    pieces = re.split(r"[;&|()`\n{}<>]|\$\(|\bthen\b|\bdo\b|\belse\b", text)
    parts: list[Part] = []
    for piece in pieces:
        words = [re.sub(r"[\"'\\]", "", word) for word in piece.split()]
        words = [w for w in words if w]
        for start in range(len(words)):
            parts.append(Part(tuple(words[start:]), loose_only=True))
    return parts


# --- shell strings ------------------------------------------------------------------------------

ANSI_C_ESCAPES = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n",
    "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


def decode_ansi_c(text: str, strict: bool = True) -> str:
    """Rewrite `$'...'` (ANSI-C quoting) and `$"..."` as plain single/double quoting.

    bashlex does not decode `$'\\x72m'`; after this it reads `'rm'`.
    """
    out: list[str] = []
    i, n = 0, len(text)
    quote: str | None = None
    while i < n:
        char = text[i]
        if quote == "'":
            out.append(char)
            quote = None if char == "'" else quote
            i += 1
            continue
        if char == "\\" and i + 1 < n:
            out.append(text[i : i + 2])
            i += 2
            continue
        if quote == '"':
            out.append(char)
            quote = None if char == '"' else quote
            i += 1
            continue
        if char == "$" and i + 1 < n and text[i + 1] == "'":
            decoded, i = _read_ansi_c(text, i + 2, strict)
            out.append("'" + decoded.replace("'", "'\\''") + "'")
            continue
        if char == "$" and i + 1 < n and text[i + 1] == '"':
            i += 1  # $"..." is a translated string: read it as "..."
            continue
        if char in "'\"":
            quote = char
        out.append(char)
        i += 1
    return "".join(out)


def _read_ansi_c(text: str, i: int, strict: bool) -> tuple[str, int]:
    out: list[str] = []
    n = len(text)
    while i < n:
        char = text[i]
        if char == "'":
            return "".join(out), i + 1
        if char != "\\" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        code = text[i + 1]
        if code in ANSI_C_ESCAPES:
            out.append(ANSI_C_ESCAPES[code])
            i += 2
        elif code in "01234567":
            digits = re.match(r"[0-7]{1,3}", text[i + 1 :]).group(0)  # type: ignore[union-attr]
            out.append(chr(int(digits, 8) & 0xFF))
            i += 1 + len(digits)
        elif code in "xuU":
            limit = {"x": 2, "u": 4, "U": 8}[code]
            digits = re.match(rf"[0-9A-Fa-f]{{0,{limit}}}", text[i + 2 :]).group(0)  # type: ignore[union-attr]
            if not digits:
                out.append("\\" + code)
            else:
                out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        elif code == "c" and i + 2 < n:
            out.append(chr(ord(text[i + 2]) & 0x1F))
            i += 3
        else:
            out.append("\\" + code)
            i += 2
    if strict:
        raise UnreadableCommand("an unterminated $'...' string")
    return "".join(out), n


def parse_shell(text: str, depth: int) -> list[Part]:
    """Every simple command in a shell string (pipelines, lists, subshells, `$( )`, backticks,
    process substitution, if/for/while bodies, functions), wrappers looked through."""
    if depth > MAX_DEPTH:
        raise UnreadableCommand(f"more than {MAX_DEPTH} nested shells")
    decoded = decode_ansi_c(text)
    if not decoded.strip():
        return []
    trees = parse_trees(decoded)  # also refuses substitutions bashlex would not show
    parts: list[Part] = []
    for tree in trees:
        _walk(tree, parts, depth, fed=False)
    return parts


def _walk(node: Any, parts: list[Part], depth: int, fed: bool) -> None:
    kind = getattr(node, "kind", "")
    if kind == "pipeline":
        first = True
        for stage in node.parts:
            if stage.kind in ("pipe", "reservedword"):
                continue
            _walk(stage, parts, depth, fed=fed or not first)
            first = False
        return
    if kind == "command":
        words = [part.word for part in node.parts if part.kind == "word"]
        assignments = [part.word for part in node.parts if part.kind == "assignment"]
        redirects = [part for part in node.parts if part.kind == "redirect"]
        stdin_text = any(r.type in ("<<", "<<<") for r in redirects)
        writes = _writing_redirect(redirects)
        if words:
            found = _argv_parts(words, depth + 1, fed=fed or stdin_text, assignments=assignments)
            if writes and found:
                head = found[0]
                found[0] = Part(
                    head.argv, head.loose_only, head.extra_args, head.not_allowable or writes
                )
            parts.extend(found)
        for child in node.parts:  # substitutions inside words and redirect targets
            _walk_children(child, parts, depth)
        return
    if kind == "function":
        # The body runs when the function is called: its commands are parts now.
        _walk_children(node, parts, depth)
        return
    _walk_children(node, parts, depth, fed=fed)


def _walk_children(node: Any, parts: list[Part], depth: int, fed: bool = False) -> None:
    for name in ("parts", "list"):
        for child in getattr(node, name, None) or []:
            _walk(child, parts, depth, fed)
    for name in ("command", "output", "heredoc", "body"):
        child = getattr(node, name, None)
        if child is not None and hasattr(child, "kind"):
            _walk(child, parts, depth, fed)


def _writing_redirect(redirects: list[Any]) -> str | None:
    for redirect in redirects:
        if redirect.type in ("<", "<<", "<<<", "<&"):
            continue
        target = redirect.output
        if isinstance(target, int) or not hasattr(target, "word"):
            continue  # 2>&1: a descriptor, not a file
        if redirect.type == ">&" and target.word.isdigit():
            continue
        if target.word in SAFE_REDIRECT_TARGETS:
            continue
        return f"writes to '{target.word}' with {redirect.type}"
    return None


# --- deciding ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleVerdict:
    """What the rules say about one call: an action and the rule(s), or nothing.

    `unreadable` is set when the call is a command that could not be read: no allow rule
    matched it, and the caller must not let it run without asking.
    """

    action: str | None = None
    rule: str = ""
    also: tuple[str, ...] = ()  # further allow rules that covered other parts
    unreadable: str | None = None
    invalid: tuple[str, ...] = field(default=())


def _parsed(texts: Iterable[str]) -> list[tuple[str, Rule | None]]:
    out: list[tuple[str, Rule | None]] = []
    for text in texts:
        try:
            out.append((text, _cached_rule(text)))
        except RuleError:
            logger.warning("ignoring unreadable rule %r", text)
            out.append((text, None))
    return out


def _safe_matches(rule: Rule, call: CallContext, action: str) -> bool:
    try:
        return rule.matches(call, action)
    except RuleError:
        logger.warning("rule %r does not fit tool %r", rule.text, call.name)
        # A rule that does not fit: never allows; deny/ask fail closed on the tool name.
        return action != "allow"


def evaluate(
    call: CallContext, allow: Iterable[str], ask: Iterable[str], deny: Iterable[str]
) -> RuleVerdict:
    """Deny, then ask, then allow; first match decides (see the module docstring)."""
    if call.tool.command_argument:
        return command_rule_decision(call, allow=allow, ask=ask, deny=deny)
    for action, texts in (("deny", deny), ("ask", ask), ("allow", allow)):
        for text, rule in _parsed(texts):
            if rule is None:
                if action != "allow" and text.partition("(")[0].strip() == call.name:
                    return RuleVerdict(action, text)
                continue
            if _safe_matches(rule, call, action):
                return RuleVerdict(action, rule.text)
    return RuleVerdict()


def command_rule_decision(
    call: CallContext, *, allow: Iterable[str], ask: Iterable[str], deny: Iterable[str]
) -> RuleVerdict:
    """Rules for a command tool. A deny or ask rule matches if any part of the command does
    (including parts only guessed from an unreadable command); the command is allowed only
    if every part is matched by some allow rule, and never when it could not be read."""
    analysis = _command_analysis(call)
    for action, texts in (("deny", deny), ("ask", ask)):
        for text, rule in _parsed(texts):
            if rule is None:
                if text.partition("(")[0].strip() == call.name:
                    return RuleVerdict(action, text)
                continue
            if _safe_matches(rule, call, action):
                return RuleVerdict(action, rule.text)
    if analysis.unreadable is not None:
        return RuleVerdict(unreadable=analysis.unreadable)
    candidates = [
        (rule, None if rule.specifier is None else _command_pattern_or_none(rule, call.tool))
        for _, rule in _parsed(allow)
        if rule is not None and rule.tool == call.name
    ]
    for rule, pattern in candidates:
        if pattern is None and _safe_matches(rule, call, "allow"):
            return RuleVerdict("allow", rule.text)  # `run_command`, `run_command(cwd:...)`
    parts = analysis.strict_parts
    if not parts:
        return RuleVerdict()
    used: list[str] = []
    for part in parts:
        rule = next(
            (r for r, pattern in candidates if pattern is not None and _allows(pattern, part)), None
        )
        if rule is None:
            return RuleVerdict()
        if rule.text not in used:
            used.append(rule.text)
    return RuleVerdict("allow", used[0], tuple(used[1:]))


def _command_pattern_or_none(rule: Rule, tool: Tool) -> CommandPattern | None:
    try:
        if specifier_kind(rule, tool) != "command":
            return None
        return command_pattern(rule.specifier or "", rule.text)
    except RuleError:
        return None
