"""Upstream MCP servers and their pinned tools.

Rows change only through `dispatcher.tools.sources.services` (each change versioned and
audited, and the registry's generation bumped in the same transaction).
"""

from __future__ import annotations

from typing import Any

from django.db import models

SEPARATOR = "__"


class Transport(models.TextChoices):
    STDIO = "stdio"
    HTTP = "http"


class McpServer(models.Model):
    name = models.CharField(max_length=32, unique=True)
    # A team's server serves that team's agents only; none serves every agent.
    team = models.ForeignKey(
        "teams.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="mcp_servers"
    )
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.JSONField(default=list, blank=True, help_text="stdio: the argv.")
    url = models.CharField(max_length=1000, blank=True, help_text="http: the endpoint.")
    # Secrets may live here (API keys): shown by key only, never audited by value.
    env = models.JSONField(default=dict, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    paths = models.JSONField(default=list, blank=True, help_text="Paths the sandbox lets it use.")
    trust_annotations = models.BooleanField(default=False)
    timeout = models.FloatField(default=60.0)
    version = models.PositiveIntegerField(default=1)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def target(self) -> str:
        """What it runs or reaches, as shown to an admin."""
        if self.transport == Transport.STDIO:
            return " ".join(self.command)
        return self.url

    def masked(self) -> dict[str, Any]:
        """The configuration without secret values (env and header values), for audit
        payloads and version snapshots."""
        return {
            "name": self.name,
            "transport": self.transport,
            "command": list(self.command),
            "url": self.url,
            "env": sorted(self.env),
            "headers": sorted(self.headers),
            "paths": list(self.paths),
            "trust_annotations": self.trust_annotations,
            "timeout": self.timeout,
        }


class ToolState(models.TextChoices):
    ACTIVE = "active"  # offered, as pinned
    CHANGED = "changed"  # upstream reports another definition: held until accepted
    NEW = "new"  # appeared upstream after registration: held until accepted
    MISSING = "missing"  # no longer listed upstream: reported, not offered
    UNUSABLE = "unusable"  # its name or schema cannot be offered (see `problem`)


class McpToolQuerySet(models.QuerySet["McpTool"]):
    def offered(self) -> McpToolQuerySet:
        return self.filter(state=ToolState.ACTIVE)

    def held(self) -> McpToolQuerySet:
        return self.filter(state__in=(ToolState.CHANGED, ToolState.NEW))


class McpTool(models.Model):
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200, help_text="The upstream server's name for it.")
    exposed_name = models.CharField(max_length=240, unique=True, help_text="SERVER__tool")
    state = models.CharField(max_length=16, choices=ToolState.choices)
    problem = models.TextField(blank=True)
    # The pinned definition: what an admin accepted (at registration, or after review).
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    # What the server reported last, when it differs from the pinned definition.
    seen_description = models.TextField(blank=True)
    seen_input_schema = models.JSONField(null=True, blank=True)
    seen_annotations = models.JSONField(null=True, blank=True)
    seen_fingerprint = models.CharField(max_length=64, blank=True)
    seen_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.CharField(max_length=200, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)

    objects = McpToolQuerySet.as_manager()

    class Meta:
        ordering = ["server__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["server", "name"], name="mcptool_unique_per_server")
        ]

    def __str__(self) -> str:
        return f"{self.exposed_name} [{self.state}]"


class ServerVersion(models.Model):
    """One change of a server: what changed, by whom, and the configuration after it
    (secret values left out). Kept when the server is removed."""

    server_name = models.CharField(max_length=32, db_index=True)
    version = models.PositiveIntegerField()
    change = models.CharField(max_length=32)
    actor = models.CharField(max_length=200)
    snapshot = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["server_name", "-version", "-created_at"]

    def __str__(self) -> str:
        return f"{self.server_name} v{self.version}: {self.change}"


class Generation(models.Model):
    """One row: set anew with every change of servers or tools, so each process knows
    when its cached tool list is stale (one indexed read per lookup of an upstream tool)."""

    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"generation {self.value}"
