"""safestop settings, read from the environment.

The embedded default (no DATABASE_URL, no REDIS_URL) is a SQLite file in WAL mode with
IMMEDIATE transactions, an in-memory channel layer and an in-process background loop.
DATABASE_URL switches to PostgreSQL; REDIS_URL switches channels and background work to Redis
and Celery.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONE, SELF

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def refuse_to_start(message: str) -> NoReturn:
    """Stop the process with a message an operator can act on, not a traceback."""
    raise SystemExit(f"safestop cannot start: {message}")


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# `production` (docker-compose.yml and docs/OPERATIONS.md set it) refuses to start on a public
# or weak secret key; anything else is a developer's machine.
SAFESTOP_ENV = os.environ.get("SAFESTOP_ENV", "development").strip().lower()
PRODUCTION = SAFESTOP_ENV == "production"
# Keys anyone can read in this repository: signing sessions or CSRF tokens with one lets anyone
# forge them.
PUBLIC_SECRET_KEYS = frozenset(
    {"dev-only-insecure-key-change-me-in-production", "change-me-in-production"}
)
SECRET_KEY = (
    os.environ.get("SAFESTOP_SECRET_KEY", "") or "dev-only-insecure-key-change-me-in-production"
)
if PRODUCTION and (
    SECRET_KEY in PUBLIC_SECRET_KEYS or len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5
):
    refuse_to_start(
        "SAFESTOP_ENV=production needs SAFESTOP_SECRET_KEY set to a private random value of at "
        "least 50 characters (it signs sessions and CSRF tokens). Make one with:\n"
        "    python -c 'import secrets; print(secrets.token_urlsafe(50))'\n"
        "and keep it the same on every process of the deployment."
    )
DEBUG = env_bool("SAFESTOP_DEBUG", False)
ALLOWED_HOSTS = env_list("SAFESTOP_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]")
CSRF_TRUSTED_ORIGINS = env_list(
    "SAFESTOP_CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000"
)

# HTTPS (docs/OPERATIONS.md, production checklist): behind a TLS proxy that sets
# X-Forwarded-Proto, with daphne --proxy-headers (which makes request.is_secure() true).
SAFESTOP_HTTPS = env_bool("SAFESTOP_HTTPS", False)
if SAFESTOP_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SAFESTOP_HSTS_SECONDS", 365 * 24 * 3600))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SAFESTOP_HSTS_INCLUDE_SUBDOMAINS", True)
    # Preloading puts the domain into browsers' own lists, which is slow to undo: the
    # operator's call (SAFESTOP_HSTS_PRELOAD=1), so its deploy check is not a warning here.
    SECURE_HSTS_PRELOAD = env_bool("SAFESTOP_HSTS_PRELOAD", False)
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Content-Security-Policy (django-csp): the console runs its own static scripts only — no
# inline script, no inline event handler, no eval (htmx's is off in base.html), no CDN.
# connect-src 'self' covers the same-origin websockets (ws:/wss:) in CSP Level 3 browsers.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_htmx",
    "template_partials",
    "axes",
    "csp",
    "runs",
    "api",
    "handoff",
    "notifications",
    "policies",
    "gateway",
    "accounts",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "console.middleware.ErrorAnswers",  # JSON errors under /api/, 503 without a database
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # after authentication: a signed-in user's own language wins over the cookie and the
    # browser's Accept-Language; times follow the user's team's time zone
    "console.middleware.UserLocale",
    "accounts.oidc.SessionRefresh",  # an IdP sign-in is re-checked every 15 minutes
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
    "console.middleware.SyncMiddlewareChain",  # last: keeps the chain above in one thread (why: the class)
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.template.context_processors.tz",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.views.needs_me.nav",
            ],
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql", "postgis"})
SQLITE_SCHEMES = frozenset({"sqlite", "sqlite3"})


def sqlite_database(name: str) -> dict[str, Any]:
    """The embedded default: one SQLite file in WAL mode with IMMEDIATE transactions."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        # IMMEDIATE takes the write lock at BEGIN: SQLite's answer to SELECT ... FOR UPDATE,
        # so two transitions on one run can never interleave.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": os.environ.get("SAFESTOP_SQLITE_TEST_PATH", "")},
    }


def postgres_database(url: str) -> dict[str, Any]:
    # A connection the server dropped (a restart, a failover, pg_terminate_backend) stays in
    # the pool looking idle; checked on the way out, it is replaced, so the next request gets a
    # live one instead of an error. The pool's check is the backend's (`console.postgresql`:
    # its socket first, a query only when the socket is not quiet); CONN_HEALTH_CHECKS would
    # add psycopg_pool's, a round trip before every request's first statement, so it is on only
    # without the pool (where it checks nothing either: CONN_MAX_AGE is 0).
    pooled = env_bool("SAFESTOP_DB_POOL", True)
    database: dict[str, Any] = dict(
        dj_database_url.parse(url, conn_max_age=0, conn_health_checks=not pooled)
    )
    database["ENGINE"] = "console.postgresql"
    # One psycopg pool per process. Without it every request and every websocket handshake
    # opens (and closes) a PostgreSQL connection: ~10 ms of a ~25 ms single-event request on
    # the bench machine (docs/BENCHMARKS.md). CONN_MAX_AGE stays 0, as Django requires with a
    # pool. max_size is a cap, not a reservation: threads that each hold a connection (the race
    # tests run 20 at once) must not wait for one another.
    if pooled:
        database.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": int(os.environ.get("SAFESTOP_DB_POOL_MAX_SIZE", 50)),
            "timeout": 10,
        }
    # The statements of `runs.sql` (the transitions' hand-built ones, bound by the server) are
    # prepared on their connection the first time they are sent; the ORM's own statements carry
    # their parameters in their text and are never prepared. A pooler in transaction mode
    # between safestop and PostgreSQL must keep prepared statements per server connection
    # (PgBouncer 1.21+: max_prepared_statements), or SAFESTOP_DB_PREPARED_STATEMENTS=0 turns
    # preparing off (docs/OPERATIONS.md).
    if env_bool("SAFESTOP_DB_PREPARED_STATEMENTS", True):
        database.setdefault("OPTIONS", {})["prepare_threshold"] = 0
    database.setdefault("TEST", {})
    # One test database per test session (the pid of pytest), so two suites on one machine never
    # share (or drop) each other's; SAFESTOP_TEST_DB_NAME names it instead.
    database["TEST"]["NAME"] = (
        os.environ.get("SAFESTOP_TEST_DB_NAME") or f"test_safestop_{os.getpid()}"
    )
    return database


def database_from_url(url: str) -> dict[str, Any]:
    """PostgreSQL, or a SQLite file configured exactly like the embedded default; any other
    scheme (or a URL that does not parse) stops the start with a message, not a traceback."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in POSTGRES_SCHEMES:
        return postgres_database(url)
    if scheme in SQLITE_SCHEMES:
        name = dj_database_url.parse(url)["NAME"]
        if not name or name == ":memory:":
            refuse_to_start(
                f"DATABASE_URL={url!r} names no file: use sqlite:///relative/path or "
                "sqlite:////absolute/path, or unset DATABASE_URL and set SAFESTOP_SQLITE_PATH"
            )
        return sqlite_database(name)
    refuse_to_start(
        f"DATABASE_URL scheme {scheme or '(none)'!r} is not supported: use "
        "postgres://user:password@host:5432/name for PostgreSQL, or unset it (SAFESTOP_SQLITE_PATH "
        "names the embedded SQLite file; sqlite:///path works too)"
    )


if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    DATABASES = {
        "default": sqlite_database(
            os.environ.get("SAFESTOP_SQLITE_PATH", str(BASE_DIR / "safestop.sqlite3"))
        )
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

# Failed console sign-ins are throttled by django-axes per (username, client address) pair:
# after SAFESTOP_LOGIN_FAILURE_LIMIT failures that pair is locked (the login page says so, 429 +
# Retry-After) for SAFESTOP_LOGIN_COOLOFF_SECONDS, doubling with each further lockout of the pair
# up to SAFESTOP_LOGIN_COOLOFF_MAX_SECONDS (`console.views.auth.login_cool_off`). Neither the
# username alone nor the address alone is locked: wrong passwords typed for a reviewer never
# keep that reviewer, or anyone else behind the same address, away from the Stop button.
# Attempts live in the database, so every web process sees the same count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "accounts.backends.PasswordBackend",  # superusers only with SAFESTOP_PASSWORD_LOGIN=off
    "accounts.oidc.OIDCBackend",  # the organisation's IdP (DESIGN §16), when configured
]
AXES_FAILURE_LIMIT = int(os.environ.get("SAFESTOP_LOGIN_FAILURE_LIMIT", 5))
SAFESTOP_LOGIN_COOLOFF_SECONDS = int(os.environ.get("SAFESTOP_LOGIN_COOLOFF_SECONDS", 300))
SAFESTOP_LOGIN_COOLOFF_MAX_SECONDS = int(
    os.environ.get("SAFESTOP_LOGIN_COOLOFF_MAX_SECONDS", 24 * 3600)
)
AXES_COOLOFF_TIME = "console.views.auth.login_cool_off"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.views.auth.login_locked_out"
# REMOTE_ADDR, as for the API's limits: daphne --proxy-headers puts the client's address there;
# an X-Forwarded-For read here would let a guesser pick a new address per attempt.
AXES_CLIENT_IP_CALLABLE = "api.ratelimit.client_address"
AXES_ENABLE_ACCESS_FAILURE_LOG = True  # each failure with its time: /metrics counts them
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins are not ours to keep
AXES_SENSITIVE_PARAMETERS = ["password"]
AXES_WHITELIST_CALLABLE = "accounts.oidc.is_idp_sign_in"  # the IdP's callback guesses nothing

# Signing in with the organisation's OpenID Connect provider (DESIGN §16; docs/OPERATIONS.md,
# "Single sign-on"). Unset issuer: password sign-in only, as in development. The endpoints come
# from the issuer's discovery document (accounts/oidc.py), so these are all an operator sets.
SAFESTOP_OIDC_ISSUER = os.environ.get("SAFESTOP_OIDC_ISSUER", "").strip().rstrip("/")
SAFESTOP_OIDC_CLIENT_ID = os.environ.get("SAFESTOP_OIDC_CLIENT_ID", "")
SAFESTOP_OIDC_CLIENT_SECRET = os.environ.get("SAFESTOP_OIDC_CLIENT_SECRET", "")
SAFESTOP_OIDC_GROUPS_CLAIM = os.environ.get("SAFESTOP_OIDC_GROUPS_CLAIM", "groups")
SAFESTOP_OIDC_PROVIDER_NAME = os.environ.get("SAFESTOP_OIDC_PROVIDER_NAME", "")
# A JSON object, IdP group → "team:role": seeds the admins' table at start (accounts.services).
SAFESTOP_OIDC_GROUP_ROLES = os.environ.get("SAFESTOP_OIDC_GROUP_ROLES", "")
SAFESTOP_PASSWORD_LOGIN = env_bool("SAFESTOP_PASSWORD_LOGIN", True)
# The IdP's SCIM client authenticates with this bearer token; unset, /scim/v2/ answers 404.
SAFESTOP_SCIM_TOKEN = os.environ.get("SAFESTOP_SCIM_TOKEN", "")
if SAFESTOP_OIDC_ISSUER and not SAFESTOP_OIDC_CLIENT_ID:
    refuse_to_start("SAFESTOP_OIDC_ISSUER is set but SAFESTOP_OIDC_CLIENT_ID is not")
# mozilla-django-oidc: authorization code + PKCE S256, nonce, the ID token kept for the IdP's
# logout, and the session re-checked through the IdP every SAFESTOP_OIDC_RECHECK_SECONDS.
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True
OIDC_RP_SIGN_ALGO = os.environ.get("SAFESTOP_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("SAFESTOP_OIDC_SCOPES", "openid email profile")
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = int(os.environ.get("SAFESTOP_OIDC_RECHECK_SECONDS", 900))
OIDC_AUTHENTICATION_CALLBACK_URL = "accounts:sso_callback"
OIDC_TIMEOUT = 10
OIDC_CREATE_USER = True

# English stays the default (a browser that asks for neither language gets English); Simplified
# Chinese for `Accept-Language: zh-CN`, `zh`, `zh-Hans`, `zh-SG` (console.middleware.UserLocale
# maps the bare and regional codes Django's own lookup does not).
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "console:login"

DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("SAFESTOP_MAX_BODY_BYTES", 1024 * 1024))

REDIS_URL = os.environ.get("REDIS_URL", "")
# Redis Pub/Sub has no databases: browser frames are namespaced by this prefix instead
# (default: the database number of REDIS_URL). Give each deployment sharing a Redis its own.
VIEWER_CHANNEL_PREFIX = os.environ.get("SAFESTOP_VIEWER_CHANNEL_PREFIX") or (
    f"safestop-db{urlsplit(REDIS_URL).path.strip('/') or '0'}" if REDIS_URL else ""
)

# Two channel layers (console/realtime.py says who sends what where):
# - "default": what agent workers listen on (`agent_<run_id>`, the stop signal). Reliable
#   delivery: the stop signal must not be lost while a worker is connected.
# - "viewers": what browsers listen on (`run_<id>`, `team_<id>`), many sockets per change.
# The in-memory layer is one instance per alias: a publisher and its consumers must use the
# same alias, or frames go nowhere (`console.realtime.VIEWER_LAYER` names it in the code).

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default: exactly channels-redis's
            # 5 s BZPOPMIN, so a websocket idle for 5 s would die with "Timeout reading from
            # redis" (django/channels_redis#422). Allow a read to outlast the blocking pop; a
            # Redis that truly stops answering still times out.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                "capacity": 5000,
                "expiry": 30,
            },
        },
        "viewers": {
            # Pub/Sub: one PUBLISH per change, and each daphne process fans it out to its own
            # sockets; the core layer above writes one Redis message per socket per change, popped
            # one by one (200 viewers of a busy run: p99 4.9 s; docs/BENCHMARKS.md, fan-out).
            # At most once: a frame published while a process's subscription is down (Redis restart,
            # dropped connection; it resubscribes by itself) is lost. That is fine for browsers only: every frame carries the run's `seq`, and console.js refetches
            # when it sees a gap. Never put the stop signal on this layer.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # Its reader polls with a 0.1 s timeout, so the 5 s default does not cut idle sockets
            # (tests/console/test_viewer_layer.py idles past it); kept equal to "default" so a slow
            # Redis is judged the same way on both. Pub/Sub channels ignore the database number,
            # so the prefix carries it: two deployments on one Redis server (or the test suite
            # and the bench) must not see each other's `team_1` frames.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                "prefix": VIEWER_CHANNEL_PREFIX,
            },
        },
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 5000},
        },
        "viewers": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 5000},
        },
    }

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.api_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "safestop API",
    "DESCRIPTION": "Wire contract for agent runtimes and reviewers: runs, leases, permits, "
    "tool results, events, outbox, stops, stop packets, resolutions, ledger.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # one name per choice set in the schema (fields named `status` carry several)
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.models.RunStatus",
        "ApprovalStatusEnum": "runs.models.ApprovalStatus",
        "ApprovalTargetEnum": "runs.models.ApprovalTarget",
        "ResolutionDecisionEnum": "handoff.models.ResolutionDecision",
        "EventOutcomeEnum": ["accepted", "duplicate", "rejected"],
        # an approval rule's side effect: "write", or blank for any call
        "RuleSideEffectEnum": "api.serializers.RULE_SIDE_EFFECTS",
        # "transport" names three choice sets: an outbox item's, a rule's, an MCP upstream's
        "OutboxTransportEnum": ["webhook", "email"],
        "McpTransportEnum": "gateway.models.Transport",
    },
}

# --- safestop's own knobs -----------------------------------------------------------------
SAFESTOP_DRAIN_DEADLINE_SECONDS = float(os.environ.get("SAFESTOP_DRAIN_DEADLINE_SECONDS", 30))
# An approval no rule times out (the agent asked for it itself) waits this long, then expires
# as a rejection (DESIGN §10: deny by default).
SAFESTOP_APPROVAL_TIMEOUT_SECONDS = int(os.environ.get("SAFESTOP_APPROVAL_TIMEOUT_SECONDS", 900))
# Agent-supplied JSON Schemas for a reviewer's edits (runs.argument_schemas): the schema's size at
# the permit; the edited arguments' size at the decision; and the child process that checks
# them (and a schema of more than 64 subschemas against the meta-schema): killed past its
# seconds, its address space capped.
SAFESTOP_ARGUMENTS_SCHEMA_MAX_BYTES = int(
    os.environ.get("SAFESTOP_ARGUMENTS_SCHEMA_MAX_BYTES", 32 * 1024)
)
SAFESTOP_ARGUMENTS_MAX_BYTES = int(os.environ.get("SAFESTOP_ARGUMENTS_MAX_BYTES", 1024 * 1024))
SAFESTOP_ARGUMENTS_CHECK_SECONDS = float(os.environ.get("SAFESTOP_ARGUMENTS_CHECK_SECONDS", 5))
SAFESTOP_ARGUMENTS_CHECK_MEMORY_BYTES = int(
    os.environ.get("SAFESTOP_ARGUMENTS_CHECK_MEMORY_BYTES", 512 * 1024 * 1024)
)
# API answers: a list item carries the first characters of its arguments (the detail has them
# whole), and a list page stops adding items once its JSON passes this many bytes.
SAFESTOP_API_LIST_ARGUMENTS_CHARS = int(os.environ.get("SAFESTOP_API_LIST_ARGUMENTS_CHARS", 300))
SAFESTOP_API_PAGE_MAX_BYTES = int(os.environ.get("SAFESTOP_API_PAGE_MAX_BYTES", 2 * 1024 * 1024))
# Approval requests one team may make in a sliding minute; past it a permit or outbox item that
# would be held answers 429 `approval_rate_limited` with Retry-After (0 turns it off).
SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE = int(
    os.environ.get("SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE", 120)
)
SAFESTOP_DISPATCH_DEADLINE_SECONDS = float(os.environ.get("SAFESTOP_DISPATCH_DEADLINE_SECONDS", 60))
SAFESTOP_WEBHOOK_ALLOWED_HOSTS = env_list("SAFESTOP_WEBHOOK_ALLOWED_HOSTS", "")

# The MCP gateway (gateway/, `/mcp/<name>/`). Upstream secrets (env, headers) are sealed with a
# key derived from SAFESTOP_MCP_SECRET_KEY, or SECRET_KEY when it is empty. A session leases its
# run for SAFESTOP_MCP_LEASE_TTL_SECONDS (renewed every third of it) and ends, like a client
# that left, after SAFESTOP_MCP_SESSION_IDLE_SECONDS without a request. A request the upstream
# sends the client (sampling, elicitation) waits SAFESTOP_MCP_CLIENT_ANSWER_SECONDS for its answer.
SAFESTOP_MCP_SECRET_KEY = os.environ.get("SAFESTOP_MCP_SECRET_KEY", "")
SAFESTOP_MCP_MAX_MESSAGE_BYTES = int(os.environ.get("SAFESTOP_MCP_MAX_MESSAGE_BYTES", "1048576"))
SAFESTOP_MCP_LEASE_TTL_SECONDS = float(os.environ.get("SAFESTOP_MCP_LEASE_TTL_SECONDS", "30"))
SAFESTOP_MCP_SESSION_IDLE_SECONDS = float(
    os.environ.get("SAFESTOP_MCP_SESSION_IDLE_SECONDS", "1800")
)
SAFESTOP_MCP_CLIENT_ANSWER_SECONDS = float(
    os.environ.get("SAFESTOP_MCP_CLIENT_ANSWER_SECONDS", "600")
)
SAFESTOP_WEBHOOK_CONNECT_TIMEOUT = float(os.environ.get("SAFESTOP_WEBHOOK_CONNECT_TIMEOUT", 3))
SAFESTOP_WEBHOOK_READ_TIMEOUT = float(os.environ.get("SAFESTOP_WEBHOOK_READ_TIMEOUT", 10))
SAFESTOP_DEFAULT_LEASE_TTL = float(os.environ.get("SAFESTOP_DEFAULT_LEASE_TTL", 30))
SAFESTOP_RATE_LIMIT_PER_MINUTE = int(os.environ.get("SAFESTOP_RATE_LIMIT_PER_MINUTE", 6000))
# Wrong bearer tokens one client address may send per minute before every bearer request from it
# answers 429 until the minute ends (api/ratelimit.py); 0 turns it off.
SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE = int(os.environ.get("SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE", 30))
SAFESTOP_SERVE_STATIC = env_bool("SAFESTOP_SERVE_STATIC", True)
SAFESTOP_BACKGROUND_INTERVAL = float(os.environ.get("SAFESTOP_BACKGROUND_INTERVAL", 0.5))
# With Celery: the period of beat's safety-net sweeps. Work is woken by kicks and at deadlines
# (runs.tasks); the net only catches what a lost kick or wake missed.
SAFESTOP_SAFETY_NET_SECONDS = float(os.environ.get("SAFESTOP_SAFETY_NET_SECONDS", 30))
# Browser websockets re-read their user's access this often (seconds; 0 disables), in case an
# `access.changed` message was lost on the at-most-once viewers layer (console/consumers.py).
SAFESTOP_WS_ACCESS_RECHECK_SECONDS = float(os.environ.get("SAFESTOP_WS_ACCESS_RECHECK_SECONDS", 60))

# Notifications (DESIGN §11; docs/OPERATIONS.md, "Notifications"). Links in messages point here;
# unset, `manage.py serve` sets it to the address it listens on (this default is for the rest).
SAFESTOP_PUBLIC_URL = os.environ.get("SAFESTOP_PUBLIC_URL", "http://127.0.0.1:8000")
SAFESTOP_NOTIFY_MAX_ATTEMPTS = int(os.environ.get("SAFESTOP_NOTIFY_MAX_ATTEMPTS", 8))
SAFESTOP_NOTIFY_RETRY_BASE_SECONDS = float(os.environ.get("SAFESTOP_NOTIFY_RETRY_BASE_SECONDS", 10))
SAFESTOP_NOTIFY_RETRY_MAX_SECONDS = float(os.environ.get("SAFESTOP_NOTIFY_RETRY_MAX_SECONDS", 3600))
# A delivery still `sending` after this long was claimed by a sender that died: sent again.
SAFESTOP_NOTIFY_STUCK_SECONDS = float(os.environ.get("SAFESTOP_NOTIFY_STUCK_SECONDS", 300))
# How long one tick of the embedded loop keeps starting sends.
SAFESTOP_NOTIFY_TICK_SECONDS = float(os.environ.get("SAFESTOP_NOTIFY_TICK_SECONDS", 2))
# Apprise URL schemes a channel may use. Whatever the scheme, the host it posts to must be on
# SAFESTOP_WEBHOOK_ALLOWED_HOSTS (notifications/apprise_targets.py). The generic json:// /
# form:// / xml:// are left off the default; msteams:// too (Microsoft retired its connectors
# and Apprise's plugin fails every send: use workflows://).
SAFESTOP_NOTIFY_APPRISE_SCHEMES = env_list(
    "SAFESTOP_NOTIFY_APPRISE_SCHEMES", "workflows,discord,tgram,pover,pagerduty,opsgenie"
)
# Slack interactivity (Approve / Reject buttons) is on when this is set.
SAFESTOP_SLACK_SIGNING_SECRET = os.environ.get("SAFESTOP_SLACK_SIGNING_SECRET", "")
SAFESTOP_HANDOFF_REMIND_SECONDS = float(os.environ.get("SAFESTOP_HANDOFF_REMIND_SECONDS", 1800))
SAFESTOP_LEDGER_VERIFY_SECONDS = float(os.environ.get("SAFESTOP_LEDGER_VERIFY_SECONDS", 3600))

# The ledger's keys (runs/ledger_keys.py; docs/OPERATIONS.md, "The ledger against a database
# writer"): every entry and every anchor is an HMAC with a key kept out of the database, so
# someone who can write the database cannot recompute a chain. One or more `id:secret` separated
# by whitespace or commas; the first signs, the others only verify (rotation). From the
# environment, or from the file SAFESTOP_LEDGER_KEY_FILE names (a mounted secret).
DEV_LEDGER_KEY = "dev:dev-only-insecure-ledger-key-change-me-in-production"
_ledger_key_file = os.environ.get("SAFESTOP_LEDGER_KEY_FILE", "")
SAFESTOP_LEDGER_KEY = os.environ.get("SAFESTOP_LEDGER_KEY", "") or (
    Path(_ledger_key_file).read_text().strip() if _ledger_key_file else DEV_LEDGER_KEY
)
if PRODUCTION and SAFESTOP_LEDGER_KEY == DEV_LEDGER_KEY:
    # A warning, not a refusal: the ledger still chains and verifies; but anyone who can write
    # the database can also recompute its hashes with a key published here (check --deploy
    # reports it too: runs/checks.py).
    sys.stderr.write(
        "safestop WARNING: SAFESTOP_ENV=production with the public development ledger key: set "
        "SAFESTOP_LEDGER_KEY (or SAFESTOP_LEDGER_KEY_FILE) to `id:secret`, secret from\n"
        "    python -c 'import secrets; print(secrets.token_urlsafe(32))'\n"
    )
# Where the walks write signed chain heads (runs/ledger_anchors.py): outside the database, on
# storage its writers cannot reach. One directory per database; empty turns anchors off.
SAFESTOP_LEDGER_ANCHOR_DIR = os.environ.get(
    "SAFESTOP_LEDGER_ANCHOR_DIR", str(BASE_DIR / "var" / "ledger-anchors")
)

# Email: SMTP when SAFESTOP_EMAIL_HOST is set; otherwise mails are kept in the database and shown
# on the console's "Outbox of notifications" page (the demo), never sent anywhere.
EMAIL_HOST = os.environ.get("SAFESTOP_EMAIL_HOST", "")
EMAIL_PORT = int(os.environ.get("SAFESTOP_EMAIL_PORT", 587 if EMAIL_HOST else 25))
EMAIL_HOST_USER = os.environ.get("SAFESTOP_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("SAFESTOP_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("SAFESTOP_EMAIL_USE_TLS", bool(EMAIL_HOST))
EMAIL_TIMEOUT = float(os.environ.get("SAFESTOP_EMAIL_TIMEOUT", 10))
EMAIL_BACKEND = os.environ.get(
    "SAFESTOP_EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "notifications.mail.CaptureEmailBackend",
)
DEFAULT_FROM_EMAIL = os.environ.get("SAFESTOP_FROM_EMAIL", "safestop@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("SAFESTOP_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # httpx logs every request's URL at INFO: a Slack webhook URL is its own credential.
        "httpx": {"level": "WARNING"},
    },
}
