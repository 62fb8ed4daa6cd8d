"""What the identity provider's group map gave a person organization-wide.

Team roles the map gives are teams.Membership rows with source `sso`; an organization
role is a Django group, which cannot say where it came from, so the map's own record of
the organization roles it gave is kept here: a sign-in takes back only those.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class MappedOrgRole(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mapped_org_roles"
    )
    role = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role"], name="mapped_org_role_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} is org {self.role} by the group map"
