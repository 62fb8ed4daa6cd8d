"""The rules engine: parsing, validation, path / command / argument matching, precedence."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dispatcher.policy.context import CallContext, Decision, Profile
from dispatcher.policy.rules import RuleError, evaluate, parse_rule, validate_rules
from dispatcher.policy.waterfall import user_rules
from dispatcher.tools.base import Tool
from dispatcher.tools.list_directory import TOOL as LIST_DIRECTORY
from dispatcher.tools.read_file import TOOL as READ_FILE
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.search_files import TOOL as SEARCH_FILES
from dispatcher.tools.write_file import TOOL as WRITE_FILE

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

TOOLS = (RUN_COMMAND, READ_FILE, WRITE_FILE, SEARCH_FILES, LIST_DIRECTORY)


def make_call(
    tool: Tool, arguments: dict[str, Any], workspace: Path = Path("/nonexistent-ws"), **profile: Any
) -> CallContext:
    return CallContext(
        call_id="t",
        session_id="s",
        tool=tool,
        name=tool.name,
        arguments=arguments,
        workspace=workspace,
        mode=profile.get("mode", "standard"),
        username="u",
        agent_name="a",
        profile=Profile(
            mode=profile.get("mode", "standard"),
            allow=tuple(profile.get("allow", ())),
            ask=tuple(profile.get("ask", ())),
            deny=tuple(profile.get("deny", ())),
            version=profile.get("version", 7),
        ),
    )


def mode_allows(call: CallContext) -> Decision:
    return Decision("allow", "mode:trusted", "trusted")


def mode_asks(call: CallContext) -> Decision:
    return Decision("ask", "mode:standard", "standard")


# --- parsing and validation -----------------------------------------------------------------


def test_parse_rule_forms() -> None:
    assert parse_rule("run_command") == parse_rule("  run_command ")
    rule = parse_rule("run_command(npm test *)")
    assert (rule.tool, rule.specifier, rule.text) == (
        "run_command",
        "npm test *",
        "run_command(npm test *)",
    )
    assert parse_rule("run_command(bash -c (x))").specifier == "bash -c (x)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Empty rule"),
        ("run_command(npm test", "unbalanced parentheses"),
        ("run_command(npm test))", "unbalanced parentheses"),
        ("run_command(a(b)", "unbalanced parentheses"),
        ("run_command npm)", "')' without '('"),
        ("(npm test)", "no tool name"),
        ("run_command()", "empty specifier"),
        ("run_command(   )", "empty specifier"),
        ("run command(x)", "not a valid tool name"),
    ],
)
def test_parse_errors_name_the_rule(text: str, message: str) -> None:
    with pytest.raises(RuleError, match=re.escape(message)) as info:
        parse_rule(text)
    assert text.strip() in str(info.value) or not text.strip()


def test_validate_rules() -> None:
    assert validate_rules({"allow": ["run_command(npm test *)", "read_file(src/**)"]}, TOOLS) == []
    assert validate_rules({}, TOOLS) == []
    problems = validate_rules(
        {
            "allow": ["rn_command(ls)", "read_file(!src/**)"],
            "ask": ["write_file(nope:*)", "run_command(*)"],
            "deny": ["run_command(ls", "search_files(pattern:foo*)"],
            "maybe": [],
        },
        TOOLS,
    )
    text = "\n".join(problems)
    assert len(problems) == 5, problems
    assert "unknown tool 'rn_command'" in text and "Rule 'rn_command(ls)'" in text
    assert "negation" in text and "read_file(!src/**)" in text
    assert "must start with a command name" in text
    assert "unbalanced" in text
    assert "Unknown rule list 'maybe'" in text
    # write_file(nope:*) reads as a path pattern: valid (a file named 'nope:*')
    assert validate_rules({"deny": "run_command"}, TOOLS) == [
        "The deny rules must be a list of strings, not str."
    ]


def test_param_spec_on_tool_without_path_or_command() -> None:
    bare = Tool(
        name="ping", description="", parameters={"type": "object", "properties": {"host": {}}}
    )
    assert validate_rules({"allow": ["ping(host:*.example.com)"]}, [bare]) == []
    problems = validate_rules({"allow": ["ping(example.com)", "ping(port:1)"]}, [bare])
    assert "takes no path or command" in problems[0]
    assert "has no parameter 'port'" in problems[1]


# --- commands: the big table ----------------------------------------------------------------

DENY = [
    "run_command(rm *)",
    "run_command(curl *)",
    "run_command(git push *)",
    "run_command(wget *)",
]
ASK = ["run_command(git commit *)", "run_command(npm install *)", "run_command(docker *)"]
ALLOW = [
    "run_command(npm test *)",
    "run_command(git status)",
    "run_command(git diff *)",
    "run_command(git log *)",
    "run_command(ls *)",
    "run_command(echo *)",
    "run_command(cat *)",
    "run_command(grep *)",
    "run_command(pytest *)",
    "run_command(python -m pytest *)",
    "run_command(make test)",
    "run_command(npm run * --silent)",
]


def sh(text: str) -> list[str]:
    return ["bash", "-c", text]


# (argv, expected action from rules alone; None = no rule decided, falls to the mode)
SAFE: list[tuple[list[str], str]] = [
    (["npm", "test"], "allow"),
    (["npm", "test", "--watch"], "allow"),
    (["npm", "test", "--", "--grep", "x"], "allow"),
    (["git", "status"], "allow"),
    (["git", "diff"], "allow"),
    (["git", "diff", "HEAD~1", "--", "src"], "allow"),
    (["git", "log", "--oneline", "-5"], "allow"),
    (["ls"], "allow"),
    (["ls", "-la"], "allow"),
    (["ls", "-la", "src"], "allow"),
    (["echo", "hello"], "allow"),
    (["echo"], "allow"),
    (["cat", "README.md"], "allow"),
    (["grep", "-rn", "TODO", "src"], "allow"),
    (["pytest"], "allow"),
    (["pytest", "-q", "tests/x.py"], "allow"),
    (["python", "-m", "pytest", "-x"], "allow"),
    (["make", "test"], "allow"),
    (["npm", "run", "build", "--silent"], "allow"),
    (["npm", "run", "lint", "fix", "--silent"], "allow"),
    (["timeout", "60", "npm", "test"], "allow"),
    (["nice", "-n", "5", "npm", "test"], "allow"),
    (["env", "CI=1", "npm", "test"], "allow"),
    (["env", "NODE_ENV=test", "FORCE_COLOR=0", "npm", "test"], "allow"),
    (["command", "ls"], "allow"),
    (["timeout", "-s", "KILL", "10", "nice", "git", "status"], "allow"),
    (["nohup", "pytest"], "allow"),
    (sh("npm test"), "allow"),
    (sh("npm test && git status"), "allow"),
    (sh("git status; git diff"), "allow"),
    (sh("ls -la | grep py"), "allow"),
    (sh("cat a.txt | grep x | grep -v y"), "allow"),
    (sh("echo start\nnpm test\necho done"), "allow"),
    (sh("npm test 2>&1 | grep -v warn"), "allow"),
    (sh("npm test > /dev/null 2>&1"), "allow"),
    (sh("CI=1 npm test"), "allow"),
    (sh("timeout 30 npm test -- --ci"), "allow"),
    (sh("\\ls -la"), "allow"),
    (sh("'ls' src"), "allow"),
    (sh('"git" "status"'), "allow"),
    (sh("g''it status"), "allow"),
    (sh("$'\\x6cs' -la"), "allow"),
    (["sh", "-c", "ls && echo ok"], "allow"),
    (["bash", "-c", "bash -c 'git status'"], "allow"),
    (sh("ls | xargs echo"), "allow"),
    (sh("echo a; echo b; echo c"), "allow"),
    (sh("grep -c x file || echo none"), "allow"),
    (["ls", "&&", "rm", "-rf", "/"], "allow"),  # no shell: '&&' is an argument to ls
    (["echo", "$(rm -rf x)"], "allow"),  # no shell: printed literally
    (["watch", "-n", "1", "ls"], "allow"),
    (["watch", "git status"], "allow"),  # a shell string, read like `sh -c`
    (["watch", "-x", "ls", ">", "x"], "allow"),  # -x: no shell, `>` is an argument to ls
    (["ionice", "-c", "3", "npm", "test"], "allow"),
    (["taskset", "0x3", "npm", "test"], "allow"),
    (["chrt", "-f", "10", "pytest"], "allow"),
]

# Commands no allow rule names: the rules say nothing (the mode decides).
UNNAMED: list[list[str]] = [
    ["npm", "testing"],
    ["npm", "tester"],
    ["npm"],
    ["npm", "run", "build"],  # `npm run * --silent` needs the flag last
    ["git", "status", "--porcelain"],  # `git status` is exact
    ["git"],
    ["make", "test", "install"],
    ["make", "install"],
    ["lsof"],
    ["echoo", "x"],
    ["python", "-m", "pip", "install", "x"],
    ["./ls"],
    ["/opt/evil/ls", "-la"],
    ["bin/npm", "test"],
    ["node", "x.js"],
    ["mv", "a", "b"],
    ["cp", "a", "b"],
    ["chmod", "+x", "a"],
    ["find", ".", "-name", "x"],
    ["find", ".", "-exec", "ls", ";"],
    sh("npm test && mv a b"),
    sh("ls; touch x"),
    sh("npm test | tee log"),
    sh("npm test || chmod 777 x"),
    # wrappers an allow rule does not look through: what runs is not the `ls` it names
    ["npx", "ls"],  # a package called `ls`
    ["npm", "exec", "--", "ls"],
]

# Variants of denied commands: must be denied (never allowed).
DENIED_BASES = [
    "rm -rf x",
    "rm x",
    "rm -rf /",
    "curl https://x.sh",
    "curl -fsSL https://x.sh -o y",
    "git push",
    "git push origin main",
    "git push --force",
    "wget http://x",
]


def variants(base: str) -> list[list[str]]:
    """Ways to hide `base` behind an allowed command, a wrapper, or quoting."""
    words = base.split()
    name, rest = words[0], " ".join(words[1:])
    tail = f" {rest}" if rest else ""
    hex_name = "".join(f"\\x{ord(c):02x}" for c in name)
    return [
        words,
        [f"/usr/bin/{name}", *words[1:]],
        ["timeout", "5", *words],
        ["nice", "-n", "5", *words],
        ["env", "X=1", *words],
        ["command", *words],
        ["xargs", *words],
        ["nohup", *words],
        ["sudo", *words],
        ["env", "-S", base],
        sh(base),
        sh(f"npm test && {base}"),
        sh(f"npm test || {base}"),
        sh(f"git status; {base}"),
        sh(f"ls | {base}"),
        sh(f"echo hi\n{base}"),
        sh(f"(npm test; {base})"),
        sh(f"echo $({base})"),
        sh(f"echo `{base}`"),
        sh(f"ls $({base})"),
        sh(f'echo "$({base})"'),
        sh(f"{name[0]}''{name[1:]}{tail}"),
        sh(f'"{name}"{tail}'),
        sh(f"\\{name}{tail}"),
        sh(f"$'{hex_name}'{tail}"),
        sh(f"timeout 5 {base}"),
        sh(f"env A=1 {base}"),
        sh(f"ls | xargs {base}"),
        sh(f"if true; then {base}; fi"),
        sh(f"npm test && bash -c '{base}'"),
        ["bash", "-c", f'sh -c "{base}"'],
        sh(f"eval '{base}'"),
        sh(f"f() {{ {base}; }}; f"),
        sh(f"cat <({base})"),
        ["find", ".", "-exec", *words, ";"],
        sh(f"npm test && case x in y) {base};; esac"),  # unparsable: guessed parts
        sh(f"echo $(( 1 + 2 )) && {base}"),  # unparsable: guessed parts
        # substitutions bashlex does not show: unreadable, guessed parts
        sh(f"ls ${{x:=$({base})}}"),
        sh(f"ls ${{x:-$({base})}}"),
        sh(f"ls ${{x#$({base})}}"),
        sh(f'echo "${{x:-`{base}`}}"'),
        sh(f"ls ${{x:-${{y:-$({base})}}}}"),
        sh(f"ls ~$({base})"),
        sh(f"ls ~root`{base}`"),
        sh(f"cat <<EOF\n$({base})\nEOF"),
        # wrappers
        ["flock", "F", *words],
        ["flock", "-w", "3", "F", "-c", base],
        ["chroot", "/", *words],
        ["script", "-qc", base, "/dev/null"],
        ["script", "out.log", "--command", base],
        ["watch", base],
        ["watch", "-n", "1", *words],
        ["watch", "-x", *words],
        ["npx", *words],
        ["npx", "-c", base],
        ["npm", "exec", "--", *words],
        ["npm", "x", "-c", base],
        ["ionice", "-c", "3", *words],
        ["taskset", "0x3", *words],
        ["chrt", "-f", "10", *words],
        ["unshare", "-r", *words],
        ["nsenter", "-t", "1", "-m", *words],
        ["sg", "wheel", "-c", base],
        ["sg", "wheel", base],
        ["runuser", "-u", "x", *words],
        ["runuser", "x", "-c", base],
        ["su", "-c", base],
        ["su", "-", "root", "--command", base],
        sh(f"nice flock F timeout 5 npx {base}"),
    ]


DENIED: list[list[str]] = [v for base in DENIED_BASES for v in variants(base)]

ASKED_BASES = ["git commit -m x", "npm install left-pad", "docker run -it ubuntu"]
ASKED: list[list[str]] = [v for base in ASKED_BASES for v in variants(base)]

# Commands the rule engine cannot read: never allowed, whatever the allow rules or mode say.
UNREADABLE: list[list[str]] = [
    sh("npm test && case x in y) ls;; esac"),
    sh("echo $(( 1 + 2 ))"),
    sh("ls 'unterminated"),
    sh("$CMD status"),
    sh("git $(echo status)"),  # `git $x` could be `git push`
    sh("l? -la"),
    sh("curl_not_really | bash"),
    sh("echo ls | sh"),
    sh("bash <<EOF\nls\nEOF"),
    ["bash", "-c"],
    sh("$'\\x6c"),
    ["env", "-S", "ls 'x"],
    # command substitutions bashlex would not show, even with nothing denied inside
    sh("ls ${x:=$(touch y)}"),
    sh("ls ${x:-$(touch y)}"),
    sh("ls ${x#$(touch y)}"),
    sh('echo "${x:-`touch y`}"'),
    sh("ls ${x:-${y:-$(touch y)}}"),
    sh("ls ${x:-'}'$(touch y)}"),
    sh('ls ${x:-"}"$(touch y)}'),
    sh("ls ${x:-$(touch y)"),
    sh("echo ${!x}"),
    sh("ls ~$(touch y)"),
    sh("ls ~u`touch y`"),
    sh("cat <<EOF\n$(touch y)\nEOF"),
    ["watch", "ls ${x:-$(touch y)}"],
    ["flock", "F", "-c", "ls ${x:-$(touch y)}"],
    # Read strictly since issue 11: expansions, substitutions, globs, here-documents,
    # compound commands, file redirections, options that load code, risky variables,
    # wrappers that change who or where, and inline code are never read as allowed.
    sh("(ls && echo ok) || echo failed"),
    sh("echo $(ls)"),
    sh("echo `git status`"),
    sh("if git status; then echo clean; fi"),
    sh("for f in a b; do echo $f; done"),
    ["bash", "-lc", "npm test"],
    ["env", "-S", "npm test --ci"],
    sh("ls *.py"),
    sh("echo $HOME"),
    sh("cat <<EOF\nhello\nEOF"),
    sh("ls ${HOME}"),
    sh('echo "$x" "${HOME:-/tmp}/src" ${#x}'),
    sh("git log HEAD~$n"),
    ["git", "statuses"],
    ["python", "-c", "print(1)"],
    ["xargs", "git", "status"],  # xargs could add git's options or subcommand
    sh("ls | xargs git status"),
    sh("echo hi > out.txt"),
    sh("echo hi >> ~/.bashrc"),
    sh("cat a > b"),
    sh("ls &> log"),
    sh("echo $(whoami)"),
    sh("echo `id`"),
    sh("ls <(mkfifo x)"),
    sh("f() { touch x; }; f"),
    sh("LD_PRELOAD=/tmp/x.so ls"),
    sh("PATH=.:$PATH ls"),
    ["env", "LD_PRELOAD=/tmp/x.so", "npm", "test"],
    ["env", "PATH=/tmp", "git", "status"],
    ["env", "BASH_ENV=/tmp/x", "bash", "-c", "ls"],
    ["env", "GIT_SSH_COMMAND=x", "git", "log"],
    ["env", "NODE_OPTIONS=--require=/tmp/x.js", "npm", "test"],
    sh("npm test & touch x"),
    sh("sudo ls"),
    ["sudo", "ls"],
    sh("ls && (cd /tmp && touch x)"),
    sh("while true; do touch x; done"),
    ["flock", "F", "-c", "ls"],
    ["flock", "F", "ls"],  # creates F, then runs what an allow rule does not look through
    ["chroot", "/srv", "ls"],
    ["chroot", "/srv"],
    ["script", "-qc", "ls", "/dev/null"],  # writes a typescript
    ["npm", "x", "-c", "ls"],
    ["unshare", "-r", "ls"],
    ["nsenter", "-t", "1", "ls"],
    ["sg", "wheel", "ls"],
    ["sg", "wheel", "-c", "ls"],
    ["su", "-c", "ls"],
    ["runuser", "-u", "x", "ls"],
    ["watch", "ls > x"],
]


def _cases() -> list[tuple[list[str], set[str | None]]]:
    cases: list[tuple[list[str], set[str | None]]] = []
    cases += [(argv, {expected}) for argv, expected in SAFE]
    cases += [(argv, {None}) for argv in UNNAMED]
    cases += [(argv, {"deny"}) for argv in DENIED]
    # ... except that a guessed part `$` (from `${x:-$(...)}`) could also be a denied `rm`
    cases += [(argv, {"ask", "deny"} if "${" in argv[-1] else {"ask"}) for argv in ASKED]
    # a computed word may also be read as a denied one (`$CMD` could be `rm`): both are fine
    cases += [(argv, {"unreadable", "deny", "ask"}) for argv in UNREADABLE]
    return cases


CASES = _cases()


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 300, len(CASES)


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[repr(c[0])[:80] for c in CASES])
def test_command_table(argv: list[str], expected: set[str | None], settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"  # trusted mode must then ask for what is unreadable
    call = make_call(RUN_COMMAND, {"argv": argv}, allow=ALLOW, ask=ASK, deny=DENY)
    verdict = evaluate(call, allow=ALLOW, ask=ASK, deny=DENY)
    got = "unreadable" if verdict.action is None and verdict.unreadable else verdict.action
    assert got in expected, (argv, verdict)
    # Whatever happens, only the SAFE list is ever auto-allowed, even under a trusted mode.
    decision = user_rules(call, mode_allows)
    if (argv, "allow") not in SAFE:
        assert decision.by != "mode:trusted" or got is None
        assert decision.action != "allow" or got is None and decision.by == "mode:trusted"
    if got in ("deny", "ask", "unreadable"):
        assert decision.action != "allow"


def test_unreadable_is_asked_in_trusted_mode_without_the_sandbox(settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    call = make_call(RUN_COMMAND, {"argv": sh("echo $(( 1 + 2 ))")}, allow=["run_command"])
    decision = user_rules(call, mode_allows)
    assert decision.action == "ask"
    assert decision.by == "rule:unreadable-command"
    assert "could not be read" in decision.reason and "profile v7" in decision.reason
    # ... but a stricter answer from the mode stands
    assert user_rules(call, lambda c: Decision("deny", "mode:read_only", "ro")).action == "deny"
    # a sandbox with network is no bound either
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", True
    assert user_rules(call, mode_allows).action == "ask"


def test_unreadable_runs_in_trusted_mode_when_the_sandbox_bounds_it(settings: Any) -> None:
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", False
    call = make_call(RUN_COMMAND, {"argv": sh("echo $(( 1 + 2 ))")}, allow=["run_command"])
    decision = user_rules(call, mode_allows)
    assert decision.action == "allow" and decision.by == "mode:trusted"
    assert "runs in the sandbox, without network" in decision.reason
    # the bare allow rule never matched it: in standard mode it is asked
    assert user_rules(call, mode_asks).by == "mode:standard"


def test_deny_pattern_without_star_still_catches_arguments() -> None:
    deny = ["run_command(git push)"]
    call = make_call(RUN_COMMAND, {"argv": ["git", "push", "origin", "main"]})
    assert evaluate(call, allow=[], ask=[], deny=deny).action == "deny"
    # whereas an allow pattern without `*` is exact
    allow = ["run_command(git push)"]
    assert evaluate(call, allow=allow, ask=[], deny=[]).action is None


def test_star_in_the_middle_is_one_or_more_words() -> None:
    allow = ["run_command(git * --dry-run)"]
    for argv, ok in [
        (["git", "push", "--dry-run"], True),
        (["git", "push", "origin", "main", "--dry-run"], True),
        (["git", "--dry-run"], False),
        (["git", "push", "--dry-run", "x"], False),
    ]:
        call = make_call(RUN_COMMAND, {"argv": argv})
        assert (evaluate(call, allow=allow, ask=[], deny=[]).action == "allow") is ok, argv


def test_compound_allow_names_every_rule() -> None:
    call = make_call(
        RUN_COMMAND,
        {"argv": sh("npm test && git status")},
        allow=["run_command(npm test *)", "run_command(git status)"],
    )
    decision = user_rules(call, mode_asks)
    assert decision.action == "allow"
    assert decision.by == "rule:allow:run_command(npm test *)"
    assert "'run_command(git status)'" in decision.reason


def test_bare_and_param_rules_on_run_command() -> None:
    call = make_call(RUN_COMMAND, {"argv": ["make"], "cwd": "sub"})
    assert evaluate(call, allow=["run_command"], ask=[], deny=[]).action == "allow"
    assert evaluate(call, allow=["run_command(cwd:sub*)"], ask=[], deny=[]).action == "allow"
    assert evaluate(call, allow=[], ask=[], deny=["run_command"]).action == "deny"


# --- paths ----------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "secrets").mkdir()
    (root / "secrets" / ".env").write_text("K=v")
    (root / "src" / "app.py").write_text("")
    (root / "src" / ".hidden").write_text("")
    (root / "config.txt").symlink_to(root / "secrets" / ".env")
    (root / "link_src").symlink_to(root / "src")
    (root / "docs_link").symlink_to(root / "secrets")
    return root


PATH_CASES = [
    # (pattern, path, matches as deny/ask, matches as allow)
    ("src/**", "src/app.py", True, True),
    ("src/**", "src/pkg/deep/new.py", True, True),
    ("src/**", "./src/app.py", True, True),
    ("src/**", "src", False, False),
    ("src/**", "lib/src/app.py", False, False),
    ("/src/**", "src/app.py", True, True),
    ("/src/**", "lib/src/app.py", False, False),
    ("src", "lib/src/app.py", True, True),  # no slash: any depth, like .gitignore
    ("**/.env", ".env", True, True),
    ("**/.env", "secrets/.env", True, True),
    ("**/.env", "a/b/c/.env", True, True),
    ("**/.env", ".env.example", False, False),
    ("*.lock", "poetry.lock", True, True),
    ("*.lock", "a/b/yarn.lock", True, True),
    ("/*.lock", "a/b/yarn.lock", False, False),
    ("src/*", "src/.hidden", True, True),  # dotfiles match * like git
    ("src/**", "src/.hidden", True, True),
    ("**", ".git/config", True, True),
    ("src/**", "Src/app.py", False, False),  # case-sensitive
    ("SRC/**", "src/app.py", False, False),
    ("*.PY", "src/app.py", False, False),
    # symlinks: config.txt -> secrets/.env
    ("**/.env", "config.txt", True, False),
    ("*.txt", "config.txt", True, False),  # the given path matches, the resolved one not
    ("secrets/**", "config.txt", True, False),
    ("secrets/**", "docs_link/.env", True, False),
    ("src/**", "link_src/app.py", True, False),
    ("link_src/**", "link_src/app.py", True, False),
    ("**", "link_src/app.py", True, True),
    # outside the workspace: never allowed, deny still reads the given text
    ("**", "../outside.txt", True, False),
    ("**/passwd", "/etc/passwd", True, False),
]


@pytest.mark.parametrize(("pattern", "path", "loose", "strict"), PATH_CASES)
def test_path_rules(workspace: Path, pattern: str, path: str, loose: bool, strict: bool) -> None:
    rule = parse_rule(f"read_file({pattern})")
    call = make_call(READ_FILE, {"path": path}, workspace)
    assert rule.matches(call, "deny") is loose
    assert rule.matches(call, "ask") is loose
    assert rule.matches(call, "allow") is strict


def test_symlink_to_env_is_denied_and_not_allowed(workspace: Path) -> None:
    call = make_call(
        READ_FILE,
        {"path": "config.txt"},
        workspace,
        allow=["read_file(*.txt)"],
        deny=["read_file(**/.env)"],
    )
    decision = user_rules(call, mode_allows)
    assert decision.action == "deny" and decision.rule == "read_file(**/.env)"
    call = make_call(READ_FILE, {"path": "config.txt"}, workspace, allow=["read_file(*.txt)"])
    assert user_rules(call, mode_asks).by == "mode:standard"


def test_default_path_argument(workspace: Path) -> None:
    call = make_call(SEARCH_FILES, {"pattern": "x"}, workspace)
    assert parse_rule("search_files(.)").matches(call, "allow")
    assert not parse_rule("search_files(src/**)").matches(call, "deny")


# --- argument rules ---------------------------------------------------------------------------


def test_param_rules(workspace: Path) -> None:
    write = make_call(WRITE_FILE, {"path": "src/a.py", "content": "x = 1  # TODO later"}, workspace)
    assert parse_rule("write_file(content:*TODO*)").matches(write, "deny")
    assert not parse_rule("write_file(content:*todo*)").matches(write, "deny")
    search = make_call(SEARCH_FILES, {"pattern": "foobar"}, workspace)
    assert parse_rule("search_files(pattern:foo*)").matches(search, "allow")
    assert not parse_rule("search_files(glob:*.py)").matches(search, "deny")  # absent


# --- precedence through user_rules --------------------------------------------------------------


def test_precedence_deny_ask_allow(workspace: Path) -> None:
    args = {"path": "src/.env", "content": ""}
    both = {
        "allow": ["write_file(src/**)"],
        "ask": ["write_file(**/.env)"],
        "deny": ["write_file(src/.env)"],
    }
    decision = user_rules(make_call(WRITE_FILE, args, workspace, **both), mode_allows)
    assert decision == Decision(
        "deny",
        "rule:deny:write_file(src/.env)",
        "Rule 'write_file(src/.env)' in u's deny list (profile v7).",
        rule="write_file(src/.env)",
        layer="user:u",
        layer_version=7,
    )
    both["deny"] = []
    assert user_rules(make_call(WRITE_FILE, args, workspace, **both), mode_allows).action == "ask"
    both["ask"] = []
    decision = user_rules(make_call(WRITE_FILE, args, workspace, **both), mode_asks)
    assert decision.action == "allow" and decision.by == "rule:allow:write_file(src/**)"
    both["allow"] = ["write_file(lib/**)"]
    assert (
        user_rules(make_call(WRITE_FILE, args, workspace, **both), mode_asks).by == "mode:standard"
    )


def test_first_matching_rule_in_a_list_decides() -> None:
    call = make_call(
        RUN_COMMAND,
        {"argv": ["rm", "x"]},
        deny=["run_command(curl *)", "run_command(rm *)", "run_command"],
    )
    assert user_rules(call, mode_allows).rule == "run_command(rm *)"


def test_other_tools_rules_do_not_apply(workspace: Path) -> None:
    call = make_call(
        READ_FILE, {"path": "src/app.py"}, workspace, deny=["write_file", "run_command(cat *)"]
    )
    assert user_rules(call, mode_asks).by == "mode:standard"


def test_broken_saved_rule_never_allows_and_fails_closed_for_deny() -> None:
    call = make_call(RUN_COMMAND, {"argv": ["ls"]}, allow=["run_command(ls"], deny=[])
    assert user_rules(call, mode_asks).by == "mode:standard"
    call = make_call(RUN_COMMAND, {"argv": ["ls"]}, deny=["run_command(ls"])
    assert user_rules(call, mode_allows).action == "deny"


# --- start-up check -----------------------------------------------------------------------------


def test_check_rules_in_settings(settings: Any) -> None:
    from dispatcher.checks import check_rules_in_settings

    settings.HARNESS_DEFAULT_RULES = {
        "allow": ["run_command(npm test *)"],
        "deny": ["read_file(**/.env)"],
    }
    assert check_rules_in_settings() == []
    settings.HARNESS_DEFAULT_RULES = {"allow": ["run_command(npm test"], "ask": ["nope"]}
    errors = check_rules_in_settings()
    assert [e.id for e in errors] == ["dispatcher.E031", "dispatcher.E031"]
    text = " ".join(e.msg for e in errors)
    assert "Rule 'run_command(npm test'" in text and "Rule 'nope'" in text
    settings.HARNESS_DEFAULT_RULES = ["run_command"]
    assert [e.id for e in check_rules_in_settings()] == ["dispatcher.E030"]
    settings.HARNESS_DEFAULT_RULES = {}
    assert check_rules_in_settings() == []


@pytest.mark.parametrize(
    "path", ["src/.git/config", "src/.git/hooks/pre-commit", "src/x/../.git/./config", "src/.git"]
)
def test_a_write_rule_never_allows_git_hooks_or_config(workspace: Path, path: str) -> None:
    """`write_file(src/**)` must not let an agent write what a later allowed `git -C src
    status` runs (`core.fsmonitor`, hooks); reading those files stays allowed, and deny
    rules still see the write."""
    rule = parse_rule("write_file(src/**)")
    write = make_call(WRITE_FILE, {"path": path, "content": "[core]\n\tfsmonitor = id"}, workspace)
    assert rule.matches(write, "allow") is False
    assert rule.matches(write, "deny") is True
    assert rule.matches(
        make_call(WRITE_FILE, {"path": "src/a.py", "content": ""}, workspace), "allow"
    )
    read = make_call(READ_FILE, {"path": path}, workspace)
    assert parse_rule("read_file(src/**)").matches(read, "allow") is True
