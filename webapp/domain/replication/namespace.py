"""One identity per storage namespace: which targets put their objects in the same place.

Objects are content-addressed under `<prefix>/sha256/…` (targets.py), so every target
whose endpoint, bucket and prefix name the same place shares them, across projects. A
deletion must then ask all of them whether an object is still needed. Comparing the
fields as typed was wrong: `replicas` and `/replicas` are one prefix (keys strip the
slashes), an empty endpoint is the deployment's S3_ENDPOINT_URL written out, and
`HTTP://Host:80/` is `http://host`. identity() says it once; targets are also saved
normalised (StorageTarget.save).
"""

from __future__ import annotations

from django.conf import settings

from webapp.domain.models import StorageTarget
from webapp.domain.replication.spelling import normal_endpoint, normal_prefix


def identity(target) -> tuple[str, str, str]:
    """(endpoint, bucket, prefix) of the place the target's objects live in; an empty
    endpoint is the deployment's (or AWS, where there is none)."""
    endpoint = normal_endpoint(target.endpoint_url) or normal_endpoint(
        settings.S3_ENDPOINT_URL or ""
    )
    return endpoint or "aws", target.bucket, normal_prefix(target.prefix)


def sharing(target) -> list[int]:
    """The ids of every target, of any project, whose objects live where this one's do
    (itself included)."""

    mine = identity(target)
    candidates = StorageTarget.objects.filter(bucket=target.bucket)
    return sorted(t.pk for t in candidates if identity(t) == mine)
