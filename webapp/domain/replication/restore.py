"""Bring a replica back: the files of a verified replica, downloaded and verified.

`replica_files` gives what the API hands to clients ({path, size, sha256, url} with a
presigned GET URL, and `offset` for a file in a pack; a file cut at tensor boundaries has
`pieces`, [{url, size, sha256}] in order, instead of a `url`); `restore_replica` downloads them
with the same stdlib code the client uses (download.download_files), after checking
that the manifest on the target agrees with the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.conf import settings

from lifeboat.download import RestoreError, download_files
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import targets

__all__ = ["RestoreError", "replica_files", "restore_replica"]


def replica_files(replica, expires_s: int | None = None) -> list[dict]:
    """The files of a verified replica, each with a presigned GET URL."""
    if not replica.files:
        return []
    try:
        client = targets.client_for(replica.target)
    except targets.TargetRefused:
        return []  # no URL signed with keys the project may no longer use
    expires_s = expires_s or settings.REPLICATION_URL_EXPIRES_S
    urls: dict[str, str] = {}  # one URL a pack, however many files it holds

    def url(key: str) -> str:
        if key not in urls:
            urls[key] = client.generate_presigned_url(
                "get_object", Params={"Bucket": replica.target.bucket, "Key": key},
                ExpiresIn=expires_s,
            )  # fmt: skip
        return urls[key]

    found = []
    for entry in replica.files:
        one = {k: entry[k] for k in ("path", "size", "sha256")}
        if "pieces" in entry:  # cut at tensor boundaries (replication/pieces.py): in order
            one["pieces"] = [
                {"url": url(p["key"]), "size": p["size"], "sha256": p["sha256"]}
                for p in entry["pieces"]
            ]
            found.append(one)
            continue
        one["url"] = url(entry["key"])
        if "offset" in entry:  # in a pack (replication/packs.py): its bytes from offset on
            one["offset"] = entry["offset"]
        found.append(one)
    return found


def read_manifest(replica) -> dict:
    client = targets.client_for(replica.target)
    try:
        body = client.get_object(Bucket=replica.target.bucket, Key=replica.manifest_key)["Body"]
        return json.loads(body.read())
    except client.exceptions.NoSuchKey:
        raise RestoreError(
            f"the manifest {replica.manifest_key} is gone from {replica.target.name}"
        ) from None


def restore_replica(
    replica, dest, progress: Callable[[int, int], None] | None = None, *, durable: bool = True,
    keep_mismatched: bool = False,
) -> list:  # fmt: skip
    """Download a verified replica into `dest`, verifying every file's sha256 against
    the manifest on the target and the checkpoint's record. Raises RestoreError.

    File paths with '..' or absolute ones are refused by the download. `dest` must be a
    folder no job can write in: the worker's own scratch folder, or a staging folder it
    just made (0700) and names by its descriptor (confined_files.fd_path), as resume
    does; the names below `dest` are then the download's own."""

    if replica.status != ReplicaStatus.VERIFIED:
        raise RestoreError(f"replica {replica.pk} is {replica.status}, not verified")
    manifest = read_manifest(replica)
    listed = sorted((f["path"], f["size"], f["sha256"]) for f in manifest.get("files", []))
    recorded = sorted(replica.checkpoint.files.values_list("path", "size", "sha256"))
    if listed != recorded:
        raise RestoreError(
            f"the manifest on {replica.target.name} does not list the checkpoint's files"
        )
    return download_files(
        replica_files(replica), dest, progress, durable=durable, keep_mismatched=keep_mismatched
    )
