"""Issue 23, points 1-4, in a real browser (Playwright driving Debian's Chromium against
gunicorn, as tests/test_browser.py): a family of resumed runs told apart and grouped on
a runs list that refreshes itself while visible, the resume button on a failed run, the
damaged local copy with a verified replica, and the resume confirmation showing the whole
command at 1400 and 800 pixels, then landing on the resume's live row, which follows.

Screenshots go to var/screenshots/<test name>/ (the path is printed). Without Chromium
these tests skip, except under CI=true, where they fail."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.browser import person, sign_in
from webapp.domain.models import (
    Checkpoint,
    LaunchProfile,
    Replica,
    Resume,
    Run,
    StorageTarget,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# The page and screenshots are tests/support/browser.py's; Chromium (skipped, or failed
# under CI=true, without it) is conftest.py's `browser`.


@pytest.fixture(scope="module")
def web(worker_env):
    # The runs list's refresh, faster than its default (10 s, 30 s for the problems
    # summary), so that seeing it refresh takes seconds.
    from tests.support.servers import WebServer

    server = WebServer(worker_env, RUNS_REFRESH_S="2", PROBLEMS_REFRESH_S="3")
    yield server
    server.stop()


# A command much wider than the confirmation's box (the was 1,261 px in 832).
LONG_TEMPLATE = (
    "srun --nodes=1 --ntasks-per-node=1 --cpus-per-task=8 --job-name=resume-{{resume_id}} "
    "python -m examples.digits.train --config examples/digits/configs/cnn-small-augmented"
    ".yaml --resume-from {{checkpoint_path}} --run-key {{new_run_key}} --step {{step}} "
    "--log-every 50 --checkpoint-every 100 --keep-last 3 --seed 20261201"
)


@pytest.fixture
def wide(browser):
    contexts = []

    def open_page(width: int, height: int = 900):
        context = browser.new_context(viewport={"width": width, "height": height})
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        return page

    yield open_page
    for context in contexts:
        context.close()


def make_run(project, key: str, **fields) -> Run:
    fields.setdefault("last_seen_at", timezone.now())
    return Run.objects.create(project=project, key=key, **fields)


def make_checkpoint(run, step: int, status: str = "verified") -> Checkpoint:
    return Checkpoint.objects.create(
        project=run.project, run=run, step=step, status=status, saved_at=timezone.now(),
        location=f"/data/{run.key}/step-{step}", total_size=4096, file_count=1,
    )  # fmt: skip


def digits_family(project):
    now = timezone.now()
    first = make_run(project, "digits", name="digits CNN", status="failed",
                     created_at=now - timedelta(hours=3), error="CUDA error: ECC")  # fmt: skip
    at_92 = make_checkpoint(first, 92)
    second = make_run(project, "digits-resume-1", name="digits CNN", status="failed",
                      resumed_from=at_92, created_at=now - timedelta(hours=2))  # fmt: skip
    at_150 = make_checkpoint(second, 150)
    third = make_run(project, "digits-resume-2", name="digits CNN", status="finished",
                     resumed_from=at_150, created_at=now - timedelta(hours=1))  # fmt: skip
    make_checkpoint(third, 200)
    return first, second, third


def test_a_family_of_resumed_runs_is_told_apart_grouped_and_refreshed(wide, web, project, shots):
    from playwright.sync_api import expect

    first, second, third = digits_family(project)
    make_run(project, "other", name="digits CNN")
    person(project, "vera", "viewer")
    for width in (1400, 800):
        page = wide(width)
        sign_in(page, web, "vera")
        page.goto(f"{web.url}/p/alpha/?q=digits")
        family = page.locator(f"#family-{first.pk}")
        expect(family.locator(".family-state")).to_have_text("recovered")
        links = family.locator("td:first-child > a")
        expect(links).to_have_text(
            ["digits CNN · attempt 1", "digits CNN · attempt 2", "digits CNN · attempt 3"]
        )
        expect(page.get_by_role("link", name="digits CNN", exact=True)).to_be_visible()
        shots(f"runs-family-{width}", page)
        page.get_by_role("link", name="digits CNN · attempt 1").click()
        expect(page.get_by_role("heading", name="digits CNN · attempt 1")).to_be_visible()
        lineage = page.locator("#lineage .resumed-as")
        expect(lineage).to_contain_text("This run failed and was resumed as digits CNN · attempt 2")
        expect(lineage).to_contain_text("the family has recovered")
        expect(page.locator(".page-head .family-state")).to_have_text("family: recovered")
        shots(f"run-failed-parent-{width}", page)
        page.get_by_role("link", name="digits CNN · attempt 2").click()
        lines = page.locator("#lineage p:not(.muted)")
        expect(lines).to_have_count(2)
        expect(lines.nth(0)).to_contain_text("digits CNN · attempt 1")
        expect(lines.nth(1)).to_contain_text("digits CNN · attempt 3")
        shots(f"run-middle-{width}", page)

    # The list refreshes itself while visible, and asks nothing while hidden.
    page.goto(f"{web.url}/p/alpha/")
    expect(page.locator("#problems")).to_contain_text("No problems")
    page.evaluate("window.notReloaded = true")
    make_checkpoint(third, 300, status="corrupt")
    # The list every 2 s, the problems summary every 3 s (the server above).
    expect(page.locator(f"#run-row-{third.pk}")).to_contain_text("1 corrupt", timeout=6_000)
    expect(page.locator("#problems")).to_contain_text("1 corrupt checkpoint", timeout=8_000)
    assert page.evaluate("window.notReloaded") is True
    shots("runs-refreshed", page)
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState', {get: () => 'hidden'});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    # Listening only once the page is hidden: a poll that fired just before is not one.
    asked = []
    page.on("request", lambda r: asked.append(r.url) if r.headers.get("hx-request") else None)
    page.wait_for_timeout(4_000)  # two of the list's periods
    assert asked == []


def test_a_failed_run_offers_resume_from_its_latest_verified_checkpoint(
    wide, web, project, shots, queues
):
    from playwright.sync_api import expect

    run = make_run(project, "llama/7b", name="Llama 7B", status="failed", error="NCCL timeout")
    make_checkpoint(run, 100)
    make_checkpoint(run, 200, status="corrupt")
    LaunchProfile.objects.create(
        project=project, name="local-echo", kind="local", command_template="echo {{step}}"
    )
    person(project, "otto", "operator")
    page = wide(1400)
    sign_in(page, web, "otto")
    page.goto(f"{web.url}/p/alpha/")
    expect(page.locator("#problems")).to_contain_text("1 failed, not resumed")
    expect(page.locator("#problems")).to_contain_text("1 corrupt checkpoint")
    shots("runs-problems", page)
    page.get_by_role("link", name="Llama 7B").click()
    recover = page.locator("#recover")
    expect(recover).to_contain_text("This run failed")
    expect(recover).to_contain_text("step 100")
    button = recover.get_by_role("button", name="Resume from the latest verified checkpoint")
    expect(button).to_be_enabled()
    shots("run-failed-offers-resume", page)
    button.click()
    expect(page.get_by_role("heading", name="Resume from step 100")).to_be_visible()
    expect(page.locator("#resume-command")).to_have_text('echo "${LIFEBOAT_STEP}"')
    shots("resume-confirm", page)


def test_a_damaged_local_copy_with_a_verified_replica_resumes_and_the_row_follows(
    wide, web, project, shots, queues
):
    from playwright.sync_api import expect

    run = make_run(project, "digits", name="digits CNN", status="failed")
    checkpoint = make_checkpoint(run, 92, status="corrupt")
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status_message="model.pt does not match its sha256", verified_at=timezone.now()
    )
    target = StorageTarget.objects.create(project=project, name="backup", bucket="ckpts")
    Replica.objects.create(checkpoint=checkpoint, target=target, status="verified")
    LaunchProfile.objects.create(
        project=project, name="local-echo", kind="local",
        command_template="echo resumed {{checkpoint_id}} from {{checkpoint_path}}",
    )  # fmt: skip
    person(project, "otto", "operator")
    page = wide(1400)
    sign_in(page, web, "otto")
    page.goto(f"{web.url}/p/alpha/")
    row = page.locator(f"#run-row-{run.pk}")
    expect(row.locator("td").nth(4)).to_have_text("92")  # "Latest verified" counts the replica
    expect(row).to_contain_text("1 verified")
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint.pk}/")
    expect(page.locator("#replica-rescue")).to_contain_text(
        "The local copy is corrupt, but a replica is verified (backup)"
    )
    expect(page.locator("dl.facts")).not_to_contain_text("Verified")
    expect(page.get_by_role("button", name="Restore test from the replica")).to_be_enabled()
    shots("checkpoint-damaged-replica-verified", page)
    page.get_by_role("link", name="Resume from the replica…").click()
    page.locator("#resume").get_by_role("button", name="Resume…").click()
    expect(page.get_by_role("heading", name="Resume from step 92")).to_be_visible()
    expect(page.locator(".notice-error")).to_have_count(0)
    page.get_by_role("button", name="Start the resume").click()
    [resume] = Resume.objects.all()
    page.wait_for_url(f"{web.url}/p/alpha/runs/digits/#resume-{resume.pk}")
    live = page.locator(f"#resume-{resume.pk}")
    expect(live).to_contain_text("Requested")
    expect(live).to_be_in_viewport()
    shots("resume-requested", page)
    # The launch worker's steps, as it writes them: the row follows each within seconds.
    Resume.objects.filter(pk=resume.pk).update(status="running", external_id="pid:4242")
    expect(live).to_contain_text("Running", timeout=5_000)
    expect(live).to_contain_text("pid:4242")
    child = make_run(project, f"digits-resume-{resume.pk}", name="digits CNN",
                     resumed_from=checkpoint)  # fmt: skip
    Resume.objects.filter(pk=resume.pk).update(status="succeeded", new_run=child)
    expect(live).to_contain_text("Succeeded", timeout=5_000)
    expect(live.get_by_role("link", name="digits CNN · attempt 2")).to_be_visible()
    # The family's state and the offer follow too, without a reload.
    expect(page.locator(".page-head .family-state")).to_have_text("family: recovered, running")
    expect(page.locator("#recover")).to_have_count(0)
    shots("resume-succeeded", page)


def test_a_checkpoint_with_nothing_verified_cannot_be_resumed(wide, web, project, shots):
    from playwright.sync_api import expect

    run = make_run(project, "r", name="r", status="failed")
    checkpoint = make_checkpoint(run, 10, status="corrupt")
    person(project, "otto", "operator")
    page = wide(1400)
    sign_in(page, web, "otto")
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint.pk}/")
    expect(page.locator("#live").get_by_role("button", name="Resume…")).to_be_disabled()
    expect(page.locator("#resume")).to_contain_text("no replica of it is verified")
    page.goto(f"{web.url}/p/alpha/runs/r/")
    expect(
        page.locator("#recover").get_by_role(
            "button", name="Resume from the latest verified checkpoint"
        )
    ).to_be_disabled()
    shots("nothing-verified", page)


@pytest.mark.parametrize("width", [1400, 800])
def test_the_confirmation_shows_the_whole_command_with_a_copy_button(
    wide, web, project, shots, width
):
    from playwright.sync_api import expect

    from webapp.domain.recovery import resume as resumes

    run = make_run(project, "digits", name="digits CNN", status="failed")
    checkpoint = make_checkpoint(run, 92)
    chosen = LaunchProfile.objects.create(
        project=project, name="slurm-gpu", kind="local", command_template=LONG_TEMPLATE
    )
    command = resumes.render(LONG_TEMPLATE)
    person(project, "otto", "operator")
    page = wide(width)
    sign_in(page, web, "otto")
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint.pk}/resume/?profile={chosen.pk}")
    box = page.locator("#resume-command")
    expect(box).to_have_text(command)
    sizes = box.evaluate(
        "e => ({scroll: e.scrollWidth, client: e.clientWidth, text: e.innerText,"
        " right: e.getBoundingClientRect().right, viewport: window.innerWidth})"
    )
    assert sizes["scroll"] <= sizes["client"], sizes  # nothing scrolled out of sight
    assert sizes["right"] <= sizes["viewport"], sizes  # nor off the page
    assert sizes["text"] == command  # every character, no "…"
    # Wrapped between words: no word's text lies on two lines.
    cut = box.evaluate(
        """e => [...e.querySelectorAll('.word')].filter(w => {
            const r = document.createRange();
            r.selectNodeContents(w);
            const lines = [...r.getClientRects()].filter(x => x.width > 0).map(x => x.top);
            return new Set(lines).size > 1;
        }).map(w => w.textContent)"""
    )
    assert cut == []
    assert box.evaluate("e => e.getClientRects()[0].height") > 40  # it did wrap
    shots(f"resume-confirm-{width}", page)
    page.get_by_role("button", name="Copy the command").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == command
