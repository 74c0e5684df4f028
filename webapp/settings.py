"""Django settings, all read from the environment (see docs/deployment.md).

With nothing set: SQLite and data under var/ in the checkout, DEBUG off, and SECRET_KEY
required. A variable the environment does not set is taken from var/lifeboat.env
(LIFEBOAT_ENV_FILE names another file, `off` none) when there is one: `make run` writes the
settings it chose there, so every command run in the checkout afterwards finds its stack.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from webapp.env import env_bool, env_int, env_list, env_str, use_env_file
from webapp.env_file import NAME as ENV_FILE_NAME

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LIFEBOAT_VAR_DIR", str(BASE_DIR / "var")))
_env_file = env_str("LIFEBOAT_ENV_FILE", str(VAR_DIR / ENV_FILE_NAME))
ENV_FILE = None if _env_file == "off" else Path(_env_file)
if ENV_FILE is not None and not use_env_file(ENV_FILE) and "LIFEBOAT_ENV_FILE" in os.environ:
    raise ImproperlyConfigured(f"LIFEBOAT_ENV_FILE={_env_file!r}: no such file")

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            f"SECRET_KEY must be set when DEBUG is off, and {ENV_FILE or 'no settings file'} "
            "does not set it: run `make run` once in this checkout (it writes its settings "
            "there), or set SECRET_KEY (or DEBUG=1 for development)"
        )
    SECRET_KEY = "insecure-development-key-only-used-with-DEBUG-on"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "webapp.domain",
    "webapp.api",
    "webapp.dashboard",
    "webapp.accounts",
    "axes",
    # Only for its templates and static files: the API docs page (Swagger UI) is served
    # from here, not from a CDN, so it works offline (django-ninja picks its CDN page
    # when "ninja" is not an installed app).
    "ninja",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "webapp.ops.latency.LatencyMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with its own page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

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
            ],
            # Numbers, sizes and times for people in every template, without a {% load %}.
            "builtins": ["webapp.dashboard.templatetags.numbers"],
        },
    },
]

# --- Database ------------------------------------------------------------------------
# PostgreSQL in production (DATABASE_URL=postgres://user:pass@host:5432/name); SQLite
# under var/ when nothing is configured.
# SQLite, whether the default file or a sqlite:// DATABASE_URL (worker processes of the
# test suite get one): IMMEDIATE takes the write lock at BEGIN, so two concurrent writers
# wait for each other (up to timeout) instead of failing at once with "database is
# locked" when a read transaction tries to upgrade to a write.
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
_database_url = env_str("DATABASE_URL")
if _database_url:
    DATABASES = {
        "default": dj_database_url.parse(
            _database_url, conn_max_age=env_int("DB_CONN_MAX_AGE", 600, minimum=0)
        )
    }
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        DATABASES["default"]["OPTIONS"] = {
            **SQLITE_OPTIONS,
            **DATABASES["default"].get("OPTIONS", {}),
        }
    elif env_bool("DB_PREPARED_STATEMENTS", True):
        # The ingest path's statements (webapp/domain/ingest/sql_pipeline.py) are prepared once per
        # connection; Django's own queries bind on the client and are never prepared.
        # Off for a PgBouncer in transaction mode older than 1.21.
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "lifeboat.sqlite3",
            "OPTIONS": dict(SQLITE_OPTIONS),
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:projects"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static")))

# --- Web security ----------------------------------------------------------------------
# Behind TLS (docs/deployment.md, "Behind TLS"): cookies only over https, HSTS, and the
# proxy's header that says the request came over https. Secure cookies are on by default
# with DEBUG off; everything else is off by default (`make run` serves http://127.0.0.1).
SECURE_COOKIES = env_bool("SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", SECURE_COOKIES)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", SECURE_COOKIES)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# The header (and value) a TLS-terminating proxy sets, e.g. "X-Forwarded-Proto: https".
# Set it only when the proxy always overwrites that header: a client could send it.
_proxy_ssl_header = env_str("SECURE_PROXY_SSL_HEADER")
if _proxy_ssl_header:
    _name, _, _value = _proxy_ssl_header.partition(":")
    if not _name.strip() or not _value.strip():
        raise ImproperlyConfigured(
            "SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https'"
        )
    SECURE_PROXY_SSL_HEADER = (
        "HTTP_" + _name.strip().upper().replace("-", "_"),
        _value.strip(),
    )
# Login attempts (django-axes): after LOGIN_FAILURE_LIMIT failures for one user name from
# one address, that pair is locked out for LOGIN_LOCKOUT_MINUTES, even with the right
# password. Behind a proxy, REMOTE_ADDR is the proxy's unless LOGIN_CLIENT_IP_HEADER
# names the header that carries the client's address (e.g. X-Forwarded-For).
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False
LOGIN_CLIENT_IP_HEADER = env_str("LOGIN_CLIENT_IP_HEADER", "") or ""
AXES_CLIENT_IP_CALLABLE = "webapp.accounts.client_ip.client_ip"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# LOG_FORMAT=json writes one JSON object per line; either way every line a task writes
# carries its task, run and checkpoint ids (webapp/ops/logs.py).
LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "webapp.ops.logs.ContextFilter"}},
    "formatters": {
        "plain": {
            "()": "webapp.ops.logs.PlainFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        },
        "json": {"()": "webapp.ops.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# Prometheus scrapes /metrics with this bearer token. Without one, /metrics answers 401
# unless METRICS_PUBLIC=1 opens it to anyone who can reach it (it lists run keys).
METRICS_TOKEN = env_str("METRICS_TOKEN", "") or ""
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", False)
# How often (ms) each web process adds its API latency counts to Redis (webapp/ops/latency.py).
LATENCY_FLUSH_MS = env_int("LATENCY_FLUSH_MS", 1000, minimum=0)

# --- Ingest API ----------------------------------------------------------------------
# Outermost: whatever answers under /api/ (a CSRF page, a 405, a 400 for a bad Host)
# answers JSON (webapp/api/json_everywhere.py).
MIDDLEWARE.insert(0, "webapp.api.json_everywhere.JsonErrorsUnderApi")
# Threads per web process (webapp/asgi.py) for the requests that are not single events:
# pages, reads, batches. Each holds its own database connection.
WEB_THREADS = env_int("WEB_THREADS", 8, minimum=1)
# The runs list refreshes itself this often (s) while the page is visible; the problems
# summary, which works out every running run's health (problems.summary), less often.
RUNS_REFRESH_S = env_int("RUNS_REFRESH_S", 10, minimum=1)
PROBLEMS_REFRESH_S = env_int("PROBLEMS_REFRESH_S", 30, minimum=1)
# The largest request body POST /api/v1/events accepts; larger ones get 413.
EVENTS_MAX_BODY_BYTES = env_int("EVENTS_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
EVENTS_MAX_BATCH = env_int("EVENTS_MAX_BATCH", 1000, minimum=1)
# How long a web process may trust a token it has looked up (0: every request asks the
# database). A revoked token is refused at once by the process that revoked it and within
# this many seconds by the others; it saves a query (about 0.9 ms of CPU) per request.
API_TOKEN_CACHE_SECONDS = env_int("API_TOKEN_CACHE_SECONDS", 5, minimum=0)
# Groups of small event requests of one web process that may be in their transactions at
# once (webapp/domain/ingest/group_commit.py): while one waits for PostgreSQL, the next is
# applied by another thread of the pool.
INGEST_COMMITTERS = env_int("INGEST_COMMITTERS", 2, minimum=1)
# Validation messages of a web process go out together, at most one per this many ms
# under load and at once when idle (webapp/domain/validation/outbox.py); 0: one message
# per transaction, published by the request itself.
VALIDATION_PUBLISH_MS = env_int("VALIDATION_PUBLISH_MS", 50, minimum=0)

# --- Restore tests (webapp/domain/recovery/restore_test.py) ---------------------------------------
# The latest verified checkpoint of each active run is restore-tested this often.
RESTORE_TEST_EVERY_S = env_int("RESTORE_TEST_EVERY_S", 6 * 3600, minimum=60)

# --- Resume (webapp/domain/recovery/resume.py) ---------------------------------------------------
# How often a launch worker looks at a resumed job (process or Slurm job) until it ends;
# the run page's resume row shows a change this long after it happens, at most (one
# `kill -0`, or one squeue/sacct call, per resume in flight).
LAUNCH_FOLLOW_S = env_int("LAUNCH_FOLLOW_S", 3, minimum=1)
# A launched job's environment is built, never inherited (webapp/domain/launch/job_env.py):
# these names are copied from the worker (no credentials in them), the rest is the
# profile's env and the resume's LIFEBOAT_* values.
LAUNCH_BASE_ENV = env_list(
    "LAUNCH_BASE_ENV", ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ"]
)
# Where a launched job reports back (LIFEBOAT_URL): the address jobs reach Lifeboat at.
LAUNCH_LIFEBOAT_URL = env_str("LAUNCH_LIFEBOAT_URL", SITE_URL)
# The Unix user local jobs and restore checks run as, never the worker's own: "jobs", or
# per project "llm=llm-jobs,vision=vision-jobs,*=jobs" (webapp/domain/launch/run_as.py).
# Without it they are refused, unless LAUNCH_LOCAL_SAME_USER says this is one person on
# one machine (`make run`), where the job may run as the worker's own user.
LAUNCH_RUN_AS = env_list("LAUNCH_RUN_AS")
LAUNCH_LOCAL_SAME_USER = env_bool("LAUNCH_LOCAL_SAME_USER", False)
# Automatic resumes per project (webapp/domain/launch/auto_limits.py): at most this many
# unfinished at once, and this many requested in any hour; beyond, a resume.skipped event.
AUTO_RESUME_MAX_ACTIVE = env_int("AUTO_RESUME_MAX_ACTIVE", 3, minimum=0)
AUTO_RESUME_MAX_PER_HOUR = env_int("AUTO_RESUME_MAX_PER_HOUR", 10, minimum=0)
# A preempted run (run.preempted) is resumed automatically only if it has not come back by
# itself (a Slurm requeue restarts the same run key) within this many seconds.
AUTO_RESUME_PREEMPTED_AFTER_S = env_int("AUTO_RESUME_PREEMPTED_AFTER_S", 300, minimum=0)

# --- Alerts (webapp/domain/health/alerts.py) ---------------------------------------------------
# Links in alerts point here.
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")
# A running run that sent heartbeats and then none for this long is overdue.
ALERT_HEARTBEAT_GRACE_S = env_int("ALERT_HEARTBEAT_GRACE_S", 600, minimum=60)
# A save this many times slower than the run's median is worth an alert.
ALERT_SLOW_SAVE_FACTOR = float(env_str("ALERT_SLOW_SAVE_FACTOR", "3") or 3)
ALERT_TIMEOUT_S = env_int("ALERT_TIMEOUT_S", 10, minimum=1)
ALERT_MAX_ATTEMPTS = env_int("ALERT_MAX_ATTEMPTS", 5, minimum=1)
ALERT_RETRY_BASE_S = env_int("ALERT_RETRY_BASE_S", 30, minimum=1)
# Hosts and networks that URLs set by project admins (webhooks, S3 endpoints) may reach
# although they are loopback, link-local or private: host names, host:port, IPs and
# networks, e.g. "minio.internal,10.0.0.0/8,127.0.0.1:8333" (webapp/domain/outbound.py).
# Empty: only public addresses.
OUTBOUND_ALLOW = env_list("LIFEBOAT_OUTBOUND_ALLOW")
# E-mail: SMTP when EMAIL_HOST is set; without it, e-mail channels fail with a message
# that says so (never a silent "sent").
EMAIL_HOST = env_str("EMAIL_HOST", "") or ""
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "lifeboat@localhost")

# --- Badges and health (webapp/domain/health/badges.py, health/analytics.py) ---------------
# How long browsers and proxies (GitHub's camo) may keep a status badge, in seconds.
BADGE_MAX_AGE_S = env_int("BADGE_MAX_AGE_S", 30, minimum=0)
# A tag's or project's badge counts the running runs and those that ended within this
# many hours (a failed run that was resumed no longer counts).
BADGE_ENDED_HOURS = env_int("BADGE_ENDED_HOURS", 24, minimum=1)
# No MTBF from the project's history before it holds this many failed runs and this many
# hours of running time (docs/analytics.md); until then the analytics use ?mtbf_hours= or
# ANALYTICS_DEFAULT_MTBF_HOURS (0: none, and they say what they need).
ANALYTICS_MTBF_MIN_FAILURES = env_int("ANALYTICS_MTBF_MIN_FAILURES", 3, minimum=1)
ANALYTICS_MTBF_MIN_HOURS = env_int("ANALYTICS_MTBF_MIN_HOURS", 24, minimum=0)
ANALYTICS_DEFAULT_MTBF_HOURS = env_int("ANALYTICS_DEFAULT_MTBF_HOURS", 0, minimum=0)
# An event's own time is believed unless it is later than its receipt by more than
# EVENT_CLOCK_AHEAD_S or older by more than EVENT_CLOCK_BEHIND_S (a spool keeps events
# through an outage); then its receipt time stands in (webapp/domain/ingest/clock.py).
EVENT_CLOCK_AHEAD_S = env_int("EVENT_CLOCK_AHEAD_S", 300, minimum=0)
EVENT_CLOCK_BEHIND_S = env_int("EVENT_CLOCK_BEHIND_S", 365 * 86400, minimum=0)
# Goodput (docs/analytics.md): a run silent for longer than this, with no step gained
# across the silence, counts that stretch as idle.
GOODPUT_IDLE_AFTER_S = env_int("GOODPUT_IDLE_AFTER_S", 600, minimum=1)
# The project's goodput view reads each run's share of its training's ledger, computed
# again every GOODPUT_REFRESH_S for the runs that changed, at most GOODPUT_REFRESH_MAX_RUNS
# runs a pass (webapp/domain/health/goodput_store.py).
GOODPUT_REFRESH_S = env_int("GOODPUT_REFRESH_S", 300, minimum=10)
GOODPUT_REFRESH_MAX_RUNS = env_int("GOODPUT_REFRESH_MAX_RUNS", 2000, minimum=1)

# --- Redis and Celery ----------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged only when it has finished, so a worker killed mid-task is
# redelivered. With Redis, redelivery happens after the visibility timeout, which must
# be longer than the longest task (a multi-GB upload); tasks are idempotent.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 6 * 3600, minimum=5),
    # Look for expired unacknowledged tasks on every 10 s tick (one ZRANGE) instead of
    # every tenth, so redelivery follows the visibility timeout by seconds, not minutes.
    "unacked_restore_throttle": 1,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "validate"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# A task that fails on something that passes (a deadlock, a lost database or broker
# connection, S3 throttling: webapp/domain/transient.py) is tried again this many times,
# after delays doubling up to TASK_RETRY_MAX_S (workers/retrying.py).
TASK_TRANSIENT_RETRIES = env_int("TASK_TRANSIENT_RETRIES", 10, minimum=0)
TASK_RETRY_MAX_S = env_int("TASK_RETRY_MAX_S", 60, minimum=1)
# A checkpoint written by many ranks whose ranks have not all reported their part this
# long after the first did is marked incomplete, naming the missing ranks.
CHECKPOINT_PARTS_WAIT_S = env_int("CHECKPOINT_PARTS_WAIT_S", 600, minimum=1)
# The sweeper (webapp/domain/repair.py) looks this often for work the database says is
# owed and nobody is doing, and sends it again.
SWEEP_INTERVAL_S = env_int("SWEEP_INTERVAL_S", 60, minimum=1)
# A task sent this long ago that has not started, while its queue is empty, was lost
# (a publish while Redis was down, a worker killed holding it): sent again.
SWEEP_LOST_AFTER_S = env_int("SWEEP_LOST_AFTER_S", 300, minimum=1)
# A deletion, or a resume being prepared, with no sign of life for this long was
# interrupted: finished (a deletion) or failed with the reason (a resume).
SWEEP_STUCK_S = env_int("SWEEP_STUCK_S", 1800, minimum=60)
# A replica whose objects a store still lists after retention deleted them (a bucket
# with versioning keeps them as noncurrent versions) is proven again this often
# (webapp/domain/retention/replica_objects.py).
RETENTION_RECHECK_S = env_int("RETENTION_RECHECK_S", 24 * 3600, minimum=60)
# The storage audit (webapp/domain/retention/orphans.py) lists each enabled target this
# often; objects younger than the grace are not judged (an upload may be under way), and
# orphans past the alert size raise storage.orphans.
STORAGE_AUDIT_S = env_int("STORAGE_AUDIT_S", 24 * 3600, minimum=60)
STORAGE_AUDIT_GRACE_S = env_int("STORAGE_AUDIT_GRACE_S", 6 * 3600, minimum=0)
STORAGE_AUDIT_ALERT_BYTES = env_int("STORAGE_AUDIT_ALERT_BYTES", 1024**3, minimum=0)
# The storage ledger (webapp/domain/replication/ledger.py) writes its history this often.
STORAGE_LEDGER_S = env_int("STORAGE_LEDGER_S", 3600, minimum=60)
# Verified checkpoints this recent are looked at for a copy their targets' policies ask
# for and that was never requested.
SWEEP_REPLICA_LOOKBACK_S = env_int("SWEEP_REPLICA_LOOKBACK_S", 24 * 3600, minimum=60)
# This many repairs of one project's work within the last two hours make a problem on
# its runs list (webapp/domain/health/problems.py).
SWEEP_PROBLEM_PER_HOUR = env_int("SWEEP_PROBLEM_PER_HOUR", 5, minimum=1)
# A running validation's worker renews its lease this often (a third of it); a lease
# that lapsed means the worker died, and the sweeper sends the check again.
VALIDATION_LEASE_S = env_int("VALIDATION_LEASE_S", 120, minimum=3)

# --- S3 object storage ---------------------------------------------------------------
# The default target of `make run` (SeaweedFS on 127.0.0.1:8333); projects add their own.
S3_ENDPOINT_URL = env_str("S3_ENDPOINT_URL")
S3_REGION = env_str("S3_REGION", "us-east-1")
S3_ACCESS_KEY_ID = env_str("S3_ACCESS_KEY_ID")
S3_SECRET_ACCESS_KEY = env_str("S3_SECRET_ACCESS_KEY")
S3_BUCKET = env_str("S3_BUCKET", "lifeboat")
# Which projects may name which credentials in a storage target's credentials_ref
# (webapp/domain/replication/storage_access.py): "S3_BACKUP=ml-team|vision,S3_ARCHIVE=*". A name not
# listed is refused for every project.
S3_CREDENTIALS_REFS = env_list("S3_CREDENTIALS_REFS")
# Which projects may use the deployment's own S3 keys (S3_ACCESS_KEY_ID) for a target
# without a credentials_ref: slugs, or * for all.
S3_DEFAULT_CREDENTIALS_PROJECTS = env_list("S3_DEFAULT_CREDENTIALS_PROJECTS", ["*"])

# --- Validation ----------------------------------------------------------------------
# The load check runs in a child process with these limits (docs/design.md: loads never
# run unbounded in the worker itself).
VALIDATION_TIMEOUT_S = env_int("VALIDATION_TIMEOUT_S", 1800, minimum=1)
VALIDATION_MEMORY_BYTES = env_int("VALIDATION_MEMORY_BYTES", 16 * 1024**3, minimum=256 * 1024**2)
# After this many validations of one checkpoint that could not run (errors, not
# findings), it is marked suspicious instead of being retried forever.
VALIDATION_MAX_ERRORS = env_int("VALIDATION_MAX_ERRORS", 3, minimum=1)
# A file with at least this many bytes of holes (never written; no disk behind them) is
# reported suspicious without being hashed: a terabyte of holes costs a job nothing and
# a worker hours (webapp/domain/validation/integrity.py).
VALIDATION_SPARSE_HOLE_BYTES = env_int("VALIDATION_SPARSE_HOLE_BYTES", 1024**2, minimum=4096)
# While other projects' checkpoints wait, one project's checks take at most this many
# workers at once (0: no limit); with nobody else waiting it takes them all.
VALIDATION_PROJECT_MAX_ACTIVE = env_int("VALIDATION_PROJECT_MAX_ACTIVE", 2, minimum=0)
# Files hashed, and inspection children run, at once by one worker (at most its cores).
VALIDATION_PARALLEL = env_int("VALIDATION_PARALLEL", 8, minimum=1)
# A local checkpoint of at least this many bytes (and two files or more) is checked as
# up to VALIDATION_FANOUT_PARTS part tasks that any validate worker takes, then one
# verdict task (webapp/domain/validation/fanout.py); 0 never fans out.
VALIDATION_FANOUT_BYTES = env_int("VALIDATION_FANOUT_BYTES", 4 * 1024**3, minimum=0)
VALIDATION_FANOUT_PARTS = env_int("VALIDATION_FANOUT_PARTS", 8, minimum=2)
# Pinned and latest verified checkpoints are checked again when their last check is
# older than this (bits rot).
REVALIDATE_AFTER_S = env_int("REVALIDATE_AFTER_S", 24 * 3600, minimum=60)
SCRATCH_DIR = Path(env_str("LIFEBOAT_SCRATCH_DIR", str(VAR_DIR / "scratch")))

# --- Replication ---------------------------------------------------------------------
# Files are sent in parts of this size (S3's minimum is 5 MiB), this many parts at once;
# a file too large for 10,000 parts gets larger parts.
REPLICATION_PART_SIZE = env_int("REPLICATION_PART_SIZE", 16 * 1024**2, minimum=5 * 1024**2)
REPLICATION_CONCURRENCY = env_int("REPLICATION_CONCURRENCY", 10, minimum=1)
# Files of one checkpoint sent at once (a many-file checkpoint is bound by round trips,
# not bytes). The bytes held in memory stay under PART_SIZE x CONCURRENCY however many.
REPLICATION_FILES_AT_ONCE = env_int("REPLICATION_FILES_AT_ONCE", 16, minimum=1)
# Files smaller than this go in packs of up to REPLICATION_PART_SIZE, when a checkpoint
# has 32 of them or more (webapp/domain/replication/packs.py); 0: every file alone.
REPLICATION_PACK_BELOW = env_int("REPLICATION_PACK_BELOW", 1024**2, minimum=0)
# Files this large or larger whose header says where their tensors are (safetensors, a
# torch zip) are sent as pieces cut at tensor boundaries, so an unchanged tensor is not
# sent again (webapp/domain/replication/pieces.py); 0: every file whole.
REPLICATION_PIECES_ABOVE = env_int("REPLICATION_PIECES_ABOVE", 64 * 1024**2, minimum=0)
# The checksum sent with every part, which the server verifies before it keeps the part:
# CRC32 or SHA256. The file's sha256 is computed from the same bytes and compared either
# way, so a part's checksum only has to catch damage in transit; SHA256 parts hash every
# byte a second time on both ends, about 20% of the throughput (docs/benchmarks.md).
REPLICATION_PART_CHECKSUM = env_str("REPLICATION_PART_CHECKSUM", "CRC32").upper()
if REPLICATION_PART_CHECKSUM not in ("SHA256", "CRC32"):
    raise ImproperlyConfigured("REPLICATION_PART_CHECKSUM must be SHA256 or CRC32")
# 0: no limit. A worker sends at most this many bytes a second (shared links).
REPLICATION_MAX_BYTES_PER_S = env_int("REPLICATION_MAX_BYTES_PER_S", 0, minimum=0)
# An attempt that could not reach the target is tried again after RETRY_BASE_S, doubling
# up to RETRY_MAX_S, until MAX_ATTEMPTS; then the replica is "failed" with the last error.
REPLICATION_MAX_ATTEMPTS = env_int("REPLICATION_MAX_ATTEMPTS", 6, minimum=1)
REPLICATION_RETRY_BASE_S = env_int("REPLICATION_RETRY_BASE_S", 30, minimum=0)
REPLICATION_RETRY_MAX_S = env_int("REPLICATION_RETRY_MAX_S", 3600, minimum=0)
# botocore's own retries of one request, within an attempt.
REPLICATION_S3_RETRIES = env_int("REPLICATION_S3_RETRIES", 5, minimum=1)
# How long a worker's claim on a replica lasts without a progress write; a redelivered
# copy of the task waits this long before it takes an upload over from a dead worker.
REPLICATION_LEASE_S = env_int("REPLICATION_LEASE_S", 120, minimum=1)
# Multipart uploads no replica knows of are aborted after this long (beat, hourly).
REPLICATION_ABANDONED_UPLOAD_S = env_int("REPLICATION_ABANDONED_UPLOAD_S", 24 * 3600, minimum=0)
# Lifetime of the presigned download URLs the API hands out.
REPLICATION_URL_EXPIRES_S = env_int("REPLICATION_URL_EXPIRES_S", 3600, minimum=60)
