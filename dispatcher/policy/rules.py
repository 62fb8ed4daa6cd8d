"""Permission rules: `Tool` or `Tool(specifier)` in allow / ask / deny lists (docs/rules.md).

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
match when *any* reading of the call matches (any part of a compound command read widely
by `dispatcher.policy.parts`, options in any order, either the given or the resolved
path, a command name that could expand to the pattern's); allow rules match only when
*every* reading does, and read commands with the strict reader
(`dispatcher.policy.reading`): a command it cannot read completely is never allowed by a
rule. Deny and ask rules on `read_file` also bind `search_files` and `list_directory`.
"""

from __future__ import annotations

import dataclasses
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

from dispatcher.policy import effect_rules, git_links
from dispatcher.policy.context import CallContext
from dispatcher.policy.parts import command_parts
from dispatcher.policy.program_facts import names_git_control, names_git_directory_file
from dispatcher.policy.reading import Command, Reading, read_command
from dispatcher.policy.shell import (
    GLOB_CHARACTERS,
    SPECIAL_CHARACTERS,
    command_name,
    could_be,
    is_computed,
)
from dispatcher.tools import client_tool
from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import Tool, command_argv, tool_paths

logger = logging.getLogger(__name__)

ACTIONS = ("deny", "ask", "allow")
TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
PARAM_SPEC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(.*)$", re.DOTALL)
# Read rules (`read_file(**/.env)`) in the deny and ask lists also bind these tools: a
# search or a listing never shows what a read would not.
READ_TOOL = "read_file"
READ_SCOPE_TOOLS = frozenset({"search_files", "list_directory"})


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
                return command_reading(call).unreadable is None
            return True
        kind = specifier_kind(self, call.tool)
        if kind == "param":
            return _param_matches(self, call, strict)
        if kind == "command":
            pattern = command_pattern(self.specifier)
            if strict:
                reading = command_reading(call)
                if reading.unreadable is not None:
                    return False
                commands = reading.commands
                return bool(commands) and all(_allows(pattern, c) for c in commands)
            return any(pattern.matches(argv, loose=True) for argv in loose_parts(call))
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
    if tool.path_arguments or tool.embedded_paths is not None:
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
    from dispatcher.tools.registry import all_tools, client_rule_tool, rule_tool

    # Given `tools` (a team admin's teams' tools), a rule names one of them or a client's
    # tool: another team's MCP server's tool is as unknown as one that does not exist.
    lookup = rule_tool if tools is None else client_rule_tool
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
            if effect_rules.is_effect_rule(text):  # read by what a preview shows
                problems.extend(effect_rules.problems(action, text))
                continue
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
    try:
        embedded = tool_paths(tool, arguments)
    except ValueError:
        return []  # unreadable: no path rule matches (the confinement guard denies it)
    reading = _client_readings_of if tool.client_executed else _readings_of
    readings.extend(reading(value, workspace) for value in embedded)
    return readings


def path_reading(value: str, workspace: Path) -> tuple[str | None, str | None, str]:
    """One path's (given, resolved, text) readings; see `path_readings`."""
    return _readings_of(value, workspace)


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
        # a write to git's hooks or config decides what a later allowed git command runs
        # and a file named HEAD (or commondir) makes its directory a git directory
        if not call.tool.read_only and any(
            names_git_control(reading or "") or names_git_directory_file(reading or "")
            for group in readings
            for reading in group[:2]
        ):
            return False
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
    # Literal words after the name that any loose match must contain (a quick answer).
    needed: frozenset[str] = frozenset()

    def matches(self, argv: Sequence[str], *, loose: bool, extra_args: bool = False) -> bool:
        """Strict (allow): words literally and in place, command name exactly as written,
        no computed words where the pattern is literal. Loose (deny/ask): a command path
        counts as its basename, a word that could expand to the pattern's word counts,
        more arguments after an exact pattern still match, and options may sit anywhere
        and be clustered (see `_matches_any_order`)."""
        if not argv or not self.words:
            return False
        argv = list(argv)
        if loose:
            # the name compares lower-cased (command_name): `RM -rf x` runs rm on macOS
            argv[0] = command_name(argv[0]) or argv[0]
            pattern = (self.words[0].lower(), *self.words[1:])
            if not _word_matches(pattern[0], argv[0], True):
                return False  # the quick answer for most deny rules
            words = tuple(argv)
            if self.needed and not self.needed <= set(words) and not _any_special(words):
                return False
            return _match_words(pattern, words, True, True) or _matches_any_order(pattern, words)
        if extra_args and not self.open_ended:
            return False
        if not _word_matches(self.words[0], argv[0], False):
            return False
        return _match_words(self.words, tuple(argv), self.open_ended, False)


def _any_special(words: Sequence[str]) -> bool:
    """A word the shell would expand could be any word."""
    return any(SPECIAL_CHARACTERS.search(word) for word in words)


# Long options read as their usual short letter when a deny pattern is matched (`rm -rf *`
# denies `rm --recursive --force x`); `-R` counts as `-r`.
LONG_AS_SHORT = {"recursive": "r", "force": "f", "verbose": "v", "all": "a", "quiet": "q"}


def _is_option(word: str) -> bool:
    return len(word) > 1 and word.startswith("-") and not GLOB_CHARACTERS.search(word)


def _option_names(words: Sequence[str]) -> set[str]:
    """Short letters of every `-abc` cluster and long names of every `--name[=v]`."""
    names: set[str] = set()
    for word in words:
        if word.startswith("--") and len(word) > 2:
            long = word[2:].split("=", 1)[0]
            names.add("--" + long)
            names.add(LONG_AS_SHORT.get(long, "--" + long))
        elif _is_option(word):
            names.update(word[1:])
    if "R" in names:
        names.add("r")
    return names


def _matches_any_order(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Loose matching with options anywhere: the pattern's options (`-rf`, `--hard`) must
    all be present somewhere (clusters split: `-fr` holds `-r` and `-f`), and its other
    words must appear in order, where the command may put options and one value after
    each between them (`git -C . reset --hard` is `git reset *`)."""
    if not _word_matches(pattern[0], words[0], True):
        return False
    wanted = [word for word in pattern[1:] if _is_option(word)]
    positional = [word for word in pattern[1:] if not _is_option(word)]
    computed = any(is_computed(word) or GLOB_CHARACTERS.search(word) for word in words[1:])
    if wanted and not computed:
        have = _option_names(words[1:])
        for option in wanted:
            need = _option_names([option])
            if not need <= have:
                return False
    rest = words[1:]
    reach = _skip_options(rest, {0})
    for word in positional:
        if word == "*":
            reach = {end for start in reach for end in range(start + 1, len(rest) + 1)}
        else:
            reach = {
                at + 1 for at in reach if at < len(rest) and _word_matches(word, rest[at], True)
            }
        if not reach:
            return False
        reach = _skip_options(rest, reach)
    return True


def _skip_options(words: Sequence[str], reach: set[int]) -> set[int]:
    """Positions reachable from `reach` by skipping options and one value after each."""
    found, todo = set(reach), sorted(reach)
    while todo:
        at = todo.pop()
        if at < len(words) and words[at].startswith("-") and len(words[at]) > 1:
            for step in (at + 1, at + 2):
                if step <= len(words) and step not in found:
                    found.add(step)
                    todo.append(step)
    return found


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


def _match_words(
    pattern: tuple[str, ...], words: tuple[str, ...], open_ended: bool, loose: bool
) -> bool:
    """Match pattern words against argv words in place; `*` is one or more words.

    Walks the set of argv positions each prefix of the pattern can end at (linear in
    the words for each pattern word, whatever the number of `*`)."""
    reach = {0}
    for word in pattern:
        if word == "*":
            reach = set(range(min(reach) + 1, len(words) + 1))
        else:
            reach = {
                at + 1 for at in reach if at < len(words) and _word_matches(word, words[at], loose)
            }
        if not reach:
            return False
    return open_ended or len(words) in reach


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
    words = words[:-1] if open_ended else words
    needed = frozenset(
        word
        for word in words[1:]
        if word != "*" and not SPECIAL_CHARACTERS.search(word) and not word.startswith("-")
    )
    return CommandPattern(tuple(words), open_ended, needed)


def _allows(pattern: CommandPattern, command: Command) -> bool:
    return pattern.matches(command.argv, loose=False, extra_args=command.extra_args)


def _command_argv(call: CallContext) -> tuple[str, ...] | None:
    argv = command_argv(call.tool, call.arguments)
    return None if argv is None else tuple(argv)


def command_reading(call: CallContext) -> Reading:
    """What the call's command runs, read strictly (see dispatcher.policy.reading), and
    unreadable when the disk shows it reaching into a git directory (`disk_problem`)."""
    reading = _lexical_reading(call)
    if reading.unreadable is None:
        problem = disk_problem(call, reading)
        if problem is not None:
            return Reading((), problem)
    return reading


def _lexical_reading(call: CallContext) -> Reading:
    """The reading by the call's arguments alone: pure, so a verdict on it may be kept."""
    argv = _command_argv(call)
    if argv is None:
        return Reading((), "the command is not a list of strings")
    where = next((v for v in _path_values(call) if names_git_control(v)), None)
    if where is not None:
        return Reading((), _in_git_directory(where))
    return read_command(argv)


def _path_values(call: CallContext) -> list[str]:
    return [v for n in call.tool.path_arguments if isinstance(v := call.arguments.get(n), str)]


def _in_git_directory(where: str) -> str:
    return (
        f"it runs in '{where}', inside a git directory, where plain file names "
        "(`config`, `hooks/pre-commit`) are git's configuration and hooks"
    )


def disk_problem(call: CallContext, reading: Reading) -> str | None:
    """Why a command its words leave readable reaches into a git directory after all, as
    the disk and its client show, or None (see dispatcher.policy.git_links). Never kept:
    links change, and the same arguments run in other directories.

    The reader keeps an allow rule from writing git's control files by the words that name
    them (`sed -i ... .git/config`); run in `.git`, `sed -i ... config` names none. So the
    directory a command runs in counts: run_command's `cwd` (Gemini's `dir_path`) with
    symlinks followed for a command run here, and a decide-only call's shell directory as
    its client reported it (`client_cwd`, a hook's `cwd`); and every word of a command run
    here is resolved (`meta/config`, `meta` a link to `.git`)."""
    if call.client_cwd and git_links.client_cwd_in_git_directory(call.client_cwd, call.workspace):
        return _in_git_directory(call.client_cwd)
    if call.tool.client_executed:
        return None  # its paths are on the client's disk
    for value in _path_values(call):
        try:
            root = call.workspace.resolve()
            relative = (root / value).resolve().relative_to(root)
        except (OSError, ValueError, RuntimeError):
            continue  # outside the workspace or unresolvable: the confinement guard denies
        if names_git_control(relative.as_posix()):
            return _in_git_directory(value)
    cwd = next(iter(_path_values(call)), ".")
    linked = git_links.linked_git_word(reading.commands, call.workspace, cwd)
    if linked is not None:
        return (
            f"'{linked}' reaches into a git directory through a symbolic link (git's "
            "configuration and hooks decide what git runs next)"
        )
    return None


def loose_parts(call: CallContext) -> tuple[tuple[str, ...], ...]:
    """Every argv deny and ask rules try: the wide parts plus what the strict reader saw."""
    argv = _command_argv(call)
    if argv is None:
        return ()
    return _loose_parts(argv)


@functools.lru_cache(maxsize=2048)
def _loose_parts(argv: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    found = [part.argv for part in command_parts(argv).parts]
    found += [command.argv for command in read_command(argv).commands]
    return tuple(dict.fromkeys(found))


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
    """Deny, then ask, then allow; first match decides (see the module docstring).

    A `client_tool` call asking about a client's own tool (Claude Code's permission
    prompt asking about its `Bash`) is also held to that tool's deny and ask rules, read
    as that tool's call (`Bash(curl *)` denies the command whether the hook or the prompt
    asks about it); its allow rules do not apply to it."""
    allow, ask, deny = tuple(allow), tuple(ask), tuple(deny)
    own = _evaluate(call, allow=allow, ask=ask, deny=deny)
    if own.action == "deny":
        return own
    named = client_tool.named_tools(call.tool, call.arguments)
    for action in ("deny", "ask"):
        if action == "ask" and own.action == "ask":
            return own
        lists = {"deny": deny if action == "deny" else (), "ask": ask if action == "ask" else ()}
        for tool, arguments in named:
            asked = dataclasses.replace(call, tool=tool, name=tool.name, arguments=arguments)
            verdict = _evaluate(asked, allow=(), **lists)
            if verdict.action == action:
                return RuleVerdict(action, verdict.rule)
    return own


def _evaluate(
    call: CallContext, allow: Sequence[str], ask: Sequence[str], deny: Sequence[str]
) -> RuleVerdict:
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
            if action != "allow" and _binds_read_scope(rule, call):
                return RuleVerdict(action, rule.text)
    return RuleVerdict()


# A name no pattern is written for: a read rule that matches it inside a directory
# matches everything there, so the whole search or listing is bound by the rule.
PROBE = "harness-probe-8f2c"


def _read_path_spec(rule: Rule) -> pathspec.PathSpec[Any] | None:
    """The path pattern of a `read_file(...)` rule, or None for a parameter rule."""
    from dispatcher.tools.registry import get_tool

    read_tool = get_tool(READ_TOOL)
    try:
        if read_tool is not None and specifier_kind(rule, read_tool) != "path":
            return None
        return path_spec(rule.specifier or "", rule.text)
    except RuleError:
        return None


def _binds_read_scope(rule: Rule, call: CallContext) -> bool:
    """A deny or ask rule on reading binds a search or listing whose path is what the rule
    names, lies inside it, or holds nothing the rule would not name (`read_file(secrets/**)`
    binds `list_directory(secrets)`). Single files inside are hidden from the results by
    `dispatcher.policy.results`."""
    if rule.tool != READ_TOOL or call.name not in READ_SCOPE_TOOLS:
        return False
    if rule.specifier is None:
        return True
    spec = _read_path_spec(rule)
    if spec is None:
        return False
    for group in path_readings(call.tool, call.arguments, call.workspace):
        for reading in group:
            if reading is None:
                continue
            probe = PROBE if reading == "." else posixpath.join(reading, PROBE)
            if spec.match_file(reading) or spec.match_file(probe):
                return True
    return False


def read_rule_hiding(call: CallContext, path: str) -> str | None:
    """The deny or ask rule on reading, of any layer of policy (the organization's, the
    team's, the owner's), that a read of `path` (relative to the workspace) would meet, or
    None: what a search or listing must not show."""
    profile = call.profile
    texts = [t for layer in profile.layers for t in (*layer.deny, *layer.ask)]
    for _, rule in _parsed([*texts, *profile.deny, *profile.ask]):
        if rule is None or rule.tool != READ_TOOL:
            continue
        spec = _read_path_spec(rule) if rule.specifier is not None else None
        if rule.specifier is None:
            return rule.text
        if spec is None:
            continue
        if any(r is not None and spec.match_file(r) for r in _readings_of(path, call.workspace)):
            return rule.text
    return None


# Command verdicts depend only on the tool, its arguments and the three rule lists: they
# are kept for the next call with the same ones (rule evaluation is on every call's path).
_VERDICTS: dict[tuple[Any, ...], RuleVerdict] = {}
MAX_VERDICTS = 4096
# Arguments longer than this are decided afresh each time, not kept: an agent's 4096
# distinct calls of a request's size (1 MiB) each would keep gigabytes in the web process.
MAX_KEPT_ARGUMENTS = 16 * 1024


def command_rule_decision(
    call: CallContext, *, allow: Iterable[str], ask: Iterable[str], deny: Iterable[str]
) -> RuleVerdict:
    """Rules for a command tool. A deny or ask rule matches if any part of the command does
    (read widely, including parts only guessed from a string that cannot be parsed); the
    command is allowed only if the strict reader reads all of it and every simple command
    it runs is matched by some allow rule. Pure in its inputs, so remembered."""
    allow, ask, deny = tuple(allow), tuple(ask), tuple(deny)
    try:
        arguments = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return _on_disk(call, _command_rule_decision(call, allow=allow, ask=ask, deny=deny))
    if len(arguments) > MAX_KEPT_ARGUMENTS:
        return _on_disk(call, _command_rule_decision(call, allow=allow, ask=ask, deny=deny))
    key = (call.tool, call.name, arguments, allow, ask, deny)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _command_rule_decision(call, allow=allow, ask=ask, deny=deny)
        if len(_VERDICTS) >= MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    return _on_disk(call, verdict)


def _on_disk(call: CallContext, verdict: RuleVerdict) -> RuleVerdict:
    """A kept verdict that no deny or ask rule gave, made unreadable when the disk or the
    client shows the command reaching into a git directory (never kept: see disk_problem)."""
    if verdict.action in ("deny", "ask") or verdict.unreadable is not None:
        return verdict
    reading = _lexical_reading(call)
    problem = disk_problem(call, reading) if reading.unreadable is None else None
    if problem is None:
        return verdict
    return dataclasses.replace(verdict, action=None, rule="", also=(), unreadable=problem)


def _command_rule_decision(
    call: CallContext, *, allow: Sequence[str], ask: Sequence[str], deny: Sequence[str]
) -> RuleVerdict:
    parts = loose_parts(call)
    names = (call.name, *call.tool.rule_aliases)  # (Monitor's command is Bash's)
    for action, texts in (("deny", deny), ("ask", ask)):
        for text, rule in _parsed(texts):
            if rule is None:
                if text.partition("(")[0].strip() in names:
                    return RuleVerdict(action, text)
                continue
            if rule.tool not in names:
                continue
            pattern = None if rule.specifier is None else _command_pattern_or_none(rule, call.tool)
            if pattern is not None:
                if any(pattern.matches(argv, loose=True) for argv in parts):
                    return RuleVerdict(action, rule.text)
            elif _safe_matches(rule, call, action):
                return RuleVerdict(action, rule.text)
    reading = _lexical_reading(call)  # what the disk shows is read after (_on_disk)
    if reading.unreadable is not None:
        return RuleVerdict(unreadable=reading.unreadable)
    candidates = [
        (rule, None if rule.specifier is None else _command_pattern_or_none(rule, call.tool))
        for _, rule in _parsed(allow)
        if rule is not None and rule.tool in names
    ]
    for rule, pattern in candidates:
        if pattern is None and _safe_matches(rule, call, "allow"):
            return RuleVerdict("allow", rule.text)  # `run_command`, `run_command(cwd:...)`
    used: list[str] = []
    for command in reading.commands:
        rule = next(
            (r for r, pattern in candidates if pattern is not None and _allows(pattern, command)),
            None,
        )
        if rule is None:
            return RuleVerdict()
        if rule.text not in used:
            used.append(rule.text)
    return RuleVerdict("allow", used[0], tuple(used[1:])) if used else RuleVerdict()


def _command_pattern_or_none(rule: Rule, tool: Tool) -> CommandPattern | None:
    try:
        if specifier_kind(rule, tool) != "command":
            return None
        return command_pattern(rule.specifier or "", rule.text)
    except RuleError:
        return None
