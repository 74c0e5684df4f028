"""One identity per storage namespace (webapp/domain/replication/namespace.py): targets
that name one place in two spellings (`/replicas` and `replicas`; no endpoint and the
deployment's endpoint written out) share their content-addressed objects, so retention
in one project, or on one of a project's two targets, never deletes an object or a
manifest that another verified replica still names. Real SeaweedFS, real replication."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.support.replication import make_checkpoint, replicate_now
from webapp.domain.models import Project, Replica, RetentionPolicy, StorageTarget
from webapp.domain.replication import namespace
from webapp.domain.replication.restore import restore_replica
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)


def exists(s3, key: str) -> bool:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=key).get("Contents", [])
    return any(item["Key"] == key for item in listed)


def test_targets_are_saved_in_one_spelling_and_compared_by_place(project, s3, settings):
    base = f"ns-{uuid.uuid4().hex[:6]}"
    settings.S3_ENDPOINT_URL = s3.endpoint
    plain = StorageTarget.objects.create(project=project, name="a", bucket=s3.bucket, prefix=base)
    spelled = StorageTarget.objects.create(
        project=project, name="b", bucket=s3.bucket, prefix=f"/{base}/",
        endpoint_url=s3.endpoint.upper().replace("HTTP://", "http://") + "/",
    )  # fmt: skip
    elsewhere = StorageTarget.objects.create(
        project=project, name="c", bucket=s3.bucket, prefix=f"{base}-other"
    )
    spelled.refresh_from_db()
    assert spelled.prefix == base and not spelled.endpoint_url.endswith("/")
    assert namespace.identity(plain) == namespace.identity(spelled)
    assert namespace.sharing(plain) == sorted([plain.pk, spelled.pk])
    assert elsewhere.pk not in namespace.sharing(plain)
    assert namespace.normal_endpoint("HTTPS://S3.Example.org:443/") == "https://s3.example.org"


def test_one_projects_retention_keeps_what_another_projects_verified_replica_names(
    project, root, s3, settings
):
    settings.S3_ENDPOINT_URL = s3.endpoint
    base = f"shared-{uuid.uuid4().hex[:6]}"
    shared_bytes = os.urandom(64 * 1024)  # the same file in both projects: one object
    first = StorageTarget.objects.create(
        project=project, name="main", bucket=s3.bucket, prefix=base
    )
    (kept,) = replicate_now(make_checkpoint(project, root, 1, {"model.pt": shared_bytes}))
    assert kept.target == first

    other = Project.objects.create(name="Beta", slug="beta", allowed_roots=[str(root)])
    # The same place: a leading slash, and the deployment's endpoint written out.
    StorageTarget.objects.create(
        project=other, name="theirs", bucket=s3.bucket, prefix=f"/{base}",
        endpoint_url=s3.endpoint,
    )  # fmt: skip
    theirs = [
        replicate_now(make_checkpoint(other, root, step, {"model.pt": data}, run="b-run"))[0]
        for step, data in ((1, shared_bytes), (2, os.urandom(1000)))
    ]
    RetentionPolicy.objects.create(project=other, applies_to="replicas", keep_last=1)
    done = retention.apply(other)
    assert [(d.step, d.delete) for d in done] == [(1, True)]
    theirs[0].refresh_from_db()
    assert theirs[0].status == "deleted"

    kept.refresh_from_db()
    assert kept.status == "verified"
    (entry,) = kept.files
    assert exists(s3, entry["key"]), "the other project's retention deleted a shared object"
    restore_replica(kept, root / "restored")
    assert (root / "restored" / "model.pt").read_bytes() == shared_bytes


def test_a_projects_two_targets_on_one_store_keep_the_manifest_the_other_names(
    project, root, s3, settings
):
    settings.S3_ENDPOINT_URL = s3.endpoint
    base = f"twice-{uuid.uuid4().hex[:6]}"
    StorageTarget.objects.create(project=project, name="one", bucket=s3.bucket, prefix=base)
    StorageTarget.objects.create(
        project=project, name="two", bucket=s3.bucket, prefix=f"{base}/", endpoint_url=""
    )
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": os.urandom(4096)})
    replicas = {r.target.name: r for r in replicate_now(checkpoint)}
    make_checkpoint(project, root, 2, {"model.pt": os.urandom(4096)})  # the latest now
    assert replicas["one"].manifest_key == replicas["two"].manifest_key  # one place
    decision = retention.Decision(
        scope="replicas", run="run-1", step=1, checkpoint_id=checkpoint.pk, delete=True,
        reasons=["test"], replica_id=replicas["one"].pk, target="one",
    )  # fmt: skip
    assert retention.delete_replica(decision, actor="test")

    survivor = Replica.objects.get(pk=replicas["two"].pk)
    assert survivor.status == "verified"
    assert exists(s3, survivor.manifest_key)
    assert all(exists(s3, f["key"]) for f in survivor.files)
    restore_replica(survivor, root / "restored")
