"""One action layer: each action asked once through the API (a token, over HTTP) and once
through the dashboard (a signed-in operator's POST), each on a fresh project built the
same way, leaves the same rows, the same audit line and the same task on the same queue
(webapp/domain/actions). Ids and the actor's name differ by construction and are
written as placeholders; everything else is compared as it is, read back from the
database and the real Redis queues."""

from __future__ import annotations

import pytest

from tests.support.celery_workers import queued_tasks
from tests.support.dashboard import as_user, make_checkpoint, make_run, profile, with_replica
from tests.support.people import member
from webapp.dashboard.recovery_views import template_digest
from webapp.domain.models import Event, Project, Replica, Resume, StorageTarget, Validation
from webapp.domain.publish import QUEUES

pytestmark = pytest.mark.django_db(transaction=True)

# What each task's first argument is the id of.
ARG_KIND = {
    "workers.validate.validate_checkpoint": "checkpoint",
    "workers.restore.restore_test": "validation",
    "workers.replicate.replicate": "replica",
    "workers.launch.launch_resume": "resume",
    "workers.launch.cancel_resume": "resume",
    "workers.retention.apply_project": "project",
}
DATA_KIND = {"validation": "validation", "replicas": "replica", "resume": "resume"}


class Side:
    """One fresh project with run "r", checkpoint step 10 and what `setup` adds, and a
    way to ask for an action in it: through the API or the dashboard."""

    def __init__(self, slug: str, setup):
        self.project = Project.objects.create(name=slug, slug=slug, allowed_roots=["/data"])
        self.checkpoint = make_checkpoint(make_run(self.project, "r"), 10)
        self.extra = setup(self) if setup else None

    def ids(self) -> dict[str, dict[int, str]]:
        """Every id this side made, as kind#n in the order made."""
        rows = {
            "checkpoint": [self.checkpoint.pk],
            "project": [self.project.pk],
            "validation": Validation.objects.filter(checkpoint__project=self.project),
            "replica": Replica.objects.filter(checkpoint__project=self.project),
            "resume": Resume.objects.filter(project=self.project),
        }
        return {
            kind: {
                pk: f"{kind}#{n}"
                for n, pk in enumerate(
                    pks
                    if isinstance(pks, list)
                    else pks.order_by("pk").values_list("pk", flat=True)
                )
            }
            for kind, pks in rows.items()
        }

    def state(self, actor: str, redis) -> dict:
        """Rows, audit lines and queued tasks, with ids and the actor as placeholders."""
        ids = self.ids()

        def name(kind, value):
            if isinstance(value, list):
                return [name(kind, v) for v in value]
            return ids[kind].get(value, value)

        def text(value):
            return value.replace(actor, "<actor>") if isinstance(value, str) else value

        events = [
            (e.type, e.run.key if e.run else None, e.step, e.actor == actor, text(e.message),
             {k: name(DATA_KIND[k], v) if k in DATA_KIND else text(v) for k, v in e.data.items()})
            for e in Event.objects.filter(project=self.project).order_by("pk")
        ]  # fmt: skip
        tasks = [
            (queue, t["task"], [name(ARG_KIND[t["task"]], t["args"][0]), *t["args"][1:]],
             {k: text(v) for k, v in t["kwargs"].items()})
            for queue in [*QUEUES, "launch.h1"]
            for t in queued_tasks(redis, queue)
        ]  # fmt: skip
        validations = Validation.objects.filter(checkpoint__project=self.project).order_by("pk")
        resumes = Resume.objects.filter(project=self.project).order_by("pk")
        self.checkpoint.refresh_from_db()
        return {
            "checkpoint": (self.checkpoint.status, self.checkpoint.pinned),
            "validations": [(v.kind, v.status, text(v.requested_by)) for v in validations],
            "replicas": sorted(
                (r.target.name, r.status, r.attempts)
                for r in Replica.objects.filter(checkpoint__project=self.project)
            ),
            # requested_by is the person (a token has none): the actor is in the Event.
            "resumes": [(r.status, r.command, r.profile.name, r.automatic) for r in resumes],
            "events": events,
            "tasks": tasks,
        }


@pytest.fixture
def both(queues):
    """Run `action` through the API in one fresh project and through the dashboard in
    another; return the two states."""

    def run(api_call, page_call, setup=None):
        via_api = Side("via-api", setup)
        token = via_api.project.issue_token("ops", ["read", "operate"])[1]
        response = api_call(via_api, token)
        assert response.status_code < 300, response.content
        api_state = via_api.state("token:ops", queues)
        queues.flushdb()

        via_page = Side("via-page", setup)
        operator = member(via_page.project, "otto", "operator")
        response = page_call(via_page, as_user(operator))
        assert response.status_code in (200, 302), response.content
        page_state = via_page.state("user:otto", queues)
        assert api_state == page_state
        return api_state

    return run


def test_validate(api, both):
    state = both(
        lambda s, token: api.post(token, f"/checkpoints/{s.checkpoint.pk}/validate"),
        lambda s, user: user.post(f"/p/{s.project.slug}/checkpoints/{s.checkpoint.pk}/validate/"),
    )
    assert state["validations"] == [("integrity", "queued", "<actor>")]
    [event] = state["events"]
    assert event[:5] == (
        "checkpoint.validation_requested", "r", 10, True, "<actor> asked for a new check of step 10"
    )  # fmt: skip
    assert event[5] == {"validation": "validation#0"}
    assert state["tasks"] == [
        (
            "validate",
            "workers.validate.validate_checkpoint",
            ["checkpoint#0"],
            {"requested_by": "<actor>", "revalidate": True},
        )
    ]


@pytest.mark.parametrize("pinned", [True, False])
def test_pin_and_unpin(api, both, pinned):
    def start(side):
        side.checkpoint.pinned = not pinned
        side.checkpoint.save()

    state = both(
        lambda s, token: api.post(token, f"/checkpoints/{s.checkpoint.pk}/pin", {"pinned": pinned}),
        lambda s, user: user.post(
            f"/p/{s.project.slug}/checkpoints/{s.checkpoint.pk}/pin/",
            {"pinned": "1" if pinned else "0"},
        ),
        start,
    )
    verb = "pinned" if pinned else "unpinned"
    assert state["checkpoint"] == ("verified", pinned)
    assert state["events"] == [(f"checkpoint.{verb}", "r", 10, True, f"<actor> {verb} step 10", {})]
    assert state["tasks"] == []


def test_replicate(api, both):
    def target(side):
        StorageTarget.objects.create(project=side.project, name="backup", bucket="b")

    state = both(
        lambda s, token: api.post(token, f"/checkpoints/{s.checkpoint.pk}/replicate"),
        lambda s, user: user.post(f"/p/{s.project.slug}/checkpoints/{s.checkpoint.pk}/replicate/"),
        target,
    )
    assert state["replicas"] == [("backup", "pending", 0)]
    [event] = state["events"]
    assert event[0] == "checkpoint.replication_requested" and event[5] == {
        "replicas": ["replica#0"]
    }
    assert state["tasks"] == [("replicate", "workers.replicate.replicate", ["replica#0"], {})]


def test_restore_test(api, both):
    state = both(
        lambda s, token: api.post(token, f"/checkpoints/{s.checkpoint.pk}/restore-test"),
        lambda s, user: user.post(
            f"/p/{s.project.slug}/checkpoints/{s.checkpoint.pk}/restore-test/"
        ),
        lambda side: with_replica(side.checkpoint),
    )
    assert state["validations"] == [("restore", "queued", "<actor>")]
    [event] = state["events"]
    assert event[0] == "checkpoint.restore_test_requested"
    assert event[5] == {"validation": "validation#0"}
    assert state["tasks"] == [("restore", "workers.restore.restore_test", ["validation#0"], {})]


def test_resume(api, both):
    def resume_page(side, user):
        chosen = side.extra
        return user.post(
            f"/p/{side.project.slug}/checkpoints/{side.checkpoint.pk}/resume/",
            {"profile": chosen.pk, "digest": template_digest(chosen)},
        )

    state = both(
        lambda s, token: api.post(
            token, f"/checkpoints/{s.checkpoint.pk}/resume", {"profile": "local-echo"}
        ),
        resume_page,
        lambda side: profile(side.project),
    )
    [(status, command, profile_name, automatic)] = state["resumes"]
    assert (status, profile_name, automatic) == ("requested", "local-echo", False)
    [event] = state["events"]
    assert event[0] == "resume.requested" and event[5]["resume"] == "resume#0"
    assert state["tasks"] == [("launch", "workers.launch.launch_resume", ["resume#0"], {})]


def test_cancel_resume(api, both):
    def running_resume(side):
        chosen = profile(side.project)
        chosen.host = "h1"
        chosen.save()
        return Resume.objects.create(
            project=side.project,
            run=side.checkpoint.run,
            checkpoint=side.checkpoint,
            profile=chosen,
            status="running",
        )

    state = both(
        lambda s, token: api.post(token, f"/resumes/{s.extra.pk}/cancel"),
        lambda s, user: user.post(f"/p/{s.project.slug}/resumes/{s.extra.pk}/cancel/"),
        running_resume,
    )
    assert state["resumes"][0][0] == "running"  # the launch host cancels it
    assert state["events"] == [
        (
            "resume.cancel_requested", "r", 10, True,
            "<actor> asked to cancel the resume from step 10", {"resume": "resume#0"},
        )
    ]  # fmt: skip
    # To the launch queue of the profile's host, where the process lives.
    assert state["tasks"] == [("launch.h1", "workers.launch.cancel_resume", ["resume#0"], {})]


def test_a_resume_that_has_ended_is_not_cancelled_twice(api, token, project, queues):
    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 10)
    ended = Resume.objects.create(
        project=project, run=run, checkpoint=checkpoint, profile=profile(project),
        status="cancelled",
    )  # fmt: skip
    response = api.post(token, f"/resumes/{ended.pk}/cancel")
    assert response.status_code == 409 and "already ended" in response.json()["error"]
    operator = member(project, "otto", "operator")
    html = (
        as_user(operator)
        .post(f"/p/alpha/resumes/{ended.pk}/cancel/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "Not cancelled: resume" in html
    assert not Event.objects.exists() and queued_tasks(queues, "launch") == []


def test_retention_apply(api, both):
    state = both(
        lambda s, token: api.post(token, "/retention/apply"),
        lambda s, user: user.post(f"/p/{s.project.slug}/retention/apply/"),
    )
    assert state["events"] == [
        (
            "retention.requested", None, None, True,
            "<actor> asked for the retention policies to be applied", {},
        )
    ]  # fmt: skip
    assert state["tasks"] == [("validate", "workers.retention.apply_project", ["project#0"], {})]
