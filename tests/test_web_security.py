"""What a stranger gets from the web server: /metrics only with its token (or when the
deployment opens it), /healthz without exception text, a login that locks after repeated
failures (django-axes, through the real login view), and the TLS settings read from the
environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.events import event, saved

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def reported_run(api, token, key: str) -> None:
    body = {"events": [event("run.started", run=key), saved(run=key, step=1)]}
    assert api.post_events(token, body).status_code == 202


def test_metrics_are_closed_to_an_anonymous_caller_unless_the_deployment_opens_them(
    client, api, token, settings, queues
):
    reported_run(api, token, "secret-run-key")
    settings.METRICS_TOKEN = ""
    settings.METRICS_PUBLIC = False
    closed = client.get("/metrics")
    assert closed.status_code == 401
    assert "METRICS_TOKEN" in closed.json()["error"]
    assert "secret-run-key" not in closed.content.decode()
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401

    settings.METRICS_TOKEN = "scrape-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="scrape-token").status_code == 401
    scraped = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert scraped.status_code == 200 and 'run="secret-run-key"' in scraped.content.decode()

    settings.METRICS_TOKEN = ""
    settings.METRICS_PUBLIC = True
    opened = client.get("/metrics")
    assert opened.status_code == 200 and 'run="secret-run-key"' in opened.content.decode()


def test_healthz_names_what_is_down_without_the_exception(client, settings, queues):
    settings.CELERY_BROKER_URL = "redis://:hunter2@127.0.0.1:1/0"  # nothing listens there
    answer = client.get("/healthz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "unhealthy", "database": "ok", "broker": "unavailable"}
    text = answer.content.decode()
    assert "127.0.0.1" not in text and "Error" not in text and "hunter2" not in text


# --- Login attempts ------------------------------------------------------------------------


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("ada", password="the-right-password")


def sign_in(client: Client, password: str, address: str = "203.0.113.7"):
    return client.post(
        "/accounts/login/",
        {"username": "ada", "password": password},
        REMOTE_ADDR=address,
    )


def test_a_login_is_locked_after_repeated_failures_even_with_the_right_password(user, settings):
    settings.AXES_FAILURE_LIMIT = 3
    client = Client()
    for _ in range(2):
        wrong = sign_in(client, "guess")
        assert wrong.status_code == 200 and "do not match" in wrong.content.decode()
    third = sign_in(client, "guess")
    assert third.status_code == 429
    right = sign_in(client, "the-right-password")
    page = right.content.decode()
    assert right.status_code == 429
    assert "Too many failed sign-ins" in page and "the right one included" in page
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302  # still not signed in
    # The lock is per user name and address: the user signs in from elsewhere.
    elsewhere = Client()
    assert sign_in(elsewhere, "the-right-password", address="198.51.100.9").status_code == 302
    assert elsewhere.session["_auth_user_id"] == str(user.pk)


def test_a_success_before_the_limit_starts_the_count_again(user, settings):
    settings.AXES_FAILURE_LIMIT = 3
    client = Client()
    for _ in range(2):
        sign_in(client, "guess")
    assert sign_in(client, "the-right-password").status_code == 302
    client.logout()
    for _ in range(2):  # four failures in all, but two since the success
        assert sign_in(client, "guess").status_code == 200
    assert sign_in(client, "the-right-password").status_code == 302
    client.logout()
    for expected in (200, 200, 429):  # the third in a row locks
        assert sign_in(client, "guess").status_code == expected
    assert sign_in(client, "the-right-password").status_code == 429


# --- TLS settings from the environment -----------------------------------------------------

READ_SETTINGS = """
import json
from django.conf import settings
print(json.dumps({name: getattr(settings, name, None) for name in (
    "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER", "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "OUTBOUND_ALLOW", "METRICS_PUBLIC")}))
"""


def settings_with(**environment: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECURE_", "SESSION_", "CSRF_", "LIFEBOAT_OUTBOUND", "METRICS"))
    }
    env.update(DJANGO_SETTINGS_MODULE="webapp.settings", DEBUG="1", **environment)
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", READ_SETTINGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tls_settings_come_from_the_environment_and_are_off_for_make_run():
    plain = settings_with()
    assert plain == {
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_SSL_REDIRECT": False,
        "OUTBOUND_ALLOW": [],
        "METRICS_PUBLIC": False,
    }
    behind_tls = settings_with(
        SECURE_HSTS_SECONDS="31536000",
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https",
        SECURE_COOKIES="1",
        SECURE_SSL_REDIRECT="1",
        LIFEBOAT_OUTBOUND_ALLOW="minio.internal, 10.0.0.0/8",
    )
    assert behind_tls == {
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "OUTBOUND_ALLOW": ["minio.internal", "10.0.0.0/8"],
        "METRICS_PUBLIC": False,
    }
