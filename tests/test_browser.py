"""The dashboard in a real browser (Playwright driving Debian's Chromium) against gunicorn
and a real Celery worker: sign in, open a run, validate a checkpoint and watch its badge
change without a reload, pin it; a viewer finds no buttons and is refused with 403.

Each test writes screenshots of the pages it saw to var/screenshots/<test name>/ and
prints that path. Without /usr/bin/chromium these tests skip, except under CI=true,
where they fail: CI must not pass without having looked."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.support.browser import person, sign_in
from webapp.domain.models import (
    Checkpoint,
    LaunchProfile,
    Replica,
    Resume,
    StorageTarget,
    Validation,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_validates_and_pins_without_a_reload(
    page, web, project, checkpoint_on_disk, queues, celery_worker, shots
):
    from playwright.sync_api import expect

    person(project, "otto", "operator")
    sign_in(page, web, "otto")
    shots("projects", page)
    page.get_by_role("link", name="Alpha").click()
    expect(page.get_by_role("link", name="Llama 7B")).to_be_visible()
    shots("project", page)
    page.get_by_role("link", name="Llama 7B").click()
    expect(page.get_by_role("heading", name="Llama 7B")).to_be_visible()
    shots("run", page)
    page.get_by_role("link", name="100", exact=True).click()
    expect(page.get_by_role("heading", name="Step 100")).to_be_visible()
    badge = page.locator(".status-line .badge").first
    expect(badge).to_have_text("Reported")
    shots("checkpoint-reported", page)

    page.evaluate("window.notReloaded = true")
    page.get_by_role("button", name="Validate").click()
    # Queued, verifying, then the worker's verdict, all by htmx polling.
    expect(badge).to_have_text("Verified", timeout=45_000)
    assert page.evaluate("window.notReloaded") is True
    expect(page.locator("#live")).to_contain_text("user:otto")
    shots("checkpoint-verified", page)

    page.get_by_role("button", name="Pin", exact=True).click()
    expect(page.locator(".status-line .badge-pinned")).to_have_text("Pinned")
    expect(page.get_by_role("button", name="Unpin")).to_be_visible()
    assert page.evaluate("window.notReloaded") is True
    shots("checkpoint-pinned", page)

    checkpoint_on_disk.refresh_from_db()
    assert checkpoint_on_disk.status == "verified" and checkpoint_on_disk.pinned
    from webapp.domain.models import Event

    audit = set(Event.objects.filter(actor="user:otto").values_list("type", flat=True))
    assert audit == {"checkpoint.validation_requested", "checkpoint.pinned"}

    # The run page's table shows the new state too.
    page.get_by_role("link", name="Llama 7B").click()
    expect(page.locator("#checkpoints .badge-verified")).to_be_visible()
    shots("run-after", page)


def test_a_viewer_finds_no_buttons_and_is_refused(page, web, project, checkpoint_on_disk, shots):
    from playwright.sync_api import expect

    person(project, "vera", "viewer")
    sign_in(page, web, "vera")
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint_on_disk.pk}/")
    expect(page.get_by_role("heading", name="Step 100")).to_be_visible()
    expect(page.locator("#live")).to_contain_text("You are a viewer")
    assert page.locator("form[action$='/validate/'], form[action$='/pin/']").count() == 0
    expect(page.get_by_role("button", name="Validate")).to_be_disabled()
    shots("checkpoint-as-viewer", page)
    # Posting by hand, with a valid CSRF token, is refused by the server.
    statuses = page.evaluate(
        """async (id) => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const out = [];
            for (const action of ['validate', 'pin', 'restore-test', 'resume']) {
                const r = await fetch(`/p/alpha/checkpoints/${id}/${action}/`, {
                    method: 'POST', headers: {'X-CSRFToken': token}, body: new FormData()});
                out.push(r.status);
            }
            return out;
        }""",
        checkpoint_on_disk.pk,
    )
    assert statuses == [403, 403, 403, 403]
    expect(page.get_by_role("button", name="Resume…")).to_be_disabled()
    expect(page.locator("#resume")).to_contain_text("You are a viewer")
    assert page.locator("form[action$='/resume/'], form[action$='/restore-test/']").count() == 0
    page.goto(f"{web.url}/p/alpha/settings/tokens/")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    shots("settings-refused", page)
    checkpoint_on_disk.refresh_from_db()
    assert not checkpoint_on_disk.pinned and checkpoint_on_disk.status == "reported"


def test_an_admin_creates_a_token_shown_once(page, web, project, checkpoint_on_disk, shots):
    from playwright.sync_api import expect

    person(project, "ada", "admin")
    sign_in(page, web, "ada")
    page.goto(f"{web.url}/p/alpha/")
    page.get_by_role("link", name="Settings").click()
    page.get_by_label("Name").fill("trainer")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token").inner_text()
    assert secret.startswith("lb_")
    shots("token-created", page)
    page.goto(f"{web.url}/p/alpha/settings/tokens/")
    expect(page.get_by_role("cell", name="trainer")).to_be_visible()
    assert secret not in page.content()
    page.get_by_role("link", name="Storage targets").click()
    shots("storage", page)
    page.get_by_role("link", name="Launch profiles").click()
    shots("launch-profiles", page)
    page.get_by_role("link", name="Alerts").click()
    page.get_by_label("Name").fill("ops-slack")
    page.get_by_label("Target").fill("https://hooks.example.com/T000/B000")
    page.get_by_role("button", name="Add alert channel").click()
    expect(page.locator("#channels")).to_contain_text("ops-slack")
    # A flip sent on the second try: both attempts are shown.
    from webapp.domain.models.alerts import AlertChannel, Flip, Notification

    flip = Flip.objects.create(
        project=project, run=checkpoint_on_disk.run, kind="run.overdue", key="browser-1",
        message="Run Llama 7B is overdue: no checkpoint for 1 h 40 min (expected every 1 h)",
    )  # fmt: skip
    Notification.objects.create(
        flip=flip, channel=AlertChannel.objects.get(name="ops-slack"), status="sent",
        attempts=[{"at": "2026-11-30T06:00:00Z", "ok": False, "status": 503,
                   "error": "HTTP 503 Service Unavailable"},
                  {"at": "2026-11-30T06:00:30Z", "ok": True, "status": 200, "error": ""}],
    )  # fmt: skip
    page.reload()
    expect(page.locator("#flips")).to_contain_text("HTTP 503 Service Unavailable")
    shots("alerts", page)
    page.get_by_role("button", name="Disable ops-slack").click()
    expect(page.get_by_role("button", name="Enable ops-slack")).to_be_visible()
    page.get_by_role("link", name="Recovery").click()
    page.get_by_label("Storage quota (GiB)").fill("500")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#notices")).to_contain_text("storage quota bytes")
    shots("recovery", page)
    # Keyboard: the skip link is the first stop and lands on the content.
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()


def test_an_operator_restore_tests_and_resumes_after_confirming_the_command(
    page, web, project, checkpoint_on_disk, queues, shots
):
    """No launch or restore worker listens: the tasks wait in Redis, and the page shows
    them requested and queued."""
    from playwright.sync_api import expect

    from tests.support.celery_workers import queued_tasks

    checkpoint = checkpoint_on_disk
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    target = StorageTarget.objects.create(project=project, name="backup", bucket="ckpts")
    Replica.objects.create(checkpoint=checkpoint, target=target, status="verified")
    now = timezone.now()
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="passed", device="cpu",
        requested_by="schedule", message="restored and loaded on cpu",
        timings={"download_verify_s": 1.25, "load_s": 0.5, "to_device_s": 0.01,
                 "total_s": 1.76, "peak_host_bytes": 300 * 1024**2, "peak_device_bytes": 0},
        bytes_total=256 * 1024, bytes_done=256 * 1024, started_at=now, finished_at=now,
    )  # fmt: skip
    LaunchProfile.objects.create(
        project=project, name="local-echo", kind="local",
        command_template="echo resumed {{checkpoint_id}} from {{checkpoint_path}}",
    )  # fmt: skip
    person(project, "otto", "operator")
    sign_in(page, web, "otto")
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint.pk}/")
    expect(page.locator("#restore-tests + table")).to_contain_text("1.8 s")

    page.get_by_role("button", name="Restore test").click()
    expect(page.locator("#live")).to_contain_text("queued for a restore test")
    expect(page.locator("#live table.restore-tests")).to_contain_text("Queued")
    [task] = queued_tasks(queues, "restore")
    shots("checkpoint-restore-test-queued", page)

    page.locator("#resume-profile").select_option(label="local-echo (Local process)")
    page.locator("#resume").get_by_role("button", name="Resume…").click()
    expect(page.get_by_role("heading", name="Resume from step 100")).to_be_visible()
    command = 'echo resumed "${LIFEBOAT_CHECKPOINT_ID}" from "${LIFEBOAT_CHECKPOINT_PATH}"'
    expect(page.locator("#resume-command")).to_have_text(command)
    values = page.locator("#resume-values")
    expect(values).to_contain_text(f"LIFEBOAT_CHECKPOINT_ID{checkpoint.pk}")
    expect(values).to_contain_text(f"LIFEBOAT_CHECKPOINT_PATH{checkpoint.location}")
    assert not Resume.objects.exists()  # nothing runs before the confirmation
    shots("resume-confirm", page)

    page.get_by_role("button", name="Start the resume").click()
    # Post/redirect/get onto the resume's live row on the run page.
    expect(page.get_by_role("heading", name="Llama 7B")).to_be_visible()
    [resume] = Resume.objects.all()
    assert page.url.endswith(f"/p/alpha/runs/llama/7b/#resume-{resume.pk}")
    assert resume.status == "requested" and resume.command == command
    assert resume.requested_by.username == "otto"
    row = page.locator(f"#resume-{resume.pk}")
    expect(row).to_contain_text("Requested")
    expect(row).to_contain_text(command)
    expect(page.locator("#notices")).to_contain_text(f"Resume {resume.pk} of step 100")
    assert [t["args"] for t in queued_tasks(queues, "launch")] == [[resume.pk]]
    shots("run-resume-requested", page)
    from webapp.domain.models import Event

    audit = set(Event.objects.filter(actor="user:otto").values_list("type", flat=True))
    assert audit == {"checkpoint.restore_test_requested", "resume.requested"}

    # The run page: the measured time to recover, and what checkpointing costs.
    expect(page.locator("#time-to-recover")).to_contain_text("1.8 s")
    expect(page.locator("#analytics dl.analytics")).to_contain_text("Median save time")
    page.get_by_label("Assume an MTBF of").fill("3")
    page.get_by_role("button", name="Recompute").click()
    expect(page.locator("#analytics")).to_contain_text("assumed here")
    # Drawn by charts.js (uPlot) where JavaScript runs, as the SVG where it does not.
    expect(page.locator("#analytics figure.chart").first).to_be_visible()
    shots("run-analytics", page)
