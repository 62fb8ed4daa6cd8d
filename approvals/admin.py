from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import services
from .models import ApprovalRequest


def _decide(request: HttpRequest, queryset: QuerySet[ApprovalRequest], approve: bool) -> None:
    for approval in queryset.select_related("call"):
        try:
            services.decide(
                approval_id=approval.pk,
                user=request.user,  # type: ignore[arg-type]
                approve=approve,
                digest=approval.call.digest,  # the admin shows the logged arguments
                feedback="Decided in the admin.",
            )
        except services.DecisionRefused as exc:
            messages.error(request, f"{approval.call.name}: {exc}")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin[ApprovalRequest]):
    list_display = ["call", "reason", "created_at", "expires_at", "decision", "decided_by"]
    list_filter = ["decision"]
    actions = ["approve", "deny"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Approve the selected calls")
    def approve(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> None:
        _decide(request, queryset, approve=True)

    @admin.action(description="Deny the selected calls")
    def deny(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> None:
        _decide(request, queryset, approve=False)
