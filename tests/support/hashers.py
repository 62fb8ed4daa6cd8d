"""The password hasher of test processes: Django's PBKDF2 with few iterations.

Every persona is a user with a password (tests/conftest.py `make_user`), and every login
checks one; at Django's default 1,200,000 iterations each costs about 0.5 s on a 2-core
machine, which was minutes of `make test` spent hashing. Same algorithm and encoding as
production (`pbkdf2_sha256$<iterations>$<salt>$<hash>`), so logins, wrong passwords and
the admin's password pages go through the same code; only the work factor is smaller.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
