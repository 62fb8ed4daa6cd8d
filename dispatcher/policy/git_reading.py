"""Reading git command lines: global options, subcommands, and the options and config
keys that make git run a command it was given (`-c core.fsmonitor=CMD`, `rebase -x CMD`,
`grep -O CMD`, `bisect run CMD`, `submodule foreach CMD`, aliases).

`read_git` is the strict reader's (allow rules); `GIT_PROGRAM_KEY` and
`git_nested_commands` serve the wide reading of deny rules and the command guard.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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

# --- git ---------------------------------------------------------------------------------------

GIT_GLOBAL_FLAGS = frozenset(
    {"-p", "-P", "--paginate", "--no-pager", "--no-replace-objects", "--bare", "-v", "-h"}
    | {"--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs"}
    | {"--no-optional-locks", "--no-advice", "--version", "--help"}
)
GIT_GLOBAL_VALUED = frozenset({"-C", "--git-dir", "--work-tree", "--namespace"})
GIT_COMMANDS = frozenset(  # noqa: SIM905 - the list `git help -a` prints
    [
        "add",
        "am",
        "archive",
        "bisect",
        "branch",
        "bundle",
        "checkout",
        "cherry-pick",
        "clean",
        "clone",
        "commit",
        "describe",
        "diff",
        "fetch",
        "format-patch",
        "gc",
        "grep",
        "init",
        "log",
        "maintenance",
        "merge",
        "mv",
        "notes",
        "pull",
        "push",
        "range-diff",
        "rebase",
        "reset",
        "restore",
        "revert",
        "rm",
        "shortlog",
        "show",
        "sparse-checkout",
        "stash",
        "status",
        "submodule",
        "switch",
        "tag",
        "worktree",
        "config",
        "fast-export",
        "fast-import",
        "filter-branch",
        "mergetool",
        "pack-refs",
        "prune",
        "reflog",
        "remote",
        "repack",
        "replace",
        "annotate",
        "blame",
        "bugreport",
        "count-objects",
        "diagnose",
        "difftool",
        "fsck",
        "help",
        "instaweb",
        "merge-tree",
        "rerere",
        "show-branch",
        "verify-commit",
        "verify-tag",
        "version",
        "whatchanged",
        "apply",
        "checkout-index",
        "commit-graph",
        "commit-tree",
        "hash-object",
        "index-pack",
        "merge-file",
        "merge-index",
        "mktag",
        "mktree",
        "multi-pack-index",
        "pack-objects",
        "prune-packed",
        "read-tree",
        "symbolic-ref",
        "unpack-objects",
        "update-index",
        "update-ref",
        "write-tree",
        "cat-file",
        "cherry",
        "diff-files",
        "diff-index",
        "diff-tree",
        "for-each-ref",
        "for-each-repo",
        "get-tar-commit-id",
        "ls-files",
        "ls-remote",
        "ls-tree",
        "merge-base",
        "name-rev",
        "pack-redundant",
        "rev-list",
        "rev-parse",
        "show-index",
        "show-ref",
        "unpack-file",
        "var",
        "verify-pack",
        "daemon",
        "fetch-pack",
        "send-pack",
        "update-server-info",
        "check-attr",
        "check-ignore",
        "check-mailmap",
        "check-ref-format",
        "column",
        "credential",
        "fmt-merge-msg",
        "hook",
        "interpret-trailers",
        "mailinfo",
        "mailsplit",
        "patch-id",
        "stripspace",
        "send-email",
        "request-pull",
    ]
)
# Config keys whose value git runs as a command, or that load code, hooks or other config.
GIT_PROGRAM_KEY = re.compile(
    r"(alias\..*|core\.(fsmonitor|sshcommand|pager|editor|hookspath|askpass|gitproxy"
    r"|alternaterefscommand|worktree)|credential\..*|.*\.helper|diff\..*\.(command|textconv)"
    r"|diff\.external|difftool\..*|merge\..*\.driver|mergetool\..*|filter\..*|pager\..*"
    r"|sequence\.editor|gpg\.(.*\.)?program|ssh\.variant|uploadpack\..*|receive\..*"
    r"|remote\..*\.(uploadpack|receivepack|vcs|proxy)|include\..*|includeif\..*"
    r"|init\.templatedir|submodule\..*|instaweb\..*|sendemail\..*|web\.browser|browser\..*"
    r"|man\..*|help\..*|interactive\.difffilter|protocol\..*|url\..*|http\..*|core\.sshCommand)",
    re.IGNORECASE,
)
# ... of which these hold a command git runs (what the guard reads as a shell string).
GIT_COMMAND_KEY = re.compile(
    r"core\.(fsmonitor|sshcommand|pager|editor|askpass|gitproxy|alternaterefscommand)"
    r"|credential\.(.*\.)?helper|diff\..*\.(command|textconv)|diff\.external"
    r"|difftool\..*\.cmd|merge\..*\.driver|mergetool\..*\.cmd|filter\..*\.(clean|smudge|process)"
    r"|pager\..*|sequence\.editor|gpg\.(.*\.)?program|uploadpack\.packobjectshook"
    r"|remote\..*\.(uploadpack|receivepack)|sendemail\..*cmd|web\.browser|browser\..*\.cmd"
    r"|man\..*\.cmd|interactive\.difffilter",
    re.IGNORECASE,
)


def git_subcommand_index(args: Sequence[str]) -> int:
    """Index of the subcommand in git's arguments after its global options (loose)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in GIT_GLOBAL_VALUED or arg in ("-c", "--config-env", "--exec-path"):
            i += 1 if arg == "--exec-path" else 2
        elif arg.startswith("-"):
            i += 1
        else:
            return i
    return i


def read_git(argv: list[str], ctx: Context) -> list[Command]:
    """git: global options known to be harmless only (no -c, --config-env, --exec-path),
    a subcommand git knows (anything else could be an alias), and no subcommand option
    that runs a command (`rebase -x`, `grep -O`, `bisect run`, `submodule foreach` ...)."""
    if ctx.appended:
        raise unreadable("'xargs git': its subcommand or options come from the input")
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg in GIT_GLOBAL_FLAGS:
            i += 1
        elif arg.split("=", 1)[0] in GIT_GLOBAL_VALUED:
            i += 1 if "=" in arg else 2
        elif arg.startswith("-"):
            raise unreadable(f"'git {arg}' is not a global option known to be harmless")
        else:
            break
    if i >= len(args):
        return [Command(tuple(argv))]
    subcommand, rest = args[i], list(args[i + 1 :])
    if subcommand not in GIT_COMMANDS:
        raise unreadable(f"'git {subcommand}' is not a git command (it could be an alias)")
    nested = _git_subcommand(subcommand, rest, ctx)
    return [Command(tuple(argv)), *nested]


# Subcommand options that run a command they are given.
GIT_RUNNING_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rebase": ("x", ("exec",)),
    "grep": ("O", ("open-files-in-pager",)),
    "difftool": ("x", ("extcmd",)),
    "clone": ("uc", ("upload-pack", "template", "config")),
    "init": ("", ("template",)),
    "fetch": ("", ("upload-pack",)),
    "pull": ("", ("upload-pack",)),
    "ls-remote": ("", ("upload-pack",)),
    "archive": ("", ("exec", "remote")),
    "push": ("", ("receive-pack", "exec")),
    "send-pack": ("", ("receive-pack", "exec")),
    "fetch-pack": ("", ("upload-pack", "exec")),
    "daemon": ("", ("access-hook",)),
}


def _git_subcommand(subcommand: str, rest: list[str], ctx: Context) -> list[Command]:
    options = before_double_dash(rest)
    if subcommand in ("filter-branch", "send-email", "instaweb"):
        raise unreadable(f"'git {subcommand}' runs commands given as strings or starts programs")
    if subcommand == "submodule" and "foreach" in rest:
        raise unreadable("'git submodule foreach' runs a shell string")
    if subcommand == "bisect" and rest[:1] == ["run"]:
        return ctx.read(rest[1:], fed=False, appended=False) if rest[1:] else []
    runs = GIT_RUNNING_OPTIONS.get(subcommand)
    if runs:
        short, long = runs
        for arg in options:
            if (short and short_cluster_has(arg, short)) or long_prefix(arg, *long, shortest=2):
                raise unreadable(f"'git {subcommand} {arg}' runs a command it was given")
    if subcommand == "config":
        for arg in options:
            if arg in ("-e", "--edit") or GIT_PROGRAM_KEY.fullmatch(arg):
                raise unreadable(
                    f"'git config {arg}' edits a setting git runs as a command or loads code from"
                )
    return []


GIT_NESTED_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rebase": ("x", ("exec",)),
    "grep": ("O", ("open-files-in-pager",)),
    "difftool": ("x", ("extcmd",)),
    "filter-branch": (
        "",
        ("tree-filter", "index-filter", "env-filter", "msg-filter", "commit-filter")
        + ("parent-filter", "tag-name-filter", "setup"),
    ),
    "clone": ("u", ("upload-pack",)),
    "fetch": ("", ("upload-pack",)),
    "pull": ("", ("upload-pack",)),
    "ls-remote": ("", ("upload-pack",)),
    "archive": ("", ("exec",)),
    "push": ("", ("receive-pack", "exec")),
}


def _git_config_value(key: str, value: str) -> Nested | None:
    if key.lower().startswith("alias."):
        text = value[1:] if value.startswith("!") else f"git {value}"
        return Nested(text=text, alias=key)
    if GIT_COMMAND_KEY.fullmatch(key):
        return Nested(text=value[1:] if value.startswith("!") else value)
    return None


def git_nested_commands(args: list[str]) -> list[Nested]:
    found: list[Nested] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        setting = args[i + 1] if arg in ("-c", "--config-env") else ""
        if arg.startswith("-c") and len(arg) > 2:
            setting = arg[2:]
        if arg.startswith("--config-env="):
            setting = arg.split("=", 1)[1]
        if setting:
            key, _, value = setting.partition("=")
            nested = _git_config_value(key, value)
            found.extend([nested] if nested else [])
        i += 2 if arg in GIT_GLOBAL_VALUED or arg in ("-c", "--config-env") else 1
    if i >= len(args):
        return found
    subcommand, rest = args[i], args[i + 1 :]
    if subcommand == "bisect" and rest[:1] == ["run"] and rest[1:]:
        found.append(Nested(tuple(rest[1:])))
    elif subcommand == "submodule" and "foreach" in rest:
        words = rest[rest.index("foreach") + 1 :]
        words = [word for word in words if word not in ("--recursive", "-q", "--quiet")]
        found.append(Nested(text=" ".join(words)))
    elif subcommand == "config":
        positional = [arg for arg in rest if not arg.startswith("-")]
        positional = positional[1:] if positional[:1] in (["set"], ["--add"]) else positional
        for key, value in zip(positional, [*positional[1:], ""], strict=True):
            nested = _git_config_value(key, value)
            found.extend([nested] if nested and (value or nested.alias) else [])
    elif subcommand in GIT_NESTED_OPTIONS:
        short, long = GIT_NESTED_OPTIONS[subcommand]
        found.extend(Nested(text=value) for value in option_values(rest, short, long) if value)
    return found
