"""The dashboard: roles (viewers see, operators act, admins configure), the audit trail
of every action, the project page's health, filters and sorting, the run page's
timeline and charts. (The number of SQL queries of each list page:
tests/test_dashboard_queries.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run
from webapp.domain.models import (
    ApiToken,
    Checkpoint,
    Event,
    LaunchProfile,
    MetricPoint,
    Run,
    StorageTarget,
    Validation,
)
from webapp.domain.models.runs import Health

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


# --- Roles and actions ------------------------------------------------------------------


def test_a_viewer_sees_the_buttons_disabled_with_the_reason(project, viewer):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    html = as_user(viewer).get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert "Only operators and admins of this project can do this. You are a viewer." in html
    assert "checkpoint-validate" not in html and "/validate/" not in html
    assert 'disabled aria-describedby="no-actions">Validate' in html


def test_a_viewer_is_refused_every_action_server_side(project, viewer):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    client = as_user(viewer)
    for action in ("validate", "pin", "replicate"):
        response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/{action}/")
        assert response.status_code == 403
        assert b"You are a viewer" in response.content
    checkpoint.refresh_from_db()
    assert not checkpoint.pinned
    assert not Validation.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_operator_validates_and_the_request_is_queued_and_audited(project, operator, queues):
    from tests.support.celery_workers import queued_tasks

    checkpoint = make_checkpoint(make_run(project, "r"), 10, status="reported")
    response = as_user(operator).post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/validate/", HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="live"')
    assert "Queued" in html and 'hx-trigger="every' in html  # it polls until a verdict
    [validation] = Validation.objects.all()
    assert validation.status == "queued" and validation.requested_by == "user:otto"
    [task] = queued_tasks(queues)
    assert task["args"] == [checkpoint.pk]
    assert task["kwargs"] == {"requested_by": "user:otto", "revalidate": True}
    [audit] = Event.objects.all()
    assert (audit.type, audit.actor, audit.step) == (
        "checkpoint.validation_requested",
        "user:otto",
        10,
    )
    assert "otto" in audit.message


def test_a_checkpoint_that_was_never_saved_cannot_be_validated(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10, status="failed")
    client = as_user(operator)
    response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/validate/")
    assert response.status_code == 302
    assert not Validation.objects.exists()
    page = client.get(response["Location"]).content.decode()
    assert "never saved" in page


def test_an_operator_pins_and_unpins_with_an_audit_entry_each(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    client = as_user(operator)
    response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/pin/", {"pinned": "1"})
    assert response.status_code == 302
    checkpoint.refresh_from_db()
    assert checkpoint.pinned
    html = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/pin/", {"pinned": "0"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert ">Pin</button>" in html
    checkpoint.refresh_from_db()
    assert not checkpoint.pinned
    types = list(Event.objects.order_by("id").values_list("type", "actor"))
    assert types == [("checkpoint.pinned", "user:otto"), ("checkpoint.unpinned", "user:otto")]
    # Pinning twice changes nothing and writes nothing.
    client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/pin/", {"pinned": "0"})
    assert Event.objects.count() == 2


def test_an_operator_replicates_to_every_enabled_target(project, operator):
    from webapp.domain.models import Replica

    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    for name in ("backup", "offsite"):
        StorageTarget.objects.create(project=project, name=name, bucket=name)
    StorageTarget.objects.create(project=project, name="old", bucket="old", enabled=False)
    client = as_user(operator)
    response = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/replicate/", HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "2 copies queued" in html
    assert html.count("badge-pending") == 2 and 'hx-trigger="every' in html  # polls
    replicas = Replica.objects.filter(checkpoint=checkpoint)
    assert sorted(replicas.values_list("target__name", "status")) == [
        ("backup", "pending"),
        ("offsite", "pending"),
    ]
    audit = Event.objects.get(type="checkpoint.replication_requested")
    assert audit.actor == "user:otto" and audit.data["replicas"] == sorted(
        replicas.values_list("pk", flat=True)
    )
    # Asking again while they are pending queues nothing more.
    again = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/replicate/", HTTP_HX_REQUEST="true")
    assert "Nothing to queue: every target has a copy of step 10" in again.content.decode()
    assert replicas.count() == 2
    assert Event.objects.filter(type="checkpoint.replication_requested").count() == 1


def test_only_a_verified_checkpoint_is_replicated(project, operator):
    from webapp.domain.models import Replica

    StorageTarget.objects.create(project=project, name="backup", bucket="b")
    checkpoint = make_checkpoint(make_run(project, "r"), 10, status="corrupt")
    html = (
        as_user(operator)
        .post(f"/p/alpha/checkpoints/{checkpoint.pk}/replicate/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "Not copied: step 10 is corrupt" in html and "notice-error" in html
    assert not Replica.objects.exists() and not Event.objects.exists()


def test_actions_need_a_csrf_token(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/pin/", {"pinned": "1"})
    assert response.status_code == 403
    checkpoint.refresh_from_db()
    assert not checkpoint.pinned
    # The page hands the token to htmx through hx-headers on <body>.
    page = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert 'hx-headers=\'{"X-CSRFToken": "' in page


def test_actions_answer_only_post(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    response = as_user(operator).get(f"/p/alpha/checkpoints/{checkpoint.pk}/pin/")
    assert response.status_code == 405


def test_a_checkpoint_of_another_project_is_not_found(project, other_project, operator):
    foreign = make_checkpoint(make_run(other_project, "r"), 10)
    client = as_user(operator)
    assert client.get(f"/p/alpha/checkpoints/{foreign.pk}/").status_code == 404
    assert client.post(f"/p/alpha/checkpoints/{foreign.pk}/pin/").status_code == 404
    assert client.post(f"/p/beta/checkpoints/{foreign.pk}/pin/").status_code == 404


# --- Settings (admins) ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["tokens", "storage", "launch-profiles", "audit"])
def test_settings_are_for_admins_only(project, viewer, operator, admin, path):
    url = f"/p/alpha/settings/{path}/"
    assert as_user(viewer).get(url).status_code == 403
    assert as_user(operator).get(url).status_code == 403
    assert as_user(admin).get(url).status_code == 200
    assert as_user(operator).post(url, {"name": "x"}).status_code == 403


def test_a_token_is_shown_once_then_only_its_prefix(project, admin):
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/tokens/", {"name": "trainer", "scopes": ["ingest"]}, follow=True
    )
    assert response.redirect_chain == [("/p/alpha/settings/tokens/", 302)]
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(name="trainer")
    html = response.content.decode()
    secret = html.split('<code id="new-token" class="token">')[1].split("</code>")[0]
    assert ApiToken.authenticate(secret) == token
    again = client.get("/p/alpha/settings/tokens/").content.decode()
    assert secret not in again and token.prefix in again
    audit = Event.objects.get(type="token.created")
    assert audit.actor == "user:ada" and "trainer" in audit.message and secret not in audit.message


def test_an_admin_revokes_a_token(project, admin):
    token, secret = project.issue_token("old", ["ingest"])
    response = as_user(admin).post(f"/p/alpha/settings/tokens/{token.pk}/revoke/")
    assert response.status_code == 302
    assert ApiToken.authenticate(secret) is None
    assert Event.objects.get(type="token.revoked").actor == "user:ada"


def test_an_admin_adds_a_storage_target_and_a_launch_profile(project, admin, settings):
    settings.OUTBOUND_ALLOW = ["127.0.0.1:8333"]
    settings.S3_CREDENTIALS_REFS = ["S3_BACKUP=alpha"]
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/storage/",
        {
            "name": "backup",
            "bucket": "ckpts",
            "prefix": "alpha/",
            "endpoint_url": "http://127.0.0.1:8333",
            "region": "us-east-1",
            "credentials_ref": "S3_BACKUP",
        },
    )
    assert response.status_code == 302, response.content.decode()
    target = StorageTarget.objects.get(project=project)
    assert target.bucket == "ckpts"
    page = client.get("/p/alpha/settings/storage/").content.decode()
    assert "s3://ckpts/alpha" in page and "S3_BACKUP_*" in page  # saved as alpha
    # A second target with the same name is refused with a message, not a 500.
    again = client.post(
        "/p/alpha/settings/storage/", {"name": "backup", "bucket": "b", "region": "us-east-1"}
    )
    assert again.status_code == 200 and "already has this name" in again.content.decode()
    response = client.post(
        "/p/alpha/settings/launch-profiles/",
        {"name": "slurm-8gpu", "kind": "slurm", "command_template": "sbatch train.sh {checkpoint}"},
    )
    assert response.status_code == 302
    assert LaunchProfile.objects.get(project=project).kind == "slurm"
    types = set(Event.objects.values_list("type", flat=True))
    assert types == {"storage_target.created", "launch_profile.created"}
    audit_page = client.get("/p/alpha/settings/audit/").content.decode()
    assert "storage_target.created" in audit_page and "launch_profile.created" in audit_page


# --- Health: up / late / overdue ------------------------------------------------------


def test_health_follows_the_expected_interval_and_its_grace(project):
    now = timezone.now()
    cases = {
        "fresh": (90, Health.UP),
        "late": (130, Health.LATE),  # past 100 s, within 100 s + 50 % grace
        "overdue": (200, Health.OVERDUE),
    }
    for key, (age, _) in cases.items():
        run = make_run(project, key, expected_interval_s=100)
        make_checkpoint(run, 1, saved_at=now - timedelta(seconds=age))
    make_run(project, "no-interval")
    make_run(project, "done", status="finished", expected_interval_s=100)
    annotated = {r.key: r.health for r in Run.objects.with_dashboard_stats().with_health(now=now)}
    for key, (_, expected) in cases.items():
        assert annotated[key] == expected
        assert Run.objects.get(key=key).health(now=now) == expected  # the same rule in Python
    assert annotated["no-interval"] == Health.UNKNOWN
    assert annotated["done"] == Health.ENDED


def test_a_run_without_checkpoints_is_measured_from_its_start(project):
    now = timezone.now()
    make_run(project, "new", expected_interval_s=60, started_at=now - timedelta(seconds=30))
    make_run(project, "stuck", expected_interval_s=60, started_at=now - timedelta(hours=1))
    annotated = dict(
        Run.objects.with_dashboard_stats().with_health(now).values_list("key", "health")
    )
    assert annotated == {"new": Health.UP, "stuck": Health.OVERDUE}


def test_a_failed_save_does_not_count_as_a_checkpoint(project):
    now = timezone.now()
    run = make_run(project, "r", expected_interval_s=60)
    make_checkpoint(run, 1, saved_at=now - timedelta(hours=1))
    make_checkpoint(run, 2, status="failed", saved_at=now)
    assert Run.objects.with_dashboard_stats().with_health(now).get().health == Health.OVERDUE


# --- The project page -------------------------------------------------------------------


def test_the_project_page_shows_health_verified_step_replicas_and_storage(project, viewer):
    from webapp.domain.models import Replica

    run = make_run(project, "llama/7b", name="Llama 7B", expected_interval_s=3600, tags=["llama"])
    make_checkpoint(run, 100, total_size=1024**3)
    last = make_checkpoint(run, 200, status="reported", total_size=1024**3)
    target = StorageTarget.objects.create(project=project, name="s3", bucket="b")
    Replica.objects.create(checkpoint=last, target=target, status="verified")
    html = as_user(viewer).get("/p/alpha/").content.decode()
    assert "Llama 7B" in html
    assert "badge-up" in html
    assert ">100<" in html  # latest verified step, not the newest
    assert "1 verified" in html
    assert "2.0 GiB" in html
    assert "every 1 h" in html


def test_the_project_page_filters_by_name_tag_and_status(project, viewer):
    now = timezone.now()
    make_run(project, "alpha-1", tags=["vision"])
    make_run(project, "beta-2", tags=["text"], status="failed")
    overdue = make_run(project, "gamma-3", expected_interval_s=10)
    make_checkpoint(overdue, 1, saved_at=now - timedelta(hours=2))
    client = as_user(viewer)

    def keys(**params):
        html = client.get("/p/alpha/", params).content.decode()
        return {k for k in ("alpha-1", "beta-2", "gamma-3") if f"/runs/{k}/" in html}

    assert keys() == {"alpha-1", "beta-2", "gamma-3"}
    assert keys(q="BETA") == {"beta-2"}
    assert keys(tag="vision") == {"alpha-1"}
    assert keys(tag="visio") == set()  # a whole tag, not a substring
    assert keys(status="failed") == {"beta-2"}
    assert keys(status="overdue") == {"gamma-3"}
    assert "No run matches" in client.get("/p/alpha/", {"q": "zzz"}).content.decode()


def test_the_project_page_sorts_and_pages(project, viewer):
    for i in range(55):
        run = make_run(project, f"run-{i:02d}")
        make_checkpoint(run, 1, total_size=i)
    client = as_user(viewer)
    html = client.get("/p/alpha/", {"sort": "storage"}).content.decode()
    assert html.index("run-54") < html.index("run-53")
    assert "Page 1 of 2" in html and "run-00" not in html
    second = client.get("/p/alpha/", {"sort": "storage", "page": 2}).content.decode()
    assert "run-00" in second and "run-54" not in second
    by_name = client.get("/p/alpha/", {"sort": "name"}).content.decode()
    assert by_name.index("run-00") < by_name.index("run-01")


def test_the_filter_form_answers_htmx_with_the_list_alone(project, viewer):
    make_run(project, "r")
    response = as_user(viewer).get("/p/alpha/", {"q": "r"}, HTTP_HX_REQUEST="true",
                                   HTTP_HX_TARGET="run-list")  # fmt: skip
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="run-list"') and "<html" not in html


def test_an_empty_project_says_what_to_add_to_a_training_script(project, viewer):
    html = as_user(viewer).get("/p/alpha/").content.decode()
    assert "import lifeboat" in html
    assert "run.checkpoint(path, step=step)" in html
    assert "with lifeboat.Run(" in html


# --- The run page -----------------------------------------------------------------------


def test_the_run_page_shows_timeline_lineage_and_charts(project, viewer):
    parent = make_run(project, "first", name="First")
    origin = make_checkpoint(parent, 500)
    run = make_run(project, "second", resumed_from=origin, last_metrics={"loss": 0.5})
    make_checkpoint(run, 600, total_size=2000, save_seconds=2.0)
    make_checkpoint(run, 700, total_size=3000, save_seconds=3.0)
    for step in range(500, 800, 10):
        MetricPoint.objects.create(
            run=run, step=step, values={"loss": 1 / step}, time=timezone.now()
        )
    # A value that is not a number is left out, not a failed page.
    MetricPoint.objects.create(run=run, step=801, values={"loss": "nan"}, time=timezone.now())
    Event.objects.create(
        project=project, run=run, type="run.failed", time=timezone.now(), data={"error": "OOM"}
    )
    Event.objects.create(
        project=project, run=run, type="checkpoint.corrupt", step=600, time=timezone.now(),
        message="model.pt does not match its sha256", actor="worker:validate",
    )  # fmt: skip
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/second/").content.decode()
    assert "Resumed from" in html and "/runs/first/" in html and "step 500" in html
    assert "run.failed" in html and "OOM" in html
    assert "checkpoint.corrupt" in html and "model.pt does not match" in html
    assert 'hx-get="/p/alpha/runs/second/?charts=1" hx-trigger="load"' in html
    charts_html = client.get(
        "/p/alpha/runs/second/", {"charts": 1}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert charts_html.lstrip().startswith('<div id="charts"')
    assert charts_html.count("<svg") == 3  # size, save time, loss
    assert 'class="series" d="M' in charts_html
    # Without JavaScript, ?charts=1 draws them in the page.
    assert (
        client.get("/p/alpha/runs/second/", {"charts": 1})
        .content.decode()
        .count('<figure class="chart">')
        == 3
    )
    parent_html = client.get("/p/alpha/runs/first/").content.decode()
    assert "Resumed as" in parent_html and "/runs/second/" in parent_html


def test_charts_are_downsampled_to_one_bucket_per_pixel(project):
    from webapp.dashboard import charts

    run = make_run(project, "big")
    now = timezone.now()
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                project=project, run=run, step=s, status="verified", saved_at=now,
                total_size=1000 + (10**6 if s == 1234 else 0), save_seconds=1.0,
            )
            for s in range(5000)
        ]
    )  # fmt: skip
    size_chart, _ = charts.run_charts(run, [])
    assert size_chart.points <= charts.BUCKETS
    assert size_chart.path.count("L") + 1 <= 2 * charts.BUCKETS + 1
    # The one spike survives the downsampling: the y axis reaches it.
    assert size_chart.y_ticks[-1][1] == "977.5 KiB"


def test_the_checkpoint_table_polls_while_unsettled_and_stops_with_286(project, viewer):
    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 1, status="verifying")
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/r/").content.decode()
    assert 'hx-trigger="every 1000ms"' in html
    fragment = client.get("/p/alpha/runs/r/", {"poll": 3}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    assert 'hx-trigger="every 3375ms"' in fragment.content.decode()  # backs off: 1.5 ** 3
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    done = client.get("/p/alpha/runs/r/", {"poll": 4}, HTTP_HX_REQUEST="true")
    assert done.status_code == 286
    assert "hx-trigger" not in done.content.decode() and "Verified" in done.content.decode()
