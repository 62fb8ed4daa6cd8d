"""Profiles are shown, never changed here: edit modes and rules at /permissions/."""

from django.contrib import admin

from dispatcher.policy.models import LayerProposal, PermissionProfile, PolicyLayer
from harness_site.admin import ReadOnlyAdmin


@admin.register(PermissionProfile)
class PermissionProfileAdmin(ReadOnlyAdmin):
    """Edit modes and rules at /permissions/ (versioned and audited)."""

    list_display = ["user", "mode", "version", "updated_at"]


@admin.register(PolicyLayer)
class PolicyLayerAdmin(ReadOnlyAdmin):
    """Change layers as code (manage.py set_rules --org / --team): versioned and audited."""

    list_display = ["kind", "team", "max_mode", "version", "updated_at"]


@admin.register(LayerProposal)
class LayerProposalAdmin(ReadOnlyAdmin):
    """Accept at /permissions/policy/ or with manage.py accept_policy_proposal."""

    list_display = ["pk", "status", "proposed_by", "base_version", "created_at"]
