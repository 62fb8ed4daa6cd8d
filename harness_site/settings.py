"""Harness settings: every value comes from the environment (see README, "Configuration").

With neither DATABASE_URL nor REDIS_URL set, Harness runs on the embedded default: a
SQLite file in WAL mode and a Redis server it starts itself (harness_site.embedded_redis),
not on import: see start_if_embedded.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

# Generic admin and queryset classes (ModelAdmin[Agent]) at run time, for mypy.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


DEBUG = env_bool("HARNESS_DEBUG", False)
ALLOWED_HOSTS = env_list("HARNESS_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("HARNESS_CSRF_TRUSTED_ORIGINS")
DATA_DIR = Path(env("HARNESS_DATA_DIR", str(BASE_DIR / "var"))).resolve()

# SECRET_KEY signs sessions, CSRF tokens and one-tap links: never a constant in the source.
# Set HARNESS_SECRET_KEY (the same in every process); without it, the embedded default
# (and HARNESS_DEBUG) generates a random key on first start and keeps it beside the audit
# key, mode 0600 (docs/security.md, "Secrets").
SECRET_KEY_FILE = DATA_DIR / "secret.key"
SECRET_KEY = env("HARNESS_SECRET_KEY")
if not SECRET_KEY and (DEBUG or not env("DATABASE_URL")):
    from audit.signing import secret_file

    try:
        SECRET_KEY = secret_file(SECRET_KEY_FILE, "secret key")
    except OSError as error:
        raise ImproperlyConfigured(
            f"Cannot read or create {SECRET_KEY_FILE}: {error}. Make HARNESS_DATA_DIR "
            "writable or set HARNESS_SECRET_KEY (a long random string)."
        ) from error
if not SECRET_KEY:
    raise ImproperlyConfigured("Set HARNESS_SECRET_KEY (a long random string) in production.")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # (allauth.mfa's passkey list loads it)
    "channels",
    "django_htmx",
    # People: allauth's accounts, single sign-on (OIDC, SAML) and second factors
    # (docs/identity.md); Harness's own part (SSO from env, break-glass, sessions) is
    # identity/.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.socialaccount.providers.saml",
    "allauth.mfa",
    "allauth.usersessions",
    "identity",
    "audit",
    "teams",
    "dispatcher",
    "dispatcher.policy",
    "dispatcher.tools.sources",
    "approvals",
    # OAuth for agents (docs/mcp.md, "Sign in"): django-oauth-toolkit is the
    # authorization server; agentauth ties its tokens to agents and asks for consent.
    "oauth2_provider",
    "agentauth",
    "demo",  # manage.py run_demo and demo_agent (demo/)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves /static/ from daphne itself (the app's own files: CSS, vendored htmx, JS).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # A NUL in the path or a form field: 400 before any view (PostgreSQL text holds none).
    "harness_site.middleware.RefuseNulCharacters",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "identity.middleware.SessionLifetime",
    "identity.mfa.RequireSecondFactor",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "harness_site.urls"
ASGI_APPLICATION = "harness_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "harness_site.context_processors.roles",
                "harness_site.context_processors.sandbox",
                "identity.context_processors.sign_in",
            ],
        },
    }
]

# --- Database -----------------------------------------------------------------------
# PostgreSQL: the hot paths' fixed statements (floor.compiled.fixed_cursor) are
# prepared once per connection and then only bound and executed: planning them was most of
# PostgreSQL's CPU per call (docs/benchmarks.md). Turn off behind a pooler in transaction
# mode that does not carry prepared statements (PgBouncer before 1.21, or without
# max_prepared_statements).
HARNESS_DB_PREPARE = env_bool("HARNESS_DB_PREPARE", True)
if env("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(env("DATABASE_URL"))}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Connections come from psycopg's pool (async views run ORM work in threads;
        # a long CONN_MAX_AGE exhausts max_connections under ASGI).
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": int(env("HARNESS_DB_POOL_MIN", "2")),
            "max_size": int(env("HARNESS_DB_POOL_MAX", "20")),
            "timeout": 10,
        }
        if HARNESS_DB_PREPARE:
            # Django turns psycopg's preparing off (prepare_threshold None) for poolers.
            # Only fixed_cursor's server-binding cursors prepare (Django's own cursors
            # bind on the client and never do).
            DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5
else:
    DATABASES = {
        "default": {
            "ENGINE": "floor.sqlite3",  # BEGIN IMMEDIATE without the sleeping busy handler
            "NAME": env("HARNESS_SQLITE_PATH", str(DATA_DIR / "harness.sqlite3")),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {
                "NAME": Path(
                    env("HARNESS_SQLITE_TEST_PATH", str(DATA_DIR / "test-harness.sqlite3"))
                )
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: broker, channel layer, wake-ups ------------------------------------------
# Importing settings starts nothing: each process that needs the embedded server starts
# it explicitly (harness_site.embedded_redis.start_if_embedded: daphne's asgi.py, the
# Celery worker and beat, manage.py, the test session).
EMBEDDED_REDIS = not env("REDIS_URL")
REDIS_URL = f"unix://{DATA_DIR / 'redis.sock'}" if EMBEDDED_REDIS else env("REDIS_URL")
# Django's cache holds what allauth counts for its rate limits (wrong passwords, device
# codes guessed): in Redis, every web process counts the same tries (in each process's
# memory, N daphne processes would allow N times as many, and a restart none).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "harness-cache",
    }
}


def _celery_url(url: str) -> str:
    return "redis+socket://" + url.removeprefix("unix://") if url.startswith("unix://") else url


CELERY_BROKER_URL = _celery_url(REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# At-most-once delivery (early ack) and one message in hand per worker process: the
# database, not the broker, decides whether a call runs (claim by conditional update).
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every connection, and in prefork workers the whole psycopg
# pool, before and after each task (celery/celery#10554): three new PostgreSQL connections
# per call. With this it does so only every 1,000 tasks; harness_site.celery hands the
# connection back to the child's pool (or drops a broken one) at each task boundary.
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_DEFAULT_QUEUE = env("HARNESS_CELERY_QUEUE", "harness")
# Two lanes (docs/operations.md, "Lanes"): the default queue carries tool execution and
# nothing else; notifications and housekeeping go to the background queue, so a flood of
# asks with a slow receiver never holds a worker an auto-allowed call is waiting for.
HARNESS_CELERY_BACKGROUND_QUEUE = (
    env("HARNESS_CELERY_BACKGROUND_QUEUE") or f"{CELERY_TASK_DEFAULT_QUEUE}-background"
)
BACKGROUND_TASKS = (
    "agentauth.tasks.*",
    "approvals.tasks.*",
    "audit.tasks.*",
    "identity.tasks.*",
    "dispatcher.tasks.reconcile",
)
CELERY_TASK_ROUTES = {task: {"queue": HARNESS_CELERY_BACKGROUND_QUEUE} for task in BACKGROUND_TASKS}
CELERY_BEAT_SCHEDULE = {
    "reconcile-calls": {
        "task": "dispatcher.tasks.reconcile",
        "schedule": float(env("HARNESS_RECONCILE_INTERVAL", "15")),
    },
    "end-stale-sign-ins": {
        "task": "identity.tasks.end_stale_sign_ins",
        "schedule": float(env("HARNESS_RECONCILE_INTERVAL", "15")) * 4,
    },
    "expire-approvals": {
        "task": "approvals.tasks.expire_approvals",
        "schedule": float(env("HARNESS_RECONCILE_INTERVAL", "15")),
    },
    "escalate-approvals": {
        "task": "approvals.tasks.escalate_approvals",
        "schedule": float(env("HARNESS_RECONCILE_INTERVAL", "15")),
    },
    "clear-device-codes": {"task": "agentauth.tasks.clear_device_codes", "schedule": 3600.0},
}


def _redis_db(url: str) -> int:
    """The database number of a Redis URL (`redis://host:6379/13`, `...?db=13`); 0 if none."""
    parts = urlsplit(url)
    query = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair)
    path = parts.path.strip("/") if parts.scheme in ("redis", "rediss") else ""
    number = query.get("db") or path or "0"
    return int(number) if number.isdigit() else 0


# Redis pub/sub channels belong to the whole server, not to a database: a PUBLISH on
# database 13 reaches subscribers on database 0. The channel layer (reviewers' pushes,
# with what agents sent) and the wake-ups are pub/sub only, so by default their prefixes
# carry the database number: two deployments on one Redis server with different
# databases never see each other's pushes or wake-ups (database 0 keeps the plain names).
_REDIS_DB = _redis_db(REDIS_URL)
_PUBSUB_SCOPE = f":db{_REDIS_DB}" if _REDIS_DB else ""
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            "prefix": env("HARNESS_CHANNEL_PREFIX", f"harness{_PUBSUB_SCOPE}"),
        },
    }
}
# Prefix of the Redis pub/sub channels that wake long-polling agent requests.
HARNESS_WAKE_PREFIX = env("HARNESS_WAKE_PREFIX", f"harness{_PUBSUB_SCOPE}:wake")
# Seconds a session's wake-up channel stays subscribed in a process after its last wait
# (dispatcher.wakeups): the session's next waiting call starts waiting before it is written.
HARNESS_WAKE_LINGER = float(env("HARNESS_WAKE_LINGER", "10"))

# --- Auth, sessions, security --------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Sign-in is allauth's (docs/identity.md): a password Harness keeps, or single sign-on.
# One backend: allauth's (username and password), refusing passwords when single sign-on
# is the only way in (HARNESS_SSO_ONLY) except for the break-glass accounts.
AUTHENTICATION_BACKENDS = ["identity.backends.PasswordBackend"]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Accounts are made by admins (or by single sign-on): nobody signs up; a username and a
# password sign in, the session lasts as Django's does (no "remember me" choice).
ACCOUNT_ADAPTER = "identity.adapters.AccountAdapter"
SOCIALACCOUNT_ADAPTER = "identity.adapters.SocialAccountAdapter"
ACCOUNT_LOGIN_METHODS = {"username"}
# Whose address a request is, for allauth's per-address rate limits (sign-in attempts,
# device codes asked for: docs/identity.md, "Behind a reverse proxy"). Unset, it is the
# connection's peer: behind a reverse proxy that is the proxy, for everyone at once, so one
# person's wrong passwords or a flood of `harness-hook login`s would refuse everybody.
# HARNESS_TRUSTED_PROXY_COUNT: how many proxies of yours append to X-Forwarded-For (the
# address that many entries from its end is the client's; any before it may be forged).
# HARNESS_TRUSTED_CLIENT_IP_HEADER: a header your proxy sets to the client's address
# instead (X-Real-IP, CF-Connecting-IP); it wins over the count. Only set either when
# every request comes through that proxy, which must overwrite what clients send.
HARNESS_TRUSTED_PROXY_COUNT = int(env("HARNESS_TRUSTED_PROXY_COUNT", "0"))
HARNESS_TRUSTED_CLIENT_IP_HEADER = env("HARNESS_TRUSTED_CLIENT_IP_HEADER") or None
if HARNESS_TRUSTED_PROXY_COUNT < 0:
    raise ImproperlyConfigured(
        f"HARNESS_TRUSTED_PROXY_COUNT is {HARNESS_TRUSTED_PROXY_COUNT}: set it to the number "
        "of reverse proxies of yours in front of Harness (0 for none)."
    )
ALLAUTH_TRUSTED_PROXY_COUNT = HARNESS_TRUSTED_PROXY_COUNT
ALLAUTH_TRUSTED_CLIENT_IP_HEADER = HARNESS_TRUSTED_CLIENT_IP_HEADER
# HARNESS_NAT64_PREFIXES: the /96 prefixes of NAT64 translators in front of an IPv6-only
# Harness, besides the well-known 64:ff9b::/96: an IPv4 client arrives as PREFIX::a.b.c.d
# and is counted as a.b.c.d (identity.adapters.client_address), not all in one network.
HARNESS_NAT64_PREFIXES: list[str] = []
for _prefix in filter(None, (p.strip() for p in env("HARNESS_NAT64_PREFIXES", "").split(","))):
    try:
        _network: ipaddress.IPv6Network | None = ipaddress.IPv6Network(_prefix)
    except ValueError:
        _network = None
    if _network is None or _network.prefixlen != 96:
        raise ImproperlyConfigured(
            f"HARNESS_NAT64_PREFIXES holds {_prefix!r}: list IPv6 /96 networks, comma "
            "separated (e.g. 2001:db8:64::/96)."
        )
    HARNESS_NAT64_PREFIXES.append(str(_network))
ACCOUNT_SIGNUP_FIELDS = ["username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_SESSION_REMEMBER = True
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_LOGOUT_REDIRECT_URL = LOGOUT_REDIRECT_URL
ACCOUNT_USER_DISPLAY = "identity.adapters.display_name"

# Single sign-on (docs/identity.md): one OIDC provider by HARNESS_OIDC_*, more (OIDC or
# SAML 2.0) by HARNESS_SSO_PROVIDERS (JSON). Whoever the provider signs in has an
# account; an existing account is linked only by an email the provider says is verified.
from identity.sso_config import (  # noqa: E402
    form_action_origins,
    providers_from_env,
    socialaccount_providers,
)

HARNESS_SSO = providers_from_env(os.environ)
# IdP groups → teams and roles (JSON: {"group": "team:NAME:reviewer" | "org:admin" | [...]});
# parsed here, a bad entry named at start-up (identity/group_map.py).
from identity.group_map import parse_group_map  # noqa: E402

HARNESS_SSO_GROUP_MAP = parse_group_map(env("HARNESS_SSO_GROUP_MAP"))
SOCIALACCOUNT_PROVIDERS = socialaccount_providers(HARNESS_SSO)
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = True
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_LOGIN_ON_GET = False
SOCIALACCOUNT_STORE_TOKENS = False
# Connecting a provider account to a signed-in account asks for the password (or second
# factor) again: a session taken over cannot add a way back in that outlives it.
SOCIALACCOUNT_REAUTHENTICATION_REQUIRED = True
SOCIALACCOUNT_REQUESTS_TIMEOUT = 10
# Password sign-in only as break-glass: with HARNESS_SSO_ONLY, only these local accounts
# (usernames, comma-separated) may sign in with a password; each such sign-in is audited
# and the org admins are told.
HARNESS_SSO_ONLY = env_bool("HARNESS_SSO_ONLY", False)
HARNESS_BREAK_GLASS_USERS = env_list("HARNESS_BREAK_GLASS_USERS")
# The identity provider says a person is gone: POST /accounts/deprovision/ signed with
# this secret deactivates the account linked to them (empty: the endpoint answers 404).
HARNESS_DEPROVISION_SECRET = env("HARNESS_DEPROVISION_SECRET")
# A sign-in ends after HARNESS_SESSION_IDLE seconds without a page request, and
# HARNESS_SESSION_MAX_AGE seconds after it began, whatever happens (0: never); its sockets
# close with it (identity.middleware, identity.tasks.end_stale_sign_ins).
HARNESS_SESSION_IDLE = float(env("HARNESS_SESSION_IDLE", str(12 * 3600)))
HARNESS_SESSION_MAX_AGE = float(env("HARNESS_SESSION_MAX_AGE", str(7 * 24 * 3600)))
SESSION_COOKIE_AGE = int(HARNESS_SESSION_MAX_AGE) or 14 * 24 * 3600
# Each person's sign-ins, listed on their own page (/accounts/sessions/); their activity
# is noted by identity.middleware, at most once a minute, not on every request.
USERSESSIONS_TRACK_ACTIVITY = False
# Second factors for everyone (allauth.mfa): an authenticator app (TOTP), passkeys and
# recovery codes; a discoverable passkey signs in without a password. The passkeys are
# also the keys that sign step-up approvals (approvals.stepup). HARNESS_MFA_REQUIRED makes
# a factor mandatory: none, admins, reviewers (and admins) or all; a person it names who
# has none is sent to the set-up page first (identity.mfa).
MFA_SUPPORTED_TYPES = ["totp", "webauthn", "recovery_codes"]
MFA_PASSKEY_LOGIN_ENABLED = True
# ...except while single sign-on is the only way in (HARNESS_SSO_ONLY): identity.passkeys.
MFA_FORMS = {
    "login_webauthn": "identity.passkeys.PasskeySignInForm",
    "add_webauthn": "identity.passkeys.PasskeyAddForm",
    "authenticate_webauthn": "identity.passkeys.PasskeyAssertionForm",
    "reauthenticate_webauthn": "identity.passkeys.PasskeyReauthenticateForm",
}
MFA_TOTP_ISSUER = "Harness"
HARNESS_MFA_REQUIRED = env("HARNESS_MFA_REQUIRED", "none")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("HARNESS_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

from django.utils.csp import CSP  # noqa: E402

SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    # Signing in with an identity provider posts here, then redirects there.
    "form-action": [CSP.SELF, *form_action_origins(HARNESS_SSO)],
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves the files straight from static/ (no collectstatic step); set
# HARNESS_STATIC_ROOT to serve a collected copy instead.
STATIC_ROOT = env("HARNESS_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("HARNESS_LOG_LEVEL", "WARNING")},
}

# --- Harness ---------------------------------------------------------------------------
# The tools agents may call; each entry is a dotted path to a Tool.
HARNESS_TOOLS = [
    "dispatcher.tools.read_file.TOOL",
    "dispatcher.tools.write_file.TOOL",
    "dispatcher.tools.list_directory.TOOL",
    "dispatcher.tools.search_files.TOOL",
    "dispatcher.tools.run_command.TOOL",
    "dispatcher.tools.delete_file.TOOL",
    # Decide-only: a client's tool Harness has no definition of (MCP approval_prompt).
    "dispatcher.tools.client_tool.TOOL",
] + env_list("HARNESS_EXTRA_TOOLS")

# Stage 4, the pre-execute waterfall: `(call, next) -> Decision`, first answer wins.
HARNESS_PRE_EXECUTE = [
    "dispatcher.policy.waterfall.session_grants",
    "dispatcher.policy.waterfall.user_rules",
    "dispatcher.policy.waterfall.permission_mode",
]
# Stage 5: every guard runs; any reason denies. Re-run by the worker before execution.
HARNESS_GUARDS = [
    "dispatcher.policy.guards.workspace_confinement",
    "dispatcher.policy.guards.command_blocklist",
    "dispatcher.policy.mode_guard.mode_ceiling",
]
# Stage 8: `(call, content) -> content`; may replace the result content, never arguments.
# hide_read_denied: a search or listing never shows what a read rule denies (docs/rules.md).
HARNESS_POST_EXECUTE: list[str] = ["dispatcher.policy.results.hide_read_denied"]
# Stage 4's ask, recorded: `(*, call, presentation) -> None`, called inside the transaction
# that puts a call in pending_approval (the approval's request row); checked at start-up
# (dispatcher.E013). Not a signal: an ask without its request row must fail, not pass.
HARNESS_ASK_RECORDER = "approvals.asks.record_ask"
# What deactivating a person does beside taking their roles (audit.roles.deactivate),
# each `(*, user, actor, sponsor) -> dict` inside its transaction, what it returns joining
# the audit event; checked at start-up (audit.E010).
HARNESS_DEACTIVATION_STEPS = [
    # (first: the agents the steps below revoke, hand over or void, locked before any
    # audit chain is written, the order a worker's claim takes)
    "dispatcher.agents.lock_agents_of",
    "approvals.services.void_votes_of",
    # (before the hand-over: a signed-in agent's tokens are in the leaver's client)
    "agentauth.services.stop_signed_in_agents_of",
    "dispatcher.agents.release_agents_of",
    # (after the hand-over: a token the leaver was shown stops, also on an agent just
    # handed to a sponsor)
    "dispatcher.agents.void_tokens_shown_to",
]
# What a person's leaving a team does (teams.services.remove_member, when the role removed
# was their last in that team: by hand, by command or by the identity provider's group map),
# each `(*, team, user, actor) -> dict` inside its transaction, what it returns joining the
# audit event; checked at start-up (audit.E011).
HARNESS_TEAM_LEFT_STEPS = [
    "agentauth.services.stop_agents_of_leaver",
    # (a bearer token of the team's agents they were shown stops: dispatcher.agents)
    "dispatcher.agents.void_tokens_of_team_leaver",
]
# Stage 6: wraps every tool execution (budgets, retries, metrics belong here).
HARNESS_EXECUTE_WRAPPER = "dispatcher.pipeline.default_execute_wrapper"

HARNESS_DEFAULT_MODE = env("HARNESS_DEFAULT_MODE", "standard")
# The rules a user starts with (JSON: {"allow": [...], "ask": [...], "deny": [...]});
# checked at start-up (dispatcher.E030-E032).
try:
    HARNESS_DEFAULT_RULES = json.loads(env("HARNESS_DEFAULT_RULES", "{}"))
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"HARNESS_DEFAULT_RULES is not valid JSON: {exc}") from None
HARNESS_ALLOW_DESTRUCTIVE = env_bool("HARNESS_ALLOW_DESTRUCTIVE", False)
HARNESS_WORKSPACE_ROOT = Path(env("HARNESS_WORKSPACE_ROOT", str(DATA_DIR / "workspaces")))
HARNESS_MAX_BODY_BYTES = int(env("HARNESS_MAX_BODY_BYTES", str(1024 * 1024)))
# Seconds a client has to send one whole request (line, headers, body) to daphne; past it
# the connection is answered 408 and closed (harness_site.slow_clients; 0: no bound).
HARNESS_REQUEST_RECEIVE_TIMEOUT = float(env("HARNESS_REQUEST_RECEIVE_TIMEOUT", "30"))
# Seconds a response (an audit export) may wait for its client to take any of it; past it
# the connection is aborted (harness_site.slow_clients: a response is sent no faster than
# its client reads; 0: no bound).
HARNESS_RESPONSE_STALL_TIMEOUT = float(env("HARNESS_RESPONSE_STALL_TIMEOUT", "120"))
# Audit exports one web process streams at once (each holds a database connection while
# its client reads); past it 503 with Retry-After (audit.export.SLOTS; 0: no cap).
HARNESS_MAX_EXPORTS = int(env("HARNESS_MAX_EXPORTS", "4"))
# Of those, how many one person may stream at once (0: no share of their own): one auditor's
# slow downloads cannot hold every slot (audit.export.SLOTS).
HARNESS_MAX_EXPORTS_PER_PERSON = int(env("HARNESS_MAX_EXPORTS_PER_PERSON", "1"))
# And how many the auditors of one team may stream between them (organization-wide auditors
# share one such share; 0: none of its own): one team's auditors cannot hold every slot.
HARNESS_MAX_EXPORTS_PER_TEAM = int(env("HARNESS_MAX_EXPORTS_PER_TEAM", "2"))
# Connections one peer address (an IPv6 /64) may hold open to one daphne at once; past it a
# new one is closed as it opens (harness_site.slow_clients). 0: not counted, the default
# behind proxies of yours (HARNESS_TRUSTED_PROXY_COUNT), whose own address every connection
# comes from: bound connections per client address there.
HARNESS_MAX_CONNECTIONS_PER_ADDRESS = int(
    env("HARNESS_MAX_CONNECTIONS_PER_ADDRESS", "0" if HARNESS_TRUSTED_PROXY_COUNT else "256")
)
HARNESS_MAX_CALLS_PER_BATCH = int(env("HARNESS_MAX_CALLS_PER_BATCH", "64"))
HARNESS_MAX_WAIT = 60
HARNESS_OUTPUT_LIMIT = int(env("HARNESS_OUTPUT_LIMIT", "30000"))
# Every program a tool starts runs under bubblewrap ("bwrap"); "off" must be chosen
# explicitly (a start-up check refuses to run without the sandbox otherwise).
HARNESS_SANDBOX = env("HARNESS_SANDBOX", "bwrap")
# Sandboxed programs get no network unless the deployment allows it.
HARNESS_SANDBOX_NETWORK = env_bool("HARNESS_SANDBOX_NETWORK", False)
# More host paths sandboxed programs may read (absolute, comma-separated), e.g. a
# toolchain in /opt; Harness's own directories stay hidden even beneath them.
HARNESS_SANDBOX_READ_ONLY = env_list("HARNESS_SANDBOX_READ_ONLY")
# When Harness runs as root, sandboxed programs run as this unprivileged host user (a
# name, or UID:GID), never as root; `make sandbox` creates the system user.
HARNESS_SANDBOX_USER = env("HARNESS_SANDBOX_USER", "harness-sandbox")
# Memory one sandboxed program may use, in bytes (a memory cgroup per call where one can
# be made, else RLIMIT_AS per process); checked at start-up (dispatcher.E044).
HARNESS_SANDBOX_MEMORY = env("HARNESS_SANDBOX_MEMORY", str(2 << 30))
# Previews (docs/security.md, "Previews"): a run_command that asks first runs over a
# copy-on-write view of the workspace, with no network, for at most this many seconds and
# writing at most this many bytes; the reviewer sees its effect, and approving applies it.
HARNESS_PREVIEW = env_bool("HARNESS_PREVIEW", True)
HARNESS_PREVIEW_TIMEOUT = float(env("HARNESS_PREVIEW_TIMEOUT", "10"))
HARNESS_PREVIEW_MAX_BYTES = int(env("HARNESS_PREVIEW_MAX_BYTES", str(64 << 20)))
# The backstop for any tool: a worker child still inside one call this long is killed by
# its pool (a body that holds the GIL, a hung C call). Its call, still running, ends
# outcome_unknown when its lease expires (messages are acked early: never re-run). No
# soft limit: it would raise in the waiting thread and leave the tool thread running.
# Checked at start-up to exceed every tool's timeout by a margin (dispatcher.E042).
HARNESS_TASK_TIME_LIMIT = float(env("HARNESS_TASK_TIME_LIMIT", "90"))
CELERY_TASK_TIME_LIMIT = HARNESS_TASK_TIME_LIMIT
HARNESS_LEASE_GRACE = float(env("HARNESS_LEASE_GRACE", "30"))
# Decide-only calls: seconds a client has to report what an allowed tool did.
HARNESS_CLIENT_REPORT_LEASE = float(env("HARNESS_CLIENT_REPORT_LEASE", "900"))
HARNESS_REQUEUE_AFTER = float(env("HARNESS_REQUEUE_AFTER", "30"))

HARNESS_REPEAT_THRESHOLDS = [
    int(n) if n.lstrip("-").isdigit() else 0 for n in env_list("HARNESS_REPEAT_THRESHOLDS", "3,5,8")
]
HARNESS_REPEAT_PREVIEW_CHARS = int(env("HARNESS_REPEAT_PREVIEW_CHARS", "500"))
HARNESS_REPEAT_EXCLUDED_TOOLS = env_list("HARNESS_REPEAT_EXCLUDED_TOOLS")

HARNESS_APPROVAL_TIMEOUT = float(env("HARNESS_APPROVAL_TIMEOUT", "900"))
HARNESS_EXPIRY_ACTION = env("HARNESS_EXPIRY_ACTION", "deny")
HARNESS_FORBID_SELF_APPROVAL = env_bool("HARNESS_FORBID_SELF_APPROVAL", False)
# A change to the organization's policy layer waits as a proposal until a second org
# admin accepts it (docs/rules.md, "Two-person changes").
HARNESS_POLICY_TWO_PERSON = env_bool("HARNESS_POLICY_TWO_PERSON", False)


# The agent API's middleware (async-native only; see harness_site.asgi).
HARNESS_API_MIDDLEWARE = ["harness_site.middleware.APISecurityHeaders"]
DATA_UPLOAD_MAX_MEMORY_SIZE = HARNESS_MAX_BODY_BYTES

# --- Audit log: signed heads, checkpoints; agent waits (docs/audit.md, docs/security.md) ---
# The key that signs chain heads and checkpoints; never stored in the database. Without
# it, a key file in the data directory is created on first use (embedded default only:
# production sets the variable, the same in every process).
HARNESS_AUDIT_KEY = env("HARNESS_AUDIT_KEY")
HARNESS_AUDIT_KEY_FILE = Path(env("HARNESS_AUDIT_KEY_FILE", str(DATA_DIR / "audit.key")))
# Where beat appends signed heads (one JSON line per changed chain per run), and an
# optional URL that receives the same lines by POST; every INTERVAL seconds (0: never).
HARNESS_CHECKPOINT_PATH = env("HARNESS_CHECKPOINT_PATH", str(DATA_DIR / "audit-checkpoints.jsonl"))
HARNESS_CHECKPOINT_URL = env("HARNESS_CHECKPOINT_URL")
HARNESS_CHECKPOINT_INTERVAL = float(env("HARNESS_CHECKPOINT_INTERVAL", "300"))
if HARNESS_CHECKPOINT_INTERVAL > 0:
    CELERY_BEAT_SCHEDULE["audit-checkpoint"] = {
        "task": "audit.tasks.write_checkpoint",
        "schedule": HARNESS_CHECKPOINT_INTERVAL,
    }
# Fair shares per agent across every gateway and web process (dispatcher.limits,
# docs/security.md): requests held waiting at once (agent API ?wait=, hook requests, MCP
# calls), calls pending approval, new sessions per minute (0: no cap). Counted in Redis
# under HARNESS_LIMITS_PREFIX (pending asks: in the database).
HARNESS_MAX_WAITS_PER_AGENT = int(env("HARNESS_MAX_WAITS_PER_AGENT", "8"))
HARNESS_MAX_PENDING_ASKS_PER_AGENT = int(env("HARNESS_MAX_PENDING_ASKS_PER_AGENT", "50"))
HARNESS_MAX_SESSIONS_PER_MINUTE = int(env("HARNESS_MAX_SESSIONS_PER_MINUTE", "30"))
# ... and per person (an agent's owner), all of their agents together: waits held at once,
# by default half of an MCP gateway process's 32 ORM threads, so one person's agents never
# hold all of them (a whole number; 0: no cap per person; check dispatcher.E047).
HARNESS_MAX_WAITS_PER_PERSON = env("HARNESS_MAX_WAITS_PER_PERSON", "16").strip()
# Calls of one owner (person) running at once, on every worker together (dispatcher.batches,
# docs/security.md): `auto` leaves one of the worker's processes for other owners; 0: no cap.
HARNESS_MAX_RUNNING_PER_OWNER = env("HARNESS_MAX_RUNNING_PER_OWNER", "auto").strip().lower()
HARNESS_LIMITS_PREFIX = env("HARNESS_LIMITS_PREFIX", "harness:limits")
# MCP clients that open a transport session per call, or none (protocol 2026-07-28), stay
# in one Harness session per run: the agent's last MCP session from the same client is
# joined while it was used within this many seconds (0: every initialize starts a new
# one). docs/mcp.md, "Which session a request joins".
HARNESS_MCP_RUN_IDLE = float(env("HARNESS_MCP_RUN_IDLE", "900"))
# Requests per second of one agent across every gateway (a token bucket in Redis holding
# up to BURST requests), checked once its token is verified and before admission; 429
# with Retry-After beyond (0: no rate).
HARNESS_AGENT_REQUESTS_PER_SECOND = float(env("HARNESS_AGENT_REQUESTS_PER_SECOND", "20"))
HARNESS_AGENT_REQUEST_BURST = int(env("HARNESS_AGENT_REQUEST_BURST", "60"))
# ... and of one person's agents together (a bucket per owner, taken in the same Redis
# call; 0: no rate per person).
HARNESS_PERSON_REQUESTS_PER_SECOND = float(env("HARNESS_PERSON_REQUESTS_PER_SECOND", "40"))
HARNESS_PERSON_REQUEST_BURST = int(env("HARNESS_PERSON_REQUEST_BURST", "120"))
# Decide-only tool sets: the tools each client runs itself, resolved only for that
# client's sessions (never listed by GET /api/v1/tools). See docs/claude-code.md and
# docs/coding-agents.md.
HARNESS_CLIENT_TOOLS = {
    "claude-code": "dispatcher.tools.claude_code.TOOLSET",
    "codex": "dispatcher.tools.codex.TOOLSET",
    "gemini-cli": "dispatcher.tools.gemini.TOOLSET",
}
# The longest a hook request (POST /api/v1/hooks/claude-code?wait=S) is held while a
# reviewer decides, and the wait when the hook names none (below Claude Code's 60 s
# default hook timeout).
HARNESS_HOOK_MAX_WAIT = float(env("HARNESS_HOOK_MAX_WAIT", "3600"))
HARNESS_HOOK_DEFAULT_WAIT = float(env("HARNESS_HOOK_DEFAULT_WAIT", "50"))
# --- MCP gateway (/mcp/) and upstream MCP servers ---------------------------------------
# Tools per tools/list page, and seconds between progress notifications of a held call.
HARNESS_MCP_PAGE_SIZE = int(env("HARNESS_MCP_PAGE_SIZE", "100"))
HARNESS_MCP_PROGRESS_INTERVAL = float(env("HARNESS_MCP_PROGRESS_INTERVAL", "10"))
# A tools/call that needs nothing of the SDK's per-request server (no progress token, a
# handshake-era revision, a known session) is answered without it (docs/mcp.md, "The
# fast path"); off: every request goes through the SDK's transport.
HARNESS_MCP_FAST_PATH = env_bool("HARNESS_MCP_FAST_PATH", True)
# --- Outbound requests (docs/security.md, "Outbound requests") -------------------------
# Every request Harness makes goes through floor.outbound: loopback, private,
# link-local, CGNAT, multicast, reserved and metadata addresses are refused unless listed
# here (hosts, host:port, addresses, networks, address:port; comma-separated).
HARNESS_OUTBOUND_ALLOW = env_list("HARNESS_OUTBOUND_ALLOW")
# Seconds one outbound exchange may take in all, and the largest answer read.
HARNESS_OUTBOUND_TIMEOUT = float(env("HARNESS_OUTBOUND_TIMEOUT", "10"))
HARNESS_OUTBOUND_MAX_BYTES = int(env("HARNESS_OUTBOUND_MAX_BYTES", str(1024 * 1024)))
# A PEM file of extra certificate authorities the door trusts besides the public ones (a
# private CA of internal services); empty: only the public ones (certifi).
HARNESS_OUTBOUND_CA_FILE = env("HARNESS_OUTBOUND_CA_FILE")
# --- OAuth for agents (docs/mcp.md, "Sign in"; docs/security.md, "OAuth tokens") ---------
# Harness is the authorization server of its own MCP endpoint and hooks API, on
# django-oauth-toolkit. Access tokens are short-lived; refresh tokens rotate on every use
# and a reused one revokes its whole family. Tokens are stored hashed.
HARNESS_OAUTH_ACCESS_TOKEN_SECONDS = int(env("HARNESS_OAUTH_ACCESS_TOKEN_SECONDS", "3600"))
HARNESS_OAUTH_REFRESH_TOKEN_SECONDS = int(
    env("HARNESS_OAUTH_REFRESH_TOKEN_SECONDS", str(30 * 24 * 3600))
)
# Clients name themselves with a Client ID Metadata Document (an https URL Harness fetches
# through the outbound door). Dynamic client registration (RFC 7591) is off unless this
# switch turns it on (then any signed-in person may register a client).
HARNESS_OAUTH_DYNAMIC_REGISTRATION = env_bool("HARNESS_OAUTH_DYNAMIC_REGISTRATION", False)
# Clients one person may register in an hour (agentauth.views.ClientRegistrationView).
HARNESS_OAUTH_REGISTRATIONS_PER_HOUR = 10
# Active agents one person may hold made by consent to a client (a metadata document or a
# registration each makes one: agentauth.services); 0: no cap.
HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON = int(env("HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON", "20"))
if HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON < 0:
    # (a negative value read as "no cap", as 0 does, though no one wrote 0)
    raise ImproperlyConfigured(
        f"HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON is {HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON}: "
        "set how many active agents signed in through clients one person may hold (0: no cap)."
    )
# django-oauth-toolkit's own models, named (its models are swappable: a relation to one
# resolves through these settings).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth2_provider.AccessToken"
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth2_provider.RefreshToken"
OAUTH2_PROVIDER_GRANT_MODEL = "oauth2_provider.Grant"
OAUTH2_PROVIDER_DEVICE_GRANT_MODEL = "oauth2_provider.DeviceGrant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth2_provider.IDToken"


def _device_agent(request: object) -> None:
    """The device code grant's pre-token step (a function here: settings cannot import
    the apps): the person who approved the code, and the agent they approved it for."""
    from agentauth.device import before_token

    before_token(request)


OAUTH2_PROVIDER = {
    "SCOPES": {"agent": "Act as an agent through Harness (tool calls, hooks)"},
    "DEFAULT_SCOPES": ["agent"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": HARNESS_OAUTH_ACCESS_TOKEN_SECONDS,
    "REFRESH_TOKEN_EXPIRE_SECONDS": HARNESS_OAUTH_REFRESH_TOKEN_SECONDS,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ACCESS_TOKEN_GENERATOR": "agentauth.tokens.new_access_token",
    "REFRESH_TOKEN_GENERATOR": "agentauth.tokens.new_refresh_token",
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "PKCE_REQUIRED": True,
    # RFC 9700: S256 only, `iss` in authorization responses, no implicit or password
    # grant, tokens only in the Authorization header, tokens hashed at rest.
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_SCHEME": True,
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_MATCHING": True,
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
    # Native clients (Claude Code, Codex, mcp-remote) listen on a loopback port of their
    # choosing (RFC 8252 7.3): any port of a loopback redirect in the document matches.
    "ALLOW_LOCALHOST_LOOPBACK": True,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"],
    "REQUEST_APPROVAL_PROMPT": "force",
    "OAUTH2_VALIDATOR_CLASS": "agentauth.validators.AgentValidator",
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": [
        "authorization_code",
        "refresh_token",
        "urn:ietf:params:oauth:grant-type:device_code",
    ],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none"],
    "CIMD_ENABLED": True,
    "CIMD_METADATA_FETCHER": "agentauth.cimd.DoorFetcher",
    "DCR_ENABLED": HARNESS_OAUTH_DYNAMIC_REGISTRATION,
    "DEVICE_FLOW_INTERVAL": 5,
    "OAUTH_PRE_TOKEN_VALIDATION": [_device_agent],
    "OAUTH2_PROTECTED_RESOURCE_NAME": "Harness",
}
# --- Reviewers anywhere: one-tap links and notification channels (docs/notifications.md)
# The address reviewers reach this Harness at: the base of every link a notification carries.
HARNESS_PUBLIC_URL = env("HARNESS_PUBLIC_URL", "http://localhost:8000")
# Where `harness-hook login` sends a person to approve its device code.
OAUTH2_PROVIDER["OAUTH_DEVICE_VERIFICATION_URI"] = HARNESS_PUBLIC_URL.rstrip("/") + "/oauth/device/"
# Wrong device codes a signed-in person may type at /oauth/device/ (agentauth.views.device)
# before device sign-in is refused for them, a right code too, until the window passes:
# guessing another developer's pending code would make their machine act as the guesser's
# agent. Counted by allauth's rate limiter (ACCOUNT_RATE_LIMITS below), in Django's cache.
HARNESS_DEVICE_CODE_ATTEMPTS = 10
HARNESS_DEVICE_CODE_WINDOW = 15 * 60
# Device codes asked for (POST /oauth/device-authorization/, agentauth.views): no one is
# signed in there and each code is a row pending for 30 minutes. Per address, as many as
# allauth's sign-ins (30 a minute), so an organization behind one NAT still logs in
# (behind a proxy, see HARNESS_TRUSTED_PROXY_COUNT); and at most HARNESS_DEVICE_PENDING_MAX
# codes of one client pending at once, however many addresses ask. Per address also at
# most HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE over a code's life (oauthlib's 30 minutes),
# so that one address holds a small share of the cap: at 30 a minute alone, one machine
# kept the cap full for ever, and every new `harness-hook login` was refused.
HARNESS_DEVICE_AUTHORIZATIONS = 30
HARNESS_DEVICE_AUTHORIZATION_WINDOW = 60
HARNESS_DEVICE_CODE_LIFE = 1800  # oauthlib's DeviceAuthorizationEndpoint expires_in
HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE = int(env("HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE", "60"))
if HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE < 1:
    raise ImproperlyConfigured(
        f"HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE is {HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE}: "
        "set how many device codes one address may ask for in 30 minutes (1 or more)."
    )
# And per network (an IPv4 address's /24, an IPv6 address's /48) at most
# HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK over a code's life: counted per address
# alone, 17 IPv4 addresses or the /64s of one IPv6 /56 filled the cap below, so one
# network holds at most a fifth of it (3 addresses' worth by default).
HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK = int(
    env("HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK", "180")
)
if HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK < 1:
    raise ImproperlyConfigured(
        f"HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK is "
        f"{HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK}: set how many device codes one network "
        "(an IPv4 /24, an IPv6 /48) may ask for in 30 minutes (1 or more)."
    )
# One client's codes pending at once: at most HARNESS_DEVICE_PENDING_MAX from all networks
# together, a guard of the table's size; and once half of them are pending, a network
# holding HARNESS_DEVICE_PENDING_SHARE of them gets no more (agentauth.views._pending_full).
# harness-hook's client is everyone's: with one cap alone, six networks (each within its
# limit above) kept it full and no one's `harness-hook login` got a code. The networks
# that hold many are now refused first; the second half takes (cap / 2) / share networks
# more to fill (1000 by default).
HARNESS_DEVICE_PENDING_MAX = int(env("HARNESS_DEVICE_PENDING_MAX", "20000"))  # 0: no cap
if HARNESS_DEVICE_PENDING_MAX < 0:
    raise ImproperlyConfigured(
        f"HARNESS_DEVICE_PENDING_MAX is {HARNESS_DEVICE_PENDING_MAX}: set the number of "
        "device codes of one client that may wait for approval at once (0: no cap)."
    )
HARNESS_DEVICE_PENDING_SHARE = int(env("HARNESS_DEVICE_PENDING_SHARE", "10"))
if HARNESS_DEVICE_PENDING_SHARE < 1:
    raise ImproperlyConfigured(
        f"HARNESS_DEVICE_PENDING_SHARE is {HARNESS_DEVICE_PENDING_SHARE}: set how many of a "
        "client's pending device codes one network may hold once half of "
        "HARNESS_DEVICE_PENDING_MAX are pending (1 or more)."
    )
# And a block of networks (an IPv4 /16, an IPv6 /32: agentauth.views.device_aggregate)
# holding HARNESS_DEVICE_PENDING_AGGREGATE_SHARE of them gets no more either: one holder of
# many /48s (a provider's /32 holds 65,536) kept each within its share and filled the half
# kept for others. Ten networks' worth by default (harness.E005: below half the cap).
HARNESS_DEVICE_PENDING_AGGREGATE_SHARE = int(env("HARNESS_DEVICE_PENDING_AGGREGATE_SHARE", "100"))
if HARNESS_DEVICE_PENDING_AGGREGATE_SHARE < 1:
    raise ImproperlyConfigured(
        f"HARNESS_DEVICE_PENDING_AGGREGATE_SHARE is {HARNESS_DEVICE_PENDING_AGGREGATE_SHARE}: "
        "set how many of a client's pending device codes one block of networks (an IPv4 /16, "
        "an IPv6 /32) may hold once half of HARNESS_DEVICE_PENDING_MAX are pending (1 or more)."
    )
ACCOUNT_RATE_LIMITS = {
    "harness_device_code": f"{HARNESS_DEVICE_CODE_ATTEMPTS}/{HARNESS_DEVICE_CODE_WINDOW}s/user",
    "harness_client_registration": f"{HARNESS_OAUTH_REGISTRATIONS_PER_HOUR}/3600s/user",
    "harness_device_authorization": (
        f"{HARNESS_DEVICE_AUTHORIZATIONS}/{HARNESS_DEVICE_AUTHORIZATION_WINDOW}s/ip,"
        f"{HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE}/{HARNESS_DEVICE_CODE_LIFE}s/ip"
    ),
    # keyed by the network (agentauth.views.device_network), not allauth's /64
    "harness_device_authorization_network": (
        f"{HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK}/{HARNESS_DEVICE_CODE_LIFE}s/key"
    ),
}
# A one-tap link decides only for its recipient signed in; false lets the link alone
# stand for the recipient (whoever holds it can decide, once).
HARNESS_LINKS_REQUIRE_LOGIN = env_bool("HARNESS_LINKS_REQUIRE_LOGIN", True)
# Then whoever can sign a link decides as its recipient: refuse to start on a key that is
# not a real secret (a known constant, short, or Django's insecure placeholder).
if not HARNESS_LINKS_REQUIRE_LOGIN:
    from harness_site.secret_key import weak_secret_key

    if reason := weak_secret_key(SECRET_KEY):
        raise ImproperlyConfigured(
            f"HARNESS_LINKS_REQUIRE_LOGIN is false, so a one-tap link decides without a "
            f"login, but the secret key {reason}. Set HARNESS_SECRET_KEY to a long random "
            "string (or unset it on the embedded default to use a generated one)."
        )
# Channels created at start-up, each sending every ask to every reviewer.
HARNESS_WEBHOOK_URL = env("HARNESS_WEBHOOK_URL")
HARNESS_WEBHOOK_SECRET = env("HARNESS_WEBHOOK_SECRET")
HARNESS_SLACK_WEBHOOK_URL = env("HARNESS_SLACK_WEBHOOK_URL")
HARNESS_NOTIFY_EMAIL = env_list("HARNESS_NOTIFY_EMAIL")
# Web Push (VAPID): generate a key pair with `manage.py vapid_keys`.
HARNESS_VAPID_PUBLIC_KEY = env("HARNESS_VAPID_PUBLIC_KEY")
HARNESS_VAPID_PRIVATE_KEY = env("HARNESS_VAPID_PRIVATE_KEY")
HARNESS_VAPID_SUBJECT = env("HARNESS_VAPID_SUBJECT", "mailto:admin@localhost")
# Email through Django's mailer (any SMTP server).
MAILERS = {
    "default": {
        "BACKEND": env("HARNESS_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend"),
        "OPTIONS": {
            "host": env("HARNESS_EMAIL_HOST", "localhost"),
            "port": int(env("HARNESS_EMAIL_PORT", "25")),
            "username": env("HARNESS_EMAIL_USER"),
            "password": env("HARNESS_EMAIL_PASSWORD"),
            "use_tls": env_bool("HARNESS_EMAIL_TLS", False),
            "timeout": 10,
        },
    }
}
DEFAULT_FROM_EMAIL = env("HARNESS_EMAIL_FROM", "harness@localhost")
# OpenTelemetry: each finished call as an execute_tool span, to this OTLP/HTTP endpoint
# (e.g. http://127.0.0.1:4318). Empty: off. Needs the `otel` extra.
HARNESS_OTEL_ENDPOINT = env("HARNESS_OTEL_ENDPOINT", "")
HARNESS_OTEL_SERVICE_NAME = env("HARNESS_OTEL_SERVICE_NAME", "harness")
