"""Telling runs apart and recovering where the trouble shows (issue 23, points 1-4):
families of resumed runs labelled by attempt and grouped with the family's state, the
problems summary and its filters, one rule of what can be resumed from (verified here or
in a replica) on every page and in resume.request(), the run page's "Resume from the
latest verified checkpoint", and the resume's live row after post/redirect/get."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run
from webapp.domain.models import Checkpoint, LaunchProfile, Replica, Resume, StorageTarget

pytestmark = pytest.mark.django_db


def replica(checkpoint, status: str = "verified") -> Replica:
    target, _ = StorageTarget.objects.get_or_create(
        project=checkpoint.project, name="backup", defaults={"bucket": "b"}
    )
    return Replica.objects.create(checkpoint=checkpoint, target=target, status=status)


def profile(project) -> LaunchProfile:
    return LaunchProfile.objects.create(
        project=project, name="local-echo", kind="local", command_template="echo {{step}}"
    )


def family(project):
    """digits CNN failed at 92, its resume failed at 150, the second resume finished:
    three runs with one name."""
    now = timezone.now()
    first = make_run(project, "digits", name="digits CNN", status="failed",
                     created_at=now - timedelta(hours=3))  # fmt: skip
    at_92 = make_checkpoint(first, 92)
    second = make_run(project, "digits-resume-1", name="digits CNN", status="failed",
                      resumed_from=at_92, created_at=now - timedelta(hours=2))  # fmt: skip
    at_150 = make_checkpoint(second, 150)
    third = make_run(project, "digits-resume-2", name="digits CNN", status="finished",
                     resumed_from=at_150, created_at=now - timedelta(hours=1))  # fmt: skip
    return first, second, third


def row(html: str, run) -> str:
    return html.split(f'id="run-row-{run.pk}"')[1].split("</tr>")[0]


# --- Families -----------------------------------------------------------------------------


def test_a_family_is_grouped_and_each_run_labelled_by_its_attempt(project, viewer):
    first, second, third = family(project)
    loner = make_run(project, "other", name="digits CNN")
    html = as_user(viewer).get("/p/alpha/", {"q": "digits"}).content.decode()
    group = html.split(f'id="family-{first.pk}"')[1].split("</tbody>")[0]
    assert "3 attempts" in group and ">recovered</span>" in group
    # In attempt order, each with what tells it apart; the loner stays on its own.
    assert [m for m in re.findall(r"digits CNN · attempt (\d)", group)] == ["1", "2", "3"]
    assert group.index(f'id="run-row-{first.pk}"') < group.index(f'id="run-row-{third.pk}"')
    assert "digits-resume-2 · resumed from step 150" in row(group, third)
    assert f'id="run-row-{loner.pk}"' not in group and ">digits CNN</a>" in row(html, loner)


def test_the_failed_parent_says_it_was_resumed_and_the_family_recovered(project, viewer):
    first, second, third = family(project)
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/digits/").content.decode()
    assert "<h1>digits CNN · attempt 1</h1>" in html
    assert "family: recovered" in html
    assert 'id="recover"' not in html  # recovered already: nothing to offer
    lineage = html.split('id="lineage"')[1].split("</section>")[0]
    assert "This run failed and was resumed as" in lineage
    assert "digits CNN · attempt 2</a>" in lineage and "the family has <strong>recovered" in lineage
    middle = client.get("/p/alpha/runs/digits-resume-1/").content.decode()
    lineage = middle.split('id="lineage"')[1].split("</section>")[0]
    # Each line names a different run: the parent as attempt 1, the child as attempt 3.
    assert "Resumed from <a" in lineage and "digits CNN · attempt 1</a>" in lineage
    assert "digits CNN · attempt 3</a>" in lineage and "attempt 2 of 3" in lineage


def test_a_run_resumed_under_its_own_key_names_its_own_step(project, viewer):
    """The README tour's `train_digits.py --resume` restarts the run `digits` from its own
    step: the page says so, not "a checkpoint not known to this project"."""
    run = make_run(project, "digits", name="digits CNN")
    at_92 = make_checkpoint(run, 92)
    run.resumed_from, run.resumed_from_ref = at_92, str(at_92.pk)
    run.save()
    html = as_user(viewer).get("/p/alpha/runs/digits/").content.decode()
    lineage = html.split('id="lineage"')[1].split("</section>")[0]
    assert "Resumed from its own" in lineage and "step 92</a>" in lineage
    assert "not known to this project" not in lineage


def test_a_failed_run_with_a_resume_on_its_way_is_failed_resuming(project, viewer):
    run = make_run(project, "lone", name="lone", status="failed")
    checkpoint = make_checkpoint(run, 10)
    html = as_user(viewer).get("/p/alpha/", {"problems": 1}).content.decode()
    assert "failed, resuming" not in html and "failed, not resumed" in html
    Resume.objects.create(project=project, run=run, checkpoint=checkpoint, status="launching")
    html = as_user(viewer).get("/p/alpha/", {"problems": 1}).content.decode()
    assert ">failed, resuming</span>" in html
    assert "failed, not resumed" not in html  # not a problem any more: help is on its way
    page = as_user(viewer).get("/p/alpha/runs/lone/").content.decode()
    assert ">failed, resuming</span>" in page


# --- Problems -----------------------------------------------------------------------------


def test_the_problems_summary_counts_and_links_to_each_filter(project, viewer):
    family(project)  # two failed runs, both resumed: no problem
    lost = make_run(project, "lost", status="failed")
    late = make_run(project, "late", expected_interval_s=60,
                    started_at=timezone.now() - timedelta(hours=2))  # fmt: skip
    damaged = make_run(project, "damaged")
    make_checkpoint(damaged, 1, status="corrupt")
    make_checkpoint(damaged, 2, status="corrupt")
    make_checkpoint(damaged, 3, status="suspicious")
    client = as_user(viewer)
    html = client.get("/p/alpha/", {"problems": 1}).content.decode()  # drawn in the page
    problems = html.split('id="problems"')[1].split("</section>")[0]
    assert "<strong>1</strong> failed, not resumed" in problems
    assert "<strong>1</strong> overdue" in problems
    assert "<strong>2</strong> corrupt checkpoints" in problems
    assert "<strong>1</strong> suspicious checkpoint<" in problems
    assert "2 corrupt</a>" in row(html, damaged) and "1 suspicious</a>" in row(html, damaged)
    only = client.get("/p/alpha/", {"status": "failed-unresumed"}).content.decode()
    assert "/runs/lost/" in only and "/runs/digits/" not in only
    only = client.get("/p/alpha/", {"status": "damaged"}).content.decode()
    assert "/runs/damaged/" in only and "/runs/lost/" not in only
    assert late.pk and lost.pk


def test_no_problems_says_so(project, viewer):
    make_checkpoint(make_run(project, "fine"), 1)
    html = as_user(viewer).get("/p/alpha/", {"problems": 1}).content.decode()
    assert ">No problems</span>" in html


def test_the_runs_list_refreshes_itself_only_while_visible(
    project, viewer, django_assert_num_queries
):
    make_run(project, "r")
    client = as_user(viewer)
    html = client.get("/p/alpha/", {"q": "r"}).content.decode()
    assert 'hx-get="/p/alpha/?q=r"' in html
    assert "every 10s [document.visibilityState === 'visible']" in html
    fragment = client.get(
        "/p/alpha/", {"q": "r"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-list"
    ).content.decode()
    assert fragment.lstrip().startswith('<div id="run-list"') and 'id="problems"' not in fragment
    # The problems summary: a request of its own, on the same rhythm, a constant cost.
    assert 'hx-get="/p/alpha/?problems=1"' in html and "Counting problems" in html
    with django_assert_num_queries(3 + 3):
        problems = client.get("/p/alpha/", {"problems": 1}, HTTP_HX_REQUEST="true")
    assert ">No problems</span>" in problems.content.decode()


# --- One rule of what can be resumed from --------------------------------------------------


@pytest.mark.parametrize(
    "status, replica_status, resumable",
    [
        ("verified", None, True),
        ("corrupt", None, False),
        ("corrupt", "verified", True),
        ("missing", "verified", True),
        ("deleted", "verified", True),
        ("corrupt", "failed", False),
        ("suspicious", "verified", False),  # the bytes themselves are in doubt
        ("reported", "verified", False),
    ],
)
def test_one_rule_for_resume_request_and_the_pages(
    project, operator, status, replica_status, resumable
):
    from webapp.domain.recovery import resume as resumes

    run = make_run(project, "r", status="failed")
    checkpoint = make_checkpoint(run, 10, status=status)
    if replica_status:
        replica(checkpoint, replica_status)
    chosen = profile(project)
    assert (checkpoint.resume_refusal() == "") is resumable
    assert (run.latest_resumable_checkpoint() == checkpoint) is resumable
    client = as_user(operator)
    page = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert (f'action="/p/alpha/checkpoints/{checkpoint.pk}/resume/"' in page) is resumable
    listed = client.get("/p/alpha/").content.decode()
    latest = row(listed, run).split('class="num"')[2]
    assert ("10</td>" in latest) is resumable  # the runs list's "Latest verified"
    run_page = client.get("/p/alpha/runs/r/").content.decode()
    recover = run_page.split('id="recover"')[1].split("</section>")[0]
    assert ("<button type=\"submit\" class=\"btn btn-primary\">Resume from the latest "
            "verified checkpoint</button>" in recover) is resumable  # fmt: skip
    if resumable:
        resume = resumes.request(checkpoint, chosen, actor="test")
        assert resume.pk
    else:
        with pytest.raises(resumes.ResumeError, match="can be resumed from"):
            resumes.request(checkpoint, chosen, actor="test")


def test_a_damaged_local_copy_with_a_verified_replica_says_so_and_offers_both(project, operator):
    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 10, status="corrupt", verified_at=timezone.now())
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status_message="model.pt does not match its sha256"
    )
    replica(checkpoint)
    profile(project)
    client = as_user(operator)
    html = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert "The local copy is corrupt, but a replica is verified (backup)" in html
    assert ">Resume from the replica…</a>" in html
    assert ">Restore test from the replica</button>" in html
    assert "<dt>Verified</dt>" not in html  # no stale line beside "Corrupt"
    assert "only a verified checkpoint" not in html
    confirm = client.get(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/",
        {"profile": LaunchProfile.objects.get().pk},
    ).content.decode()
    assert "Not resumed" not in confirm and "Start the resume" in confirm
    # The runs list agrees with the replica badge beside it.
    listed = client.get("/p/alpha/").content.decode()
    assert "1 verified</span>" in row(listed, run) and ">none<" not in row(listed, run)


def test_with_nothing_verified_the_resume_buttons_are_disabled(project, operator):
    run = make_run(project, "r", status="failed")
    checkpoint = make_checkpoint(run, 10, status="corrupt")
    profile(project)
    client = as_user(operator)
    html = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert re.search(
        r'<button type="button" class="btn" disabled title="[^"]*">Resume…</button>', html
    )
    assert 'href="#resume"' not in html
    page = client.get("/p/alpha/runs/r/").content.decode()
    recover = page.split('id="recover"')[1].split("</section>")[0]
    assert "disabled" in recover and "Nothing to resume from" in recover


# --- Recovery on the run page -----------------------------------------------------------------


def test_a_failed_run_offers_its_latest_verified_checkpoint_along_the_lineage(project, operator):
    parent = make_run(project, "p", status="failed")
    origin = make_checkpoint(parent, 50)
    make_checkpoint(parent, 60, status="corrupt")
    child = make_run(project, "c", status="failed", resumed_from=origin)  # died before saving
    profile(project)
    page = as_user(operator).get("/p/alpha/runs/c/").content.decode()
    recover = page.split('id="recover"')[1].split("</section>")[0]
    assert "This run failed" in recover and "step 50</a> of p" in recover
    assert f'action="/p/alpha/checkpoints/{origin.pk}/resume/"' in recover
    assert child.pk


def test_an_overdue_run_offers_resume_and_a_healthy_one_does_not(project, operator):
    overdue = make_run(project, "o", expected_interval_s=60,
                       started_at=timezone.now() - timedelta(hours=2))  # fmt: skip
    make_checkpoint(overdue, 5, saved_at=timezone.now() - timedelta(hours=1))
    fine = make_run(project, "f", expected_interval_s=3600, started_at=timezone.now())
    make_checkpoint(fine, 5)
    client = as_user(operator)
    assert "is overdue" in client.get("/p/alpha/runs/o/").content.decode()
    assert 'id="recover"' not in client.get("/p/alpha/runs/f/").content.decode()


def test_starting_a_resume_lands_on_its_live_row_which_polls_until_final(project, operator):
    run = make_run(project, "r", status="failed")
    checkpoint = make_checkpoint(run, 10)
    chosen = profile(project)
    client = as_user(operator)
    html = client.get(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk}
    ).content.decode()
    digest = html.split('name="digest" value="')[1].split('"')[0]
    assert 'data-copy="resume-command"' in html
    response = client.post(
        f"/p/alpha/checkpoints/{checkpoint.pk}/resume/", {"profile": chosen.pk, "digest": digest}
    )
    [resume] = Resume.objects.all()
    assert response.status_code == 302
    assert response["Location"] == f"/p/alpha/runs/r/#resume-{resume.pk}"
    page = client.get("/p/alpha/runs/r/").content.decode()
    live = page.split('id="resumes-live"')[1].split("</div>\n")[0]
    assert 'hx-trigger="every 2000ms' in live and f'id="resume-{resume.pk}"' in live
    poll = client.get("/p/alpha/runs/r/", {"resumes": 1}, HTTP_HX_REQUEST="true")
    assert poll.status_code == 200 and "Requested" in poll.content.decode()
    # The launch worker reports the new run and the end: the row follows, then stops.
    new_run = make_run(project, f"r-resume-{resume.pk}", name="", resumed_from=checkpoint)
    Resume.objects.filter(pk=resume.pk).update(status="succeeded", new_run=new_run)
    poll = client.get("/p/alpha/runs/r/", {"resumes": 1}, HTTP_HX_REQUEST="true")
    assert poll.status_code == 286  # htmx stops polling
    body = poll.content.decode()
    assert "Succeeded" in body and f"r-resume-{resume.pk} · attempt 2</a>" in body
