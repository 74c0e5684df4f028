"""Proof that retention happened, on a real SeaweedFS: a replica's deletion is recorded
only once a listing shows its objects gone (a bucket with versioning keeps them, and
that is reported, not recorded as done); the storage audit finds planted orphans and an
abandoned multipart upload with their sizes, never looks outside Lifeboat's own keys, and
its cleanup deletes only those (docs/retention.md, "Proof that retention happened")."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.support.dashboard import as_user
from tests.support.people import member
from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.domain.models import Event, Flip, Replica, RetentionPolicy, StorageAudit
from webapp.domain.replication import targets
from webapp.domain.replication.restore import restore_replica
from webapp.domain.retention import orphans
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)


def listed(client, bucket: str, key: str) -> bool:
    found = client.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return any(item["Key"] == key for item in found)


@pytest.fixture
def versioned_bucket(s3):
    """A bucket of its own with versioning on: a DELETE there only adds a marker."""
    bucket = f"lifeboat-versioned-{uuid.uuid4().hex[:8]}"
    s3.client.create_bucket(Bucket=bucket)
    s3.client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    yield bucket
    purge_versions(s3.client, bucket, "")
    s3.client.delete_bucket(Bucket=bucket)


def purge_versions(client, bucket: str, prefix: str) -> None:
    """What a lifecycle rule expiring noncurrent versions does."""
    answer = client.list_object_versions(Bucket=bucket, Prefix=prefix)
    for item in [*answer.get("Versions", []), *answer.get("DeleteMarkers", [])]:
        client.delete_object(Bucket=bucket, Key=item["Key"], VersionId=item["VersionId"])


def test_a_delete_the_store_did_not_carry_out_is_reported_not_recorded(
    project, root, s3, versioned_bucket
):
    make_target(project, s3, "versioned", bucket=versioned_bucket)
    replicas = {}
    for step in (1, 2):
        checkpoint = make_checkpoint(project, root, step, {"model.pt": os.urandom(MiB + step)})
        (replicas[step],) = replicate_now(checkpoint)
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    assert [d.step for d in retention.apply(project)] == [1]

    doomed = Replica.objects.get(pk=replicas[1].pk)
    model_key = doomed.files[0]["key"]
    # S3 answered 204 and lists nothing current: the bytes are still stored.
    assert not listed(s3.client, versioned_bucket, model_key)
    assert doomed.status == "deleted" and doomed.deleted_at is None
    assert "still stored: 2 of its objects" in doomed.last_error  # the file and the manifest
    assert "0 current and 2 kept only as older versions" in doomed.last_error
    assert "expires noncurrent versions" in doomed.last_error
    (event,) = Event.objects.filter(type="replica.delete_unconfirmed")
    assert event.data["still_stored"][0]["key"] in (model_key, doomed.manifest_key)
    (flip,) = Flip.objects.filter(kind="storage.delete_unconfirmed")
    assert flip.checkpoint_id == doomed.checkpoint_id
    # The storage page says so, with what the listing showed.
    page = as_user(member(project, "vic", "viewer")).get(f"/p/{project.slug}/storage/")
    proof = page.content.decode().split('id="storage-proof"')[1].split("</section>")[0]
    assert "1 deletion the store did not carry out" in proof
    assert "0 current and 2 kept only as older versions" in proof

    # The sweeper's next try finds the same: no second event, no second alert.
    retention.finish_interrupted(project, "system:sweeper")
    assert Event.objects.filter(type="replica.delete_unconfirmed").count() == 1
    assert Flip.objects.filter(kind="storage.delete_unconfirmed").count() == 1
    doomed.refresh_from_db()
    assert doomed.deleted_at is None

    # A lifecycle rule expires the old versions: the next proof passes, and only then
    # is the deletion recorded. The replica kept still restores.
    for key in (model_key, doomed.manifest_key):
        purge_versions(s3.client, versioned_bucket, key)
    retention.finish_interrupted(project, "system:sweeper")
    doomed.refresh_from_db()
    assert doomed.deleted_at is not None and doomed.last_error == ""
    restore_replica(replicas[2], root / "restored")
    assert (root / "restored" / "model.pt").stat().st_size == MiB + 2


def test_a_plain_bucket_s_delete_is_proven_and_recorded(project, root, s3):
    make_target(project, s3, "plain")
    for step in (1, 2):
        replicate_now(make_checkpoint(project, root, step, {"model.pt": os.urandom(1000 + step)}))
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    assert [d.step for d in retention.apply(project)] == [1]
    doomed = Replica.objects.get(checkpoint__step=1)
    assert doomed.deleted_at is not None and doomed.last_error == ""
    assert not Event.objects.filter(type="replica.delete_unconfirmed").exists()


def test_the_audit_reports_orphans_and_an_abandoned_upload_and_cleans_only_them(
    project, root, s3, settings
):
    target = make_target(project, s3, "audited")
    kept_checkpoint = make_checkpoint(project, root, 7, {"model.pt": os.urandom(2 * MiB)})
    (kept,) = replicate_now(kept_checkpoint)
    blobs = targets.blobs_prefix(target)
    # Planted: two objects under Lifeboat's own keys that no record names (an upload
    # whose replica row is gone), a manifest of a checkpoint that never existed, an
    # abandoned multipart upload, and a file of the team's own beside the prefix.
    orphan_a, orphan_b = f"{blobs}aa/{'a' * 64}", f"{blobs}bb/{'b' * 64}"
    s3.put(orphan_a, os.urandom(300_000))
    s3.put(orphan_b, b"x" * 1234)
    stray_manifest = targets.manifest_key_of(target, project.slug, "gone-run", 5)
    s3.put(stray_manifest, b"{}")
    upload = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=f"{blobs}cc/{'c' * 64}")
    s3.client.upload_part(
        Bucket=s3.bucket, Key=f"{blobs}cc/{'c' * 64}", UploadId=upload["UploadId"],
        PartNumber=1, Body=b"p" * 4321,
    )  # fmt: skip
    teams_own = f"{target.prefix}-notes/readme.txt"
    s3.put(teams_own, b"not Lifeboat's")

    # Within the grace nothing is judged: an upload may be under way.
    young = orphans.audit(target, "test")
    assert (young.status, young.orphan_objects, young.recent_objects) == ("done", 0, 3)
    assert young.uploads == []

    settings.STORAGE_AUDIT_GRACE_S = 0
    settings.STORAGE_AUDIT_ALERT_BYTES = 100_000
    found = orphans.audit(target, "test")
    assert found.status == "done", found.error
    assert found.orphan_objects == 3
    assert found.orphan_bytes == 300_000 + 1234 + 2
    assert [o["key"] for o in found.orphans] == [orphan_a, orphan_b, stray_manifest]
    assert [o["bytes"] for o in found.orphans] == [300_000, 1234, 2]
    assert [(u["upload_id"], u["bytes"]) for u in found.uploads] == [(upload["UploadId"], 4321)]
    # The kept replica's objects and manifest are accounted for; the team's file is not
    # even listed.
    assert found.accounted_objects == len(kept.files) + 1
    assert found.listed_objects == found.accounted_objects + 3
    (flip,) = Flip.objects.filter(kind="storage.orphans")
    assert flip.data["audit"] == found.pk and "3 objects" in flip.message
    # The next audit that finds the same is not news.
    again = orphans.audit(target, "test")
    assert again.orphan_bytes == found.orphan_bytes
    assert Flip.objects.filter(kind="storage.orphans").count() == 1

    # Only the newest audit can be cleaned.
    with pytest.raises(orphans.CleanRefused):
        orphans.clean(found, "admin@example.com")
    counts = orphans.clean(again, "admin@example.com")
    assert counts == {
        "objects": 3, "bytes": found.orphan_bytes, "uploads": 1, "still_stored": 0,
        "replicas_sent_again": 0,
    }  # fmt: skip
    for key in (orphan_a, orphan_b, stray_manifest):
        assert not listed(s3.client, s3.bucket, key)
    assert listed(s3.client, s3.bucket, teams_own)
    assert s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=blobs).get("Uploads") is None
    restore_replica(kept, root / "restored")
    assert (root / "restored" / "model.pt").stat().st_size == 2 * MiB
    (event,) = Event.objects.filter(type="storage.cleaned")
    assert event.actor == "admin@example.com" and event.data["objects"] == 3
    again.refresh_from_db()
    assert (again.cleaned_by, again.cleaned_objects, again.cleaned_uploads) == (
        "admin@example.com", 3, 1,
    )  # fmt: skip
    with pytest.raises(orphans.CleanRefused):
        orphans.clean(again, "admin@example.com")
    assert StorageAudit.objects.filter(target=target).count() == 3
    s3.client.delete_object(Bucket=s3.bucket, Key=teams_own)


def test_an_orphan_a_new_replica_names_by_the_cleanup_s_time_stays(project, root, s3, settings):
    """Content-addressed: a new checkpoint with the bytes of an orphan finds the object
    already there and does not send it, so the cleanup must look again at what the
    records name, not trust the audit's list."""
    settings.STORAGE_AUDIT_GRACE_S = 0
    target = make_target(project, s3, "race")
    data = os.urandom(5000)
    checkpoint = make_checkpoint(project, root, 3, {"tokenizer.json": data})
    (replica,) = replicate_now(checkpoint)
    key = replica.files[0]["key"]
    # The record is gone (a project deleted, say) but the object stays: an orphan.
    Replica.objects.filter(pk=replica.pk).delete()
    row = orphans.audit(target, "test")
    assert [o["key"] for o in row.orphans] == [key, targets.manifest_key(target, checkpoint)]
    (replica,) = replicate_now(checkpoint)  # finds both on the store again
    assert replica.status == "verified"
    # The cleanup looks again, so what the audit saw but a replica now names stays.
    counts = orphans.clean(row, "admin@example.com")
    assert counts["objects"] == 0 and listed(s3.client, s3.bucket, key)


def test_the_settings_show_the_audit_and_an_admin_cleans_from_the_page(
    project, root, s3, settings, admin, queues
):
    from tests.support.celery_workers import queued_tasks
    from workers.replicate import clean_storage

    settings.STORAGE_AUDIT_GRACE_S = 0
    target = make_target(project, s3, "paged")
    orphan = f"{targets.blobs_prefix(target)}dd/{'d' * 64}"
    s3.put(orphan, b"z" * 2048)
    client = as_user(admin)
    base = f"/p/{project.slug}/settings/storage/{target.pk}/audit/"
    assert client.post(base + "run/").status_code == 302
    (task,) = queued_tasks(queues, "replicate")
    assert task["task"] == "workers.replicate.audit_target"
    row = orphans.audit(target, "test")  # what that task does

    listing = client.get(f"/p/{project.slug}/settings/storage/").content.decode()
    assert "1 objects, 2.0 KiB unaccounted" in listing
    # The storage page shows each target's newest audit, linked for admins.
    storage = client.get(f"/p/{project.slug}/storage/").content.decode()
    audits = storage.split('id="storage-audits"')[1].split("</table>")[0]
    assert "1 objects, 2.0 KiB" in audits and base in audits
    page = client.get(base).content.decode()
    assert orphan in page and "Delete these 1 objects" in page
    # An operator may not see the store's keys, nor clean.
    operator = as_user(member(project, "otto", "operator"))
    assert operator.get(base).status_code == 403
    assert operator.post(f"{base}{row.pk}/clean/").status_code == 403

    queues.flushdb()
    assert client.post(f"{base}{row.pk}/clean/").status_code == 302
    (task,) = queued_tasks(queues, "replicate")
    assert (task["task"], task["args"]) == ("workers.replicate.clean_storage", [row.pk, "user:ada"])
    clean_storage(*task["args"])
    assert not listed(s3.client, s3.bucket, orphan)
    assert Event.objects.filter(type="storage.clean_requested", actor="user:ada").exists()
    page = client.get(base).content.decode()
    assert "Cleaned" in page and "Delete these" not in page
    # A second request is refused with the reason.
    refused = client.post(f"{base}{row.pk}/clean/", follow=True).content.decode()
    assert "Not cleaned: only the newest finished audit" in refused


def test_another_project_s_objects_and_manifests_are_never_another_s_orphans(
    project, root, s3, settings
):
    """Project beta stores in the same bucket and prefix through an endpoint spelled
    differently (localhost for 127.0.0.1: the namespace cannot tell them apart). Its
    objects are not alpha's orphans, and its manifests are not even listed by alpha."""
    from webapp.domain.models import Checkpoint, Project, Run, StorageTarget

    settings.STORAGE_AUDIT_GRACE_S = 0
    target = make_target(project, s3, "shared")
    beta = Project.objects.create(slug="beta", name="Beta")
    beta_target = StorageTarget.objects.create(
        project=beta, name="theirs", bucket=s3.bucket, prefix=target.prefix,
        endpoint_url=s3.endpoint.replace("127.0.0.1", "localhost"),
    )  # fmt: skip
    run = Run.objects.create(project=beta, key="b-run")
    checkpoint = Checkpoint.objects.create(
        project=beta, run=run, step=1, location="/nowhere", status="verified"
    )
    key = f"{targets.blobs_prefix(target)}ee/{'e' * 64}"
    s3.put(key, b"beta's bytes")
    manifest = targets.manifest_key(beta_target, checkpoint)
    s3.put(manifest, b"{}")
    Replica.objects.create(
        checkpoint=checkpoint, target=beta_target, status="verified",
        files=[{"path": "model.pt", "size": 12, "sha256": "e" * 64, "key": key}],
        manifest_key=manifest,
    )  # fmt: skip
    stray = f"{targets.blobs_prefix(target)}ff/{'f' * 64}"
    s3.put(stray, b"nobody's")
    row = orphans.audit(target, "test")
    assert [o["key"] for o in row.orphans] == [stray]
    assert row.listed_objects == 2  # beta's manifest is not listed at all
    orphans.clean(row, "admin@example.com")
    assert listed(s3.client, s3.bucket, key) and listed(s3.client, s3.bucket, manifest)
    assert not listed(s3.client, s3.bucket, stray)
    for leftover in (key, manifest):
        s3.client.delete_object(Bucket=s3.bucket, Key=leftover)


def test_the_api_shows_audits_and_takes_both_actions(
    api, token, read_token, project, root, s3, settings, queues
):
    from tests.support.celery_workers import queued_tasks
    from workers.replicate import audit_target, clean_storage

    settings.STORAGE_AUDIT_GRACE_S = 0
    target = make_target(project, s3, "scripted")
    orphan = f"{targets.blobs_prefix(target)}ab/{'a' * 62}cd"
    s3.put(orphan, b"q" * 999)
    assert api.get(read_token, "/storage/audits").json() == [{"target": "scripted", "audit": None}]
    # A read token reads; only an operate token acts.
    assert api.post(read_token, "/storage/audits", {"target": "scripted"}).status_code == 403
    assert api.post(token, "/storage/audits", {"target": "nope"}).status_code == 404
    assert api.post(token, "/storage/audits", {"target": "scripted"}).status_code == 202
    (task,) = queued_tasks(queues, "replicate")
    audit_id = audit_target(*task["args"])

    (listed_audit,) = api.get(read_token, "/storage/audits").json()
    assert listed_audit["audit"]["orphan_bytes"] == 999
    detail = api.get(read_token, f"/storage/audits/{audit_id}").json()
    assert detail["orphans"][0]["key"] == orphan and detail["uploads"] == []
    assert api.get(read_token, "/storage/audits/999999").status_code == 404

    queues.flushdb()
    assert api.post(read_token, f"/storage/audits/{audit_id}/clean").status_code == 403
    assert api.post(token, f"/storage/audits/{audit_id}/clean").status_code == 202
    (task,) = queued_tasks(queues, "replicate")
    clean_storage(*task["args"])
    assert not listed(s3.client, s3.bucket, orphan)
    again = api.post(token, f"/storage/audits/{audit_id}/clean")
    assert again.status_code == 409 and "once" in again.json()["error"]
