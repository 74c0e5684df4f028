"""Django settings, all read from the environment (see docs/deployment.md).

With nothing set, Lifeboat runs for development: DEBUG on, SQLite and data under
var/ in the checkout. With DEBUG off, SECRET_KEY is required.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from webapp.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LIFEBOAT_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
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
        },
    },
]

# --- Database ------------------------------------------------------------------------
# PostgreSQL in production (DATABASE_URL=postgres://user:pass@host:5432/name); SQLite
# under var/ when nothing is configured.
_database_url = env_str("DATABASE_URL")
if _database_url:
    DATABASES = {
        "default": dj_database_url.parse(
            _database_url, conn_max_age=env_int("DB_CONN_MAX_AGE", 600, minimum=0)
        )
    }
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "lifeboat.sqlite3",
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so two concurrent writers wait
                # for each other (up to timeout) instead of failing with "database is
                # locked" when a read transaction tries to upgrade.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
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

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# --- Ingest API ----------------------------------------------------------------------
# The largest request body POST /api/v1/events accepts; larger ones get 413.
EVENTS_MAX_BODY_BYTES = env_int("EVENTS_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
EVENTS_MAX_BATCH = env_int("EVENTS_MAX_BATCH", 1000, minimum=1)

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
# How long a reported checkpoint may wait for its validation task before the sweeper
# enqueues it again (the first enqueue can be lost if Redis was down at that moment).
VALIDATION_REQUEUE_AFTER_S = env_int("VALIDATION_REQUEUE_AFTER_S", 300, minimum=10)

# --- S3 object storage ---------------------------------------------------------------
# The default target of `make run` (SeaweedFS on 127.0.0.1:8333); projects add their own.
S3_ENDPOINT_URL = env_str("S3_ENDPOINT_URL")
S3_REGION = env_str("S3_REGION", "us-east-1")
S3_ACCESS_KEY_ID = env_str("S3_ACCESS_KEY_ID")
S3_SECRET_ACCESS_KEY = env_str("S3_SECRET_ACCESS_KEY")
S3_BUCKET = env_str("S3_BUCKET", "lifeboat")

# --- Validation ----------------------------------------------------------------------
# The load check runs in a child process with these limits (docs/design.md: loads never
# run unbounded in the worker itself).
VALIDATION_TIMEOUT_S = env_int("VALIDATION_TIMEOUT_S", 1800, minimum=1)
VALIDATION_MEMORY_BYTES = env_int("VALIDATION_MEMORY_BYTES", 16 * 1024**3, minimum=256 * 1024**2)
# After this many validations of one checkpoint that could not run (errors, not
# findings), it is marked suspicious instead of being retried forever.
VALIDATION_MAX_ERRORS = env_int("VALIDATION_MAX_ERRORS", 3, minimum=1)
# Pinned and latest verified checkpoints are checked again when their last check is
# older than this (bits rot).
REVALIDATE_AFTER_S = env_int("REVALIDATE_AFTER_S", 24 * 3600, minimum=60)
SCRATCH_DIR = Path(env_str("LIFEBOAT_SCRATCH_DIR", str(VAR_DIR / "scratch")))
