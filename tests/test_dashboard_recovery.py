"""The dashboard's recovery features: restore tests and resumes on the checkpoint page,
the measured time to recover and the checkpoint-cost analytics on the run page. Roles,
CSRF, 403s, audit events and validation errors. (The Alerts and Recovery settings:
tests/test_dashboard_settings_recovery.py.)"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run, profile, with_replica
from webapp.domain.models import (
    Checkpoint,
    CheckpointFile,
    Event,
    LaunchProfile,
    Resume,
    Validation,
)

pytestmark = pytest.mark.django_db


# --- Restore test -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_operator_asks_for_a_restore_test_and_it_is_queued_and_audited(
    project, operator, queues
):
    from tests.support.celery_workers import queued_tasks

    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint)
    response = as_user(operator).post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/", HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="live"')
    assert "queued for a restore test" in html and 'hx-trigger="every' in html
    [validation] = Validation.objects.all()
    assert (validation.kind, validation.status, validation.requested_by) == (
        "restore",
        "queued",
        "user:otto",
    )
    [task] = queued_tasks(queues, "restore")
    assert task["args"] == [validation.pk]
    [audit] = Event.objects.all()
    assert (audit.type, audit.actor, audit.step) == (
        "checkpoint.restore_test_requested",
        "user:otto",
        10,
    )
    # Pressed again while it waits: no second test, no second audit entry.
    again = as_user(operator).post(f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/")
    assert again.status_code == 302
    assert Validation.objects.count() == 1 and Event.objects.count() == 1


def test_a_restore_test_needs_a_verified_replica(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint, status="uploading")
    client = as_user(operator)
    page = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert 'disabled title="A restore test downloads from a verified replica' in page
    html = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "No restore test: step 10 has no verified replica" in html and "notice-error" in html
    assert not Validation.objects.exists() and not Event.objects.exists()


def test_the_page_shows_each_restore_test_with_its_phases_findings_and_progress(project, viewer):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    now = timezone.now()
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="passed", device="cuda:0 (NVIDIA H200)",
        timings={"download_verify_s": 12.5, "load_s": 3.25, "to_device_s": 0.75,
                 "total_s": 16.5, "peak_host_bytes": 3 * 1024**3,
                 "peak_device_bytes": 2 * 1024**3},
        findings=[{"level": "forward", "ok": True, "message": "forward pass finite",
                   "severity": "info"},
                  {"level": "replay", "ok": False, "message": "loss differs by 3e-2 at step 12",
                   "severity": "error"}],
        message="restored in 16.5 s", bytes_total=4096, bytes_done=4096,
        started_at=now - timedelta(seconds=20), finished_at=now,
    )  # fmt: skip
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="running", bytes_total=1000,
        bytes_done=250, started_at=now - timedelta(seconds=10),
    )  # fmt: skip
    client = as_user(viewer)
    html = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    section = html.split('id="restore-tests"')[1].split('id="resumes"')[0]
    for text in ("12.5 s", "3.2 s", "750 ms", "16.5 s", "3.0 GiB", "2.0 GiB",
                 "cuda:0 (NVIDIA H200)", "forward", "loss differs by 3e-2 at step 12",
                 "250 B of 1000 B", "left", "Running", "Passed"):  # fmt: skip
        assert text in section, text
    # The generic table of checks does not repeat them.
    assert "badge-passed" not in html.split('id="restore-tests"')[0]
    # It polls while the second one runs, and stops (286) once it is done.
    poll = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/", HTTP_HX_REQUEST="true")
    assert poll.status_code == 200 and 'hx-trigger="every' in poll.content.decode()
    Validation.objects.filter(status="running").update(status="failed", finished_at=now)
    done = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/", HTTP_HX_REQUEST="true")
    assert done.status_code == 286


# --- Resume -----------------------------------------------------------------------------


def test_the_resume_confirmation_shows_the_exact_command(project, operator):
    run = make_run(project, "llama; rm -rf ~")
    checkpoint = make_checkpoint(run, 10, file_count=1)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(location="/data/ckpts/step-10.pt")
    CheckpointFile.objects.create(checkpoint=checkpoint, path="step-10.pt", size=1, sha256="a")
    chosen = profile(
        project,
        template="python train.py --resume {{checkpoint_path}} --dir {{checkpoint_dir}} "
        "--run {{new_run_key}} --from {{run_key}} --step {{step}}",
    )
    client = as_user(operator)
    page = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert f'action="/p/alpha/checkpoints/{checkpoint.pk}/resume/"' in page
    assert f'<option value="{chosen.pk}">local-echo (Local process)</option>' in page
    response = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk})
    assert response.status_code == 200
    html = response.content.decode()
    # The command as it runs: no value in its text, each one a variable of the job...
    expected = (
        "python train.py --resume &quot;${LIFEBOAT_CHECKPOINT_PATH}&quot; "
        "--dir &quot;${LIFEBOAT_CHECKPOINT_DIR}&quot; --run &quot;${LIFEBOAT_NEW_RUN_KEY}&quot; "
        "--from &quot;${LIFEBOAT_RUN_KEY}&quot; --step &quot;${LIFEBOAT_STEP}&quot;"
    )
    # Each word in a span of its own, so that the box wraps between words only.
    shown = html.split('id="resume-command">')[1].split("</pre>")[0]
    assert re.sub(r"<[^>]+>", "", shown) == expected
    # ...shown with the value each variable will hold.
    table = html.split('id="resume-values"')[1].split("</table>")[0]
    rows = [
        ("LIFEBOAT_CHECKPOINT_PATH", "/data/ckpts/step-10.pt"),
        ("LIFEBOAT_CHECKPOINT_DIR", "/data/ckpts"),
        ("LIFEBOAT_NEW_RUN_KEY", "llama; rm -rf ~-resume-N"),
        ("LIFEBOAT_RUN_KEY", "llama; rm -rf ~"),
        ("LIFEBOAT_STEP", "10"),
    ]
    for name, value in rows:
        assert f"<tr><td><code>{name}</code></td><td><code>{value}</code></td></tr>" in table
    assert "Start the resume" in html
    assert not Resume.objects.exists() and not Event.objects.exists()  # nothing runs yet


@pytest.mark.django_db(transaction=True)
def test_an_operator_confirms_a_resume_and_it_is_queued_and_audited(project, operator, queues):
    from tests.support.celery_workers import queued_tasks

    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    chosen = profile(project)
    client = as_user(operator)
    html = client.get(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk}
    ).content.decode()
    digest = html.split('name="digest" value="')[1].split('"')[0]
    response = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk, "digest": digest}
    )
    assert response.status_code == 302
    [resume] = Resume.objects.all()
    assert resume.status == "requested" and resume.requested_by.username == "otto"
    assert resume.command == 'echo resumed "${LIFEBOAT_CHECKPOINT_ID}"'
    [task] = queued_tasks(queues, "launch")
    assert task["args"] == [resume.pk]
    [audit] = Event.objects.all()
    assert (audit.type, audit.actor, audit.step) == ("resume.requested", "user:otto", 10)
    page = client.get(response["Location"]).content.decode()
    assert f"Resume {resume.pk} of step 10 with local-echo is queued" in page
    row = page.split(f'id="resume-{resume.pk}"')[1].split("</tr>")[0]
    assert "Requested" in row and "echo resumed &quot;${LIFEBOAT_CHECKPOINT_ID}&quot;" in row
    assert 'hx-trigger="every' in page  # it polls until the resume is final


def test_a_bad_template_and_an_unverified_checkpoint_are_refused_with_the_reason(project, operator):
    client = as_user(operator)
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    bad = profile(project, name="bad", template="run {{checkpoint}}")
    html = client.get(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": bad.pk}
    ).content.decode()
    assert "unknown placeholder {{checkpoint}}" in html and "Start the resume" not in html
    response = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": bad.pk, "digest": "x"}
    )
    assert response.status_code == 400
    assert "unknown placeholder" in response.content.decode()
    corrupt = make_checkpoint(checkpoint.run, 20, status="corrupt")
    good = profile(project)
    page = client.get(f"/p/alpha/checkpoints/{corrupt.pk}/").content.decode()
    refusal = (
        "tep 20 is corrupt and no replica of it is verified: only a verified checkpoint, or "
        "one with a verified replica, can be resumed from"
    )
    assert f"S{refusal}." in page
    response = client.post(
        f"/p/alpha/checkpoints/{corrupt.pk}/resume/", {"profile": good.pk, "digest": "x"}
    )
    assert response.status_code == 400
    assert refusal in response.content.decode()
    assert not Resume.objects.exists() and not Event.objects.exists()


def test_a_profile_changed_since_the_confirmation_is_confirmed_again(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    chosen = profile(project)
    client = as_user(operator)
    html = client.get(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk}
    ).content.decode()
    digest = html.split('name="digest" value="')[1].split('"')[0]
    LaunchProfile.objects.filter(pk=chosen.pk).update(command_template="echo other {{step}}")
    response = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk, "digest": digest}
    )
    assert response.status_code == 400
    html = response.content.decode()
    text = re.sub(r"<[^>]+>", "", html)  # the command's words are spans of their own
    assert "changed since you looked" in html and "echo other &quot;${LIFEBOAT_STEP}" in text
    assert "<td><code>LIFEBOAT_STEP</code></td><td><code>10</code></td>" in html
    assert not Resume.objects.exists()


def test_a_profile_of_another_project_cannot_be_used(project, other_project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    profile(project)
    foreign = profile(other_project, name="theirs")
    response = as_user(operator).post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": foreign.pk, "digest": "x"}
    )
    assert response.status_code == 400
    assert "choose one of this project" in response.content.decode()
    assert not Resume.objects.exists()


def test_a_viewer_sees_restore_test_and_resume_disabled_and_is_refused(project, viewer):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint)
    chosen = profile(project)
    client = as_user(viewer)
    html = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert 'disabled aria-describedby="no-actions">Restore test' in html
    assert 'disabled aria-describedby="no-resume">Resume' in html
    assert "/resume/" not in html and "/restore-test/" not in html
    for path, data in (("restore-test", {}), ("resume", {"profile": chosen.pk})):
        response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/{path}/", data)
        assert response.status_code == 403 and b"You are a viewer" in response.content
    # Not even the confirmation page.
    assert client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/resume/").status_code == 403
    assert not Validation.objects.exists() and not Resume.objects.exists()
    assert not Event.objects.exists()


def test_recovery_actions_need_a_csrf_token_and_a_post(project, operator):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint)
    chosen = profile(project)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/").status_code == 403
    response = client.post(f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk})
    assert response.status_code == 403
    url = f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/"
    assert as_user(operator).get(url).status_code == 405
    assert not Validation.objects.exists() and not Resume.objects.exists()


def test_recovery_actions_on_another_projects_checkpoint_are_not_found(
    project, other_project, operator
):
    foreign = make_checkpoint(make_run(other_project, "r"), 10)
    client = as_user(operator)
    assert client.post(f"/p/alpha/checkpoints/{foreign.pk}/restore-test/").status_code == 404
    assert client.get(f"/p/alpha/checkpoints/{foreign.pk}/resume/").status_code == 404
    assert client.post(f"/p/beta/checkpoints/{foreign.pk}/resume/").status_code == 404


# --- The run page: time to recover and what checkpointing costs ---------------------------


def analysed_run(project):
    """A run of 10 h that saved a 1 GiB checkpoint every 30 min, each in 60 s; the project
    has three failed runs of 10, 10 and 30 h before it (M = 60 h / 3 = 20 h: enough
    history for an MTBF, docs/analytics.md)."""
    from webapp.domain.models import Run

    start = timezone.now() - timedelta(hours=10)
    for key, hours in (("old", 10), ("old-2", 10), ("old-3", 30)):
        Run.objects.create(
            project=project, key=key, status="failed", started_at=start - timedelta(hours=hours),
            ended_at=start, last_seen_at=start,
        )  # fmt: skip
    run = make_run(project, "r", status="finished", started_at=start,
                   ended_at=start + timedelta(hours=10))  # fmt: skip
    for i in range(1, 21):
        make_checkpoint(
            run, i * 100, saved_at=start + timedelta(minutes=30 * i), save_seconds=60.0,
            total_size=1024**3,
        )  # fmt: skip
    return run


def test_the_run_page_shows_the_measured_time_to_recover(project, viewer):
    run = analysed_run(project)
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/r/").content.decode()
    assert "not measured: no restore test of this run has passed yet" in html
    checkpoint = run.checkpoints.get(step=2000)
    now = timezone.now()
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="failed", timings={"total_s": 1.0},
        finished_at=now,
    )  # fmt: skip
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="passed", device="cuda:0",
        timings={"total_s": 42.5}, finished_at=now - timedelta(minutes=5),
    )  # fmt: skip
    html = client.get("/p/alpha/runs/r/").content.decode()
    ttr = html.split('id="time-to-recover"')[1].split("</dd>")[0]
    assert "42.5 s" in ttr and "step 2000" in ttr and "cuda:0" in ttr
    assert f"/p/alpha/checkpoints/{checkpoint.pk}/#restore-tests" in ttr


def test_the_analytics_show_overhead_intervals_losses_and_the_chart(project, viewer):
    analysed_run(project)
    client = as_user(viewer)
    page = client.get("/p/alpha/runs/r/").content.decode()
    assert 'hx-get="/p/alpha/runs/r/?analytics=1" hx-trigger="load"' in page
    response = client.get("/p/alpha/runs/r/", {"analytics": 1}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="analytics">')
    figures = response.context["a"]
    # 20 saves of 60 s in 10 h: 3.33 %; τ = 30 min − 60 s = 29 min; M = 20 h.
    assert "3.33 %" in html and "29 min" in html
    assert figures.mtbf_seconds == pytest.approx(20 * 3600, rel=1e-3)
    assert "3 failed runs over 60.0 h" in html
    assert "17.1 MiB/s" in html  # 1 GiB saved in 60 s
    daly = figures.daly_interval_seconds
    assert daly and "recommended" in html
    assert "more often than it needs to" in html  # 29 min against Daly's ~2.6 h
    assert html.count("<svg") == 1 and "marker-daly" in html and "marker-actual" in html
    assert "Time wasted against the checkpoint interval" in html


def test_an_assumed_mtbf_is_used_and_a_nonsense_one_is_ignored(project, viewer):
    analysed_run(project)
    client = as_user(viewer)
    response = client.get(
        "/p/alpha/runs/r/", {"analytics": 1, "mtbf_hours": "3"}, HTTP_HX_REQUEST="true"
    )
    assert response.context["a"].mtbf_seconds == 3 * 3600
    assert "assumed here" in response.content.decode()
    for nonsense in ("-1", "0", "nan", "inf", "x"):
        response = client.get(
            "/p/alpha/runs/r/", {"analytics": 1, "mtbf_hours": nonsense}, HTTP_HX_REQUEST="true"
        )
        assert response.status_code == 200
        assert response.context["a"].mtbf_source != "given", nonsense


def test_without_a_failure_or_an_assumption_the_analytics_say_what_is_missing(project, viewer):
    run = make_run(project, "r", started_at=timezone.now() - timedelta(hours=1))
    make_checkpoint(run, 1, save_seconds=None)
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/r/", {"analytics": 1}, HTTP_HX_REQUEST="true").content.decode()
    assert "no failure seen in this project yet" in html
    assert "No checkpoint reported its save time yet." in html
    assert "<svg" not in html
    # Without JavaScript the figures come in the page itself.
    page = client.get("/p/alpha/runs/r/", {"analytics": 1}).content.decode()
    assert "<!doctype html>" in page and "no failure seen in this project yet" in page


def test_a_resume_shows_the_time_from_the_click_to_the_first_step(project, viewer):
    from webapp.domain.models import Checkpoint, MetricPoint, Resume, Run

    run = make_run(project, "r", status="failed")
    checkpoint = make_checkpoint(run, 100)
    clicked = timezone.now() - timedelta(minutes=3)
    resume = Resume.objects.create(
        project=project, run=run, checkpoint=Checkpoint.objects.get(pk=checkpoint.pk),
        status="running", created_at=clicked,
    )  # fmt: skip
    client = as_user(viewer)
    assert "recovered: first step" not in client.get("/p/alpha/runs/r/").content.decode()
    new_run = Run.objects.create(project=project, key="r-resumed")
    Resume.objects.filter(pk=resume.pk).update(new_run=new_run)
    MetricPoint.objects.create(run=new_run, step=101, values={"loss": 1.0},
                               time=clicked + timedelta(seconds=12.5))  # fmt: skip
    MetricPoint.objects.create(run=new_run, step=102, values={"loss": 0.9},
                               time=clicked + timedelta(seconds=13))  # fmt: skip
    html = client.get("/p/alpha/runs/r/").content.decode()
    assert "recovered: first step 12.5 s after the click" in html


@pytest.mark.django_db(transaction=True)
def test_a_profile_that_takes_a_world_size_asks_for_one(project, operator, queues):
    """{{world_size}} in the command: the page offers the field, shows the saved world
    size, and a world size the checkpoint's format cannot be resharded to is refused with
    the reason; its own is queued."""
    run = make_run(project, "r")
    run.world_size = 8
    run.save()
    checkpoint = make_checkpoint(run, 10)
    chosen = profile(project, "ranks", "torchrun --nproc-per-node {{world_size}} train.py")
    client = as_user(operator)
    url = f"/p/alpha/checkpoints/{checkpoint.pk}/resume/"

    html = client.get(url, {"profile": chosen.pk, "world_size": "4"}).content.decode()
    assert 'id="resume-world-size" name="world_size"' in html and 'placeholder="8"' in html
    assert "Saved by 8 ranks." in html
    assert "<code>LIFEBOAT_WORLD_SIZE</code></td><td><code>4</code>" in html
    digest = html.split('name="digest" value="')[1].split('"')[0]

    refused = client.post(url, {"profile": chosen.pk, "digest": digest, "world_size": "4"})
    assert refused.status_code == 400
    assert "saved by 8 ranks in a format Lifeboat cannot reshard" in refused.content.decode()
    assert not Resume.objects.exists()

    done = client.post(url, {"profile": chosen.pk, "digest": digest, "world_size": "8"})
    assert done.status_code == 302
    assert Resume.objects.get().world_size == 8
    assert (
        'name="world_size"'
        not in client.get(url, {"profile": profile(project).pk}).content.decode()
    )
