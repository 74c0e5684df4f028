"""Where a replica's objects live on a storage target, and clients to reach it.

Objects are content-addressed: a file is stored once per target under the sha256 of its
bytes (`<prefix>/sha256/ab/abcd...`), so a tokenizer or config that does not change
between checkpoints is sent once. A manifest per checkpoint
(`<prefix>/manifests/<project>/<run>/step-<step>.json`) maps its paths to those objects;
it is written last, and a replica without one is not a replica.
"""

from __future__ import annotations

from webapp.domain.replication import namespace, storage
from webapp.domain.replication.storage_access import TargetRefused, target_access

__all__ = ["TargetRefused", "client_for", "credentials"]


def credentials(target) -> tuple[str | None, str | None]:
    """The access key and secret named by the target's credentials_ref, read from the
    environment of this process (never stored in the database, never shown), if the
    deployment granted them to the target's project (else TargetRefused)."""
    access = target_access(target)
    return access.key, access.secret


def client_for(target, *, pool: int | None = None, retries: int | None = None):
    """A boto3 client for the target (webapp.domain.replication.storage.client, cached per process),
    once its endpoint and credentials passed webapp.domain.replication.storage_access (TargetRefused
    otherwise; checked on every call, so a withdrawn grant applies at once)."""

    access = target_access(target)
    return storage.client(
        access.endpoint, access.region, access.key, access.secret, pool=pool, retries=retries
    )


def _prefix(target) -> str:
    return target.prefix.strip("/") + "/" if target.prefix.strip("/") else ""


def blobs_prefix(target) -> str:
    return f"{_prefix(target)}sha256/"


def blob_key(target, sha256: str) -> str:
    return f"{blobs_prefix(target)}{sha256[:2]}/{sha256}"


def manifests_prefix(target) -> str:
    return f"{_prefix(target)}manifests/"


def manifest_key(target, checkpoint) -> str:
    return manifest_key_of(target, checkpoint.project.slug, checkpoint.run.key, checkpoint.step)


def manifest_key_of(target, project_slug: str, run_key: str, step: int) -> str:
    return f"{manifests_prefix(target)}{project_slug}/{run_key}/step-{step}.json"


def same_store(target) -> dict:
    """A filter (on replicas) for the targets, of every project, whose objects live where
    this one's do: content-addressed objects and manifests may be shared between them
    (webapp/domain/replication/namespace.py decides what is the same place)."""

    return {"target_id__in": namespace.sharing(target)}
