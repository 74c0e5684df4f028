"""Retention (or the storage audit's cleanup) deleting an object at the moment a copy of
another checkpoint finds it on the target and skips sending it (objects are shared by
content, and nothing orders a HEAD on one worker before a DELETE on another). Real
SeaweedFS and PostgreSQL; the interleaving is forced by making the second copy from
inside the first DELETE."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection, transaction

from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.domain.models import Event, Replica
from webapp.domain.replication import policy, targets
from webapp.domain.replication import replicate as r
from webapp.domain.replication.restore import restore_replica
from webapp.domain.retention import orphans
from webapp.domain.retention import policy as retention
from workers.replicate import replicate

pytestmark = pytest.mark.django_db(transaction=True)


def listed(client, bucket: str, key: str) -> bool:
    found = client.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return any(item["Key"] == key for item in found)


@pytest.mark.parametrize("second_copy", ["recorded", "under way"])
def test_a_copy_that_skipped_an_object_retention_was_deleting_is_sent_again(
    project, root, s3, settings, second_copy
):
    # Larger than a part: the second copy asks the target for it (a HEAD) before sending.
    settings.REPLICATION_PART_SIZE = 5 * MiB
    target = make_target(project, s3, "shared")
    frozen = os.urandom(6 * MiB)
    step1 = make_checkpoint(project, root, 1, {"frozen.bin": frozen, "head.bin": b"1" * 100})
    (first,) = replicate_now(step1)
    frozen_key = next(e["key"] for e in first.files if e["path"] == "frozen.bin")
    step2 = make_checkpoint(project, root, 2, {"frozen.bin": frozen, "head.bin": b"2" * 100})

    made = []

    def copy_step_2(**_):
        """At retention's first DELETE, the frozen layer is still on the target: step 2's
        copy finds it there and does not send it."""
        if made:
            return
        if second_copy == "recorded":
            made.extend(replicate_now(step2))
            assert made[0].status == "verified" and made[0].bytes_sent < MiB
            return
        with transaction.atomic():
            (replica_id,) = policy.request(step2)
        claimed = r.claim(replica_id)
        made.append((claimed, r.send(claimed)))

    client = targets.client_for(target)
    client.meta.events.register("before-call.s3.DeleteObject", copy_step_2)
    try:
        decision = retention.Decision(
            "replicas", "run-1", 1, step1.pk, True, ["kept one"], first.pk, target.name
        )
        assert retention.delete_replica(decision, "retention")
    finally:
        client.meta.events.unregister("before-call.s3.DeleteObject", copy_step_2)

    assert not listed(s3.client, s3.bucket, frozen_key)
    second = Replica.objects.get(checkpoint=step2)
    if second_copy == "under way":
        claimed, result = made[0]
        # The attempt that skipped the object records nothing.
        assert r.record_verified(claimed, result) == "superseded"
    second.refresh_from_db()
    assert second.status == "pending", second.last_error
    assert "1 of its objects on shared were deleted" in second.last_error
    (event,) = Event.objects.filter(type="replica.reopened")
    assert event.data["was"] == ("verified" if second_copy == "recorded" else "uploading")

    # The copy queued again sends the frozen layer again, and restores whole.
    second.lease_until = None
    second.save(update_fields=["lease_until"])
    assert replicate(second.pk) == "verified"
    assert listed(s3.client, s3.bucket, frozen_key)
    second.refresh_from_db()
    restore_replica(second, root / "restored")
    assert (root / "restored" / "frozen.bin").read_bytes() == frozen


def test_a_copy_that_skipped_an_orphan_the_cleanup_was_deleting_is_sent_again(
    project, root, s3, settings
):
    settings.REPLICATION_PART_SIZE = 5 * MiB
    settings.STORAGE_AUDIT_GRACE_S = 0
    target = make_target(project, s3, "audited")
    frozen = os.urandom(6 * MiB)
    step1 = make_checkpoint(project, root, 1, {"frozen.bin": frozen})
    (first,) = replicate_now(step1)
    frozen_key = first.files[0]["key"]
    # Its record deleted (by hand, or an older version): its objects are orphans.
    first.delete()
    found = orphans.audit(target, "test")
    assert frozen_key in [o["key"] for o in found.orphans]
    step2 = make_checkpoint(project, root, 2, {"frozen.bin": frozen, "head.bin": b"2"})
    made = []

    def copy_step_2(**_):
        """As the cleanup deletes, step 2's copy finds the frozen layer still there."""
        if not made:
            made.extend(replicate_now(step2))

    client = targets.client_for(target)
    client.meta.events.register("before-call.s3.DeleteObjects", copy_step_2)
    try:
        counts = orphans.clean(found, "admin@example.com")
    finally:
        client.meta.events.unregister("before-call.s3.DeleteObjects", copy_step_2)

    assert counts["replicas_sent_again"] == 1
    second = Replica.objects.get(pk=made[0].pk)
    assert second.status == "pending"
    assert f"deleted, as orphans by the cleanup of storage audit {found.pk}" in second.last_error
    assert replicate(second.pk) == "verified"
    restore_replica(Replica.objects.get(pk=second.pk), root / "restored")
    assert (root / "restored" / "frozen.bin").read_bytes() == frozen


def test_a_copy_under_way_that_points_into_a_pack_after_retention_first_looked_is_sent_again(
    project, root, s3
):
    """Step 2's copy finds its small files in step 1's pack, and its row names the pack
    only after retention of step 1 read the live replicas; it confirms the pack (a HEAD)
    just before retention deletes it. Retention's second look must read that copy again
    (its files changed since the first read, under the same claim), not trust the first
    read. Retention runs in a thread, paused at its first DELETE until step 2's HEAD."""
    target = make_target(project, s3, "packed")
    small = {f"t/{i:02d}.bin": os.urandom(2000) for i in range(40)}
    step1 = make_checkpoint(project, root, 1, {**small, "head.bin": b"1" * 100})
    (first,) = replicate_now(step1)
    pack = next(e["key"] for e in first.files if "offset" in e)
    step2 = make_checkpoint(project, root, 2, {**small, "head.bin": b"2" * 100})
    with transaction.atomic():
        (replica_id,) = policy.request(step2)
    claimed = r.claim(replica_id)

    looked, headed = threading.Event(), threading.Event()
    deleted = []

    def retain():
        decision = retention.Decision(
            "replicas", "run-1", 1, step1.pk, True, ["kept one"], first.pk, target.name
        )
        try:
            deleted.append(retention.delete_replica(decision, "retention"))
        finally:
            connection.close()

    retention_thread = threading.Thread(target=retain)

    def pause_at_the_first_delete(**_):
        if not looked.is_set():
            looked.set()  # retention has read the live replicas
            headed.wait(30)

    def after_the_head(**_):
        headed.set()

    def retention_reads_before_the_row_names_the_pack(execute, sql, params, many, context):
        if not looked.is_set() and sql.startswith("UPDATE") and '"files"' in sql:
            retention_thread.start()
            assert looked.wait(30)
        return execute(sql, params, many, context)

    client = targets.client_for(target)
    client.meta.events.register("before-call.s3.DeleteObject", pause_at_the_first_delete)
    client.meta.events.register("after-call.s3.HeadObject", after_the_head)
    try:
        with connection.execute_wrapper(retention_reads_before_the_row_names_the_pack):
            made = r.send(claimed)
        retention_thread.join(60)
    finally:
        headed.set()
        client.meta.events.unregister("before-call.s3.DeleteObject", pause_at_the_first_delete)
        client.meta.events.unregister("after-call.s3.HeadObject", after_the_head)

    assert deleted == [True] and not listed(s3.client, s3.bucket, pack)
    assert r.record_verified(claimed, made) == "superseded"
    second = Replica.objects.get(pk=replica_id)
    assert second.status == "pending", second.last_error
    second.lease_until = None
    second.save(update_fields=["lease_until"])
    assert replicate(second.pk) == "verified"
    restore_replica(Replica.objects.get(pk=second.pk), root / "restored")
    assert (root / "restored" / "t" / "07.bin").read_bytes() == small["t/07.bin"]
