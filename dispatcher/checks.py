"""Start-up validation (`manage.py check`): tools, policy chain, repeat reminders, modes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from dispatcher.policy.models import Mode
from dispatcher.tools.base import Tool


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
        problems = entry_problems(rules)
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
