"""Settings a project admin manages (issue #23, points 7 and 8): post/redirect/get for
every form, a new token's secret shown once, unique token names, members and the last
admin, editing and deleting storage targets, launch profiles and alert channels (kept
where history refers to them), the launch profile's options and preview, cancelling a
resume from the run page, the audit log's filters and links, and the runs list's sorts."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run
from tests.support.people import member
from webapp.domain.launch import template
from webapp.domain.models import (
    ApiToken,
    Event,
    LaunchProfile,
    Membership,
    Replica,
    Resume,
    StorageTarget,
)
from webapp.domain.models.alerts import AlertChannel, Flip, Notification
from webapp.domain.models.projects import LastAdmin

pytestmark = pytest.mark.django_db


def secret_in(html: str) -> str | None:
    match = re.search(r'<code id="new-token" class="token">([^<]+)</code>', html)
    return match.group(1) if match else None


# --- Tokens: post/redirect/get, shown once, unique names --------------------------------


def test_a_new_token_is_shown_once_after_the_redirect_and_a_reload_makes_none(project, admin):
    client = as_user(admin)
    response = client.post("/p/alpha/settings/tokens/", {"name": "trainer", "scopes": ["ingest"]})
    assert response.status_code == 302 and response["Location"] == "/p/alpha/settings/tokens/"
    page = client.get("/p/alpha/settings/tokens/")
    secret = secret_in(page.content.decode())
    assert secret and ApiToken.authenticate(secret).name == "trainer"
    assert page["Cache-Control"] == "no-store"
    assert 'data-copy="new-token"' in page.content.decode()
    reload = client.get("/p/alpha/settings/tokens/").content.decode()
    assert secret_in(reload) is None and secret not in reload
    assert ApiToken.objects.filter(project=project).count() == 1


def test_token_names_are_unique_among_tokens_in_use(project, admin):
    client = as_user(admin)
    client.post("/p/alpha/settings/tokens/", {"name": "trainer", "scopes": ["ingest"]})
    again = client.post("/p/alpha/settings/tokens/", {"name": "trainer", "scopes": ["read"]})
    assert again.status_code == 200
    assert "A token in use already has this name" in again.content.decode()
    assert ApiToken.objects.filter(project=project, name="trainer").count() == 1
    # The database says so too, whoever writes.
    with pytest.raises(IntegrityError), transaction.atomic():
        project.issue_token("trainer", ["read"])
    # The command line says so too.
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="already has a token named 'trainer' in use"):
        call_command("create_project", "alpha", "--token-name", "trainer")
    # A revoked token's name can be given again (rotation).
    ApiToken.objects.get(name="trainer").revoke()
    assert client.post(
        "/p/alpha/settings/tokens/", {"name": "trainer", "scopes": ["ingest"]}
    ).status_code == 302  # fmt: skip


# --- Members -------------------------------------------------------------------------------


def test_an_admin_adds_changes_and_removes_members(project, admin, django_user_model):
    bob = django_user_model.objects.create_user("bob", password="pw")
    client = as_user(admin)
    response = client.post("/p/alpha/settings/members/", {"username": "bob", "role": "viewer"})
    assert response.status_code == 302
    membership = Membership.objects.get(project=project, user=bob)
    assert membership.role == "viewer"
    unknown = client.post("/p/alpha/settings/members/", {"username": "nobody", "role": "viewer"})
    assert "No active user is called" in unknown.content.decode()
    twice = client.post("/p/alpha/settings/members/", {"username": "bob", "role": "admin"})
    assert "already a member" in twice.content.decode()
    url = f"/p/alpha/settings/members/{membership.pk}/"
    assert client.post(url + "role/", {"role": "operator"}).status_code == 302
    assert Membership.objects.get(pk=membership.pk).role == "operator"
    assert client.post(url + "remove/").status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()
    types = list(Event.objects.order_by("id").values_list("type", flat=True))
    # The miss is audited too: the form says whether a name exists (docs/security.md).
    assert types == [
        "member.added",
        "member.lookup_failed",
        "member.role_changed",
        "member.removed",
    ]
    assert set(Event.objects.values_list("actor", flat=True)) == {"user:ada"}


def test_the_last_admin_cannot_be_removed_or_demoted(project, admin):
    membership = Membership.objects.get(user=admin)
    with pytest.raises(LastAdmin):
        membership.delete()
    membership.role = "viewer"
    with pytest.raises(LastAdmin):
        membership.save()
    with pytest.raises(ValidationError, match="last admin"):
        membership.full_clean()  # the Django admin's form says so too
    client = as_user(admin)
    url = f"/p/alpha/settings/members/{membership.pk}/"
    page = client.post(url + "remove/", follow=True).content.decode()
    assert "the last admin of" in page
    client.post(url + "role/", {"role": "viewer"})
    assert Membership.objects.get(pk=membership.pk).role == "admin"
    # With a second admin, the first may step down.
    member(project, "grace", "admin")
    assert client.post(url + "role/", {"role": "viewer"}).status_code == 302
    assert Membership.objects.get(pk=membership.pk).role == "viewer"
    assert not Event.objects.filter(type="member.removed").exists()


@pytest.mark.parametrize(
    "path",
    [
        "members/",
        "members/1/role/",
        "members/1/remove/",
        "storage/1/",
        "storage/1/delete/",
        "launch-profiles/1/",
        "launch-profiles/1/delete/",
        "launch-profiles/preview/",
        "alerts/1/edit/",
        "alerts/1/delete/",
    ],
)
def test_only_admins_manage_settings(project, viewer, operator, path):
    url = f"/p/alpha/settings/{path}"
    for user in (viewer, operator):
        assert as_user(user).post(url, {"username": "vera", "role": "admin"}).status_code == 403
    assert Membership.objects.get(user=viewer).role == "viewer"


# --- Storage targets, launch profiles, alert channels: edit and delete -------------------


def test_a_storage_target_without_replicas_is_edited_and_deleted(project, admin):
    target = StorageTarget.objects.create(project=project, name="old", bucket="b")
    client = as_user(admin)
    url = f"/p/alpha/settings/storage/{target.pk}/"
    response = client.post(
        url, {"name": "new", "bucket": "b2", "region": "eu-west-1", "enabled": "on"}
    )
    assert response.status_code == 302, response.content.decode()
    target.refresh_from_db()
    assert (target.name, target.bucket, target.region) == ("new", "b2", "eu-west-1")
    assert client.post(url + "delete/").status_code == 302
    assert not StorageTarget.objects.filter(pk=target.pk).exists()
    types = list(Event.objects.order_by("id").values_list("type", flat=True))
    assert types == ["storage_target.changed", "storage_target.deleted"]


def test_a_storage_target_with_replicas_is_kept_disabled_and_says_so(project, admin):
    target = StorageTarget.objects.create(project=project, name="s3", bucket="b")
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    Replica.objects.create(checkpoint=checkpoint, target=target, status="verified")
    client = as_user(admin)
    page = client.post(f"/p/alpha/settings/storage/{target.pk}/delete/", follow=True)
    html = page.content.decode()
    assert "is kept, disabled: 1 replicas are stored there" in html
    assert "1 replica stored there" in html
    target.refresh_from_db()
    assert target.enabled is False
    # Where the replicas are cannot change under them.
    edit = client.get(f"/p/alpha/settings/storage/{target.pk}/").content.decode()
    assert "Fixed: 1 replicas are stored there." in edit
    client.post(
        f"/p/alpha/settings/storage/{target.pk}/",
        {"name": "s3", "bucket": "elsewhere", "region": "us-east-1"},
    )
    target.refresh_from_db()
    assert target.bucket == "b"
    assert Event.objects.filter(type="storage_target.disabled").exists()


def test_storage_targets_show_their_real_endpoint(project, admin, settings):
    settings.S3_ENDPOINT_URL = "http://127.0.0.1:8333"
    StorageTarget.objects.create(project=project, name="own", bucket="b")
    html = as_user(admin).get("/p/alpha/settings/storage/").content.decode()
    assert "http://127.0.0.1:8333" in html and "(the deployment's own)" in html
    assert ">AWS<" not in html


def test_a_launch_profile_used_by_a_resume_is_not_deleted(project, admin):
    used = LaunchProfile.objects.create(project=project, name="used", command_template="true")
    spare = LaunchProfile.objects.create(project=project, name="spare", command_template="true")
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    Resume.objects.create(project=project, run=checkpoint.run, checkpoint=checkpoint, profile=used)
    client = as_user(admin)
    page = client.post(f"/p/alpha/settings/launch-profiles/{used.pk}/delete/", follow=True)
    assert "Launch profile used is kept: 1 resumes used it" in page.content.decode()
    assert LaunchProfile.objects.filter(pk=used.pk).exists()
    assert client.post(f"/p/alpha/settings/launch-profiles/{spare.pk}/delete/").status_code == 302
    assert not LaunchProfile.objects.filter(pk=spare.pk).exists()
    assert list(Event.objects.values_list("type", flat=True)) == ["launch_profile.deleted"]


def test_a_launch_profile_sets_workdir_and_env(project, admin):
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/launch-profiles/",
        {
            "name": "gpu",
            "kind": "local",
            "command_template": "python train.py --resume {{checkpoint_path}}",
            "workdir": "/scratch/ada",
            "env": "CUDA_VISIBLE_DEVICES=0\nOMP_NUM_THREADS=4",
        },
    )
    assert response.status_code == 302, response.content.decode()
    profile = LaunchProfile.objects.get(name="gpu")
    assert profile.options == {
        "workdir": "/scratch/ada",
        "env": {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4"},
    }
    bad = client.post(
        f"/p/alpha/settings/launch-profiles/{profile.pk}/",
        {"name": "gpu", "kind": "local", "command_template": "true", "env": "1BAD=x"},
    )
    assert "Line 1: write NAME=value" in bad.content.decode()
    edit = client.get(f"/p/alpha/settings/launch-profiles/{profile.pk}/").content.decode()
    assert "OMP_NUM_THREADS=4" in edit and "{{checkpoint_path}}" in edit


def test_the_profile_preview_is_the_launchers_own_rendering(project, admin):
    client = as_user(admin)
    text = "srun python train.py --resume {{checkpoint_path}} --run {{new_run_key}}"
    html = client.post("/p/alpha/settings/launch-profiles/preview/", {"command_template": text})
    html = html.content.decode()
    assert template.render(text).replace('"', "&quot;") in html
    assert "LIFEBOAT_CHECKPOINT_PATH=/data/ckpt/run-3/step-1200.pt" in html
    refused = client.post(
        "/p/alpha/settings/launch-profiles/preview/", {"command_template": "echo '{{run_key}}'"}
    ).content.decode()
    assert "Refused:" in refused and "single quotes" in refused
    page = client.get("/p/alpha/settings/launch-profiles/").content.decode()
    for name in template.NAMES:
        assert f"{{{{{name}}}}}" in page


def test_an_alert_channel_with_notifications_is_kept_disabled(project, admin):
    sent = AlertChannel.objects.create(
        project=project, name="ops", kind="email", target="ops@example.com"
    )
    fresh = AlertChannel.objects.create(
        project=project, name="new", kind="email", target="new@example.com"
    )
    flip = Flip.objects.create(project=project, kind="run.down", message="x")
    Notification.objects.create(flip=flip, channel=sent)
    client = as_user(admin)
    page = client.post(f"/p/alpha/settings/alerts/{sent.pk}/delete/", follow=True)
    assert "is kept, disabled: 1 notifications" in page.content.decode()
    sent.refresh_from_db()
    assert sent.enabled is False
    response = client.post(
        f"/p/alpha/settings/alerts/{fresh.pk}/edit/",
        {"name": "newer", "kind": "email", "target": "a@example.com, b@example.com"},
    )
    assert response.status_code == 302
    fresh.refresh_from_db()
    assert (fresh.name, fresh.target) == ("newer", "a@example.com, b@example.com")
    assert client.post(f"/p/alpha/settings/alerts/{fresh.pk}/delete/").status_code == 302
    assert not AlertChannel.objects.filter(pk=fresh.pk).exists()


# --- Cancelling a resume from the run page ------------------------------------------------


def test_a_running_resume_is_cancelled_from_its_row(
    project, operator, viewer, queues, django_capture_on_commit_callbacks
):
    from tests.support.celery_workers import queued_tasks

    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 10)
    profile = LaunchProfile.objects.create(project=project, name="p", command_template="true")
    resume = Resume.objects.create(
        project=project, run=run, checkpoint=checkpoint, profile=profile, status="running"
    )
    page = as_user(operator).get("/p/alpha/runs/r/").content.decode()
    assert f"Cancel resume {resume.pk}" in page
    assert f'action="/p/alpha/resumes/{resume.pk}/cancel/"' in page
    # The checkpoint page's row of the resume has it too.
    on_checkpoint = as_user(operator).get(f"/p/alpha/checkpoints/{checkpoint.pk}/")
    assert f'action="/p/alpha/resumes/{resume.pk}/cancel/"' in on_checkpoint.content.decode()
    as_viewer = as_user(viewer).get("/p/alpha/runs/r/").content.decode()
    assert "/cancel/" not in as_viewer and 'disabled title="Only operators' in as_viewer
    assert as_user(viewer).post(f"/p/alpha/resumes/{resume.pk}/cancel/").status_code == 403
    # The task is published when the action's transaction commits.
    with django_capture_on_commit_callbacks(execute=True):
        response = as_user(operator).post(f"/p/alpha/resumes/{resume.pk}/cancel/")
    assert response.status_code == 302
    assert response["Location"] == f"/p/alpha/runs/r/#resume-{resume.pk}"
    tasks = queued_tasks(queues, "launch")
    assert [(t["task"], t["args"]) for t in tasks] == [
        ("workers.launch.cancel_resume", [resume.pk])
    ]
    audit = Event.objects.get(type="resume.cancel_requested")
    assert audit.run == run and audit.actor == "user:otto"


# --- The audit log -------------------------------------------------------------------------


def test_the_audit_log_filters_links_and_pages(project, admin):
    run = make_run(project, "run-7", name="digits")
    checkpoint = make_checkpoint(run, 3)
    now = timezone.now()
    for i in range(60):
        Event.objects.create(
            project=project, type="storage_target.created", time=now, actor="user:ada",
            message=f"target {i}",
        )  # fmt: skip
    Event.objects.create(
        project=project, run=run, step=3, type="checkpoint.restore_test_requested", time=now,
        actor="user:otto", message="asked for a restore test of step 3",
    )  # fmt: skip
    client = as_user(admin)
    first = client.get("/p/alpha/settings/audit/").content.decode()
    assert "Page 1 of 2" in first
    only = client.get("/p/alpha/settings/audit/", {"run": "run-7"}).content.decode()
    assert "asked for a restore test of step 3" in only and "target 1" not in only
    assert 'href="/p/alpha/runs/run-7/"' in only
    assert f'href="/p/alpha/checkpoints/{checkpoint.pk}/"' in only
    by_otto = client.get("/p/alpha/settings/audit/", {"actor": "otto"}).content.decode()
    assert "restore test" in by_otto and "target 1" not in by_otto
    by_type = client.get(
        "/p/alpha/settings/audit/", {"action": "storage_target.created", "page": 2}
    ).content.decode()
    assert "restore test" not in by_type and "Page 2 of 2" in by_type


# --- The runs list: sorts and pagers ------------------------------------------------------


def rows(html: str) -> list[str]:
    return re.findall(r'<a href="/p/alpha/runs/([^/"]+)/"', html)


def test_name_sort_is_natural_and_toggles(project, viewer):
    for n in (3, 28, 29, 30, 1, 2):
        make_run(project, f"run-{n}")
    make_run(project, "zzz", name="run-10")  # sorted by the name it shows
    client = as_user(viewer)
    html = client.get("/p/alpha/", {"sort": "name"}).content.decode()
    assert rows(html) == ["run-1", "run-2", "run-3", "zzz", "run-28", "run-29", "run-30"]
    assert 'data-dir="asc"' in html and "Run ↑" in html
    assert "sort=name&amp;dir=desc" in html  # the header reverses the sort
    down = client.get("/p/alpha/", {"sort": "name", "dir": "desc"}).content.decode()
    assert rows(down) == ["run-30", "run-29", "run-28", "zzz", "run-3", "run-2", "run-1"]
    assert "Run ↓" in down and "sort=name&amp;dir=asc" in down
    # Reversing once does not reverse the next request's order.
    assert rows(client.get("/p/alpha/", {"sort": "name"}).content.decode()) == rows(html)


def test_every_sort_reverses(project, viewer):
    for i in range(4):
        run = make_run(project, f"r{i}")
        make_checkpoint(run, i + 1, total_size=i)
    client = as_user(viewer)
    for sort in ("storage", "step", "activity", "status", "age"):
        a = rows(client.get("/p/alpha/", {"sort": sort, "dir": "asc"}).content.decode())
        d = rows(client.get("/p/alpha/", {"sort": sort, "dir": "desc"}).content.decode())
        assert sorted(a) == sorted(d) == ["r0", "r1", "r2", "r3"], sort
        if sort in ("storage", "step"):
            assert a == ["r0", "r1", "r2", "r3"] and d == a[::-1], sort


def test_the_pager_fits_the_sort(project, viewer):
    for i in range(55):
        make_run(project, f"run-{i}")
    client = as_user(viewer)
    by_name = client.get("/p/alpha/", {"sort": "name"}).content.decode()
    assert "Next →" in by_name and "Older" not in by_name
    assert "sort=name&amp;page=2" in by_name
    by_time = client.get("/p/alpha/").content.decode()
    assert "Older →" in by_time


def test_the_tag_filter_applies_while_typing(project, viewer):
    html = as_user(viewer).get("/p/alpha/").content.decode()
    assert "input changed delay:300ms from:#tag" in html
