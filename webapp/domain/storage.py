"""boto3 clients for the object stores a project uses."""

from __future__ import annotations

from django.conf import settings

from webapp.domain.storage_access import target_access


def s3_client(project=None, bucket: str | None = None):
    """A client for `bucket`: the project's storage target for that bucket if it has
    one (its endpoint, region and credentials named by reference, checked by
    webapp.domain.storage_access: TargetRefused), else the default store of the
    settings."""
    import boto3
    from botocore.config import Config

    endpoint, region = settings.S3_ENDPOINT_URL, settings.S3_REGION
    key, secret = settings.S3_ACCESS_KEY_ID, settings.S3_SECRET_ACCESS_KEY
    target = None
    if project is not None and bucket:
        target = project.storage_targets.filter(bucket=bucket, enabled=True).first()
    if target is not None:
        access = target_access(target)
        endpoint, region, key, secret = access.endpoint, access.region, access.key, access.secret
    return boto3.client(
        "s3",
        endpoint_url=endpoint or None,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10),
    )
