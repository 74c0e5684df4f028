"""Where a replica's objects live on a storage target, and clients to reach it.

Objects are content-addressed: a file is stored once per target under the sha256 of its
bytes (`<prefix>/sha256/ab/abcd...`), so a tokenizer or config that does not change
between checkpoints is sent once. A manifest per checkpoint
(`<prefix>/manifests/<project>/<run>/step-<step>.json`) maps its paths to those objects;
it is written last, and a replica without one is not a replica.
"""

from __future__ import annotations

import threading

from django.conf import settings

from webapp.domain.storage_access import TargetRefused, target_access

__all__ = ["TargetRefused", "client_for", "credentials"]

_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def credentials(target) -> tuple[str | None, str | None]:
    """The access key and secret named by the target's credentials_ref, read from the
    environment of this process (never stored in the database, never shown), if the
    deployment granted them to the target's project (else TargetRefused)."""
    access = target_access(target)
    return access.key, access.secret


def client_for(target, *, pool: int | None = None, retries: int | None = None):
    """A boto3 client for the target, once its endpoint and credentials passed
    webapp.domain.storage_access (TargetRefused otherwise; checked on every call, so a
    withdrawn grant applies at once). Clients are cached per process: building one costs
    tens of milliseconds, and the API builds presigned URLs on every read."""
    import boto3
    from botocore.config import Config

    access = target_access(target)
    key, secret, endpoint, region = access.key, access.secret, access.endpoint, access.region
    pool = pool or max(settings.REPLICATION_CONCURRENCY, settings.REPLICATION_FILES_AT_ONCE) + 2
    retries = retries or settings.REPLICATION_S3_RETRIES
    cache_key = (endpoint, region, key, secret, pool, retries)
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=region,
                aws_access_key_id=key,
                aws_secret_access_key=secret,
                config=Config(
                    retries={"max_attempts": retries, "mode": "standard"},
                    connect_timeout=5,
                    read_timeout=60,
                    max_pool_connections=pool,
                    # Send a checksum only where the code gives one (every part and
                    # object does), instead of botocore adding a CRC32 of its own.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    # Over plain http botocore would otherwise hash every body with
                    # sha256 to sign it: a third pass over the bytes, on both ends. The
                    # checksum header each part and object carries is checked anyway.
                    s3={"payload_signing_enabled": False},
                ),
            )
            _clients[cache_key] = client
    return client


def _prefix(target) -> str:
    return target.prefix.strip("/") + "/" if target.prefix.strip("/") else ""


def blobs_prefix(target) -> str:
    return f"{_prefix(target)}sha256/"


def blob_key(target, sha256: str) -> str:
    return f"{blobs_prefix(target)}{sha256[:2]}/{sha256}"


def manifest_key(target, checkpoint) -> str:
    return (
        f"{_prefix(target)}manifests/{checkpoint.project.slug}/{checkpoint.run.key}/"
        f"step-{checkpoint.step}.json"
    )


def same_store(target) -> dict:
    """A filter for the targets whose objects share a namespace with this one (same
    endpoint, bucket and prefix): content-addressed objects may be shared between them."""
    return {
        "target__endpoint_url": target.endpoint_url,
        "target__bucket": target.bucket,
        "target__prefix": target.prefix,
    }
