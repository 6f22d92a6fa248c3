"""Settings, read from the environment, with embedded defaults that need nothing but Python.

Embedded: SQLite in var/ (WAL), the in-memory channel layer, the offline planner.
Scale-out: DATABASE_URL (PostgreSQL) and REDIS_URL (channels-redis) switch both.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import jinja2
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from django.utils.functional import lazy

# Importing the settings changes nothing on disk: var/ and the secret key file are made at first use
# (the SQLite backend creates its folder when it first connects; the key when something first signs).
BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PLANNER_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


@functools.cache
def secret_key_file() -> str:
    """The key generated once and kept in var/secret_key (never in the repository). Made on first use, by
    whichever process signs something first; O_EXCL lets two processes starting together agree on one key."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY: str = os.environ.get("SECRET_KEY") or lazy(secret_key_file, str)()  # type: ignore[assignment]
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "planner_site",
    "agents",
    "goals",
    "planning",
    "notifications",
    "policies",
    "runtime",  # above the domain: drives the cycles, the notifications' dispatch and retention
    "ninja",  # the external agents' API: its OpenAPI docs page
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last but one: it turns a lockout into the login page, as django-axes asks
    # NUL or invalid UTF-8 in a query or form: a 400 before any view. Last and sync only, so the whole chain runs
    # in the request's thread without hopping to the event loop and back per middleware (request_guard.py).
    "planner_site.request_guard.RequestTextMiddleware",
]

ROOT_URLCONF = "planner_site.urls"
ASGI_APPLICATION = "planner_site.asgi.application"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
                "planner_site.roles.roles_context",
            ],
        },
    },
    {
        # The rows drawn by the thousand (a plan's steps, the dashboard's agents): Jinja2 draws a row several times
        # faster than the Django template language, which made the 1,000-step plan page 3x its bare baseline
        # (docs/architecture.md "Templates").
        "NAME": "jinja2",
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "DIRS": [BASE_DIR / "templates" / "jinja2"],
        "APP_DIRS": False,
        # Every value is escaped as a Django template escapes it: planner_site/jinja_env.py.
        "OPTIONS": {"environment": "planner_site.jinja_env.environment", "undefined": jinja2.StrictUndefined},
    },
]

def db_stall_bounds(*, idle_in_transaction: float, statement: float, tcp_user_timeout: float,
                    keepalives_idle: int) -> dict[str, Any]:
    """libpq connection parameters bounding how long a cut-off connection holds anything: client keepalives and
    TCP user timeout, a 10 s connect timeout (a SYN into a cut network is otherwise retried for minutes), and the
    same on the server's side of the socket plus the session timeouts (`options`)."""
    ms = {"idle_in_transaction_session_timeout": int(idle_in_transaction * 1000),
          "statement_timeout": int(statement * 1000), "tcp_user_timeout": int(tcp_user_timeout * 1000),
          "tcp_keepalives_idle": keepalives_idle, "tcp_keepalives_interval": 2, "tcp_keepalives_count": 3}
    return {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": keepalives_idle, "keepalives_interval": 2,
            "keepalives_count": 3, "tcp_user_timeout": int(tcp_user_timeout * 1000),
            "options": " ".join(f"-c {name}={value}" for name, value in ms.items())}


SQLITE_PATH = Path(os.environ.get("SQLITE_PATH", VAR_DIR / "planner.sqlite3"))
if os.environ.get("DATABASE_URL"):
    DATABASES: dict[str, Any] = {
        "default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "60")))
    }
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get("TEST_DATABASE_NAME", "test_planner")
    # Bounded stalls (docs/runtime-guarantees.md): a process cut off from the database (a failing switch, a paused
    # VM) must not hold its row locks for hours. The server ends a session idle in a transaction after
    # DB_IDLE_IN_TRANSACTION_SECONDS and a statement after DB_STATEMENT_TIMEOUT_SECONDS (0: no limit), and both
    # ends probe an idle socket (TCP keepalives) and give up on unacknowledged data after DB_TCP_USER_TIMEOUT_SECONDS.
    DB_IDLE_IN_TRANSACTION_SECONDS = float(os.environ.get("DB_IDLE_IN_TRANSACTION_SECONDS", "5"))
    DB_STATEMENT_TIMEOUT_SECONDS = float(os.environ.get("DB_STATEMENT_TIMEOUT_SECONDS", "30"))
    DB_TCP_USER_TIMEOUT_SECONDS = float(os.environ.get("DB_TCP_USER_TIMEOUT_SECONDS", "10"))
    DB_KEEPALIVES_IDLE_SECONDS = int(os.environ.get("DB_KEEPALIVES_IDLE_SECONDS", "5"))
    DB_POOL_RECONNECT_SECONDS = float(os.environ.get("DB_POOL_RECONNECT_SECONDS", "5"))
    DATABASES["default"].setdefault("OPTIONS", {}).update(db_stall_bounds(
        idle_in_transaction=DB_IDLE_IN_TRANSACTION_SECONDS, statement=DB_STATEMENT_TIMEOUT_SECONDS,
        tcp_user_timeout=DB_TCP_USER_TIMEOUT_SECONDS, keepalives_idle=DB_KEEPALIVES_IDLE_SECONDS))
    if env_bool("DB_POOL", True):
        # A pool per process (PostgreSQL allows 100 connections here): a thread gives its connection back
        # while it waits for a model, so a runner drives many agents on a few connections. Connections are
        # checked when taken, so one terminated under the process is replaced, not handed out broken.
        from planner_site.db_pool import pool_connection_check

        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool requires it: "closing" returns to the pool
        # A connection the pool failed to make is retried with a backoff that doubles (1, 2, 4 ... s) until
        # `reconnect_timeout`, and the pool does not grow meanwhile: after an outage of minutes the next try could
        # come a minute after the database is back, every thread failing for want of a connection. Given up after
        # DB_POOL_RECONNECT_SECONDS, the next request for a connection tries again at once.
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1, "max_size": int(os.environ.get("DB_POOL_MAX_SIZE", "10")), "timeout": 10,
            "check": pool_connection_check, "reconnect_timeout": DB_POOL_RECONNECT_SECONDS,
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "planner_site.sqlite",  # Django's SQLite backend, creating the file's folder on connect
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                # The runner and the web share one file: WAL lets readers go on while one writes, IMMEDIATE
                # takes the write lock up front (no deadlocked upgrades), the timeout waits instead of failing.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # One test database file per test process, so parallel runs never share one.
            "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH", str(VAR_DIR / f"test-{os.getpid()}.sqlite3"))},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Scale-out runs agents' cycles as jobs of Procrastinate, a PostgreSQL job engine (runtime/tasks.py);
# its Django app brings its tables (migrations) and admin pages to watch the jobs. The embedded stack has no
# use for it (SQLite, one process).
SCALE_OUT = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if SCALE_OUT:
    INSTALLED_APPS.append("procrastinate.contrib.django")
PROCRASTINATE_AUTODISCOVER_MODULE_NAME = ""
PROCRASTINATE_ON_APP_READY = "runtime.tasks.on_app_ready"

if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub has no per-channel capacity, so a burst of events is not dropped silently (STACK.md),
            # and socket_timeout=None keeps redis-py 8 from killing idle readers after 5 s.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [{"address": os.environ["REDIS_URL"], "socket_timeout": None}],
                "prefix": os.environ.get("CHANNELS_PREFIX", "planner"),
            },
        }
    }
    # One cache for every process (the API's rate limit per token counts across all web processes).
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
            "KEY_PREFIX": os.environ.get("CHANNELS_PREFIX", "planner"),
            # Bounded stalls (docs/runtime-guarantees.md): a process cut off from Redis fails a cache call after
            # these seconds instead of waiting until TCP gives up (a runner's pass reads the cache; minutes).
            "OPTIONS": {"socket_timeout": float(os.environ.get("REDIS_TIMEOUT_SECONDS", "5")),
                        "socket_connect_timeout": float(os.environ.get("REDIS_TIMEOUT_SECONDS", "5"))},
        }
    }
    # Sessions stay in the database alone: Django's cached_db sessions (one round trip fewer a page) fail every page
    # while Redis is away, since their cache write after a miss is not guarded (tests/browser/test_live.py
    # test_pages_resync_after_a_redis_outage).
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The server's websockets (live pages, agents' sockets) without per-message compression; LIVE_WS_DEFLATE=1 offers
# it. Each socket compresses every update again with a compressor of its own, so a fan-out of one update to many
# open pages compresses the same text once per page, for updates of a few KB (docs/performance.md).
LIVE_WS_DEFLATE = env_bool("LIVE_WS_DEFLATE", False)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": int(os.environ.get("PASSWORD_MIN_LENGTH", "10"))}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one username, or from one
# address, logins for it are locked for LOGIN_LOCKOUT_MINUTES; the login page says so (HTTP 429). Failures
# are counted in the database, so every web process of a scale-out deployment shares them.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one alone locks
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "planner_site.accounts.login_locked_out"
AXES_CLIENT_IP_CALLABLE = "planner_site.accounts.client_ip"
AXES_DISABLE_ACCESS_LOG = True  # failures only: successful logins are not logged row by row
AXES_VERBOSE = False
# Behind this many reverse proxies (each appending to X-Forwarded-For), the client address is read from there.
TRUSTED_PROXY_COUNT = int(os.environ.get("TRUSTED_PROXY_COUNT", "0"))

# Request bodies are read at the ASGI level under these limits before Django sees them (planner_site/asgi_guards.py):
# larger is a 413 before it is read (the API has its own, smaller API_MAX_BODY_BYTES); a body that stalls or never
# comes is a 408 after REQUEST_BODY_TIMEOUT_SECONDS.
REQUEST_MAX_BODY_BYTES = int(os.environ.get("REQUEST_MAX_BODY_BYTES", str(2_621_440)))  # Django's form default
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_MAX_BODY_BYTES
REQUEST_BODY_TIMEOUT_SECONDS = float(os.environ.get("REQUEST_BODY_TIMEOUT_SECONDS", "10"))

# Mail (Django 6.1's MAILERS): set EMAIL_HOST to send mail; password reset is offered only then.
MAILERS: dict[str, Any] = {}
# Mail is optional here (nothing but password reset sends any), so no mailer is not a misconfiguration.
SILENCED_SYSTEM_CHECKS = [] if os.environ.get("EMAIL_HOST") else ["mail.W001"]
if os.environ.get("EMAIL_HOST"):
    MAILERS["default"] = {
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": os.environ["EMAIL_HOST"],
            "port": int(os.environ.get("EMAIL_PORT", "587")),
            "username": os.environ.get("EMAIL_HOST_USER", ""),
            "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
            "use_tls": env_bool("EMAIL_USE_TLS", True),
        },
    }
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "planner@localhost")
# Notifications (notifications/) go out by their own mailer: the console (the server's output) without EMAIL_HOST.
MAILERS["notifications"] = MAILERS.get("default") or {"BACKEND": "django.core.mail.backends.console.EmailBackend"}

# Notifications: links in them start with PLANNER_BASE_URL and expire after NOTIFY_LINK_MAX_AGE_SECONDS; the
# dispatcher reads new events every NOTIFY_SWEEP_SECONDS (and at once after a commit in its process); a failed
# delivery is retried NOTIFY_RETRY_FIRST_SECONDS later, twice as long each time, NOTIFY_MAX_ATTEMPTS in all.
PLANNER_BASE_URL = os.environ.get("PLANNER_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
NOTIFY_LINK_MAX_AGE_SECONDS = int(os.environ.get("NOTIFY_LINK_MAX_AGE_SECONDS", str(7 * 24 * 3600)))
NOTIFY_SWEEP_SECONDS = int(os.environ.get("NOTIFY_SWEEP_SECONDS", "1"))
NOTIFY_RETRY_FIRST_SECONDS = int(os.environ.get("NOTIFY_RETRY_FIRST_SECONDS", "2"))
NOTIFY_MAX_ATTEMPTS = int(os.environ.get("NOTIFY_MAX_ATTEMPTS", "6"))
NOTIFY_TIMEOUT_SECONDS = float(os.environ.get("NOTIFY_TIMEOUT_SECONDS", "10"))
# A Slack app channel calls Slack's Web API at SLACK_API_BASE_URL (tests point it at a local stand-in); a Slack click
# older than five minutes is refused as a replay (slack_sdk's verifier). A connect code lasts SLACK_CONNECT_CODE_MAX_AGE_SECONDS.
SLACK_API_BASE_URL = os.environ.get("SLACK_API_BASE_URL", "https://slack.com/api/")
SLACK_TIMEOUT_SECONDS = int(os.environ.get("SLACK_TIMEOUT_SECONDS", "2"))
SLACK_CONNECT_CODE_MAX_AGE_SECONDS = int(os.environ.get("SLACK_CONNECT_CODE_MAX_AGE_SECONDS", "900"))
# Remote A2A agents (docs/a2a-agents.md): how long one request to an agent may take, and how long a cycle follows
# a streaming agent's task before it leaves the stream (the next cycle subscribes again).
A2A_TIMEOUT_SECONDS = float(os.environ.get("A2A_TIMEOUT_SECONDS", "10"))
A2A_STREAM_MAX_SECONDS = float(os.environ.get("A2A_STREAM_MAX_SECONDS", "30"))
# While a remote A2A agent works on its task (submitted, working), the task is read again after this many
# seconds when the agent's cycle interval is longer: its question reaches the inbox within about this long.
A2A_FOLLOW_SECONDS = float(os.environ.get("A2A_FOLLOW_SECONDS", "0.5"))
# An agent whose card offers push notifications (and not streaming) is asked to POST its tasks' updates to
# A2A_PUSH_BASE_URL + /a2a/push/<task>/: the dashboard's address as the agents reach it (PLANNER_BASE_URL when that
# is set; empty: not asked, polled). Its task is then read only every A2A_PUSH_POLL_SECONDS, in case a push is lost.
A2A_PUSH_BASE_URL = os.environ.get("A2A_PUSH_BASE_URL", os.environ.get("PLANNER_BASE_URL", "")).rstrip("/")
A2A_PUSH_POLL_SECONDS = float(os.environ.get("A2A_PUSH_POLL_SECONDS", "30"))
# Each user has at most NOTIFY_MAX_CHANNELS_PER_USER channels; a Slack channel's URL must be on one of
# SLACK_WEBHOOK_HOSTS (an Enterprise Grid may add its own).
NOTIFY_MAX_CHANNELS_PER_USER = int(os.environ.get("NOTIFY_MAX_CHANNELS_PER_USER", "5"))
SLACK_WEBHOOK_HOSTS = [h.strip().lower() for h in os.environ.get("SLACK_WEBHOOK_HOSTS", "hooks.slack.com").split(",")
                       if h.strip()]
# Requests to addresses people typed (planner_site/outbound.py) never reach loopback, private, link-local,
# unique-local, multicast, unspecified or metadata addresses unless OUTBOUND_ALLOWED_NETWORKS names them (CIDRs
# and host names, comma-separated; empty by default); at most OUTBOUND_MAX_PER_MINUTE requests a minute go to
# one host and port (0: no cap).
OUTBOUND_ALLOWED_NETWORKS = [n.strip() for n in os.environ.get("OUTBOUND_ALLOWED_NETWORKS", "").split(",")
                             if n.strip()]
OUTBOUND_MAX_PER_MINUTE = int(os.environ.get("OUTBOUND_MAX_PER_MINUTE", "30"))
# Remote AG-UI agents (docs/agui-agents.md): seconds to connect, to wait between two events of a run, and at
# most for one run's whole stream.
AGUI_CONNECT_TIMEOUT_SECONDS = float(os.environ.get("AGUI_CONNECT_TIMEOUT_SECONDS", "5"))
AGUI_READ_TIMEOUT_SECONDS = float(os.environ.get("AGUI_READ_TIMEOUT_SECONDS", "60"))
AGUI_RUN_MAX_SECONDS = float(os.environ.get("AGUI_RUN_MAX_SECONDS", "300"))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"  # only `collectstatic` fills it; whitenoise serves from the finders
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# WhiteNoise streams files with a sync iterator; under ASGI Django warns on every static file. The files
# are small and cached by browsers, so the warning is noise here.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")
warnings.filterwarnings("ignore", message="No directory at: ")  # STATIC_ROOT before collectstatic

SESSION_COOKIE_HTTPONLY = True
if env_bool("HTTPS"):  # behind TLS (a proxy that sets X-Forwarded-Proto): HTTPS only, cookies only over HTTPS
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # A load balancer probes /healthz over plain HTTP on the backend's port: it gets the answer, not a redirect.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD")
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
# Scripts only from this site (htmx is served by django-htmx with the nonce); model and user text is
# escaped, and even if something slipped through it could not run. Inline style attributes draw the bars.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "object-src": [CSP.NONE],
}
SECURE_CONTENT_TYPE_NOSNIFF = True

# Agents' sandboxed workspaces: tools may touch nothing outside AGENT_WORKSPACES/<agent id>/.
AGENT_WORKSPACES = Path(os.environ.get("AGENT_WORKSPACES", VAR_DIR / "workspaces"))
# The most one upload of files into a workspace, from an agent's page, may hold (all its files together).
WORKSPACE_UPLOAD_MAX_BYTES = int(os.environ.get("WORKSPACE_UPLOAD_MAX_BYTES", str(5 * 1024 * 1024)))

# The runtime (runtime/). Embedded: one process drives every agent, up to RUNNER_CONCURRENCY cycles at
# once, looking for due agents every RUNNER_TICK_SECONDS at least. Scale-out: Procrastinate workers, each
# running up to RUNNER_CONCURRENCY cycle jobs at once; a worker beats every RUNNER_HEARTBEAT_SECONDS, and one
# silent for RUNNER_STALLED_SECONDS is dead: its jobs are retried by the others. RUNNER_SWEEP_SECONDS: how
# often a chain of cycles is started for agents that have none (new, resumed, or left by a failure).
RUNNER_TICK_SECONDS = float(os.environ.get("RUNNER_TICK_SECONDS", "0.5"))
RUNNER_CONCURRENCY = int(os.environ.get("RUNNER_CONCURRENCY", "100"))
RUNNER_HEARTBEAT_SECONDS = float(os.environ.get("RUNNER_HEARTBEAT_SECONDS", "2"))
RUNNER_STALLED_SECONDS = float(os.environ.get("RUNNER_STALLED_SECONDS", "10"))
# A runner's lease (docs/runtime-guarantees.md): once its worker's last heartbeat the database took is this old,
# it starts no tool and records nothing more (self-fencing), before anyone may take its jobs over.
RUNNER_LEASE_SECONDS = float(os.environ.get("RUNNER_LEASE_SECONDS", "0")) or (
    RUNNER_STALLED_SECONDS - max(2 * RUNNER_HEARTBEAT_SECONDS, 0.25 * RUNNER_STALLED_SECONDS))
if not RUNNER_HEARTBEAT_SECONDS < RUNNER_LEASE_SECONDS < RUNNER_STALLED_SECONDS:
    raise ImproperlyConfigured("RUNNER_LEASE_SECONDS must be above RUNNER_HEARTBEAT_SECONDS and below "
                               "RUNNER_STALLED_SECONDS")
RUNNER_SWEEP_SECONDS = int(os.environ.get("RUNNER_SWEEP_SECONDS", "2"))
# A tool agent that waits for a person and nothing else (a plan awaiting approval or an answer, steps behind a step
# awaiting approval) cycles this often at most: an operator's decision brings its next cycle forward at once
# (agents/signals.py). 0 keeps every agent at its own interval.
RUNNER_WAITING_SECONDS = float(os.environ.get("RUNNER_WAITING_SECONDS", "30"))
# Scale-out: persona agents are driven in passes, one chain of passes per shard (runtime/tasks.py): a shard
# per RUNNER_SHARD_CYCLES_PER_SECOND of the running personas' cycles (125: 250 personas at the default 2 s), at most
# RUNNER_PERSONA_SHARDS (4: the most runners that share the personas' passes).
RUNNER_PERSONA_SHARDS = int(os.environ.get("RUNNER_PERSONA_SHARDS", "4"))
RUNNER_SHARD_CYCLES_PER_SECOND = float(os.environ.get("RUNNER_SHARD_CYCLES_PER_SECOND", "125"))
if RUNNER_PERSONA_SHARDS < 1 or RUNNER_SHARD_CYCLES_PER_SECOND <= 0:
    raise ImproperlyConfigured("RUNNER_PERSONA_SHARDS must be at least 1 and RUNNER_SHARD_CYCLES_PER_SECOND above 0")
# The least time between the starts of two passes of a shard: a persona due meanwhile waits for the next pass, at
# most this late (its next cycle keeps its pace), and a pass as long as the gap is followed at once. A longer gap
# makes fewer, larger passes, each costing its job and its fixed statements once for more cycles; fewer shards than
# runners leave a runner idle (docs/performance.md).
RUNNER_PASS_GAP_SECONDS = float(os.environ.get("RUNNER_PASS_GAP_SECONDS", "1.0"))
# Scale-out: a tool agent's chain of cycles starts with a start pass of its shard (runtime/tasks.py), which
# plans the first goals of all the shard's agents starting then together; RUNNER_START_SHARDS such passes may run
# at once (the runners share them). The same value in every process.
RUNNER_START_SHARDS = int(os.environ.get("RUNNER_START_SHARDS", "4"))
if RUNNER_START_SHARDS < 1:
    raise ImproperlyConfigured("RUNNER_START_SHARDS must be at least 1")
RUNNER_AUTOSTART = env_bool("RUNNER_AUTOSTART", True)
RUNNER_DB_RETRY_MAX_SECONDS = float(os.environ.get("RUNNER_DB_RETRY_MAX_SECONDS", "10"))  # backoff ceiling
RUNNER_SHUTDOWN_GRACE_SECONDS = float(os.environ.get("RUNNER_SHUTDOWN_GRACE_SECONDS", "30"))
LLM_CONCURRENCY_PER_MODEL = int(os.environ.get("LLM_CONCURRENCY_PER_MODEL", "100"))  # calls at once, per model
# ... and for a model server on this machine (a loopback OPENAI_BASE_URL), unless the model's settings give its own
# "concurrency": local servers answer one request at a time (0: no special bound). A limit of at most 16 is kept by
# every process together, through leases in the cache (LLM_SHARED_SLOTS: auto; on: always; off: per event loop).
LLM_LOCAL_CONCURRENCY = int(os.environ.get("LLM_LOCAL_CONCURRENCY", "1"))
LLM_SHARED_SLOTS = os.environ.get("LLM_SHARED_SLOTS", "auto")
# How often a model call looks whether its plan was cancelled (it then stops, waiting or in flight).
LLM_ABORT_POLL_SECONDS = float(os.environ.get("LLM_ABORT_POLL_SECONDS", "0.5"))

# Retention: how long rows are kept (hours; 0 keeps them forever). Runners prune in the background every
# RETENTION_PRUNE_SECONDS (0: never; `manage.py prune` does the same by hand), in batches of
# RETENTION_BATCH_ROWS, so a demo left running stays at a constant size. Operators' own events and the
# events of open plans are always kept.
RETAIN_EXPERIENCES_HOURS = float(os.environ.get("RETAIN_EXPERIENCES_HOURS", "24"))
RETAIN_LLM_BODIES_HOURS = float(os.environ.get("RETAIN_LLM_BODIES_HOURS", "24"))  # prompt and response text
RETAIN_LLM_CALLS_HOURS = float(os.environ.get("RETAIN_LLM_CALLS_HOURS", "168"))  # the rows (tokens, cost)
RETAIN_EVENTS_HOURS = float(os.environ.get("RETAIN_EVENTS_HOURS", "168"))
RETAIN_UNDO_HOURS = float(os.environ.get("RETAIN_UNDO_HOURS", "168"))  # steps' undo copies, after their plan closed
# Notifications with their deliveries and attempts, once every delivery is delivered or failed (30 days)
RETAIN_NOTIFICATIONS_HOURS = float(os.environ.get("RETAIN_NOTIFICATIONS_HOURS", "720"))
RETENTION_PRUNE_SECONDS = float(os.environ.get("RETENTION_PRUNE_SECONDS", "60"))
RETENTION_BATCH_ROWS = int(os.environ.get("RETENTION_BATCH_ROWS", "2000"))

# LLM gateway: providers, per-purpose model chains; "offline-rules" is the built-in deterministic model.
OPENAI_BASE_URL = os.environ.get("OPENAI_BASE_URL", "")
OPENAI_API_KEY = os.environ.get("OPENAI_API_KEY", "")
LLM_TIMEOUT_SECONDS = float(os.environ.get("LLM_TIMEOUT_SECONDS", "60"))
LLM_MAX_RETRIES = int(os.environ.get("LLM_MAX_RETRIES", "2"))
# The openai SDK's HTTP transport: "aiohttp" (its documented choice for many calls at once: half the CPU a call
# of "httpx" with 200 in flight) or "httpx" (the SDK's default).
LLM_HTTP_TRANSPORT = os.environ.get("LLM_HTTP_TRANSPORT", "aiohttp")
if LLM_HTTP_TRANSPORT not in {"aiohttp", "httpx"}:
    raise ImproperlyConfigured(f"LLM_HTTP_TRANSPORT must be aiohttp or httpx, not {LLM_HTTP_TRANSPORT!r}")
LLM_DEFAULT_MODEL = "offline-rules"  # what answers when a chain is empty
_default_chain = LLM_DEFAULT_MODEL if not OPENAI_BASE_URL else os.environ.get("LLM_MODEL", "gpt-4o-mini")
# Who answers which model: provider name (kept on each call in the log) -> the function that answers a call
# (a dotted path, imported once; agents/llm/gateway.py `Provider`) and the models it serves, "*" for every
# model no other provider lists; optionally "list", a function naming the models its server reports (their aliases
# for LLM_MODEL_SETTINGS). The offline models live with the world they simulate.
LLM_PROVIDERS = {
    "offline": {"answer": "agents.offline_model.offline_answer", "models": ["offline-rules", "offline-sloppy"]},
    "openai": {"answer": "agents.llm.openai_provider.openai_complete", "models": ["*"],
               "list": "agents.llm.openai_provider.served_models"},
}
# The providers that answer in this process without waiting on anything (no network, no server).
LLM_PROVIDERS_AT_ONCE = ["offline"]
# Records every model call, answered or failed, and returns the row's id: the call log (LLMCall), then the
# agent's budget check (a budget reached pauses the agent).
LLM_CALL_RECORDER = "agents.llm_calls.llm_calls_record"


def model_list(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


# Chains by group: "planner" (plan, replan) and "fast" (restate, reflect, goals, milestone, decide) ...
LLM_MODELS = {
    "planner": model_list(os.environ.get("PLANNER_MODELS", _default_chain)),
    "fast": model_list(os.environ.get("FAST_MODELS", _default_chain)),
}
# ... and, where set, one purpose's own chain.
LLM_PURPOSE_MODELS = {
    purpose: model_list(chain)
    for purpose, chain in (("restate", os.environ.get("RESTATE_MODELS")), ("plan", os.environ.get("PLAN_MODELS")),
                           ("replan", os.environ.get("REPLAN_MODELS")), ("reflect", os.environ.get("REFLECT_MODELS")),
                           ("goals", os.environ.get("GOALS_MODELS")),
                           ("milestone", os.environ.get("MILESTONE_MODELS")),
                           ("decide", os.environ.get("DECIDE_MODELS")))
    if chain
}
# USD per million tokens in and out, per model, e.g. {"gpt-4o-mini": [0.15, 0.6]}: fills LLMCall.cost.
LLM_PRICES = json.loads(os.environ.get("LLM_PRICES", "{}"))
PLAN_MAX_STEPS = int(os.environ.get("PLAN_MAX_STEPS", "20"))
# A policy's approval of a step that writes or is risky waits this long before the step starts, with an Undo in the
# inbox, on the plan page and in the notification (docs/operator-decisions.md). 0: it starts at once.
POLICY_UNDO_SECONDS = max(0.0, float(os.environ.get("POLICY_UNDO_SECONDS", "10")))
# One deadline per plan: restatement, attempts, reflections, the whole chain (each call waits only for what remains).
PLAN_DEADLINE_SECONDS = float(os.environ.get("PLAN_DEADLINE_SECONDS", "120"))
PLAN_ATTEMPTS_PER_MODEL = 3
# A tool agent's simple goal is one step with no model call: "Read notes.txt" always; the everyday ones ("Convert
# data.csv to JSON", "List the workspace", count, copy) for a small planner model ("small"), for any ("all"), or
# never ("off": no shortcut at all).
PLAN_ONE_STEP_SHORTCUT = os.environ.get("PLAN_ONE_STEP_SHORTCUT", "small")
# Per model: {"<model>": {"format": "json_schema" | "json_object" | "ollama" | "off", "context": 2048,
# "small": true}} (agents/llm/structured.py). LLM_FORMAT and LLM_CONTEXT_TOKENS are the defaults.
LLM_MODEL_SETTINGS = json.loads(os.environ.get("LLM_MODEL_SETTINGS", "{}"))
LLM_FORMAT = os.environ.get("LLM_FORMAT", "json_schema")
LLM_CONTEXT_TOKENS = int(os.environ.get("LLM_CONTEXT_TOKENS", "0"))
# How long a format found for a model (its server refused the one before) is kept in the cache; 0: for ever.
LLM_FORMAT_MEMORY_SECONDS = float(os.environ.get("LLM_FORMAT_MEMORY_SECONDS", str(7 * 24 * 3600)))
PLAN_REJECTIONS_BEFORE_FALLBACK = 2

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # outage_lines: in a runner, what fails for want of the database is one line per outage, said when it ends
    # (runtime/outage.py); elsewhere it lets everything through.
    "filters": {"quiet_forbidden": {"()": "planner_site.error_pages.QuietForbidden"},
                "outage_lines": {"()": "runtime.outage.OutageLines"}},
    # Each line with its time and source: a runner's log is read after the fact, beside the jobs table.
    "formatters": {"timed": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["quiet_forbidden", "outage_lines"],
                            "formatter": "timed"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {"planner": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO"), "propagate": False}},
}

# OpenTelemetry traces (docs/tracing.md): exported only when an OTLP/HTTP endpoint is set.
OTEL_EXPORTER_OTLP_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
TRACE_EXPORT_ENDPOINT = os.environ.get("TRACE_EXPORT_ENDPOINT", "")  # the product's own, over the one above
OTEL_SERVICE_NAME = os.environ.get("OTEL_SERVICE_NAME", "agent-planner")
OTEL_PERSONA_SAMPLE_RATIO = float(os.environ.get("OTEL_PERSONA_SAMPLE_RATIO", "0.01"))
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = env_bool("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
TRACE_URL_TEMPLATE = os.environ.get("TRACE_URL_TEMPLATE", "")  # e.g. http://localhost:6006/trace/{trace_id}
