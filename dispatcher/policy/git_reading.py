"""Reading git command lines by the facts of `program_facts.GIT`: global options,
subcommands, config keys (allowed by key), and the options and settings that make git run
a command it was given (`-c core.fsmonitor=CMD`, `rebase -x CMD`, `grep -O CMD`, `bisect run
CMD`, `submodule foreach CMD`, aliases) or write a file (`log --output=F`).

`read_git` is the strict reader's (allow rules); `git_nested_commands` and
`git_settings_in_variables` serve the wide reading of deny rules and the command guard.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from dispatcher.policy.program_facts import GIT, GIT_CONFIG_PARAMETERS, names_git_directory_operand
from dispatcher.policy.programs import (
    Command,
    Context,
    Nested,
    before_double_dash,
    long_prefix,
    option_values,
    short_cluster_has,
    unreadable,
)
from dispatcher.policy.shell import UnreadableCommand


def read_git(argv: list[str], ctx: Context) -> list[Command]:
    """git: global options known to be harmless only (no -c, --config-env, --exec-path),
    a subcommand git knows (anything else could be an alias), no subcommand option that
    runs a command (`rebase -x`, `grep -O`, `bisect run`, `submodule foreach` ...) or
    writes a file (`--output`, `archive -o`), and `git config` only on allowed keys."""
    if ctx.appended:
        raise unreadable("'xargs git': its subcommand or options come from the input")
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg in GIT.global_flags:
            i += 1
        elif arg.split("=", 1)[0] in GIT.global_valued:
            i += 1 if "=" in arg else 2
        elif arg.startswith("-"):
            raise unreadable(f"'git {arg}' is not a global option known to be harmless")
        else:
            break
    if i >= len(args):
        return [Command(tuple(argv))]
    subcommand, rest = args[i], list(args[i + 1 :])
    if subcommand not in GIT.commands:
        raise unreadable(f"'git {subcommand}' is not a git command (it could be an alias)")
    nested = _git_subcommand(subcommand, rest, ctx)
    return [Command(tuple(argv)), *nested]


def _git_subcommand(subcommand: str, rest: list[str], ctx: Context) -> list[Command]:
    options = before_double_dash(rest)
    opaque = GIT.opaque_commands.get(subcommand)
    if opaque and not (subcommand == "format-patch" and _writes_to_stdout(options)):
        raise unreadable(f"'git {subcommand}': {opaque}")
    if subcommand == "submodule" and "foreach" in rest:
        raise unreadable("'git submodule foreach' runs a shell string")
    if subcommand == "bisect" and rest[:1] == ["run"]:
        return ctx.read(rest[1:], fed=False, appended=False) if rest[1:] else []
    short, long = GIT.running_options.get(subcommand, ("", ()))
    for arg in options:
        if (short and short_cluster_has(arg, short)) or long_prefix(arg, *long, shortest=2):
            raise unreadable(f"'git {subcommand} {arg}' runs a command it was given")
        if long_prefix(arg, *GIT.configured_running_options, shortest=3):
            raise unreadable(f"'git {subcommand} {arg}' runs commands set in git's configuration")
        if long_prefix(arg, *GIT.writing_options, shortest=3) or short_cluster_has(
            arg, GIT.writing_short.get(subcommand, "")
        ):
            raise unreadable(f"'git {subcommand} {arg}' writes a file")
    for arg in options:
        if subcommand == "apply" and long_prefix(arg, "unsafe-paths", shortest=2):
            raise unreadable(
                f"'git apply {arg}' writes the paths the patch names, `.git/hooks/...` and "
                "`.git/config` among them (git refuses them only without it)"
            )
        if long_prefix(arg, *GIT.git_dir_options.get(subcommand, ()), shortest=2):
            raise unreadable(
                f"'git {subcommand} {arg}' makes a git directory not named .git, whose "
                "config an allowed write may change"
            )
    if subcommand == "config":
        _read_config(rest)
    if subcommand == "mv":  # `git mv x HEAD` makes a file that makes a git directory
        named = next((arg for arg in rest if names_git_directory_operand(arg)), None)
        if named is not None:
            raise unreadable(
                f"'git mv ... {named}' writes a file that makes its directory a git directory"
            )
    return []


def _writes_to_stdout(options: list[str]) -> bool:
    return "--stdout" in options and not any(
        short_cluster_has(arg, "o") or long_prefix(arg, "output-directory", shortest=3)
        for arg in options
    )


CONFIG_FLAGS = frozenset(
    {"--global", "--local", "--worktree", "--list", "-l", "--get", "--get-all"}
    | {"--get-regexp", "--get-urlmatch", "--unset", "--unset-all", "--add", "--replace-all"}
    | {"--null", "-z", "--name-only", "--show-origin", "--show-scope", "--bool", "--int"}
    | {"--bool-or-int", "--path", "--expiry-date", "--no-type", "--includes", "--no-includes"}
    | {"--all", "--regexp", "--fixed-value"}
)
CONFIG_VALUED = frozenset({"--type", "--default", "--comment", "--value", "--url"})
CONFIG_READS = frozenset({"--list", "-l", "--get", "--get-all", "--get-regexp", "--get-urlmatch"})
CONFIG_SUBCOMMANDS = {"list": True, "get": True, "set": False, "unset": False}  # True: reads


def _read_config(args: list[str]) -> bool:
    """`git config`: reading any key is readable; setting or unsetting one only when the
    key is in `GIT.safe_config_key` (it runs nothing). Options are known ones only, and
    words after `--` are operands too (`git config -- core.pager CMD` sets core.pager).
    True when it sets or unsets a key."""
    operands: list[str] = []
    reads = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            operands.extend(args[i:])
            break
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            if name in CONFIG_VALUED:
                i += 0 if "=" in arg else 1
            elif arg not in CONFIG_FLAGS:
                raise unreadable(f"'git config {arg}' is not an option known to be harmless")
            reads = reads or arg in CONFIG_READS
            continue
        operands.append(arg)
    if operands and operands[0] in CONFIG_SUBCOMMANDS and not reads:
        reads = CONFIG_SUBCOMMANDS[operands[0]]
        operands = operands[1:]
    elif operands[:1] and operands[0] in ("rename-section", "remove-section", "edit"):
        raise unreadable(f"'git config {operands[0]}' is not read")
    if reads or len(operands) == 0:
        return False
    key = operands[0]
    if not GIT.safe_config_key.fullmatch(key.lower()):
        raise unreadable(
            f"'git config {key}': an allow rule may set only keys that run nothing "
            "(user.name, core.autocrlf, color.* ...)"
        )
    return True


def changes_only_config(argv: Sequence[str]) -> bool:
    """Whether `argv` is git alone, with no global option, changing its repository's
    configuration by design and nothing that runs a program: `git config` setting or
    unsetting a key that runs nothing (as read above), `git branch -u UPSTREAM [BRANCH]`
    (`--set-upstream-to`, `--unset-upstream`). (`git remote` is never read.) Such a
    command, allowed by a rule, runs with `.git/config` writable (the rest of the git
    metadata stays read-only: dispatcher.tools.sandbox_git.ALL_BUT_CONFIG); any other
    that no person approved finds it read-only."""
    words = list(argv)
    if len(words) < 3 or words[0] != "git":
        return False
    subcommand, rest = words[1], words[2:]
    if subcommand == "config":
        try:
            return _read_config(rest)
        except UnreadableCommand:
            return False
    operands = [word for word in rest if not word.startswith("-")]
    if subcommand != "branch":
        return False
    if rest[:1] in (["-u"], ["--set-upstream-to"]):
        return len(rest) in (2, 3) and operands == rest[1:]
    if rest[0].startswith("--set-upstream-to=") or rest[0] == "--unset-upstream":
        return len(rest) in (1, 2) and operands == rest[1:]
    return False


def _git_config_value(key: str, value: str) -> Nested | None:
    if key.lower().startswith("alias."):
        text = value[1:] if value.startswith("!") else f"git {value}"
        return Nested(text=text, alias=key)
    if GIT.command_key.fullmatch(key):
        return Nested(text=value[1:] if value.startswith("!") else value)
    return None


def git_nested_commands(args: list[str]) -> list[Nested]:
    """What git with arguments `args` may run, read widely: the commands its `-c` settings
    carry, and those its subcommand starts (`bisect run`, `rebase -x`, `git config KEY CMD`)."""
    found: list[Nested] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        setting = args[i + 1] if arg in ("-c", "--config-env") and i + 1 < len(args) else ""
        if arg.startswith("-c") and len(arg) > 2:
            setting = arg[2:]
        if arg.startswith("--config-env="):
            setting = arg.split("=", 1)[1]
        if setting:
            key, _, value = setting.partition("=")
            nested = _git_config_value(key, value)
            found.extend([nested] if nested else [])
        i += 2 if arg in GIT.global_loose_valued else 1
    if i >= len(args):
        return found
    return found + _subcommand_nested(args[i], args[i + 1 :])


def _subcommand_nested(subcommand: str, rest: list[str]) -> list[Nested]:
    found: list[Nested] = []
    if subcommand == "bisect" and rest[:1] == ["run"] and rest[1:]:
        found.append(Nested(tuple(rest[1:])))
    elif subcommand == "submodule" and "foreach" in rest:
        words = rest[rest.index("foreach") + 1 :]
        words = [word for word in words if word not in ("--recursive", "-q", "--quiet")]
        found.append(Nested(text=" ".join(words)))
    elif subcommand == "config":
        positional = [arg for arg in rest if not arg.startswith("-")]
        positional = positional[1:] if positional[:1] in (["set"], ["--add"]) else positional
        for key, value in zip(positional, [*positional[1:], ""][: len(positional)], strict=True):
            nested = _git_config_value(key, value)
            found.extend([nested] if nested and (value or nested.alias) else [])
    elif subcommand in GIT.nested_options:
        short, long = GIT.nested_options[subcommand]
        found.extend(Nested(text=value) for value in option_values(rest, short, long) if value)
    return found


def git_settings_in_variables(assignments: Sequence[str]) -> list[Nested]:
    """The commands the git settings in `GIT_CONFIG_PARAMETERS` would run: it holds
    `'key'='value'` pairs, as `git -c` passes them to the git it starts. A value that
    cannot be split is read as one command string (over-approximated, never skipped).
    (`GIT_CONFIG_VALUE_n` is one of `program_facts.COMMAND_VARIABLE`.)"""
    found: list[Nested] = []
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        if name.removesuffix("+") != GIT_CONFIG_PARAMETERS:
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            found.append(Nested(text=value))
            continue
        for word in words:
            key, _, setting = word.partition("=")
            nested = _git_config_value(key, setting)
            found.extend([nested] if nested else [])
        found.extend(_unquoted_settings(value))
    return found


def _unquoted_settings(value: str) -> list[Nested]:
    """Each command key's value read to the end of `value`, quotes dropped: a shell
    string's reading (bashlex) removes the quotes inside an assignment's double quotes
    (`"'k'='v w'"` reads `k=v w`), so the pairs may not split as git splits them."""
    text = value.replace("'", "")
    found: list[Nested] = []
    for match in re.finditer(r"([\w.-]+)=", text):
        nested = _git_config_value(match.group(1), text[match.end() :])
        found.extend([nested] if nested else [])
    return found
