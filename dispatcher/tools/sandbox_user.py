"""Who sandboxed programs run as on the host (settings.HARNESS_SANDBOX_USER), apart from
dispatcher.tools.sandbox so that the modules it imports (sandbox_git) can ask too."""

from __future__ import annotations

import os
import pwd
import re

from django.conf import settings

from dispatcher.tools.base import ToolError

__all__ = ["SandboxUnavailable", "sandbox_user"]


class SandboxUnavailable(ToolError):
    """The configured sandbox cannot run here; nothing was started (fail closed)."""


def sandbox_user() -> tuple[int, int] | None:
    """The host (uid, gid) sandboxed programs run as, or None when Harness is not root
    (its own uid is unprivileged; programs see it as 65534 in a user namespace).

    When Harness is root: settings.HARNESS_SANDBOX_USER, a user name or `UID:GID`.
    Raises SandboxUnavailable when it names no user, or root's uid or gid.
    """
    if os.geteuid() != 0:
        return None
    value = str(settings.HARNESS_SANDBOX_USER).strip()
    uid_gid = re.fullmatch(r"(\d+):(\d+)", value)
    if uid_gid:
        user = (int(uid_gid.group(1)), int(uid_gid.group(2)))
    else:
        try:
            entry = pwd.getpwnam(value)
        except KeyError:
            raise SandboxUnavailable(
                f"Harness runs as root and HARNESS_SANDBOX_USER {value!r} is not a user on "
                "this host, so no program runs. `make sandbox` creates the system user "
                "harness-sandbox; or set HARNESS_SANDBOX_USER to an unused UID:GID."
            ) from None
        user = (entry.pw_uid, entry.pw_gid)
    if 0 in user:
        raise SandboxUnavailable(
            f"HARNESS_SANDBOX_USER {value!r} is root's uid or gid, so no program runs. "
            "Name an unprivileged user."
        )
    return user
