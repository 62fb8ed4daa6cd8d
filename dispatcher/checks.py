"""Start-up validation (`manage.py check`): tools, policy chain, repeat reminders, modes,
the sandbox and the worker's time limit."""

from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from dispatcher.policy.models import Mode
from dispatcher.tools.base import ClientToolset, Tool

# Seconds a worker needs around a tool's own timeout: guards, claim, the result's write.
TASK_TIME_MARGIN = 30.0


@register()
def check_tools(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors: list[Error] = []
    seen: dict[str, str] = {}
    for path in settings.HARNESS_TOOLS:
        try:
            tool = import_string(path)
        except ImportError as exc:
            errors.append(
                Error(
                    f"Cannot import tool '{path}': {exc}",
                    hint="Fix HARNESS_TOOLS.",
                    id="dispatcher.E001",
                )
            )
            continue
        if not isinstance(tool, Tool):
            errors.append(
                Error(
                    f"'{path}' is not a Tool.",
                    hint="Point HARNESS_TOOLS at Tool instances.",
                    id="dispatcher.E002",
                )
            )
            continue
        if tool.name in seen:
            errors.append(
                Error(
                    f"Duplicate tool name '{tool.name}' ({seen[tool.name]} and {path}).",
                    hint="Tool names must be unique; rename one or remove it from HARNESS_TOOLS.",
                    id="dispatcher.E003",
                )
            )
        seen[tool.name] = path
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            errors.append(
                Error(
                    f"Tool '{tool.name}' has an invalid parameters schema: {exc.message} (at {exc.json_path}).",
                    hint="Fix the JSON Schema (Draft 2020-12) of the tool's parameters.",
                    id="dispatcher.E004",
                )
            )
        else:
            if tool.parameters.get("type") != "object":
                errors.append(
                    Error(
                        f"Tool '{tool.name}' parameters must be a schema of type 'object'.",
                        hint="Model SDKs require an object schema for tool arguments.",
                        id="dispatcher.E005",
                    )
                )
    return errors


@register()
def check_policy_chain(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors: list[Error] = []
    for setting in ("HARNESS_PRE_EXECUTE", "HARNESS_GUARDS", "HARNESS_POST_EXECUTE"):
        for path in getattr(settings, setting):
            try:
                import_string(path)
            except ImportError as exc:
                errors.append(
                    Error(f"{setting}: cannot import '{path}': {exc}", id="dispatcher.E010")
                )
    try:
        import_string(settings.HARNESS_EXECUTE_WRAPPER)
    except ImportError as exc:
        errors.append(Error(f"HARNESS_EXECUTE_WRAPPER: {exc}", id="dispatcher.E011"))
    try:
        recorder = import_string(settings.HARNESS_ASK_RECORDER)
    except ImportError as exc:
        recorder = None
        problem = str(exc)
    else:
        problem = "" if callable(recorder) else "it is not callable"
    if recorder is None or problem:
        errors.append(
            Error(
                f"HARNESS_ASK_RECORDER '{settings.HARNESS_ASK_RECORDER}': {problem}",
                hint="Name the function that writes an ask's request row, e.g. "
                "'approvals.asks.record_ask'; without it no ask could be decided.",
                id="dispatcher.E013",
            )
        )
    if settings.HARNESS_DEFAULT_MODE not in Mode.values:
        errors.append(
            Error(
                f"HARNESS_DEFAULT_MODE '{settings.HARNESS_DEFAULT_MODE}' is not a mode.",
                hint=f"Use one of: {', '.join(Mode.values)}.",
                id="dispatcher.E012",
            )
        )
    return errors


@register()
def check_repeat_reminders(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    thresholds = settings.HARNESS_REPEAT_THRESHOLDS
    hint = "Set HARNESS_REPEAT_THRESHOLDS to increasing numbers of at least 2, e.g. '3,5,8'."
    if not thresholds:
        return [Error("HARNESS_REPEAT_THRESHOLDS is empty.", hint=hint, id="dispatcher.E020")]
    errors = []
    if min(thresholds) < 2:
        errors.append(
            Error(f"A repeat threshold is below 2: {thresholds}.", hint=hint, id="dispatcher.E021")
        )
    if len(set(thresholds)) != len(thresholds):
        errors.append(
            Error(
                f"Repeat thresholds repeat a value: {thresholds}.", hint=hint, id="dispatcher.E022"
            )
        )
    if sorted(thresholds) != thresholds:
        errors.append(
            Error(
                f"Repeat thresholds must increase: {thresholds}.", hint=hint, id="dispatcher.E023"
            )
        )
    if settings.HARNESS_REPEAT_PREVIEW_CHARS < 1:
        errors.append(
            Error("HARNESS_REPEAT_PREVIEW_CHARS must be at least 1.", id="dispatcher.E024")
        )
    return errors


@register()
def check_rules_in_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_DEFAULT_RULES (optional): {"allow": [...], "ask": [...], "deny": [...]}."""
    from dispatcher.policy.profiles import entry_problems
    from dispatcher.tools.registry import builtin_tools, client_toolsets

    rules = settings.HARNESS_DEFAULT_RULES
    if not isinstance(rules, dict):
        return [
            Error(
                f"HARNESS_DEFAULT_RULES must be a dict, not {type(rules).__name__}.",
                hint='Use {"allow": [...], "ask": [...], "deny": [...]}.',
                id="dispatcher.E030",
            )
        ]
    try:
        # The built-in and client tools only: checks read no database (upstream tools are
        # rules' targets once registered; a user's rules are checked against them when saved).
        known = builtin_tools() + tuple(t for s in client_toolsets() for t in s.tools)
        problems = entry_problems(rules, known)
    except ImportError as exc:  # a bad HARNESS_TOOLS entry; check_tools reports it
        return [Error(f"HARNESS_DEFAULT_RULES cannot be checked: {exc}", id="dispatcher.E032")]
    return [
        Error(
            f"HARNESS_DEFAULT_RULES: {problem}",
            hint="See docs/rules.md for the rule syntax.",
            id="dispatcher.E031",
        )
        for problem in problems
    ]


@register()
def check_sandbox(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_SANDBOX: "bwrap" must work on this host; "off" must be chosen explicitly."""
    from dispatcher.tools import sandbox

    value = settings.HARNESS_SANDBOX
    if value not in sandbox.MODES:
        return [
            Error(
                f"HARNESS_SANDBOX is {value!r}, which is not a sandbox Harness knows.",
                hint="Use 'bwrap' (the default), or 'off' to run programs unsandboxed.",
                id="dispatcher.E040",
            )
        ]
    errors = [
        Error(
            f"HARNESS_SANDBOX_READ_ONLY entry {path!r} is not an absolute path.",
            hint="List absolute host paths, comma-separated, e.g. '/opt/toolchain'.",
            id="dispatcher.E043",
        )
        for path in settings.HARNESS_SANDBOX_READ_ONLY
        if not path.startswith("/")
    ]
    try:
        sandbox.memory_limit()
    except ValueError as exc:
        errors.append(
            Error(
                f"{exc}.",
                hint="Set HARNESS_SANDBOX_MEMORY to bytes or a size such as 2G or 512M.",
                id="dispatcher.E044",
            )
        )
    if value == "bwrap" and (problem := sandbox.probe()) is not None:
        entry = problem.startswith("HARNESS_SANDBOX_READ_ONLY entry ")
        errors.append(
            Error(
                f"HARNESS_SANDBOX is 'bwrap' but the sandbox cannot run here: {problem}.",
                hint=(
                    "List only directories that sandboxed programs cannot change nor "
                    "redirect (owned by root, in directories only root writes, no ACL "
                    "granting write, holding no workspace nor server path), such as "
                    "/opt/toolchain; or remove the entry (docs/security.md)."
                    if entry
                    else "Install bubblewrap, util-linux and libseccomp (`make sandbox` "
                    "does it, and creates the harness-sandbox user) and allow user "
                    "namespaces; as root, give Harness a writable pids cgroup and a "
                    "HARNESS_SANDBOX_USER, or run it as an unprivileged user. To run "
                    "programs without the sandbox, set HARNESS_SANDBOX=off explicitly "
                    "(the dashboard shows it)."
                ),
                id="dispatcher.E041",
            )
        )
    return errors


# Where the kernel says what it does with a crashing process's memory (one for the host).
CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


def core_dump_socket(core_pattern: Path = CORE_PATTERN) -> str | None:
    """The kernel's core_pattern when it is a socket (`@path`, `@@path`: Linux 6.16 and
    later), else None (a file name or a pipe, `|helper`, both of which the sandbox's core
    dump limit of 1 stops; or no pattern to read).

    Nothing in the sandbox stops a socket: the kernel connects to it from the host's root
    and writes the dump whatever RLIMIT_CORE is (0 included), and a program that is not
    dumpable becomes dumpable again at its next execve (measured on 6.18: a program of the
    sandbox user that crashed under limit 1 was dumped to the socket, 5 MB)."""
    try:
        pattern = core_pattern.read_text(errors="replace").strip()
    except OSError:
        return None
    return pattern if pattern.startswith("@") else None


@register()
def check_core_dumps(
    app_configs: Any = None, core_pattern: Path = CORE_PATTERN, **kwargs: Any
) -> list[Warning]:
    """A core_pattern socket takes a sandboxed program's memory out of the sandbox when it
    crashes (docs/security.md, "What the sandbox does not stop")."""
    if settings.HARNESS_SANDBOX != "bwrap":
        return []
    pattern = core_dump_socket(core_pattern)
    if pattern is None:
        return []
    return [
        Warning(
            f"The kernel's core_pattern is {pattern!r}, a socket: a sandboxed program that "
            "crashes is dumped to the server listening on it, outside the sandbox, with its "
            "memory (which may hold the secrets the call or server was given). The "
            "sandbox's core dump limit stops a core file and a pipe helper, not a socket.",
            hint="Set kernel.core_pattern to a file name (`sysctl -w kernel.core_pattern=core`"
            ", and in /etc/sysctl.d/ to keep it) or to '|/bin/false'; or have the server on "
            "the socket drop the dumps of the sandbox user's processes (docs/security.md).",
            id="dispatcher.W040",
        )
    ]


@register()
def check_previews(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_PREVIEW_TIMEOUT and HARNESS_PREVIEW_MAX_BYTES (docs/security.md, "Previews")."""
    from dispatcher import previews

    return [
        Error(
            f"{problem}.",
            hint="Set it in the environment (README: the env-var table).",
            id="dispatcher.E045",
        )
        for problem in previews.preview_setting_problems()
    ]


@register()
def check_running_cap(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_MAX_RUNNING_PER_OWNER (docs/security.md, "Fair shares per agent")."""
    from dispatcher import batches

    problem = batches.running_cap_problem(settings.HARNESS_MAX_RUNNING_PER_OWNER)
    if problem is None:
        return []
    hint = "Leave it unset (auto), or set a number of calls; 0 turns the cap off."
    return [Error(f"{problem}.", hint=hint, id="dispatcher.E046")]


@register()
def check_person_caps(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_MAX_WAITS_PER_PERSON and the request rate per person (docs/security.md,
    "Fair shares")."""
    from dispatcher import limits

    threads = limits.MCP_ORM_THREADS  # (an MCP gateway process's: mcp.orm_threads)
    errors = []
    value = str(settings.HARNESS_MAX_WAITS_PER_PERSON)
    if (problem := limits.waits_per_person_problem(value)) is not None:
        hint = "Leave it unset (16), or set a whole number of waits; 0 turns the cap off."
        errors.append(Error(f"{problem}.", hint=hint, id="dispatcher.E047"))
    elif int(value) >= threads:
        errors.append(
            Error(
                f"HARNESS_MAX_WAITS_PER_PERSON is {value}: one person's agents could hold all "
                f"{threads} ORM threads of an MCP gateway process, and every other "
                "person's calls would wait for one.",
                hint=f"Set it below {threads} (16 by default), or 0 for no cap per person.",
                id="dispatcher.E047",
            )
        )
    if settings.HARNESS_PERSON_REQUESTS_PER_SECOND < 0 or (
        settings.HARNESS_PERSON_REQUESTS_PER_SECOND > 0
        and settings.HARNESS_PERSON_REQUEST_BURST < 1
    ):
        errors.append(
            Error(
                "HARNESS_PERSON_REQUESTS_PER_SECOND must be 0 (no rate per person) or more, "
                "with HARNESS_PERSON_REQUEST_BURST at least 1.",
                hint="Leave both unset (40 per second, bursts of 120).",
                id="dispatcher.E047",
            )
        )
    return errors


@register()
def check_task_time_limit(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The worker's time limit (the backstop) must never cut a tool inside its own timeout."""
    from dispatcher.tools.registry import builtin_tools

    limit = settings.CELERY_TASK_TIME_LIMIT
    try:
        tools = [tool for tool in builtin_tools() if isinstance(tool, Tool)]
    except ImportError:  # check_tools reports it
        return []
    if not tools:
        return []
    longest = max(tools, key=lambda tool: tool.timeout)
    needed = longest.timeout + TASK_TIME_MARGIN
    if limit is not None and limit < needed:
        return [
            Error(
                f"HARNESS_TASK_TIME_LIMIT ({limit:g} s) would kill tool '{longest.name}' "
                f"inside its own {longest.timeout:g} s timeout.",
                hint=f"Set HARNESS_TASK_TIME_LIMIT to at least {needed:g}.",
                id="dispatcher.E042",
            )
        ]
    return []


@register()
def check_client_tools(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """HARNESS_CLIENT_TOOLS: client -> a ClientToolset of decide-only tools with valid schemas."""
    errors: list[Error] = []
    for client, path in settings.HARNESS_CLIENT_TOOLS.items():
        try:
            toolset = import_string(path)
        except ImportError as exc:
            errors.append(Error(f"HARNESS_CLIENT_TOOLS['{client}']: {exc}", id="dispatcher.E050"))
            continue
        if not isinstance(toolset, ClientToolset) or toolset.client != client:
            errors.append(
                Error(
                    f"HARNESS_CLIENT_TOOLS['{client}'] = '{path}' is not the ClientToolset of "
                    f"'{client}'.",
                    hint="Point it at a ClientToolset whose client is the key.",
                    id="dispatcher.E051",
                )
            )
            continue
        for tool in toolset.tools:
            try:
                Draft202012Validator.check_schema(tool.parameters)
            except SchemaError as exc:
                errors.append(
                    Error(f"{client} tool '{tool.name}': {exc.message}", id="dispatcher.E052")
                )
            if not tool.client_executed:
                errors.append(
                    Error(
                        f"{client} tool '{tool.name}' is not client_executed.",
                        hint="A client's tools are decide-only: Harness never runs them.",
                        id="dispatcher.E053",
                    )
                )
    return errors


@register()
def check_task_names(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Every task Harness sends by name (the lifecycle never imports the tasks that run it,
    and the beat schedule names them too) is one the Celery app registers."""
    from approvals.notifications import services as notifications
    from dispatcher.batches import EXECUTE_TASK
    from harness_site.celery import app

    for config in apps.get_app_configs():  # what autodiscover_tasks imports, without the
        try:  # loader's signal (Celery's Django fixup runs the checks again from it)
            importlib.import_module(f"{config.name}.tasks")
        except ModuleNotFoundError as exc:
            if exc.name != f"{config.name}.tasks":
                raise
    sent = {
        EXECUTE_TASK: "dispatcher.batches.EXECUTE_TASK",
        notifications.PLAN_ASK_TASK: "PLAN_ASK_TASK",
        notifications.PLAN_OUTCOME_TASK: "PLAN_OUTCOME_TASK",
        notifications.DELIVER_TASK: "DELIVER_TASK",
    }
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        sent.setdefault(str(entry["task"]), f"CELERY_BEAT_SCHEDULE['{name}']")
    return [
        Error(
            f"{where} sends the task '{name}', which no Celery task registers.",
            hint="Name a task declared with @shared_task(name=...) in a tasks module.",
            id="dispatcher.E014",
        )
        for name, where in sent.items()
        if name not in app.tasks
    ]


@register()
def check_fast_path_versions(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """The fast paths lean on library internals (the ORM's compiler, kombu's Redis QoS,
    Celery's message envelope, redis-py's connections): each names the lines it was
    verified against."""
    from floor import broker, celery_message, compiled, redis_clients
    from floor.sqlite3 import base as sqlite_backend

    warnings = []
    for module in (compiled, celery_message, broker, sqlite_backend, redis_clients):
        for package, line in module.VERIFIED_WITH.items():
            installed = _installed_line(package)
            if installed != line:
                warnings.append(
                    Warning(
                        f"{module.__name__} was verified against {package} {line}.x; "
                        f"{package} {installed or 'is not installed'} is installed.",
                        hint="Run the test suite (make test) on this combination before "
                        "production, then update VERIFIED_WITH in that module.",
                        id="dispatcher.W015",
                    )
                )
    return warnings


def _installed_line(package: str) -> str:
    """The installed `major.minor` of a distribution, or "" when it is not installed."""
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
    return ".".join(version.split(".")[:2])
