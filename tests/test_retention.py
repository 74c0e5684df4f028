"""Retention on a run of 50 checkpoints: each rule alone and all together, dry run then
real run; pinned, resumed-from, best and latest always survive; local copies go only
with a verified replica; replicas' shared objects stay while another replica names them."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.domain.models import (
    Checkpoint,
    Event,
    Replica,
    RetentionPolicy,
    Run,
    StorageTarget,
)
from webapp.domain.replication.restore import restore_replica
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = list(range(10, 510, 10))  # 50 checkpoints
PINNED, RESUMED_FROM, CORRUPT, UNREPLICATED, IN_PROGRESS = 70, 130, 30, 20, 500
LATEST_VERIFIED = 490


def loss(step: int) -> float:
    return ((step * 37) % 101) / 100


@pytest.fixture
def fifty(project, root):
    """Steps 10..500; step 30 corrupt, 500 still being checked, the others verified and,
    but for step 20, with a verified replica; 70 pinned; a run resumed from 130."""
    target = StorageTarget.objects.create(project=project, name="main", bucket="b")
    for step in STEPS:
        status = {CORRUPT: "corrupt", IN_PROGRESS: "verifying"}.get(step, "verified")
        checkpoint = make_checkpoint(
            project,
            root,
            step,
            {"model.pt": step.to_bytes(4, "big"), "extra/state.json": b"{}"},
            status=status,
            metrics={"loss": loss(step)},
            pinned=step == PINNED,
        )
        if status == "verified" and step != UNREPLICATED:
            # The local policy reads the rows; the objects are another test's business.
            Replica.objects.create(
                checkpoint=checkpoint, target=target, status="verified", verified_at=timezone.now()
            )
    Run.objects.create(
        project=project,
        key="run-2",
        resumed_from=Checkpoint.objects.get(run__key="run-1", step=RESUMED_FROM),
    )
    return project


def on_disk(root) -> set[int]:
    return {step for step in STEPS if (root / "run-1" / f"step-{step}" / "model.pt").exists()}


def best(k: int) -> set[int]:
    verified = [s for s in STEPS if s not in (CORRUPT, IN_PROGRESS)]
    return set(sorted(verified, key=loss)[:k])


ALWAYS = {PINNED, RESUMED_FROM, LATEST_VERIFIED, CORRUPT, IN_PROGRESS, UNREPLICATED}

RULES = {
    "last": ({"keep_last": 5}, {450, 460, 470, 480, 490}),
    "best": ({"keep_best": 3, "metric": "loss"}, best(3)),
    "every": ({"keep_every_n_steps": 100}, {100, 200, 300, 400, 500}),
    "union": (
        {"keep_last": 5, "keep_best": 3, "metric": "loss", "keep_every_n_steps": 100},
        {450, 460, 470, 480, 490} | best(3) | {100, 200, 300, 400, 500},
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_dry_run_then_real_run_on_fifty_checkpoints(fifty, root, rule):
    fields, kept_by_rule = RULES[rule]
    RetentionPolicy.objects.create(project=fifty, applies_to="local", **fields)
    survivors = ALWAYS | kept_by_rule
    assert len(survivors) < 25  # the rule does delete something

    decisions = retention.plan(fifty, "local")
    assert [d.step for d in decisions if d.run == "run-1"] == STEPS
    assert {d.step for d in decisions if not d.delete} == survivors
    why = {d.step: "; ".join(d.reasons) for d in decisions}
    assert "pinned" in why[PINNED]
    assert "a run was resumed from it" in why[RESUMED_FROM]
    assert "latest verified" in why[LATEST_VERIFIED]
    assert why[CORRUPT] == "corrupt, not verified: never deleted by a policy"
    assert why[IN_PROGRESS] == "verifying, not verified: never deleted by a policy"
    assert why[UNREPLICATED] == "no rule keeps it, but it has no verified replica yet"
    gone = next(d for d in decisions if d.delete)
    assert gone.reasons == ["no rule keeps it", "verified replica on main"]
    assert on_disk(root) == set(STEPS)  # a dry run deletes nothing
    assert not Event.objects.filter(type="checkpoint.deleted").exists()

    # One file of a doomed checkpoint is already gone: no matter.
    os.unlink(root / "run-1" / f"step-{gone.step}" / "model.pt")
    done = retention.apply(fifty, actor="test")
    assert {d.step for d in done} == set(STEPS) - survivors
    assert on_disk(root) == survivors
    assert not (root / "run-1" / f"step-{gone.step}").exists()  # empty directories too
    deleted = Checkpoint.objects.filter(status="deleted")
    assert set(deleted.values_list("step", flat=True)) == set(STEPS) - survivors
    assert all(c.deleted_at for c in deleted)
    assert "retention policy" in deleted.first().status_message
    events = Event.objects.filter(type="checkpoint.deleted")
    assert set(events.values_list("step", flat=True)) == set(STEPS) - survivors
    assert events.first().actor == "test"
    # Running it again deletes nothing more.
    assert retention.apply(fifty) == []
    assert events.count() == len(set(STEPS) - survivors)


def test_a_checkpoint_pinned_after_the_dry_run_is_not_deleted(fifty, root):
    RetentionPolicy.objects.create(project=fifty, applies_to="local", keep_last=1)
    decision = next(d for d in retention.plan(fifty, "local") if d.delete and d.step == 40)
    Checkpoint.objects.filter(run__key="run-1", step=40).update(pinned=True)
    assert retention.delete_local(decision, "test") is False
    assert 40 in on_disk(root)
    # Nor one whose only replica failed meanwhile.
    decision = next(d for d in retention.plan(fifty, "local") if d.delete and d.step == 50)
    Replica.objects.filter(checkpoint__step=50).update(status="failed")
    assert retention.delete_local(decision, "test") is False
    assert 50 in on_disk(root)


def test_a_symlinked_file_shared_with_another_checkpoint_survives(fifty, root):
    shared = root / "run-1" / "shared.bin"
    shared.write_bytes(b"shared")
    link = root / "run-1" / "step-40" / "shared.bin"
    link.symlink_to(shared)
    checkpoint = Checkpoint.objects.get(run__key="run-1", step=40)
    checkpoint.files.create(path="shared.bin", size=6, sha256=hashlib.sha256(b"shared").hexdigest())
    RetentionPolicy.objects.create(project=fifty, applies_to="local", keep_last=1)
    retention.apply(fifty)
    assert not link.is_symlink()
    assert shared.read_bytes() == b"shared"


def test_the_management_command_shows_the_dry_run_and_applies(fifty, root):
    RetentionPolicy.objects.create(project=fifty, applies_to="local", keep_last=5)
    out = io.StringIO()
    call_command("retention", "alpha", stdout=out)
    text = out.getvalue()
    assert "keep   run-1 step 70 local copy: pinned" in text
    assert "DELETE run-1 step 40 local copy: no rule keeps it; verified replica on main" in text
    assert text.strip().endswith("kept (--apply to delete)")
    assert on_disk(root) == set(STEPS)
    out = io.StringIO()
    call_command("retention", "alpha", "--apply", stdout=out)
    assert on_disk(root) == ALWAYS | {450, 460, 470, 480, 490}


def test_replica_retention_deletes_objects_no_other_replica_needs(project, root, s3):
    """Six checkpoints replicated for real, sharing a tokenizer; the replica policy
    keeps the last two, and step 2 is pinned."""
    settings_tokenizer = os.urandom(1 * MiB)
    make_target(project, s3, "main")
    replicas = {}
    for step in range(1, 7):
        checkpoint = make_checkpoint(
            project,
            root,
            step,
            {"model.pt": os.urandom(1000 + step), "tokenizer.json": settings_tokenizer},
            pinned=step == 2,
        )
        (replicas[step],) = replicate_now(checkpoint)
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=2)
    plan = retention.plan(project, "replicas")
    assert {d.step for d in plan if d.delete} == {1, 3, 4}
    # One object of a doomed replica is already gone: no matter.
    gone = next(f["key"] for f in replicas[3].files if f["path"] == "model.pt")
    s3.client.delete_object(Bucket=s3.bucket, Key=gone)
    done = retention.apply(project)
    assert sorted(d.step for d in done) == [1, 3, 4]

    def exists(key: str) -> bool:
        listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=key).get("Contents", [])
        return any(item["Key"] == key for item in listed)

    for step, replica in replicas.items():
        replica.refresh_from_db()
        doomed = step in (1, 3, 4)
        assert replica.status == ("deleted" if doomed else "verified")
        assert exists(replica.manifest_key) is not doomed
        model_key = next(f["key"] for f in replica.files if f["path"] == "model.pt")
        assert exists(model_key) is not doomed
        tokenizer_key = next(f["key"] for f in replica.files if f["path"] == "tokenizer.json")
        assert exists(tokenizer_key)  # still named by the replicas that stay
    assert Event.objects.filter(type="replica.deleted").count() == 3
    assert retention.apply(project) == []
    # What stays still restores.
    restore_replica(replicas[2], root / "restored")
    assert (root / "restored" / "tokenizer.json").read_bytes() == settings_tokenizer


def test_the_api_shows_the_dry_run_and_queues_the_real_one(api, token, read_token, fifty, queues):
    from tests.support.celery_workers import queued_tasks

    RetentionPolicy.objects.create(project=fifty, applies_to="local", keep_last=5)
    body = api.get(read_token, "/retention").json()
    assert body["replicas"] == []
    local = {d["step"]: d for d in body["local"] if d["run"] == "run-1"}
    assert local[PINNED]["delete"] is False
    assert local[PINNED]["reasons"] == ["pinned"]
    assert local[40]["delete"] is True
    assert api.get(read_token, "/retention", run="nope").status_code == 404
    assert api.post(read_token, "/retention/apply").status_code == 403
    response = api.post(token, "/retention/apply")
    assert response.status_code == 202
    assert [t["task"] for t in queued_tasks(queues, "validate")] == [
        "workers.retention.apply_project"
    ]
    assert Event.objects.filter(type="retention.requested").exists()
