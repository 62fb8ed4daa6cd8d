"""Everything Harness knows about programs, in one declarative table with examples.

Each row of `PROGRAMS` says what one program (or a family of names) is to the command
readers: a shell, a privilege program, a wrapper and how its options look, an interpreter
and which options carry code, the options that make an ordinary program run another one,
or a program an allow rule never reads. Every row carries example commands (as openai/codex
execpolicy keeps `match`/`not_match` beside each rule): `readable` ones an allow rule may
read, `unreadable` ones it never may, `blocked` ones the always-on guard denies, and `sees`
pairs (a command, a part that deny rules must see in it). `GIT` does the same for git: its
options, subcommands, the config keys an allow rule may set (allow by key) and the keys
whose value git runs.

The three readers consult only this module: the strict reader (`reading`, `programs`,
`git_reading`: allow rules and grants), the wide reader (`shell`, `parts`: deny and ask
rules) and the guard (`guards`). `check_table` validates the rows when the module loads;
tests/policy/test_program_facts.py runs every example through the readers.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

# --- the shapes a row is made of ---------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """A program's options known to be harmless, getopt-style. Anything else is unreadable."""

    flags: str = ""  # short options without a value
    valued: str = ""  # short options taking a value (attached or the next word)
    long_flags: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Wrapper:
    """A wrapper an allow rule looks through, named exactly, with its harmless options."""

    options: Options = Options()
    operand: str = ""  # a regex for the operand before the command (timeout's DURATION)
    needs_command: bool = False  # without a command it fails (so there is nothing to read)


@dataclass(frozen=True)
class WrapperSpec:
    """How a wrapper's own options look, so the wide reading finds the wrapped command."""

    short_with_value: str = ""
    long_with_value: frozenset[str] = frozenset()
    leading_operands: int = 0  # operands before the command (timeout's DURATION)
    # A leading operand is skipped only when it looks like one (chrt's PRIORITY is a number).
    leading_pattern: str = ""
    # With no command, the wrapper starts an interactive shell (which reads standard input).
    shell_when_empty: bool = False


@dataclass(frozen=True)
class Interpreter:
    """An interpreter's options: code options make it unreadable; `flags`/`valued` are
    harmless; `attached` letters take the rest of their cluster as an optional value;
    `module` letters end the options (python -m MOD: the rest belongs to MOD)."""

    code: str = ""
    flags: str = ""
    valued: str = ""
    attached: str = ""
    module: str = ""
    long_flags: frozenset[str] = frozenset({"version", "help"})
    long_valued: frozenset[str] = frozenset()  # long options harmless with `=VALUE`
    code_modules: frozenset[str] = frozenset()  # `-m MOD` modules that run given code


@dataclass(frozen=True)
class CodeOptions:
    """Options of an ordinary program that make it run another program or a string."""

    short: str = ""  # letters in a `-abc` cluster
    long: tuple[str, ...] = ()  # long options (any GNU abbreviation of them counts)
    words: tuple[str, ...] = ()  # exact words
    prefixes: tuple[str, ...] = ()  # words starting with these
    contains: tuple[str, ...] = ()  # words containing these (case-insensitive)


@dataclass(frozen=True)
class Writes:
    """How a program an allow rule names for reading or printing (`sort *`, `uniq *`) writes
    a file it names instead: an option (`sort -o F`, `yq -i`) or an operand (`uniq IN
    OUT`). Such a form is unreadable, as `find -delete` and `git log --output` are; run
    by xargs (whose words may be those options) the program is unreadable too."""

    short: str = ""  # letters in a `-abc` cluster (anywhere in it: fail closed)
    long: tuple[str, ...] = ()  # long options (any GNU abbreviation of them counts)
    # Letters that take the rest of their cluster as a value: the cluster is read no
    # further (`iconv -tiso-8859-1` holds no `-o`). Only letters that always take one.
    stops: str = ""
    operand: int = 0  # the operand it writes, counted from 1 (`uniq IN OUT`: 2)
    # Option words that take the next word as their value, for counting operands: only
    # exact spellings (any other option is read as taking none, which counts more operands).
    valued: frozenset[str] = frozenset()


ShellKind = Literal["", "read", "other"]
StdinCode = Literal["", "no-operands", "always"]


@dataclass(frozen=True)
class Program:
    """What the readers know about the programs `names` (each its basename)."""

    names: tuple[str, ...]
    # "read": an allow rule reads its `-c STRING` (sh, bash, dash); "other": a shell whose
    # options an allow rule never reads. The guard and deny rules read into both.
    shell_kind: ShellKind = ""
    privilege: bool = False  # runs its command as another user (the guard blocks it)
    # sudo-like: short options taking a value, so the wide reading finds the command run
    privilege_valued: str | None = None
    opaque: str = ""  # why an allow rule never reads it ("" = it may)
    wrapper: WrapperSpec | None = None  # the wide reading looks through it
    strict_wrapper: Wrapper | None = None  # an allow rule looks through it too
    interpreter: Interpreter | None = None
    pattern: str = ""  # an interpreter's family of names (`python3.12`)
    inline_code: frozenset[str] = frozenset()  # options (or words) that carry code
    stdin_code: StdinCode = ""  # reads code from its input (without operands, or always)
    code_options: CodeOptions | None = None
    writes: Writes | None = None  # the forms in which it writes a file it names
    evaluates: bool = False  # a builtin that evaluates strings or changes how words read
    readable: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    sees: tuple[tuple[str, str], ...] = ()  # (command, a part deny rules must see)


# Options of a looked-through shell (and of `set`) known to be harmless.
SHELL_FLAGS = "euxvfC"  # errexit, nounset, xtrace, verbose, noglob, noclobber
SHELL_LONG_FLAGS = frozenset({"norc", "noprofile", "posix"})
SAFE_SHELL_OPTIONS = frozenset(
    {"errexit", "nounset", "pipefail", "xtrace", "verbose", "noglob", "noclobber"}
)

# --- the table ----------------------------------------------------------------------------------

DURATION = r"\d+(\.\d*)?[smhd]?"
# npm-style options that take a value (`--package foo`); others are read as flags.
PACKAGE_RUNNER_OPTIONS = frozenset(
    {"package", "call", "shell", "script-shell", "registry", "cache", "prefix", "userconfig"}
    | {"workspace", "node-options", "node-arg", "loglevel"}
)
PACKAGE_RUNNER = WrapperSpec("pc", PACKAGE_RUNNER_OPTIONS)
NPM_CODE = CodeOptions(
    "c",
    ("call", "script-shell", "shell", "node-options", "userconfig", "globalconfig")
    + ("init-module", "editor", "browser", "viewer", "git"),
)
VIM_CODE = CodeOptions("cSuUswWeEx", ("cmd",), prefixes=("+",))
TAR_CODE = CodeOptions(
    "IF",
    ("to-command", "use-compress-program", "checkpoint-action", "info-script")
    + ("new-volume-script", "rsh-command", "rmt-command"),
)
OPAQUE_SCHEDULER = "it runs command strings of its own or schedules them"
OPAQUE_ROOT = "it runs the command in another root, namespace, group or with other privileges"
AS_ANOTHER_USER = "it runs the command as another user"

PROGRAMS: tuple[Program, ...] = (
    # --- shells
    Program(
        ("sh", "bash", "dash"),
        shell_kind="read",
        readable=("bash -c 'git status && ls'", "sh -ec 'echo hi'", "bash build.sh"),
        unreadable=(
            "bash -c 'echo $(id)'",
            "bash -i -c ls",
            "bash //dev/stdin",
            "bash /dev/./stdin",
            "sh /dev/fd/0",
            "dash /proc/self/fd/0",
            "bash ../../../../../../../../dev/stdin",
            "./bash -c ls",
        ),
        blocked=("bash -c 'sudo id'", "dash -c 'git push'", "bash /dev/fd/3", "BASH -c 'sudo id'"),
        sees=(("bash -c 'ls; rm -rf x'", "rm -rf x"),),
    ),
    Program(
        ("zsh", "ksh", "ksh93", "mksh", "pdksh", "lksh", "ash", "rbash", "yash", "posh")
        + ("fish", "csh", "tcsh", "osh", "ysh", "oil", "rc", "es", "elvish", "nu", "xonsh")
        + ("ion",),
        shell_kind="other",
        readable=("zsh script.zsh", "ksh build.ksh"),
        unreadable=("zsh -c ls", "rbash -c ls", "ksh93 -c ls", "fish //dev/stdin"),
        blocked=(
            "rbash -c 'sudo id'",
            "ksh93 -c 'sudo id'",
            "yash -c 'sudo id'",
            "posh -c 'sudo id'",
            "zsh -c 'git push'",
            "lksh -c 'rm -rf /'",
        ),
        sees=(("yash -c 'curl x'", "curl x"), ("rbash -c 'curl x'", "curl x")),
    ),
    # --- privilege
    Program(
        ("sudo",),
        privilege=True,
        privilege_valued="ugChpDrtTU",
        opaque=AS_ANOTHER_USER,
        unreadable=("sudo ls",),
        blocked=("sudo ls", "sudo -u root id", "/usr/bin/sudo id", "env sudo id", "SUDO id")
        + ("/usr/bin/Sudo id", "Env sudo id"),  # a case-insensitive disk (macOS) runs sudo
        sees=(("sudo -u root git push", "git push"),),
    ),
    Program(
        ("doas",),
        privilege=True,
        privilege_valued="uC",
        opaque=AS_ANOTHER_USER,
        unreadable=("doas id",),
        blocked=("doas id",),
        sees=(("doas -u root curl x", "curl x"),),
    ),
    Program(
        ("pkexec",),
        privilege=True,
        privilege_valued="",
        opaque=AS_ANOTHER_USER,
        unreadable=("pkexec id",),
        blocked=("pkexec id",),
        sees=(("pkexec curl x", "curl x"),),
    ),
    Program(
        ("runuser",),
        privilege=True,
        privilege_valued="ugGsw",
        opaque=AS_ANOTHER_USER,
        unreadable=("runuser -u nobody id",),
        blocked=("runuser -u nobody id",),
        sees=(("runuser -u nobody -- curl x", "curl x"),),
    ),
    Program(
        ("su", "sudoedit", "run0", "ksu"),
        privilege=True,
        opaque=AS_ANOTHER_USER,
        unreadable=("su -c id", "run0 id"),
        blocked=("su -c id", "sudoedit /etc/hosts", "run0 id", "ksu"),
        sees=(("su -c 'curl x'", "curl x"),),
    ),
    # --- wrappers an allow rule looks through
    Program(
        ("env",),
        wrapper=WrapperSpec("uCS", frozenset({"unset", "chdir", "split-string"})),
        strict_wrapper=Wrapper(),
        readable=("env CI=1 npm test", "env"),
        unreadable=("env -i ls", "env PATH=/tmp ls", "env GIT_CONFIG_COUNT=1 git log"),
        blocked=("env -S 'sudo id'", "env X=1 git push"),
        sees=(("env -u X curl y", "curl y"),),
    ),
    Program(
        ("timeout",),
        wrapper=WrapperSpec("sk", frozenset({"signal", "kill-after"}), leading_operands=1),
        strict_wrapper=Wrapper(
            Options(
                "v",
                "sk",
                frozenset({"preserve-status", "foreground", "verbose"}),
                frozenset({"signal", "kill-after"}),
            ),
            operand=DURATION,
            needs_command=True,
        ),
        readable=("timeout 5 npm test", "timeout -s KILL 10s ls"),
        unreadable=("timeout 5 bash -c 'echo $x'", "timeout ls"),
        blocked=("timeout 5 sudo id",),
        sees=(("timeout -k 1 5 curl x", "curl x"),),
    ),
    Program(
        ("nice",),
        wrapper=WrapperSpec("n", frozenset({"adjustment"})),
        strict_wrapper=Wrapper(Options("", "n", frozenset(), frozenset({"adjustment"}))),
        readable=("nice -n 5 make", "nice -10 ls"),
        unreadable=("nice -n 5 sudo ls",),
        blocked=("nice -n 5 git push",),
    ),
    Program(
        ("nohup",),
        wrapper=WrapperSpec(),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("nohup make",),
        unreadable=("nohup",),
        blocked=("nohup sudo id",),
    ),
    Program(
        ("xargs",),
        wrapper=WrapperSpec(
            "adEILnPs",
            frozenset(
                {"arg-file", "delimiter", "eof", "replace", "max-lines", "max-args", "max-procs"}
                | {"max-chars", "process-slot-var"}
            ),
        ),
        strict_wrapper=Wrapper(
            Options(
                "0rtx",
                "nLsPd",
                frozenset({"null", "no-run-if-empty", "verbose", "exit"}),
                frozenset({"max-args", "max-lines", "max-chars", "max-procs", "delimiter"}),
            )
        ),
        readable=("xargs -0 wc -l", "xargs"),
        unreadable=("xargs -I{} sh -c 'echo {}'", "xargs git log", "xargs bash"),
        blocked=("xargs sudo id",),
    ),
    Program(
        ("time",),
        wrapper=WrapperSpec("fo", frozenset({"format", "output"})),
        strict_wrapper=Wrapper(Options("p")),
        readable=("time make",),
        unreadable=("time -o out make",),
        blocked=("time git push",),
    ),
    Program(
        ("stdbuf",),
        wrapper=WrapperSpec("ioe", frozenset({"input", "output", "error"})),
        strict_wrapper=Wrapper(
            Options("", "ioe", frozenset(), frozenset({"input", "output", "error"})),
            needs_command=True,
        ),
        readable=("stdbuf -o0 ls",),
        unreadable=("stdbuf -o0",),
        blocked=("stdbuf -oL sudo id",),
    ),
    Program(
        ("ionice",),
        wrapper=WrapperSpec("cnpPu", frozenset({"class", "classdata", "pid", "pgid", "uid"})),
        strict_wrapper=Wrapper(
            Options("t", "cn", frozenset({"ignore"}), frozenset({"class", "classdata"}))
        ),
        readable=("ionice -c 3 make",),
        unreadable=("ionice -p 1",),
        blocked=("ionice -c 3 sudo id",),
    ),
    Program(
        ("taskset",),
        wrapper=WrapperSpec(leading_operands=1),  # MASK
        strict_wrapper=Wrapper(
            Options("c", "", frozenset({"cpu-list"})),
            operand=r"[0-9a-fA-Fx,:\-]+",
            needs_command=True,
        ),
        readable=("taskset 0x1 make",),
        unreadable=("taskset -p 1",),
        blocked=("taskset 1 sudo id",),
    ),
    Program(
        ("chrt",),
        wrapper=WrapperSpec(
            "TPD",
            frozenset({"sched-runtime", "sched-period", "sched-deadline"}),
            leading_operands=1,  # PRIORITY
            leading_pattern=r"-?\d+",
        ),
        strict_wrapper=Wrapper(
            Options(
                "bfiordR",
                "TPD",
                frozenset({"batch", "fifo", "idle", "other", "rr", "deadline", "reset-on-fork"}),
                frozenset({"sched-runtime", "sched-period", "sched-deadline"}),
            ),
            operand=r"\d+",
            needs_command=True,
        ),
        readable=("chrt -o 0 make",),
        unreadable=("chrt -p 1",),
        blocked=("chrt -o 0 sudo id",),
    ),
    Program(
        ("command",),
        wrapper=WrapperSpec(),
        strict_wrapper=Wrapper(Options("pvV")),
        readable=("command ls", "command -v git"),
        unreadable=("command -x ls",),
        blocked=("command sudo id",),
    ),
    Program(
        ("builtin",),
        wrapper=WrapperSpec(),
        strict_wrapper=Wrapper(),
        readable=("builtin echo hi",),
        unreadable=("builtin eval ls",),
        blocked=("builtin eval ls",),
    ),
    Program(
        ("exec",),
        wrapper=WrapperSpec("a"),
        strict_wrapper=Wrapper(),
        readable=("exec ls",),
        unreadable=("exec -a x ls",),
        blocked=("exec sudo id",),
    ),
    Program(
        ("watch",),
        wrapper=WrapperSpec("nq", frozenset({"interval", "equexit"})),
        strict_wrapper=Wrapper(
            Options(
                "tdbegcwxp",
                "nq",
                frozenset(
                    {"no-title", "differences", "beep", "errexit", "chgexit", "color", "no-wrap"}
                    | {"exec", "precise", "no-color"}
                ),
                frozenset({"interval", "equexit"}),
            ),
            needs_command=True,
        ),
        readable=("watch -n 5 ls", "watch 'git status'"),
        unreadable=("watch 'ls $(id)'",),
        blocked=("watch 'sudo id'",),
    ),
    # --- wrappers only the wide reading looks through
    Program(
        ("setsid", "valgrind", "catchsegv", "nocache", "unbuffer"),
        wrapper=WrapperSpec(),
        strict_wrapper=Wrapper(needs_command=True),  # looked through, with no option
        readable=("setsid ls", "valgrind ./a.out"),
        unreadable=("setsid bash -c 'echo $x'",),
        blocked=("setsid sudo id", "valgrind git push"),
    ),
    Program(
        ("busybox", "toybox"),
        wrapper=WrapperSpec(),
        opaque="it runs the applet named by its first argument",
        unreadable=("busybox ls",),
        blocked=("busybox sudo id", "busybox sh -c 'git push'"),
    ),
    Program(
        ("chroot",),
        wrapper=WrapperSpec(
            "", frozenset({"userspec", "groups"}), leading_operands=1, shell_when_empty=True
        ),
        opaque=OPAQUE_ROOT,
        unreadable=("chroot / ls",),
        blocked=("chroot / sudo id",),
    ),
    Program(
        ("unshare",),
        wrapper=WrapperSpec(
            "RwSG",
            frozenset(
                {"propagation", "setgroups", "map-user", "map-group", "map-users", "map-groups"}
                | {"root", "wd", "setuid", "setgid", "monotonic", "boottime"}
            ),
            shell_when_empty=True,
        ),
        opaque=OPAQUE_ROOT,
        unreadable=("unshare -r ls",),
        blocked=("unshare -r sudo id",),
    ),
    Program(
        ("nsenter",),
        wrapper=WrapperSpec(
            "tSG", frozenset({"target", "setuid", "setgid"}), shell_when_empty=True
        ),
        opaque=OPAQUE_ROOT,
        unreadable=("nsenter -t 1 ls",),
        blocked=("nsenter -t 1 git push",),
    ),
    Program(
        ("strace",),
        wrapper=WrapperSpec(
            "abeEIoOpPsSuUX",
            frozenset(
                {"output", "attach", "trace-path", "string-limit", "summary-sort-by", "user"}
                | {"env", "columns", "detach-on", "interruptible", "const-print-style", "trace"}
                | {"signal", "status", "inject", "fault", "quiet", "decode-fds", "silence"}
            ),
        ),
        code_options=CodeOptions("", (), prefixes=("!", "-o!", "--output=!"), contains=("|",)),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("strace ls",),
        unreadable=("strace -o '!sh' ls", "strace -f ls"),
        blocked=("strace -f git push",),
    ),
    Program(
        ("ltrace",),
        wrapper=WrapperSpec("aAeFlnopsuwxD", frozenset({"output", "library", "align", "indent"})),
        code_options=CodeOptions("", (), prefixes=("!", "-o!"), contains=("|",)),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("ltrace ls",),
        unreadable=("ltrace -o '|sh' ls",),
        blocked=("ltrace sudo id",),
    ),
    Program(
        ("numactl",),
        wrapper=WrapperSpec(
            "imNCpPwb",
            frozenset(
                {"interleave", "membind", "cpunodebind", "physcpubind", "preferred"}
                | {"preferred-many", "weighted-interleave", "balancing"}
            ),
        ),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("numactl make",),
        unreadable=("numactl -N 0 bash -c 'echo $x'",),
        blocked=("numactl -N 0 sudo id",),
    ),
    Program(
        ("caffeinate",),  # macOS, where Claude Code's Bash may run
        wrapper=WrapperSpec("tw"),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("caffeinate make",),
        unreadable=("caffeinate sh -c 'echo $x'",),
        blocked=("caffeinate -w 1 sudo id",),
    ),
    Program(
        ("faketime",),
        wrapper=WrapperSpec("m", frozenset(), leading_operands=1),  # TIMESTAMP
        opaque="it runs the command it is given in a faked time (a library it preloads)",
        unreadable=("faketime x date",),
        blocked=("faketime x sudo id",),
    ),
    Program(
        ("fakeroot",),
        wrapper=WrapperSpec("lsib", frozenset({"lib", "faked", "unknown-is-real"})),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("fakeroot make",),
        unreadable=("fakeroot sh -c 'echo $x'",),
        blocked=("fakeroot sudo id",),
    ),
    Program(
        ("sshpass",),
        wrapper=WrapperSpec("pfdPe"),
        opaque="it passes a password to the command it runs",
        unreadable=("sshpass -f pw ssh host",),
        blocked=("sshpass -p x git push",),
    ),
    Program(
        ("proxychains", "proxychains4"),
        wrapper=WrapperSpec("f"),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("proxychains curl x",),
        unreadable=("proxychains4 sh -c 'echo $x'",),
        blocked=("proxychains sudo id",),
    ),
    Program(
        ("torsocks",),
        wrapper=WrapperSpec("uapP", frozenset({"user", "pass", "address", "port"})),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("torsocks curl x",),
        unreadable=("torsocks sh -c 'echo $x'",),
        blocked=("torsocks -a 1 sudo id",),
    ),
    Program(
        ("xvfb-run",),
        wrapper=WrapperSpec(
            "efnps", frozenset({"error-file", "auth-file", "server-num", "xauth-protocol"})
        ),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("xvfb-run pytest",),
        unreadable=("xvfb-run sh -c 'echo $x'",),
        blocked=("xvfb-run -a sudo id",),
    ),
    Program(
        ("dbus-run-session",),
        wrapper=WrapperSpec("", frozenset({"config-file", "dbus-daemon"})),
        strict_wrapper=Wrapper(needs_command=True),
        readable=("dbus-run-session pytest",),
        unreadable=("dbus-run-session sh -c 'echo $x'",),
        blocked=("dbus-run-session sudo id",),
    ),
    Program(
        ("setpriv",),
        wrapper=WrapperSpec(
            "",
            frozenset(
                {"reuid", "regid", "ruid", "euid", "rgid", "egid", "groups", "inh-caps"}
                | {"ambient-caps", "bounding-set", "securebits", "pdeathsig", "selinux-label"}
                | {"apparmor-profile", "landlock-access", "landlock-rule"}
            ),
        ),
        opaque=OPAQUE_ROOT,
        unreadable=("setpriv --reuid 0 ls",),
        blocked=("setpriv --reuid 0 sudo id",),
    ),
    Program(
        ("systemd-run",),
        wrapper=WrapperSpec(
            "pEuMHs",
            frozenset(
                {"unit", "property", "description", "slice", "uid", "gid", "nice", "setenv"}
                | {"working-directory", "on-active", "on-boot", "on-startup", "on-calendar"}
                | {"on-unit-active", "on-unit-inactive", "timer-property", "path-property"}
                | {"socket-property", "machine", "host", "service-type"}
            ),
            shell_when_empty=True,
        ),
        opaque=OPAQUE_ROOT,
        unreadable=("systemd-run ls",),
        blocked=("systemd-run --user git push",),
    ),
    Program(
        ("firejail",),
        wrapper=WrapperSpec(),
        opaque=OPAQUE_ROOT,
        unreadable=("firejail ls",),
        blocked=("firejail sudo id",),
    ),
    Program(
        ("sandbox-exec",),
        wrapper=WrapperSpec("fpD"),
        opaque=OPAQUE_ROOT,
        unreadable=("sandbox-exec -f p ls",),
        blocked=("sandbox-exec -f p sudo id",),
    ),
    Program(
        ("cgexec",),
        wrapper=WrapperSpec("g"),
        opaque=OPAQUE_ROOT,
        unreadable=("cgexec -g cpu:x ls",),
        blocked=("cgexec -g cpu:x sudo id",),
    ),
    Program(
        ("runcon",),
        wrapper=WrapperSpec("utrl", frozenset({"user", "role", "type", "range"})),
        opaque=OPAQUE_ROOT,
        unreadable=("runcon -t x ls",),
        blocked=("runcon -t x git push",),
    ),
    Program(
        ("machinectl", "newgrp", "capsh"),
        opaque=OPAQUE_ROOT,
        unreadable=("machinectl shell x", "capsh -- -c id"),
    ),
    Program(
        ("sg",),
        wrapper=WrapperSpec(shell_when_empty=True),
        opaque="it runs the command as another group",
        unreadable=("sg wheel -c ls",),
        blocked=("sg wheel -c 'sudo id'",),
    ),
    Program(
        ("script",),
        wrapper=WrapperSpec(
            "cEIOBTmo",
            frozenset(
                {"command", "echo", "log-in", "log-out", "log-io", "log-timing"}
                | {"logging-format", "output-limit"}
            ),
            shell_when_empty=True,
        ),
        opaque=OPAQUE_SCHEDULER,
        unreadable=("script -c ls",),
        blocked=("script -qc 'sudo id' /dev/null",),
    ),
    Program(
        ("flock",),
        wrapper=WrapperSpec("wE", frozenset({"wait", "timeout", "conflict-exit-code"})),
        opaque="it creates its lock file and runs the command or string it is given",
        unreadable=("flock lock make", "flock lock -c make"),
        blocked=("flock lock -c 'sudo id'", "flock lock git push"),
    ),
    Program(
        ("parallel", "tmux", "screen", "byobu", "at", "batch", "crontab", "gdb", "lldb"),
        opaque=OPAQUE_SCHEDULER,
        unreadable=("parallel echo ::: a", "tmux new 'ls'", "crontab f"),
    ),
    # --- package managers: runners and publishing
    Program(
        ("npm", "pnpm", "yarn", "yarnpkg", "corepack"),
        code_options=NPM_CODE,
        readable=("npm test", "yarn build", "pnpm install"),
        unreadable=("npm --script-shell=x test", "npm test -c 'id'"),
        blocked=("npm publish", "npm pub", "yarn npm publish", "npm exec -- sudo id"),
        sees=(("npm exec -- curl x", "curl x"), ("corepack npm publish", "npm publish")),
    ),
    Program(
        ("npx", "pnpx", "bunx"),
        wrapper=PACKAGE_RUNNER,
        code_options=NPM_CODE,
        readable=("npx jest",),
        unreadable=("npx -c 'id'", "npx --call=id"),
        blocked=("npx -c 'sudo id'", "npx sudo id"),
        sees=(("npx -c 'curl x'", "curl x"),),
    ),
    # --- interpreters: options that carry code
    Program(
        ("python",),
        pattern=r"(python|pypy)[0-9.]*",
        interpreter=Interpreter(
            code="ci",
            flags="bBdEhIOPqsSuvVx",
            valued="WX",
            module="m",
            code_modules=frozenset({"timeit", "pdb", "code", "IPython", "ipython", "trace"}),
        ),
        readable=("python3 script.py", "python3 -m pytest -q", "python3.12 -u x.py"),
        unreadable=(
            "python3 -c 'print(1)'",
            "python3 -m timeit 'x'",
            "python3 //dev/stdin",
            "python3 /dev/./stdin",
            "python3 /proc/self/fd/0",
        ),
    ),
    Program(
        ("perl",),
        # Debian installs perl under its arch-qualified name too (perl5.36-x86_64-linux-gnu)
        pattern=r"perl[0-9.]*(-[a-z0-9_]+-linux-gnu[a-z0-9_]*)?",
        interpreter=Interpreter(
            code="eEMmd", flags="acnpsStTuUwWvVh", valued="I", attached="l0ixCDF"
        ),
        readable=("perl script.pl",),
        unreadable=(
            "perl -e 'print 1'",
            "perl -Mstrict x.pl",
            "perl //dev/fd/0",
            "perl5.36-x86_64-linux-gnu -e 'print 1'",
        ),
    ),
    Program(
        ("ruby",),
        pattern=r"ruby[0-9.]*",
        interpreter=Interpreter(code="er", flags="acdlnpsSvwyh", valued="CIE", attached="0iWTxFK"),
        readable=("ruby x.rb",),
        unreadable=("ruby -e 'p 1'",),
    ),
    Program(
        ("php",),
        pattern=r"php[0-9.]*(-cli)?",
        interpreter=Interpreter(code="rBREadzcSa", flags="hilmnqsvwH", valued="ft"),
        readable=("php x.php",),
        unreadable=("php -r 'echo 1;'",),
    ),
    Program(
        ("lua",),
        pattern=r"lua(jit)?[0-9.]*",
        interpreter=Interpreter(code="elijb", flags="vEW"),
        readable=("lua x.lua",),
        unreadable=("lua -e 'print(1)'",),
    ),
    Program(
        ("node",),
        pattern=r"node(js)?",
        interpreter=Interpreter(
            code="epri",
            flags="vhc",
            long_flags=frozenset(
                {"version", "help", "check", "test", "no-warnings", "enable-source-maps"}
                | {"trace-warnings", "trace-uncaught", "no-deprecation", "throw-deprecation"}
                | {"trace-deprecation", "experimental-vm-modules", "expose-gc"}
                | {"preserve-symlinks", "pending-deprecation", "abort-on-uncaught-exception"}
            ),
            long_valued=frozenset({"max-old-space-size", "stack-trace-limit"})
            | {"unhandled-rejections"},
        ),
        readable=("node x.js", "node --max-old-space-size=4096 x.js"),
        unreadable=("node -e 'x'", "node --require x y.js", "node /dev/stdin"),
    ),
    Program(
        ("deno",),
        inline_code=frozenset({"eval", "repl", "-e", "--eval"}),
        stdin_code="no-operands",
        readable=("deno run x.ts",),
        unreadable=("deno eval 'x'",),
    ),
    Program(
        ("bun",),
        inline_code=frozenset({"-e", "--eval", "-p", "--print", "-r", "--preload"}),
        readable=("bun run x.ts",),
        unreadable=("bun -e 'x'",),
    ),
    Program(
        ("Rscript", "R"),
        inline_code=frozenset({"-e", "--default-packages"}),
        stdin_code="no-operands",
        readable=("Rscript x.R",),
        unreadable=("Rscript -e 'x'",),
    ),
    Program(
        ("julia",),
        inline_code=frozenset({"-e", "-E", "--eval", "--print", "-L", "--load", "-i"}),
        stdin_code="no-operands",
        readable=("julia x.jl",),
        unreadable=("julia -e 'x'",),
    ),
    Program(
        ("osascript", "ghc", "ghci", "scala", "groovy", "raku", "perl6", "swift"),
        inline_code=frozenset({"-e"}),
        stdin_code="no-operands",
        readable=("ghc Main.hs",),
        unreadable=("osascript -e 'x'", "raku -e 'x'"),
    ),
    Program(
        ("clojure", "clj", "elixir", "bb", "qjs"),
        inline_code=frozenset({"-e", "--eval"}),
        stdin_code="no-operands",
        readable=("clojure x.clj",),
        unreadable=("clojure -e 'x'", "bb --eval x"),
    ),
    Program(
        ("racket",),
        inline_code=frozenset({"-e", "--eval", "-r"}),
        stdin_code="no-operands",
        readable=("racket x.rkt",),
        unreadable=("racket -e 'x'",),
    ),
    Program(
        ("expect", "guile"),
        inline_code=frozenset({"-c"}),
        stdin_code="no-operands",
        readable=("expect x.exp",),
        unreadable=("expect -c 'x'",),
    ),
    Program(
        ("sbcl",),
        inline_code=frozenset({"--eval"}),
        stdin_code="no-operands",
        readable=("sbcl --script x.lisp",),
        unreadable=("sbcl --eval x",),
    ),
    Program(
        ("iex",),
        inline_code=frozenset({"-e"}),
        stdin_code="no-operands",
        readable=("iex x.exs",),
        unreadable=("iex -e x",),
    ),
    Program(
        ("erl",),
        inline_code=frozenset({"-eval", "-s"}),
        stdin_code="no-operands",
        readable=("erl -noshell",),
        unreadable=("erl -eval x",),
    ),
    Program(
        ("dc",),
        inline_code=frozenset({"-e", "--expression"}),
        stdin_code="always",
        readable=("dc x.dc",),
        unreadable=("dc -e '1p'",),
    ),
    Program(
        ("mysql", "mariadb"),
        inline_code=frozenset({"-e", "--execute"}),
        stdin_code="always",
        readable=("mysql db",),
        unreadable=("mysql -e 'select 1'",),
    ),
    Program(
        ("psql",),
        inline_code=frozenset({"-c", "--command"}),
        stdin_code="always",
        readable=("psql db",),
        unreadable=("psql -c 'select 1'",),
    ),
    Program(
        ("sqlite3",),
        inline_code=frozenset({"-cmd", "-init"}),
        stdin_code="always",
        readable=("sqlite3 db.sqlite",),
        unreadable=("sqlite3 db 'select 1'", "sqlite3 -cmd x db"),
    ),
    Program(
        ("emacs",),
        inline_code=frozenset(
            {"--eval", "-l", "--load", "-f", "--funcall", "--script", "-x", "-batch"}
        ),
        readable=("emacs x.txt",),
        unreadable=("emacs --eval x",),
    ),
    Program(
        ("emacsclient",),
        inline_code=frozenset({"-e", "--eval"}),
        readable=("emacsclient x.txt",),
        unreadable=("emacsclient -e x",),
    ),
    Program(
        ("nc", "netcat"),
        inline_code=frozenset({"-e", "-c"}),
        readable=("nc -z host 80",),
        unreadable=("nc -e /bin/sh host 1",),
    ),
    Program(
        ("ncat",),
        inline_code=frozenset({"-e", "-c", "--exec", "--sh-exec", "--lua-exec"}),
        readable=("ncat host 80",),
        unreadable=("ncat --sh-exec x host 1",),
    ),
    Program(
        ("pwsh", "powershell"),
        inline_code=frozenset(
            {"-c", "-command", "-Command", "-e", "-ec", "-EncodedCommand", "-File"}
        ),
        readable=("pwsh x.ps1",),
        unreadable=("pwsh -c x",),
    ),
    Program(
        ("tclsh", "wish", "irb", "jshell", "jimsh"),
        stdin_code="no-operands",
        readable=("tclsh x.tcl",),
        unreadable=("sh -c 'echo x | tclsh'", "tclsh //dev/stdin"),
    ),
    Program(
        ("ed", "red"),
        stdin_code="always",
        readable=("ed -s f",),
        unreadable=("sh -c 'echo q | ed f'",),
    ),
    # --- ordinary programs with options that run another program
    Program(
        ("tar", "gtar", "bsdtar"),
        code_options=TAR_CODE,
        readable=("tar -czf x.tgz src", "tar tf a.tar", "tar -tzvf a.tgz"),
        unreadable=("tar -I 'sh -c id' -cf x src", "tar --to-command=id -xf a", "tar xIf x a")
        # extracting writes what the archive names (`.git/config`, a hook), and a transform
        # renames members into .git (`--transform=s,^,.gi,`) however it is spelled
        + ("tar xf a.tar", "tar -xzf a.tgz", "tar --extract -f a", "tar --get -f a")
        + (
            "tar -cf a.tar t --transform=s,^t,.git,",
            "tar -cf a t --xform=x",
            "tar -cf a --tra=x t",
        ),
    ),  # fmt: skip
    Program(
        ("rsync",),
        code_options=CodeOptions("eM", ("rsh", "rsync-path", "remote-option", "daemon", "config")),
        readable=("rsync -a src/ dst/",),
        unreadable=("rsync -e 'sh -c id' a b", "rsync --rsh=x a b"),
    ),
    Program(
        ("ssh",),
        code_options=CodeOptions("oF"),
        readable=("ssh host uptime",),
        unreadable=("ssh -o ProxyCommand=id host",),
    ),
    Program(
        ("scp", "sftp"),
        code_options=CodeOptions("SoFD"),
        readable=("scp a host:b",),
        unreadable=("scp -S x a host:b",),
    ),
    Program(
        ("zip",),
        code_options=CodeOptions("", ("unzip-command",), prefixes=("-TT",)),
        readable=("zip -r x.zip src",),
        unreadable=("zip -TT 'sh -c id' -T x.zip f",),
    ),
    Program(
        ("sort",),
        code_options=CodeOptions("", ("compress-program",)),
        # `-o FILE` writes (or empties) the file it names; a cluster holding `o` counts even
        # where `o` is another option's value (`-to`): fail closed
        writes=Writes("o", ("output",)),
        readable=("sort -u f",),
        unreadable=(
            "sort --compress-program=x f",
            "sort --co=./x -S 1M f",
            "sort -o f g",
            "sort -uof g",
            "sort --out=f g",
            "sort g --output f",
        ),
    ),
    # --- programs for reading or printing, with forms that write a file they name
    Program(
        ("uniq",),
        writes=Writes(
            operand=2,  # `uniq [INPUT [OUTPUT]]`
            valued=frozenset({"-f", "-s", "-w", "--skip-fields", "--skip-chars", "--check-chars"}),
        ),
        readable=("uniq -c f", "uniq -f 1 -s 2 f", "uniq --skip-fields 1 f", "uniq -"),
        unreadable=("uniq f out", "uniq -c f out", "uniq -- f out", "uniq - out", "uniq -f1 f o"),
    ),
    Program(
        ("xxd",),
        writes=Writes(
            operand=2,  # `xxd [options] [infile [outfile]]`, with -r too (it patches outfile)
            valued=frozenset({"-c", "-g", "-l", "-n", "-o", "-s", "-R"})
            | {"-cols", "-groupsize", "-len", "-name", "-seek"},
        ),
        readable=("xxd f", "xxd -l 16 -c 8 f", "xxd -s -16 f", "xxd -r f.hex"),
        unreadable=("xxd f out", "xxd -r f.hex out", "xxd -ps -c 8 f out", "xxd f -c"),
    ),
    Program(
        ("shuf",),
        writes=Writes("o", ("output",)),
        readable=("shuf -n 3 f", "shuf -e a b"),
        unreadable=("shuf -o f g", "shuf -no f g", "shuf --out=f g", "shuf g --output f"),
    ),
    Program(
        ("iconv",),
        writes=Writes("o", ("output",), stops="ft"),  # -f FROM, -t TO take a value
        readable=("iconv -f utf-8 -t latin1 f", "iconv -tiso-8859-1 f"),
        unreadable=("iconv -o f g", "iconv -co f g", "iconv --out=f g", "iconv -t x --output f g"),
    ),
    Program(
        ("tree",),
        writes=Writes("oR", ("output",)),  # -R writes 00Tree.html in each directory
        readable=("tree -L 2 src", "tree -a -I node_modules"),
        unreadable=("tree -o f", "tree -aof", "tree -R -H . -L 1", "tree --output=f"),
    ),
    Program(
        ("yq", "xq", "tomlq"),
        # python-yq's `-i`/`--in-place` (argparse takes abbreviations), Go yq's `-i`/
        # `--inplace` and `-s`/`--split-exp` (one file per document, named by an expression)
        writes=Writes("is", ("in-place", "inplace", "split-exp")),
        readable=("yq .a f.yaml", "yq -y .a f.yaml", "xq -r .a f.xml", "yq -- -i f"),
        unreadable=(
            "yq -i .a=1 f.yaml",
            "yq -yi .a=1 f.yaml",
            "yq --in-place .a f",
            "yq --in-pl .a f",
            "yq --inplace .a f",
            "yq -s .a f",
            "yq --split-exp .a f",
            "tomlq -i .a f.toml",
        ),
    ),
    Program(
        ("base64",),
        writes=Writes("o", ("output",), stops="w"),  # macOS: `base64 -o FILE`
        readable=("base64 f", "base64 -d f", "base64 -w0 f"),
        unreadable=("base64 -o f g", "base64 --output=f g", "base64 -do f g"),
    ),
    # --- programs for reading that run a pager they are given
    Program(
        ("bat", "batcat"),
        code_options=CodeOptions("", ("pager",)),  # run with `--paging=always`, even unseen
        readable=("bat f", "batcat -n f", "bat --paging=never f"),
        unreadable=("bat --paging=always --pager=./x f", "batcat --pager ./x f"),
    ),
    Program(
        ("ag",),
        code_options=CodeOptions("", ("pager",)),  # `--pager CMD`: a shell command (popen)
        readable=("ag TODO src", "ag --passthrough x f"),
        unreadable=("ag --pager 'sh -c id' x", "ag --pag=./x x"),
    ),
    Program(
        ("unzip", "cpio", "7z", "7za", "7zr", "patch"),
        # (tar's row reads tar: it only lists or creates without a transform)
        opaque="the archive or patch, which the agent may have written, names the files it "
        "writes (`.git/config`, a hook)",
        unreadable=("unzip a.zip", "unzip -l a.zip", "cpio -id", "7z x a.7z", "patch -p1 -i x"),
    ),
    Program(
        ("diff3", "sdiff"),
        code_options=CodeOptions("", ("diff-program",)),  # runs PROGRAM to compare the files
        readable=("diff3 a b c", "sdiff -s a b"),
        unreadable=("diff3 --diff-program=./x a b c", "sdiff --diff-prog ./x a b"),
    ),
    Program(
        ("split",),
        code_options=CodeOptions("", ("filter",)),  # `--filter=CMD`: each piece goes to CMD
        readable=("split -l 100 f part-",),
        unreadable=("split --filter='sh -c id' f", "split --f=id f"),
    ),
    Program(
        ("rg",),
        # `--pre CMD` runs CMD on every file searched; `--hostname-bin` runs a program
        code_options=CodeOptions("", ("pre", "hostname-bin")),
        readable=("rg -n TODO src", "rg --pre-glob '*.pdf' x"),
        unreadable=("rg --pre ./x TODO", "rg --pre=id x", "rg --hostname-bin=./x x"),
    ),
    Program(
        ("fd", "fdfind"),
        code_options=CodeOptions("xX", ("exec", "exec-batch")),
        readable=("fd -e py src", "fd -H -t f x"),
        unreadable=("fd -x id", "fd -X id", "fdfind --exec id", "fd --exec-batch=id"),
    ),
    Program(
        ("pandoc",),
        code_options=CodeOptions("FL", ("filter", "lua-filter")),
        readable=("pandoc -o out.html a.md",),
        unreadable=("pandoc --filter ./x a.md", "pandoc -L x.lua a.md"),
    ),
    Program(
        # python's own tools under their script names: `pdb3 -c CMD` is `python3 -m pdb -c
        # CMD` (code), and `pydoc3 NAME` imports NAME from the working directory
        tuple(
            f"{tool}{version}"
            for tool in ("pdb", "pydoc")
            for version in ("", "3", *(f"3.{minor}" for minor in range(6, 16)))
        ),
        opaque="it is python's pdb or pydoc: it runs the code it is given or imports the "
        "named module from the working directory",
        unreadable=("pdb3 -c '!import os' x.py", "pydoc3 x", "pdb3.11 x.py"),
    ),
    Program(
        ("rename", "file-rename", "prename", "perl-rename"),
        opaque="its expression is Perl code (`s/x/`id`/e`)",
        unreadable=("rename 's/a/b/' f", "rename 's/x/`id`/e' f"),
    ),
    Program(
        ("man",),
        code_options=CodeOptions("PHX", ("pager", "html", "browser", "gxditview")),
        readable=("man ls",),
        unreadable=("man -P 'sh -c id' ls",),
    ),
    Program(
        ("less", "more", "most"),
        code_options=CodeOptions("k", ("lesskey-file", "lesskey-src"), prefixes=("+",)),
        readable=("less f",),
        unreadable=("less '+!id' f",),
    ),
    Program(
        ("vim", "vi", "nvim", "view", "vimdiff", "gvim", "rvim", "ex", "vim.basic", "vim.tiny")
        + ("rview", "evim"),
        code_options=VIM_CODE,
        # vim runs startup files with no option to show it: HOME's (an empty directory of
        # each run now, not the workspace) and, with 'exrc', the working directory's
        opaque="it runs startup files (.vimrc, .exrc, plugins) that no option shows",
        unreadable=("vim f", "vim -c '!id' f", "vim '+!id' f", "sh -c 'echo x | ex f'"),
    ),
    Program(
        ("socat",),
        code_options=CodeOptions("", (), contains=("exec:", "system:")),
        readable=("socat - TCP:host:80",),
        unreadable=("socat - EXEC:id",),
    ),
    Program(
        ("wget",),
        code_options=CodeOptions("", ("use-askpass",)),
        readable=("wget https://example.invalid/x",),
        unreadable=("wget --use-askpass=x https://example.invalid",),
    ),
    Program(
        ("hg", "cargo"),
        code_options=CodeOptions("", ("config",)),
        readable=("cargo test",),
        unreadable=("cargo --config 'x' test",),
    ),
    Program(
        ("go",),
        code_options=CodeOptions("", (), prefixes=("-toolexec", "--toolexec", "-exec", "--exec")),
        readable=("go test ./...",),
        unreadable=("go test -exec x ./...",),
    ),
    # --- programs read by a reader of their own (reading.PROGRAM_READERS)
    Program(
        ("awk", "gawk", "mawk", "nawk", "original-awk"),
        readable=("awk '{print $1}' f", "awk -F: 'NR > 1 {print $2}' f", "awk 'a || b' f"),
        unreadable=(
            "awk 'BEGIN{system(\"id\")}'",
            "awk '{print > \"out\"}' f",
            'awk \'BEGIN{print "x" > \\\n"f"}\'',
            'awk \'BEGIN{print "x" \\\n> "f"}\'',
            'awk \'BEGIN{print "a;" > "f"}\'',
            'awk \'BEGIN{print "a",\n"b" > "f"}\'',
            "awk '{print | \"sh\"}' f",
            "awk -f prog.awk f",
            "gawk '@load \"x\"'",
        ),
    ),
    Program(
        ("sed", "gsed"),
        readable=("sed -n '1,5p' f", "sed -i 's/a/b/g' f"),
        unreadable=("sed 's/a/b/e' f", "sed '1w out' f", "sed -e 'e id' f", "sed -f s.sed f"),
    ),
    Program(
        ("find", "gfind"),
        readable=("find . -name '*.py'", "find . -exec wc -l {} ;"),
        unreadable=("find . -delete", "find . -exec sh -c 'echo $1' x {} ;", "find . -fprint f"),
        blocked=("find . -exec sudo id ;",),
        sees=(("find . -exec curl x ;", "curl x"),),
    ),
    Program(
        ("make", "gmake"),
        readable=("make test", "make -j4 -C sub all"),
        unreadable=(
            "make CC='rm -rf x'",
            "make --eval 'x:'",
            "make -f - all",
            "make -f //dev/stdin all",
            "make --file=/dev/fd/0",
        ),
    ),
    Program(
        ("set", "test", "[", "printf", "jobs", "wait"),
        readable=("set -euo pipefail", "test -f x", "printf '%s' x", "jobs -l"),
        unreadable=("set -- a b", "test -v 'a[$(id)]'", "printf -v x y", "jobs -x id", "wait -p x"),
        blocked=("test -v 'a[$(sudo id)]'",),
    ),
    # --- builtins that evaluate strings, define aliases or change how words are read
    Program(
        ("eval", "source", ".", "trap", "let", "declare", "typeset", "local", "readonly")
        + ("export", "read", "mapfile", "readarray", "unset", "hash", "alias", "unalias")
        + ("enable", "shopt", "getopts", "fc", "history", "compgen", "complete", "compopt")
        + ("bind", "coproc", "caller", "select", "function", "autoload", "zmodload", "emulate")
        + ("setopt",),
        evaluates=True,
        unreadable=("eval ls", "source x.sh", "trap 'id' EXIT", "export X=1"),
        blocked=("eval ls", "source /dev/stdin", ". //dev/fd/0", "trap 'sudo id' EXIT"),
        sees=(("trap 'curl x' EXIT", "curl x"), ("alias x='curl y'", "curl y")),
    ),
)


# --- git ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GitFacts:
    """What the readers know about git. Config keys are compared lower-cased (git's
    section and key names are case-insensitive)."""

    global_flags: frozenset[str]
    global_valued: frozenset[str]  # harmless global options with a value (`-C DIR`)
    global_loose_valued: frozenset[str]  # every global option with a value (wide reading)
    commands: frozenset[str]  # git's own subcommands (anything else could be an alias)
    # subcommands an allow rule never reads: they run programs chosen by configuration or
    # strings given to them, or write files named by the agent
    opaque_commands: dict[str, str]
    # (short letters, long options) per subcommand that run a command given to them; the
    # wide reading takes their values as shell strings
    running_options: dict[str, tuple[str, tuple[str, ...]]]
    nested_options: dict[str, tuple[str, tuple[str, ...]]]
    # options of any subcommand that write a file named by their value (`log --output=F`)
    writing_options: tuple[str, ...]
    writing_short: dict[str, str]  # per subcommand: short letters that write (`archive -o`)
    configured_running_options: tuple[str, ...]
    git_dir_options: dict[str, tuple[str, ...]]
    safe_config_key: re.Pattern[str]  # keys an allow rule may set: they run nothing
    command_key: re.Pattern[str]  # keys whose value git runs as a command
    readable: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    sees: tuple[tuple[str, str], ...] = ()
    names: tuple[str, ...] = ("git",)


GIT_SUBCOMMANDS = frozenset(  # `git help -a` (git 2.39)
    "add am archive bisect branch bundle checkout cherry-pick clean clone commit describe diff "  # noqa: SIM905
    "fetch format-patch gc grep init log maintenance merge mv notes pull push range-diff rebase "
    "reset restore revert rm shortlog show sparse-checkout stash status submodule switch tag "
    "worktree config fast-export fast-import filter-branch mergetool pack-refs prune reflog "
    "remote repack replace annotate blame bugreport count-objects diagnose difftool fsck help "
    "instaweb merge-tree rerere show-branch verify-commit verify-tag version whatchanged apply "
    "checkout-index commit-graph commit-tree hash-object index-pack merge-file merge-index "
    "mktag mktree multi-pack-index pack-objects prune-packed read-tree symbolic-ref "
    "unpack-objects update-index update-ref write-tree cat-file cherry diff-files diff-index "
    "diff-tree for-each-ref for-each-repo get-tar-commit-id ls-files ls-remote ls-tree "
    "merge-base name-rev pack-redundant rev-list rev-parse show-index show-ref unpack-file var "
    "verify-pack daemon fetch-pack send-pack update-server-info check-attr check-ignore "
    "check-mailmap check-ref-format column credential fmt-merge-msg hook interpret-trailers "
    "mailinfo mailsplit patch-id stripspace send-email request-pull imap-send".split()
)
RUNS_CONFIGURED = "it runs programs named by git configuration or strings given to it"

GIT = GitFacts(
    global_flags=frozenset(
        # not --bare: it makes the working directory the git directory, whose `config` and
        # `HEAD` an allowed write may have made (see names_git_directory_file)
        {"-p", "-P", "--paginate", "--no-pager", "--no-replace-objects", "-v", "-h"}
        | {"--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs"}
        | {"--icase-pathspecs", "--no-optional-locks", "--no-advice", "--version", "--help"}
    ),
    # not --git-dir: it names a git directory by any name, whose `config` (core.fsmonitor)
    # is then an ordinary path; `git apply`, a checkout or a merge writes the `HEAD`,
    # `config`, `objects/` and `refs/` that make one (as `patch` and `unzip` would)
    global_valued=frozenset({"-C", "--work-tree", "--namespace"}),
    global_loose_valued=frozenset(
        {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix"}
    ),
    commands=GIT_SUBCOMMANDS,
    opaque_commands={
        **dict.fromkeys(
            ("filter-branch", "send-email", "instaweb", "difftool", "mergetool", "hook")
            + ("credential", "imap-send", "interpret-trailers", "daemon", "for-each-repo"),
            RUNS_CONFIGURED,
        ),
        "format-patch": "it writes patch files (use --stdout to read it)",
        "bundle": "it writes a bundle file",
    },
    running_options={
        "rebase": ("x", ("exec",)),
        "grep": ("O", ("open-files-in-pager",)),
        "clone": ("uc", ("upload-pack", "template", "config")),
        "init": ("", ("template",)),
        "fetch": ("", ("upload-pack",)),
        "pull": ("", ("upload-pack",)),
        "ls-remote": ("", ("upload-pack",)),
        "archive": ("", ("exec", "remote")),
        "push": ("", ("receive-pack", "exec")),
        "send-pack": ("", ("receive-pack", "exec")),
        "fetch-pack": ("", ("upload-pack", "exec")),
    },
    nested_options={
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
    },
    writing_options=("output", "output-directory"),
    # options of any subcommand that make git run commands set in its configuration
    configured_running_options=("trailer",),
    # options that make a git directory not named `.git` (its `config` is an ordinary path)
    git_dir_options={
        "init": ("bare", "separate-git-dir"),
        "clone": ("bare", "mirror", "separate-git-dir"),
    },
    writing_short={"archive": "o", "format-patch": "o", "diagnose": "o", "bugreport": "o"},
    # Keys that change only names, text, colours and how output looks or merges: none
    # runs or loads anything, none names a file git reads later.
    safe_config_key=re.compile(
        r"(user|author|committer)\.(name|email)"
        r"|core\.(autocrlf|safecrlf|eol|filemode|ignorecase|quotepath|whitespace|abbrev)"
        r"|color\.[a-z0-9.-]+|advice\.[a-z0-9]+|column\.ui|init\.defaultbranch"
        r"|pull\.(rebase|ff)|fetch\.prune|merge\.(ff|conflictstyle)"
        r"|rebase\.(autosquash|autostash)|diff\.(renames|algorithm|colormoved|noprefix)"
        r"|log\.(date|decorate|follow|abbrevcommit)|format\.pretty|status\.(short|branch)"
        r"|status\.showuntrackedfiles|tag\.sort|branch\.sort|grep\.linenumber"
        r"|commit\.verbose|push\.(default|autosetupremote)"
    ),
    command_key=re.compile(
        r"core\.(fsmonitor|sshcommand|pager|editor|askpass|gitproxy|alternaterefscommand)"
        r"|credential\.(.*\.)?helper|diff\..*\.(command|textconv)|diff\.external"
        r"|difftool\..*\.cmd|merge\..*\.driver|mergetool\..*\.cmd"
        r"|filter\..*\.(clean|smudge|process)|pager\..*|sequence\.editor"
        r"|gpg\.(.*\.)?program|gpg\.ssh\.defaultkeycommand|uploadpack\.packobjectshook"
        r"|remote\..*\.(uploadpack|receivepack)|sendemail\..*cmd|sendemail\.smtpserver"
        r"|web\.browser|browser\..*\.cmd|man\..*\.cmd|interactive\.difffilter"
        r"|trailer\..*\.(command|cmd)|submodule\..*\.update|imap\.tunnel|tar\..*\.command"
        r"|hook\..*\.command|lfs\.customtransfer\..*\.path|instaweb\.httpd",
        re.IGNORECASE,
    ),
    readable=(
        "git status",
        "git log --oneline -5",
        "git -C sub status",
        "git commit -m 'fix: x'",
        "git config user.name 'A B'",
        "git config --global user.email a@b.c",
        "git config --get core.pager",
        "git config --list",
        "git config color.ui auto",
        "git config --unset user.name",
        "git config -- user.name x",
        "git format-patch --stdout HEAD~1",
        "git archive HEAD",
        "git bisect run make test",
    ),
    unreadable=(
        "git -c core.pager=less log",
        "git --exec-path=. status",
        "git pushy",
        "git config core.pager less",
        "git config -- core.pager 'sh -c id'",
        "git config --rename-section x core",
        "git config --rename-section x alias",
        "git config --remove-section user",
        "git config --file .git/config user.name x",
        "git config trailer.x.command id",
        "git config core.hooksPath hooks",
        "git config alias.st status",
        "git config -e",
        "git config set core.editor vi",
        "git log --output=.git/config",
        "git --bare status",
        "git --git-dir=x status",
        "git --git-dir x --work-tree=. status",
        "git init --bare .",
        "git init --ba x",
        "git clone --mirror u x",
        "git init --separate-git-dir=x",
        "git show HEAD:x --output=.git/commondir",
        "git log --format=%H -1 .git/HEAD",
        "git log --outp=.git/config",
        "git diff --output x",
        "git show --output-directory=x",
        "git format-patch -o out HEAD~1",
        "git format-patch HEAD~1",
        "git archive -o x.tar HEAD",
        "git archive --output=x.tar HEAD",
        "git commit --trailer 'x: y' -m m",
        "git interpret-trailers --trailer x",
        "git hook run pre-commit",
        "git difftool",
        "git rebase -x id HEAD~1",
        "git grep -O id x",
        "git submodule foreach id",
        "git log .git/hooks/pre-commit",
        "git log -1 --format=x --output=.git/./config",
        "git diff -o.git/hooks/pre-commit",
        "git show HEAD:x --output=sub/../.git//hooks/post-checkout",
        "git bisect run bash -c 'echo $x'",
    ),
    blocked=(
        "git push",
        "GIT push",
        "bash -c 'git status; /usr/lib/git-core/git-push origin'",
        "Git -c core.pager='sudo id' log",
        "git -c alias.x='!sudo id' x",
        "git -c core.pager='rm -rf /' log",
        "git -c core.fsmonitor='sudo id' status",
        "env GIT_CONFIG_PARAMETERS=\"'core.pager'='sudo id'\" git log",
        "env GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0='sudo id' git log",
        "bash -c \"GIT_CONFIG_PARAMETERS=\\\"'core.pager'='sudo id'\\\" git log\"",
        "git config trailer.x.command 'sudo id'",
        "git config --add core.pager 'sudo id'",
        "git config -- core.pager 'sudo id'",
    ),
    sees=(
        ("git -c core.pager='rm -rf x' log", "rm -rf x"),
        ("git -c alias.x='!curl y' x", "curl y"),
        ("git -c alias.x=push x", "git push"),
        ("git -ccore.sshCommand='curl y' fetch", "curl y"),
        (
            "env GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0='curl y' git log",
            "curl y",
        ),  # fmt: skip
        ("env GIT_CONFIG_PARAMETERS=\"'core.pager'='curl y'\" git log", "curl y"),
        ("bash -c 'GIT_CONFIG_VALUE_0=\"curl y\" git log'", "curl y"),
        ("git config -- core.editor 'curl y'", "curl y"),
        ("git config trailer.x.cmd 'curl y'", "curl y"),
        ("git rebase -x 'curl y' HEAD~1", "curl y"),
        ("git bisect run curl y", "curl y"),
    ),
)


# --- variables ----------------------------------------------------------------------------------

# Variables a command may be prefixed with (`CI=1 npm test`). Any other name may change
# which program runs or what it loads (PATH, LD_PRELOAD, GIT_*, NODE_OPTIONS, BASH_ENV ...).
SAFE_VARIABLE = re.compile(
    r"(CI|NODE_ENV|FORCE_COLOR|NO_COLOR|CLICOLOR|CLICOLOR_FORCE|TERM|LANG|LANGUAGE|LC_[A-Z]+"
    r"|TZ|COLUMNS|LINES|DEBUG|VERBOSE|RUST_BACKTRACE|RUST_LOG|PYTHONUNBUFFERED"
    r"|PYTHONDONTWRITEBYTECODE|PYTHONHASHSEED|PYTHONIOENCODING|PYTHONUTF8|NODE_NO_WARNINGS"
    r"|PYTEST_DISABLE_PLUGIN_AUTOLOAD|TF_CPP_MIN_LOG_LEVEL)"
)
# Variables whose value a program runs as a command (`GIT_SSH_COMMAND='sudo id' git fetch`).
# GIT_CONFIG_VALUE_n is read whatever its key (GIT_CONFIG_KEY_n) says: over-approximated.
COMMAND_VARIABLE = re.compile(
    r"(GIT_SSH_COMMAND|GIT_SSH|GIT_PAGER|PAGER|GIT_EDITOR|EDITOR|VISUAL|GIT_SEQUENCE_EDITOR"
    r"|GIT_EXTERNAL_DIFF|GIT_ASKPASS|SSH_ASKPASS|SUDO_ASKPASS|GIT_PROXY_COMMAND"
    r"|GIT_CONFIG_VALUE_\d+|PROMPT_COMMAND|MANPAGER|BROWSER|LESSOPEN|LESSCLOSE)\+?="
)
# Holds `'key'='value'` pairs git reads as `-c key=value` (how `git -c` passes them on).
GIT_CONFIG_PARAMETERS = "GIT_CONFIG_PARAMETERS"

# npm accepts any unique prefix of a command name: `npm pu`, `npm pub` ... run publish.
PUBLISHERS = frozenset({"npm", "yarn", "yarnpkg", "pnpm", "bun", "cnpm"})
PUBLISH_WORDS = frozenset({"publish", "publis", "publi", "publ", "pub", "pu"})
# `npm exec CMD`, `npm x CMD`, `pnpm dlx CMD` ...: package managers that run a command.
PACKAGE_RUNNER_SUBCOMMANDS: dict[str, frozenset[str]] = {
    "npm": frozenset({"exec", "x"}),
    "pnpm": frozenset({"exec", "dlx"}),
    "yarn": frozenset({"exec", "dlx"}),
    "bun": frozenset({"x"}),
}


# Git's own control files: writing one changes what git runs next (a hook, `core.fsmonitor`
# in the config, an alternate object store), whatever program writes it.
GIT_DIR_NAME = re.compile(r"\.git(?=/|$)", re.IGNORECASE)
# Every file in a git directory counts, not only hooks and config: `.git/commondir` names
# the directory git takes its config from, `.git/HEAD` and the refs what it checks out.
GIT_CONTROL = re.compile(r"\.git(/.*)?", re.I)
# A file git looks for when it decides a directory is a git directory (a bare repository
# has `HEAD`, `config`, `objects/`, `refs/` and no `.git` in its path). Compared
# lower-cased: a client's disk may be case-insensitive.
GIT_DIRECTORY_FILES = frozenset({"head", "commondir", "gitdir"})


def names_git_control(word: str) -> bool:
    """True when `word` holds a path into a git directory's control files, after lexical
    normalisation (`.git/./hooks`, `x/../.git//config`, `-o.git/hooks/y`, a bare repository's
    `repo.git/config`), or names a `.git` directory itself (`cp -r x .git`)."""
    if "git" not in word.lower():
        return False
    for match in GIT_DIR_NAME.finditer(word):
        tail = posixpath.normpath(re.sub(r"/+", "/", word[match.start() :]))
        if GIT_CONTROL.fullmatch(tail):
            return True
    return False


def names_git_directory_file(path: str) -> bool:
    """True when a write to `path` could make its directory a git directory (a file named
    `HEAD`, `commondir` or `gitdir`): then `git status` run there reads the `config` beside
    it, which the agent may also have written, and runs its `core.fsmonitor`."""
    name = posixpath.basename(posixpath.normpath(path or ".")).lower()
    return name in GIT_DIRECTORY_FILES


# Programs that write no file named by an operand (they read, print or delete): only these
# may take an operand naming `HEAD`, `commondir` or `gitdir` (`grep HEAD f`), or words
# appended at run time by xargs, under an allow rule. Any other program (`cp x HEAD`,
# `tee HEAD`, `mv`, `install`, `ln -s refs/heads/m HEAD`, `dd of=HEAD`, `sort -o HEAD`,
# `tar -cf HEAD`, `curl -o HEAD`) may create the file that makes a directory a git
# directory, so such a command is unreadable. git is read by its own reader (`git mv`).
# Nor may a program here have an option that writes a file it names (`tree -o`, `yq -i`:
# a `Writes` row), since the words xargs appends may be that option.
WRITES_NO_NAMED_FILE = frozenset(
    {"cat", "head", "tail", "less", "more", "wc", "ls", "stat", "file", "diff", "cmp"}
    | {"grep", "egrep", "fgrep", "rg", "ag", "echo", "printf", "test", "[", "true", "false"}
    | {"basename", "dirname", "realpath", "readlink", "du", "nl", "od", "jq", "bat"}
    | {"md5sum", "sha1sum", "sha256sum", "sha512sum", "b2sum", "cksum", "strings", "hexdump"}
    | {"which", "type", "column", "cut", "tr", "fold", "fmt", "rev", "tac", "comm"}
    | {"rm", "rmdir", "unlink", "mkdir", "touch", "chmod", "pwd", "id", "date", "uname"}
)
WRITES_NO_NAMED_FILE_EXAMPLES = (  # (command, readable under `Bash(PROGRAM *)`)
    ("grep HEAD f", True),
    ("cat sub/HEAD", True),
    ("rm HEAD", True),
    ("git show HEAD", True),
    ("git diff HEAD~1", True),
    ("ls | xargs grep -l TODO", True),
    ("cp x HEAD", False),
    ("cp x sub/HEAD/", False),
    ("cp x head", False),
    ("cp -t d x/HEAD", False),
    ("cp --target-directory=d x/commondir", False),
    ("mv x HEAD", False),
    ("install -D x d/HEAD", False),
    ("ln -s refs/heads/m HEAD", False),
    ("ln x gitdir", False),
    ("dd if=x of=HEAD", False),
    ("tee -a HEAD", False),
    ("sort -oHEAD x", False),
    ("uniq x HEAD", False),
    ("rsync x HEAD", False),
    ("tar -cf HEAD x", False),
    ("curl -o HEAD u", False),
    ("wget -O HEAD u", False),
    ("git mv x HEAD", False),
    ("echo HEAD | xargs cp x", False),
    ("printf -- '-o\\nHEAD' | xargs tree", False),
    ("ls | xargs yq .a", False),
)


def names_git_directory_operand(word: str) -> bool:
    """True when `word`, an argument of a program that may write the files it names, names
    `HEAD`, `commondir` or `gitdir`: as itself, as an option's value (`of=HEAD`,
    `--target-directory=x/HEAD`) or attached to a short option (`-oHEAD`)."""
    if not any(name in word.lower() for name in GIT_DIRECTORY_FILES):
        return False
    candidates = [word, word.partition("=")[2]]
    if word.startswith("-") and not word.startswith("--"):
        candidates += [word[index:] for index in range(2, len(word))]
    return any(names_git_directory_file(candidate) for candidate in candidates if candidate)


# --- operands that name code produced at run time -----------------------------------------------

RUNTIME_INPUT = re.compile(r"(dev|proc)(/.*)?")


def names_runtime_input(word: str) -> bool:
    """True when `word`, read as a path after lexical normalisation (`//dev/stdin`,
    `/dev/./stdin`, `../../dev/fd/0`), lies under /dev or /proc: a program or script read
    from there (the input, a descriptor, another process) is produced at run time.
    A relative path climbing out with `..` is read as if it reached the root."""
    if not word or word == "-":
        return word == "-"
    path = posixpath.normpath(re.sub(r"/+", "/", word))
    while path.startswith(("../", "/")):
        path = path.removeprefix("/").removeprefix("../")
    return word.startswith(("/", "..")) and RUNTIME_INPUT.fullmatch(path) is not None


# --- what the readers derive from the table -----------------------------------------------------


def _names(predicate: object) -> frozenset[str]:
    return frozenset(name for row in PROGRAMS if getattr(row, str(predicate)) for name in row.names)


LOOKED_THROUGH_SHELLS = frozenset(n for r in PROGRAMS if r.shell_kind == "read" for n in r.names)
OTHER_SHELLS = frozenset(n for r in PROGRAMS if r.shell_kind == "other" for n in r.names)
SHELLS = LOOKED_THROUGH_SHELLS | OTHER_SHELLS
PRIVILEGE_PROGRAMS = _names("privilege")
PRIVILEGE_WRAPPERS: dict[str, str] = {
    name: row.privilege_valued
    for row in PROGRAMS
    if row.privilege_valued is not None
    for name in row.names
}
OPAQUE_PROGRAMS: dict[str, str] = {n: r.opaque for r in PROGRAMS if r.opaque for n in r.names}
STRICT_WRAPPERS: dict[str, Wrapper] = {
    n: r.strict_wrapper for r in PROGRAMS if r.strict_wrapper for n in r.names
}
WIDE_WRAPPERS: dict[str, WrapperSpec] = {
    n: r.wrapper for r in PROGRAMS if r.wrapper for n in r.names
}
INTERPRETERS: dict[str, Interpreter] = {
    r.names[0]: r.interpreter for r in PROGRAMS if r.interpreter
}
INTERPRETER_NAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(r.pattern), r.names[0]) for r in PROGRAMS if r.interpreter
)
INLINE_CODE_OPTIONS: dict[str, frozenset[str]] = {}
for _row in PROGRAMS:
    for _name in _row.names if _row.inline_code else ():
        INLINE_CODE_OPTIONS[_name] = INLINE_CODE_OPTIONS.get(_name, frozenset()) | _row.inline_code
READS_CODE_FROM_STDIN = frozenset(n for r in PROGRAMS if r.stdin_code for n in r.names)
INPUT_IS_CODE = frozenset(n for r in PROGRAMS if r.stdin_code == "always" for n in r.names)
CODE_OPTIONS: dict[str, CodeOptions] = {
    n: r.code_options for r in PROGRAMS if r.code_options for n in r.names
}
WRITES: dict[str, Writes] = {n: r.writes for r in PROGRAMS if r.writes for n in r.names}
EVALUATING_BUILTINS = _names("evaluates")


# --- copies of the programs the guard knows by name ---------------------------------------------
# The guard knows programs by name: a copy, link or rename of one under another name (`cp
# /usr/bin/git g && ./g push`, `ln -s /usr/bin/sudo s && ./s id`) would run unblocked, so
# making one is blocked itself. Copiers take the program by its bare name too (after `cd
# /usr/bin`); any other program only by a path (`/lib64/ld-linux-x86-64.so.2 /usr/bin/sudo`).
GUARD_KNOWN_PROGRAMS = (
    SHELLS | PRIVILEGE_PROGRAMS | PUBLISHERS | frozenset(WIDE_WRAPPERS) | {"git", "rm", "find"}
)
COPYING_PROGRAMS = frozenset(
    {"cp", "mv", "ln", "link", "install", "rsync", "dd", "cat", "tac", "scp", "cpio", "pax"}
    | {"base64", "base32", "basenc", "xxd", "uuencode", "gzip", "bzip2", "xz", "zstd", "lz4"}
    | {"tar", "bsdtar", "zip", "7z", "objcopy", "strip", "sed", "awk", "gawk", "mawk", "tee"}
    | {"head", "tail", "split", "csplit", "rename", "od", "hexdump", "openssl", "sort"}
)
# Programs that only look at a program file (name, size, type, hash) and copy nothing.
INSPECTING_PROGRAMS = frozenset(
    {"ls", "stat", "file", "which", "type", "command", "readlink", "realpath", "test", "["}
    | {"md5sum", "sha1sum", "sha256sum", "sha512sum", "b2sum", "cksum", "ldd", "du", "wc"}
    | {"dpkg", "rpm", "apt", "apt-get", "apt-cache", "brew", "whereis", "man", "help", "info"}
    | {"echo", "printf", "basename", "dirname", "grep", "rg", "diff", "cmp"}
)


def guard_known(name: str) -> bool:
    """A program name the guard knows (lower-cased basename), `git-*` included."""
    return name in GUARD_KNOWN_PROGRAMS or name.startswith("git-")


def names_known_program(word: str, *, bare: bool) -> str | None:
    """The guard-known program `word` names by a path (`/usr/bin/git`, `if=/usr/bin/sudo`,
    `--target-directory=/bin/bash`, `-t/bin/sh`), or, with `bare`, by its name alone."""
    candidates = [word, word.partition("=")[2]]
    if word.startswith("-") and not word.startswith("--"):
        candidates.append(word[2:])
    for candidate in candidates:
        if candidate and ("/" in candidate or bare):
            name = posixpath.basename(candidate.rstrip("/")).lower()
            if guard_known(name):
                return name
    return None


COPY_EXAMPLES = (  # (command, blocked by the guard)
    ("cp /usr/bin/git g && ./g push", True),
    ("ln -s /usr/bin/sudo s && ./s id", True),
    ("cp -- /bin/bash b", True),
    ("install -m 755 /usr/bin/env e", True),
    ("mv /tmp/sudo s", True),
    ("ln /usr/bin/git g", True),
    ("rsync -a /usr/bin/git g", True),
    ("dd if=/usr/bin/sudo of=s", True),
    ("cat /usr/bin/sudo > s", True),
    ("base64 /usr/bin/git > g.b64", True),
    ("cp -t . /usr/lib/git-core/git-push", True),
    ("cp --target-directory=. /usr/bin/SUDO", True),
    ("cd /usr/bin && cp sudo /tmp/s", True),
    ("cp /usr/bin/su?o s", True),
    ("cp /usr/bin/g* d/", True),
    ('cp "$(which sudo)" s', True),
    ("ln -s `command -v git` g", True),
    ("/lib64/ld-linux-x86-64.so.2 /usr/bin/sudo id", True),
    ("cp a.txt b.txt", False),
    ("cp -r src/ dst/", False),
    ("ls -l /usr/bin/git", False),
    ("sha256sum /usr/bin/git", False),
    ("env /usr/bin/git status", False),
    ("echo /bin/sh", False),
    ("grep -c x /usr/bin/git", False),
    ("cat env.example", False),
    ('cp "$src" dst', False),
)


# --- validation when the table loads ------------------------------------------------------------


class TableError(ValueError):
    """A row of the program table contradicts itself or another row."""


@dataclass
class _Check:
    errors: list[str] = field(default_factory=list)

    def expect(self, ok: bool, message: str) -> None:
        if not ok:
            self.errors.append(message)


def check_table(rows: tuple[Program, ...] = PROGRAMS, git: GitFacts = GIT) -> list[str]:
    """What is wrong with the table's rows (empty when nothing): every row has examples,
    each example parses and names one of the row's programs, no program has two rows of
    the same kind, and a row's facts do not contradict each other."""
    check = _Check()
    seen: dict[tuple[str, str], Program] = {}
    every: list[Program | GitFacts] = [*rows, git]
    for row in every:
        label = "/".join(row.names)
        check.expect(bool(row.unreadable or row.blocked), f"{label}: no unreadable example")
        never_readable = isinstance(row, Program) and (row.opaque or row.evaluates)
        check.expect(bool(row.readable) or bool(never_readable), f"{label}: no readable example")
        for example in (*row.readable, *row.unreadable, *row.blocked, *(c for c, _ in row.sees)):
            try:
                words = shlex.split(example)
            except ValueError as error:
                check.errors.append(f"{label}: example {example!r} does not parse ({error})")
                continue
            named = any(
                posixpath.basename(w).lower() in row.names or _family(row, w) for w in words
            )  # lower-cased: the guard reads `SUDO` as sudo (a case-insensitive disk)
            check.expect(
                named
                or any(
                    re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", example) for n in row.names
                ),
                f"{label}: example {example!r} names none of the row's programs",
            )
        if isinstance(row, Program):
            _check_row(check, row, label, seen)
    return check.errors


def _family(row: Program | GitFacts, word: str) -> bool:
    return isinstance(row, Program) and bool(row.pattern) and bool(re.fullmatch(row.pattern, word))


def _check_row(
    check: _Check, row: Program, label: str, seen: dict[tuple[str, str], Program]
) -> None:
    kinds = [
        kind
        for kind, present in (
            ("shell", row.shell_kind),
            ("wrapper", row.wrapper or row.strict_wrapper),
            ("interpreter", row.interpreter or row.inline_code or row.stdin_code),
            ("code options", row.code_options),
            ("writer", row.writes),
            ("builtin", row.evaluates),
            ("privilege", row.privilege),
        )
        if present
    ]
    for kind in kinds:
        for name in row.names:
            other = seen.setdefault((name, kind), row)
            check.expect(other is row, f"{name}: two rows say it is a {kind}")
    check.expect(not (row.strict_wrapper and row.opaque), f"{label}: looked through yet never read")
    check.expect(not row.privilege or bool(row.opaque), f"{label}: privilege must be opaque")
    check.expect(not row.interpreter or bool(row.pattern), f"{label}: interpreter without names")
    check.expect(not (row.readable and row.opaque), f"{label}: opaque yet readable")
    check.expect(
        not (row.writes and WRITES_NO_NAMED_FILE & set(row.names)),
        f"{label}: writes a file it names, yet listed in WRITES_NO_NAMED_FILE",
    )


_ERRORS = check_table()
if _ERRORS:  # a broken table must stop the import: the readers would drift silently
    raise TableError("; ".join(_ERRORS))
