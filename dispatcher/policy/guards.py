"""Guards: always-on checks that can only take permission away (docs/rules.md, "Guards").

A guard is `guard(call: CallContext) -> str | None`: None lets the call go on, a string
denies it and is the reason the model reads. Guards run at admission and again in the
worker just before execution; rules, modes and reviewers cannot override them.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dispatcher.policy.context import CallContext
from dispatcher.policy.parts import nested_commands, variable_commands
from dispatcher.policy.program_facts import (
    COPYING_PROGRAMS,
    GIT,
    GUARD_KNOWN_PROGRAMS,
    INSPECTING_PROGRAMS,
    PRIVILEGE_PROGRAMS,
    PUBLISH_WORDS,
    PUBLISHERS,
    SHELLS,
    WIDE_WRAPPERS,
    guard_known,
    names_known_program,
    names_runtime_input,
)
from dispatcher.policy.programs import Nested
from dispatcher.policy.shell import (
    BRACES,
    EXPANSIONS,
    GLOB_CHARACTERS,
    ScriptCommand,
    UnreadableCommand,
    command_name,
    could_be,
    is_computed,
    parse_script,
    shell_invocation,
    shell_readings,
    unwrap,
    unwrap_once,
)
from dispatcher.tools import client_tool
from dispatcher.tools._paths import lexical_path_violation, path_violation
from dispatcher.tools.base import Tool, command_argv, confined_paths, input_paths

logger = logging.getLogger(__name__)

MAX_SHELL_DEPTH = 8
MAX_LAYERS = 32
DOWNLOADERS = frozenset({"curl", "wget"})
# Builtins that evaluate an array subscript in a string they are given: a literal
# `a[$(cmd)]` in their arguments runs `cmd`.
SUBSCRIPT_EVALUATORS = frozenset(
    {"test", "[", "printf", "read", "declare", "typeset", "local", "export", "readonly"}
    | {"let", "unset", "mapfile", "readarray", "wait", "getopts"}
)
HIDDEN_SUBSTITUTION = re.compile(r"\[[^\]]*(\$\(|`)")


def workspace_confinement(call: CallContext) -> str | None:
    """Deny when a path argument of the tool is not a relative path inside the workspace.

    Checks every name in `call.tool.path_arguments` present in the arguments: non-strings,
    NUL bytes, `~`, absolute paths, and paths that leave the resolved workspace at any
    step (symlinks followed inside it only: `path_violation`). Command argv words are not
    paths and are not checked. A decide-only call's paths are on the client's disk:
    checked lexically against its project directory (the session workspace), never
    resolved here. A client's tool no tool set lists has the paths of its input's
    path-like keys confined (`base.input_paths`). A `client_tool` call asking about a
    client's tool (Claude Code's permission prompt asking about its `Edit`, or its
    `Artifact`) is read as that tool's call, its paths confined to the agent's configured
    workspace (`prompted_paths`).
    """
    violation = lexical_path_violation if call.tool.client_executed else path_violation
    for name in call.tool.path_arguments:
        if name not in call.arguments:
            continue
        problem = violation(call.arguments[name], call.workspace)
        if problem is not None:
            return problem if name == "path" else f"Argument '{name}': {problem}"
    problem = _embedded_path_violation(call, violation)
    if problem is not None or not call.agent_workspace:
        return problem  # (no workspace to confine them to: asked instead, see stages)
    for asked in prompted_paths(call):
        problem = workspace_confinement(replace(asked, workspace=Path(call.agent_workspace)))
        if problem is not None:
            return problem
    return None


def prompted_paths(call: CallContext) -> list[CallContext]:
    """For a `client_tool` call asking about a client's tool that names paths (Claude
    Code's `Edit`, `Write`, `Read`, ...: `path_arguments` or `embedded_paths`; a tool no
    tool set lists whose input has a path-like key, `base.input_paths`), that tool's call
    as its hook would propose it; empty for any other call. The permission prompt is not
    told the client's project directory, as the hook is: their paths are confined to the
    agent's configured workspace, or asked of a person without one."""
    return [
        replace(call, tool=tool, name=tool.name, arguments=arguments)
        for tool, arguments in client_tool.named_tools(call.tool, call.arguments)
        if tool.path_arguments
        or tool.embedded_paths is not None
        or (tool.unlisted_paths and _names_paths(arguments))
    ]


def _names_paths(arguments: Mapping[str, Any]) -> bool:
    """Does an unlisted client tool's input name a path (or hold one Harness cannot read)?"""
    try:
        return bool(input_paths(arguments))
    except ValueError:
        return True


def _embedded_path_violation(
    call: CallContext, violation: Callable[[object, Path], str | None]
) -> str | None:
    """The paths named inside an argument's text (a Codex patch's file headers): each
    must stay in the workspace, and text whose paths cannot all be read is denied."""
    try:
        paths = confined_paths(call.tool, call.arguments)
    except ValueError as unreadable:
        return (
            f"Harness cannot read the paths this '{call.name}' call touches ({unreadable}), "
            "so it is denied."
        )
    for path in paths:
        problem = violation(path, call.workspace)
        if problem is not None:
            return f"The '{call.name}' call touches a path outside the project: {problem}"
    return None


def command_blocklist(call: CallContext) -> str | None:
    """Deny commands no mode, rule or reviewer may allow (see `blocked_reason`).

    Only for tools with a `command_argument`, and for a `client_tool` call asking about
    such a tool of a client (Claude Code's permission prompt asking about its `Bash`):
    read as that tool's call. A command the guard cannot read (an unparsable shell string,
    wrappers nested absurdly deep) is denied: fail closed.
    """
    named = client_tool.named_tools(call.tool, call.arguments)
    for tool, arguments in ((call.tool, call.arguments), *named):
        answer = _command_answer(tool, arguments)
        if answer is not None:
            return answer
    return None


def _command_answer(tool: Tool, arguments: Mapping[str, Any]) -> str | None:
    argument = tool.command_argument
    if argument is None or argument not in arguments:
        return None
    argv = command_argv(tool, arguments)
    if argv is None:
        if tool.command_shell:
            return f"Argument '{argument}' must be one shell command string."
        return f"Argument '{argument}' must be a list of strings, e.g. ['git', 'status']."
    return _blocklist_answer(tuple(argv))


@functools.lru_cache(maxsize=4096)
def _blocklist_answer(argv: tuple[str, ...]) -> str | None:
    """`blocked_reason` as the guard answers it; pure in the argv, so remembered."""
    try:
        return blocked_reason(list(argv))
    except UnreadableCommand as error:
        return _cannot_read(str(error))
    except RecursionError:  # fail closed, without a traceback the size of the command
        logger.warning("the command guard gave up on a deeply nested command (%d words)", len(argv))
        return _cannot_read("the command nests too deeply to check")


def _cannot_read(why: str) -> str:
    return (
        f"The command guard cannot read this command ({why}), so it is blocked on "
        "every mode; run each program directly as an argv list instead of through a "
        "shell string."
    )


def blocked_reason(argv: list[str], depth: int = 0) -> str | None:
    """Why the command line `argv` is blocked, or None.

    Checks every layer of a wrapper chain (`env`, `timeout`, `nice`, `nohup`, `xargs`,
    `command`, `exec`, `time`, `flock`, `chroot`, `watch`, `npx`, `npm exec`, `corepack`
    ...; see `shell.WRAPPERS`), not only the innermost command; reads into `sh -c STRING`
    strings (and the strings of `script -c`, `flock -c`, `sg -c`, `watch`, `env -S`), and
    into what a command starts itself (`find -exec`, git's `bisect run`, `rebase -x`,
    `grep -O`, `-c core.fsmonitor=`, `trap`, `alias`: see `parts.nested_commands`). A
    command named by path counts as its basename. Raises UnreadableCommand when it cannot
    tell. Inline code of interpreters (`python -c`) is not read: the sandbox bounds it.
    """
    if depth > MAX_SHELL_DEPTH:
        raise UnreadableCommand(f"more than {MAX_SHELL_DEPTH} nested shells")
    layers: list[list[str]] = []
    layer: list[str] | None = argv
    while layer:
        if len(layers) >= MAX_LAYERS:
            raise UnreadableCommand(f"more than {MAX_LAYERS} nested wrapper commands")
        layers.append(layer)
        layer = unwrap_once(layer)
    for layer in reversed(layers):  # innermost first: the denial names what runs
        reason = _layer_reason(layer, depth)
        if reason is not None:
            return reason
    return None


def _layer_reason(argv: list[str], depth: int) -> str | None:
    name = command_name(argv[0])
    for rule in RULES:
        reason = rule(name, argv)
        if reason is not None:
            return reason
    if name == "env":
        reason = _variables_reason([arg for arg in argv[1:] if "=" in arg], depth)
        if reason is not None:
            return reason
    for nested in nested_commands(argv):
        reason = _nested_reason(nested, depth)
        if reason is not None:
            return reason
    return _shell_reason(argv, depth) if name in SHELLS else None


def _nested_reason(nested: Nested, depth: int) -> str | None:
    if nested.alias:
        return _blocked(
            f"Defining a git alias ('{nested.alias}' with 'git -c', 'git config' or "
            "GIT_CONFIG_PARAMETERS)",
            "run the git subcommand by its own name.",
        )
    if nested.text is not None:
        return _string_reason(nested.text, depth)
    return blocked_reason(list(nested.argv), depth + 1)


def _variables_reason(assignments: list[str], depth: int) -> str | None:
    """A variable a program runs as a command (or a git setting carried by one) holds a
    blocked command (see `parts.variable_commands`)."""
    for nested in variable_commands(assignments):
        reason = _nested_reason(nested, depth)
        if reason is not None:
            return reason
    return None


def _string_reason(text: str, depth: int, shell: str = "sh") -> str | None:
    """Blocklist a shell string a command will run (a git setting, a trap, an alias), read
    as `shell` would (one not known is read both as bash and as dash)."""
    if depth > MAX_SHELL_DEPTH:
        raise UnreadableCommand(f"more than {MAX_SHELL_DEPTH} nested shells")
    for reading in shell_readings(text, shell):
        for command in parse_script(reading):
            reason = _script_command_reason(command, depth + 1)
            if reason is not None:
                return reason
    return None


def _blocked(pattern: str, advice: str) -> str:
    return f"{pattern} is blocked by the command guard on every mode; {advice}"


def _privilege(name: str, argv: list[str]) -> str | None:
    if name in PRIVILEGE_PROGRAMS:
        return _blocked(f"'{name}'", f"run the command without {name} or ask an administrator.")
    return None


def _eval(name: str, argv: list[str]) -> str | None:
    if name == "eval":
        return _blocked("'eval'", "run the command itself as an argv list.")
    return None


def _unreadable_name(name: str, argv: list[str]) -> str | None:
    """A name a shell would compute ($x, $(...)) or expand (su?o, {a,b}) hides the program."""
    if is_computed(argv[0]) or GLOB_CHARACTERS.search(name) or BRACES.search(name):
        return _blocked(
            f"A command name computed at run time or with wildcards ({argv[0]!r})",
            "name the program literally so it can be checked.",
        )
    return None


def _source_substitution(name: str, argv: list[str]) -> str | None:
    """`source <(...)`, `. /dev/stdin <<< 'cmd'`, `source /dev/fd/3`: commands produced at
    run time or fed on standard input."""
    operand = argv[1] if argv[1:2] else ""
    produced = operand.startswith("<(") or names_runtime_input(operand)
    if name in ("source", ".") and produced:
        return _blocked(
            f"'{name} {argv[1]}' (running commands produced at run time)",
            "write the script to a file, read it, then run it.",
        )
    return None


def _subscript_substitution(name: str, argv: list[str]) -> str | None:
    """`test -v 'a[$(cmd)]'`, `printf -v 'a[$(cmd)]' x`, `read 'a[$(cmd)]'` ...: the
    builtin evaluates the subscript, which runs `cmd` though it was quoted."""
    if name in SUBSCRIPT_EVALUATORS and any(HIDDEN_SUBSTITUTION.search(a) for a in argv[1:]):
        return _blocked(
            f"'{name}' with a command hidden in an array subscript",
            "run the command itself as an argv list.",
        )
    return None


def _rm_sweeping(name: str, argv: list[str]) -> str | None:
    """`rm -r` (with or without -f) on /, /*, a top-level directory, ~ or $HOME."""
    if name != "rm":
        return None
    recursive, no_preserve_root, targets = _rm_arguments(argv[1:])
    if no_preserve_root:
        return _blocked("'rm --no-preserve-root'", "delete specific paths instead.")
    for target in targets:
        if _leaves_upward(target):
            return _blocked(
                f"'rm {target}' (deleting outside the working directory: '..' holds other "
                "workspaces and Harness's own data)",
                "delete paths inside the workspace, named from it.",
            )
    if not recursive:
        return None
    for target in targets:
        what = _sweeping_target(target)
        if what is not None:
            return _blocked(
                f"'rm -rf {target}' (recursive delete of {what})",
                "delete specific paths inside the workspace instead.",
            )
    return None


def _rm_arguments(args: list[str]) -> tuple[bool, bool, list[str]]:
    """(recursive, no_preserve_root, targets) as GNU rm reads them (options anywhere)."""
    recursive = no_preserve_root = options_done = False
    targets: list[str] = []
    for arg in args:
        if options_done or arg == "-" or not arg.startswith("-"):
            targets.append(arg)
        elif arg == "--":
            options_done = True
        elif arg.startswith("--"):
            option = arg[2:].split("=", 1)[0]
            recursive = recursive or "recursive".startswith(option) or _expands(option)
            no_preserve_root = no_preserve_root or (
                len(option) >= 3 and "no-preserve-root".startswith(option)
            )
        else:
            recursive = recursive or "r" in arg or "R" in arg or _expands(arg)
    return recursive, no_preserve_root, targets


def _leaves_upward(target: str) -> bool:
    """A relative target that climbs out of the directory it is named from (`..`, `../x`,
    `a/../../b`, `../*`)."""
    if target.startswith(("/", "~", "$")):
        return False
    parts = [part for part in target.split("/") if part not in ("", ".")]
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def _sweeping_target(target: str) -> str | None:
    """'the filesystem root', 'a top-level directory', 'the home directory', or None.

    Relative targets are left to the workspace; wildcards and expansions are read as
    sweeping whatever they could match.
    """
    path, home = target, False
    if path.startswith("~"):
        path, home = "/" + path.partition("/")[2], True
    for variable in ("${HOME}", "$HOME"):
        rest = path[len(variable) :]
        if path.startswith(variable) and (rest == "" or rest.startswith("/")):
            path, home = "/" + rest, True
    if not home and EXPANSIONS.match(path):
        return "a path computed at run time"
    if not path.startswith("/"):
        return None
    path = EXPANSIONS.sub("*", path)
    parts = [part for part in re.sub(r"/+", "/", path).split("/") if part]
    while parts and _expands(parts[-1]):
        parts.pop()  # `/*` sweeps its directory
    depth = len([part for part in posixpath.normpath("/" + "/".join(parts)).split("/") if part])
    if home and depth == 0:
        return "the home directory"
    if not home and depth == 0:
        return "the filesystem root"
    if not home and depth == 1:
        return "a top-level directory"
    return None


def _git_push(name: str, argv: list[str]) -> str | None:
    """`git push` (and `send-pack`, `http-push`) after any global options. (Aliases defined inline or
    with `git config` are blocked by `_layer_reason`.)"""
    if name != "git":
        return None
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg in GIT.global_loose_valued:
            i += 2
        elif arg.startswith("-"):
            i += 1
        else:
            break
    for subcommand in ("push", "send-pack", "http-push"):
        if i < len(args) and could_be(args[i], subcommand):
            pattern = _pattern(f"git {args[i]}", f"git {subcommand}")
            return _blocked(pattern, "commit locally and ask a person to push.")
    return None


def _publish(name: str, argv: list[str]) -> str | None:
    """`npm publish` wherever the word sits (`npm --tag x publish`, `npm -- publish`,
    `yarn npm publish`), and npm's abbreviations of it (`npm pub`)."""
    if name not in PUBLISHERS:
        return None
    for word in argv[1:]:
        if any(could_be(word, candidate) for candidate in PUBLISH_WORDS):
            pattern = _pattern(f"{name} {word}", f"{name} publish")
            return _blocked(pattern, "publishing a package needs a person.")
    return None


def _copies_known_program(name: str, argv: list[str]) -> str | None:
    """A copy, link or rename of a program the guard knows by name (`cp /usr/bin/git g`,
    `ln -s /usr/bin/sudo s`, `dd if=/usr/bin/sudo of=s`, `cp "$(which sudo)" s`): under
    its new name the copy would run unblocked (see program_facts.GUARD_KNOWN_PROGRAMS)."""
    if name in INSPECTING_PROGRAMS or name in WIDE_WRAPPERS or name in SHELLS or name == "find":
        return None
    copier = name in COPYING_PROGRAMS
    for word in argv[1:]:
        program = _known_program_named(word, copier=copier)
        if program is not None:
            return _blocked(
                f"'{name}' on the program '{program}' (a copy under another name would run "
                "without the command guard's check)",
                f"run '{program}' by its own name.",
            )
    return None


def _known_program_named(word: str, *, copier: bool) -> str | None:
    """The guard-known program `word` names as a path (or, for a copier, by its bare name,
    a glob that could match it, or a command substitution that mentions it)."""
    if copier and is_computed(word):
        mentioned = re.findall(r"[\w.+-]+", word.lower())
        return next((m for m in mentioned if guard_known(m)), None)
    named = names_known_program(word, bare=copier)
    if named is not None or not copier:
        return named
    base = command_name(word.partition("=")[2] or word)
    if GLOB_CHARACTERS.search(base):
        known = sorted(GUARD_KNOWN_PROGRAMS | {"git-push"})
        return next((p for p in known if fnmatch.fnmatchcase(p, base)), None)
    return None


def _pattern(written: str, blocked: str) -> str:
    """How a denial names what it blocked: "'git push'", or "'git $x' (could be 'git push')"."""
    return f"'{blocked}'" if written == blocked else f"'{written}' (could be '{blocked}')"


def _expands(word: str) -> bool:
    """True when a shell would expand `word` (glob, braces, $x): its value is unknown here."""
    return bool(GLOB_CHARACTERS.search(word) or BRACES.search(word) or is_computed(word))


RULES: tuple[Callable[[str, list[str]], str | None], ...] = (
    _unreadable_name,  # first: the other rules compare names literally
    _privilege,
    _eval,
    _source_substitution,
    _rm_sweeping,
    _git_push,
    _publish,
    _subscript_substitution,
    _copies_known_program,
)


def _shell_reason(argv: list[str], depth: int) -> str | None:
    """A shell may run a visible script or `-c STRING`; the string is checked command by command."""
    name = command_name(argv[0])
    invocation = shell_invocation(argv)
    script = invocation.script or ""
    if script.startswith("<(") or (names_runtime_input(script) and script != "-"):
        return _blocked(
            f"'{name} {script}' (a script produced at run time)",
            "write the script to a file, read it, then run it.",
        )
    if invocation.command_string is None:
        if invocation.c_flag:
            return _blocked(
                f"'{name} -c' without a visible command string",
                "pass the command string itself, or run the program directly.",
            )
        return None
    for reading in shell_readings(invocation.command_string, name):
        for command in parse_script(reading):
            reason = _script_command_reason(command, depth)
            if reason is not None:
                return reason
    return None


def _script_command_reason(command: ScriptCommand, depth: int) -> str | None:
    """Blocklist one command of a shell string, plus what only a shell can do: pipes into
    shells, and variables set for the command that it runs as commands."""
    reason = _variables_reason(list(command.assignments), depth)
    if reason is not None:
        return reason
    inner = unwrap(command.argv)
    name = command_name(inner[0]) if inner else ""
    if name in SHELLS and shell_invocation(inner).reads_stdin:
        upstream = {command_name((unwrap(stage) or [""])[0]) for stage in command.piped_from}
        downloader = sorted(upstream & DOWNLOADERS)
        if downloader:
            return _blocked(
                f"'{downloader[0]} ... | {name}' (a download piped into a shell)",
                "download the file, read it, then run it.",
            )
        if command.piped_from or command.stdin_text:
            return _blocked(
                f"Feeding commands to '{name}' on standard input",
                "run the commands directly so they can be checked.",
            )
    return blocked_reason(command.argv, depth + 1)
