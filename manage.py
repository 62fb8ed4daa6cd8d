#!/usr/bin/env python
import os
import sys

# Commands that never talk to Redis: they do not start the embedded server.
WITHOUT_REDIS = {
    "help",
    "check",
    "makemigrations",
    "migrate",
    "showmigrations",
    "sqlmigrate",
    "collectstatic",
    "diffsettings",
    "createsuperuser",
    "changepassword",
    "verify_audit",
    "audit_checkpoint",
    "export_audit",
    "claude_code_settings",
}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    import django
    from django.core.management import execute_from_command_line

    command = sys.argv[1] if len(sys.argv) > 1 else "help"
    if command not in WITHOUT_REDIS:
        django.setup()
        from harness_site.embedded_redis import start_if_embedded

        start_if_embedded()  # the command may send to Redis: on the embedded default, start it
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
