"""Settings in a real browser (Playwright driving Debian's Chromium against gunicorn):
an admin manages members and meets the last-admin rule, creates a token, copies its
secret with the Copy button and reloads without making a second one; the settings
pages and a checkpoint page with long restore-test findings hold at 800 pixels (no
horizontal scrolling).

Screenshots go to var/screenshots/<test name>/, like tests/test_browser.py, whose
fixtures these tests use."""

# ruff: noqa: F811 (the fixtures imported from tests/test_browser.py are parameters here)

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.support.browser import PASSWORD, person, sign_in
from webapp.domain.models import (
    AlertChannel,
    ApiToken,
    LaunchProfile,
    Membership,
    StorageTarget,
    Validation,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def no_horizontal_overflow(page) -> tuple[int, int]:
    return page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )


def test_an_admin_manages_members_and_keeps_an_admin(page, web, project, shots):  # noqa: F811
    from playwright.sync_api import expect

    ada = person(project, "ada", "admin")
    get_user_model().objects.create(
        username="bob",
        password=PBKDF2PasswordHasher().encode(PASSWORD, "lifeboat-test-salt", iterations=1000),
    )
    sign_in(page, web, "ada")
    page.goto(f"{web.url}/p/alpha/settings/members/")
    expect(page.get_by_role("link", name="Members")).to_have_attribute("aria-current", "page")
    page.get_by_label("User name").fill("bob")
    page.locator("#id_role").select_option("operator")
    page.get_by_role("button", name="Add member").click()
    expect(page.locator("#notices")).to_contain_text("bob is a member of Alpha: operator")
    shots("member-added", page)
    bob = Membership.objects.get(user__username="bob")
    assert bob.role == "operator"

    page.get_by_label("Role of bob").select_option("admin")
    page.get_by_role("button", name="Change role of bob").click()
    expect(page.locator("#notices")).to_contain_text("bob is now admin")
    assert Membership.objects.get(pk=bob.pk).role == "admin"

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Remove bob").click()
    expect(page.locator("#notices")).to_contain_text("bob is no longer a member")
    assert not Membership.objects.filter(pk=bob.pk).exists()

    # Ada is the last admin now: she can neither remove herself nor step down.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Remove ada").click()
    expect(page.locator("#notices")).to_contain_text("ada is the last admin of Alpha")
    page.get_by_label("Role of ada").select_option("viewer")
    page.get_by_role("button", name="Change role of ada").click()
    expect(page.locator("#notices")).to_contain_text("the last admin")
    shots("last-admin-refused", page)
    assert Membership.objects.get(user=ada).role == "admin"


def test_a_token_is_copied_and_a_reload_makes_no_second_one(page, web, project, shots):  # noqa: F811
    from playwright.sync_api import expect

    person(project, "ada", "admin")
    sign_in(page, web, "ada")
    page.goto(f"{web.url}/p/alpha/settings/tokens/")
    page.get_by_label("Name").fill("trainer")
    page.get_by_role("button", name="Create token").click()
    page.wait_for_url(f"{web.url}/p/alpha/settings/tokens/")  # redirected after the POST
    secret = page.locator("#new-token").inner_text()
    assert secret.startswith("lb_")
    copy = page.locator('button[data-copy="new-token"]')
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    shots("token-copied", page)

    page.reload()
    expect(page.get_by_role("cell", name="trainer")).to_be_visible()
    assert page.locator("#new-token").count() == 0 and secret not in page.content()
    assert ApiToken.objects.filter(project=project).count() == 1
    shots("after-reload", page)

    # The same name again is refused with a message on the form.
    page.get_by_label("Name").fill("trainer")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator(".errorlist")).to_contain_text("already has this name")
    assert ApiToken.objects.filter(project=project).count() == 1


def test_settings_and_checkpoint_pages_hold_at_800_pixels(
    page,
    web,
    project,
    checkpoint_on_disk,
    shots,  # noqa: F811
):
    from playwright.sync_api import expect

    person(project, "ada", "admin")
    target = StorageTarget.objects.create(
        project=project, name="seaweed", bucket="a-rather-long-bucket-name-for-checkpoints",
        prefix="team/projects/alpha/replicas/", endpoint_url="http://127.0.0.1:8333",
    )  # fmt: skip
    profile = LaunchProfile.objects.create(
        project=project, name="slurm-8gpu", kind="slurm",
        command_template="srun --gres=gpu:8 python -m training.entrypoint --resume "
        "{{checkpoint_path}} --run-name {{new_run_key}} --config configs/very/long/path.yaml",
        options={"workdir": "/scratch/alice/projects/alpha", "env": {"OMP_NUM_THREADS": "8"}},
    )  # fmt: skip
    channel = AlertChannel.objects.create(
        project=project, name="ops", kind="webhook",
        target="https://hooks.example.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    )  # fmt: skip
    long = (
        "tensor model.layers.31.self_attn.q_proj.weight differs from the saved one: "
        "max |a-b| = 0.125 at index (4095, 17); the replica at "
        "s3://a-rather-long-bucket-name-for-checkpoints/team/projects/alpha/replicas/"
        "llama/7b/step-100/model-00001-of-00004.safetensors was read in full"
    )
    Validation.objects.create(
        checkpoint=checkpoint_on_disk, kind="restore", status="failed", device="cpu",
        message="The restored weights do not match.", timings={"fetch_s": 1.5},
        findings=[{"severity": "corrupt", "level": "file", "ok": False, "message": long}] * 3,
    )  # fmt: skip
    sign_in(page, web, "ada")
    page.set_viewport_size({"width": 800, "height": 900})
    paths = {
        "members": "settings/members/",
        "tokens": "settings/tokens/",
        "storage": "settings/storage/",
        "storage-edit": f"settings/storage/{target.pk}/",
        "profiles": "settings/launch-profiles/",
        "profile-edit": f"settings/launch-profiles/{profile.pk}/",
        "alerts": "settings/alerts/",
        "alert-edit": f"settings/alerts/{channel.pk}/edit/",
        "recovery": "settings/recovery/",
        "audit": "settings/audit/",
        "checkpoint": f"checkpoints/{checkpoint_on_disk.pk}/",
    }
    wide = {}
    for name, path in paths.items():
        page.goto(f"{web.url}/p/alpha/{path}")
        page.wait_for_load_state("networkidle")
        shots(f"800-{name}", page)
        scroll, client = no_horizontal_overflow(page)
        if scroll > client:
            wide[name] = (scroll, client)
    assert wide == {}, f"wider than the window at 800 px: {wide}"
    # The restore tests fit without scrolling inside their own box either.
    page.goto(f"{web.url}/p/alpha/checkpoints/{checkpoint_on_disk.pk}/")
    table = page.locator("table.restore-tests")
    assert table.evaluate("t => t.scrollWidth <= t.clientWidth + 1")
    expect(page.locator("tr.findings-row")).to_contain_text("was read in full")
    # The profile preview renders as one types, with the launcher's rendering.
    page.goto(f"{web.url}/p/alpha/settings/launch-profiles/")
    page.get_by_label("Command template").fill("python train.py --resume {{checkpoint_path}}")
    expect(page.locator("#preview-command")).to_contain_text('"${LIFEBOAT_CHECKPOINT_PATH}"')
    page.get_by_label("Command template").fill("echo '{{run_key}}'")
    expect(page.locator("#preview-refusal")).to_contain_text("single quotes")
    shots("800-preview", page)


def test_sort_headers_toggle_and_the_tag_filter_applies_while_typing(page, web, project, shots):
    from django.utils import timezone
    from playwright.sync_api import expect

    from webapp.domain.models import Run

    person(project, "vera", "viewer")
    now = timezone.now()
    for n in (3, 28, 29, 30):
        Run.objects.create(
            project=project, key=f"run-{n}", last_seen_at=now, tags=["odd" if n % 2 else "even"]
        )
    sign_in(page, web, "vera")
    page.goto(f"{web.url}/p/alpha/")
    keys = "#run-list tbody tr td:first-child > a"
    header = page.locator("#run-list th a").first
    header.click()
    expect(header).to_have_text("Run ↑")
    expect(page.locator(keys)).to_have_text(["run-3", "run-28", "run-29", "run-30"])
    shots("name-ascending", page)
    page.locator("#run-list th a").first.click()
    expect(page.locator("#run-list th a").first).to_have_text("Run ↓")
    expect(page.locator(keys)).to_have_text(["run-30", "run-29", "run-28", "run-3"])
    # Typing a tag filters without Enter (htmx, after 300 ms); the sort stays.
    page.get_by_label("Tag").press_sequentially("odd")
    expect(page.locator(keys)).to_have_text(["run-29", "run-3"])
    assert "tag=odd" in page.url and "dir=desc" in page.url
    shots("tag-typed", page)
