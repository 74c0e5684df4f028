"""boto3 clients for the object stores a project uses: the one factory (client()) for
the default store of the settings, a project's storage targets (s3_client, and
webapp.domain.replication.targets.client_for) alike."""

from __future__ import annotations

import os
import threading

from botocore.config import Config
from botocore.utils import determine_content_length
from django.conf import settings

from webapp.domain.replication.storage_access import (
    TargetRefused,
    may_use_default_keys,
    target_access,
)

_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def client(
    endpoint: str | None,
    region: str | None,
    key: str | None,
    secret: str | None,
    *,
    pool: int | None = None,
    retries: int | None = None,
):
    """A boto3 S3 client, cached per process: building one costs tens of milliseconds,
    and the API builds presigned URLs on every read. Whoever calls this has checked the
    endpoint and credentials (webapp.domain.replication.storage_access)."""
    import boto3  # boto3 loads only where S3 is used

    # Room for every file on the wire at once (replication.fanout) and the parts of each.
    pool = pool or max(settings.REPLICATION_CONCURRENCY, settings.REPLICATION_FILES_AT_ONCE) + 2
    retries = retries or settings.REPLICATION_S3_RETRIES
    # Keyed by process too: a forked process (a Celery prefork child, a pool) inherits the
    # cache, and two processes sending on the same pooled sockets interleave their bytes
    # (seen: BadDigest on small objects, the server refusing the mixed bodies).
    cache_key = (os.getpid(), endpoint or None, region, key, secret, pool, retries)
    with _clients_lock:
        made = _clients.get(cache_key)
        if made is None:
            made = boto3.client(
                "s3",
                endpoint_url=endpoint or None,
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
            made.meta.events.register_last("before-call.s3", _no_expect_for_small_bodies)
            _clients[cache_key] = made
    return made


# botocore asks for "Expect: 100-continue" on every upload, so each one waits a round
# trip for the server's go-ahead before it sends the body. That saves sending a large body
# the server would refuse; for a small one it only doubles the round trips (a checkpoint
# of 10,000 small files: 0.76x the files per second, bench/s3_requests.py).
SMALL_BODY = 1024 * 1024


def _no_expect_for_small_bodies(params, **kwargs) -> None:
    headers = params.get("headers", {})
    if headers.get("Expect") != "100-continue":
        return
    length = determine_content_length(params.get("body"))
    if length is not None and length <= SMALL_BODY:
        del headers["Expect"]


def s3_client(project=None, bucket: str | None = None):
    """A client for `bucket`: the project's storage target for that bucket if it has
    one (its endpoint, region and credentials named by reference, checked by
    webapp.domain.replication.storage_access: TargetRefused), else the default store of the
    settings."""
    target = None
    if project is not None and bucket:
        target = project.storage_targets.filter(bucket=bucket, enabled=True).first()
    if target is None:
        if project is not None and not may_use_default_keys(project.slug):
            # The deployment's own keys, for an s3:// location in a bucket the project has
            # no target for: only where the deployment granted them to the project.
            raise TargetRefused(
                f"project {project.slug} may not use the deployment's own S3 keys "
                f"(S3_DEFAULT_CREDENTIALS_PROJECTS), and has no storage target for bucket "
                f"{bucket!r} naming credentials of its own"
            )
        return client(
            settings.S3_ENDPOINT_URL,
            settings.S3_REGION,
            settings.S3_ACCESS_KEY_ID,
            settings.S3_SECRET_ACCESS_KEY,
        )
    access = target_access(target)
    return client(access.endpoint, access.region, access.key, access.secret)
