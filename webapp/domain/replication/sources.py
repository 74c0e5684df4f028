"""A checkpoint's files opened for sending to a storage target: from under the project's
allowed roots by a confined walk, or streamed from s3://."""

from __future__ import annotations

import contextlib
import os

from webapp.domain import confined_files
from webapp.domain.replication.storage import s3_client
from webapp.domain.validation import integrity


class SourceUnavailable(Exception):
    """The checkpoint's files cannot be read (gone, refused): permanent."""


@contextlib.contextmanager
def sources(checkpoint):
    """Yields open(path): the file `path` of the checkpoint, opened for reading, under an
    allowed root (resolved as validation does), or streamed from s3://. The roots are
    opened once for all the files (resolving them per file cost a tenth of the time of a
    checkpoint of small files); every file is still opened by its own confined walk."""

    location = checkpoint.location
    if location.startswith("s3://"):
        if not integrity.s3_allowed(location, checkpoint.project.allowed_roots):
            raise SourceUnavailable(f"{location} is outside the project's allowed roots")

        def open_s3(path: str):
            bucket, key = integrity.split_s3(location.rstrip("/") + "/" + path)
            client = s3_client(checkpoint.project, bucket)
            try:
                return client.get_object(Bucket=bucket, Key=key)["Body"]
            except client.exceptions.NoSuchKey:
                raise SourceUnavailable(f"{path} is gone from {location}") from None

        yield open_s3
        return
    # A one-file checkpoint's location is the file itself (its one path is its name).
    # Opened by a confined walk from an allowed root's descriptor: a symlink out of the
    # roots, at any level and even one swapped in now, is refused, not followed.
    single = checkpoint.file_count == 1
    with confined_files.Tree(checkpoint.project.allowed_roots) as tree:
        try:
            place = tree.locate(location, "location")
        except confined_files.Refused as exc:
            raise SourceUnavailable(str(exc)) from None

        def open_file(path: str):
            try:
                if single and os.path.basename(location.rstrip("/")) == path:
                    fd = tree.open_read(place)
                else:
                    fd = tree.open_read(place.join(path, "file path"))
            except confined_files.Refused as exc:
                raise SourceUnavailable(str(exc)) from None
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise SourceUnavailable(f"{path} is gone from {location}") from None
            return os.fdopen(fd, "rb", buffering=0)

        yield open_file
