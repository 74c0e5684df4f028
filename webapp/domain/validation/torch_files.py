"""Is this a torch file? One rule, for the validation's inspector and the restore test's
loader alike (standard library only: both run it in a child process).

The bytes decide: torch.save writes a zip holding a `data.pkl` (torch >= 1.6) or, in
the legacy format, a pickle that starts with torch's magic number. The name only says
what the file promises: `.pt`, `.pth`, `.ckpt`, and the `.bin` files that Hugging Face
writes with torch.save (pytorch_model*.bin, training_args.bin). Any other `.bin` is just
a binary (DeepSpeed's, a custom format): torch if its bytes say so (accelerate's
optimizer.bin is), skipped without a finding if not. A file whose name promises torch and
whose bytes do not is a broken torch file."""

from __future__ import annotations

import zipfile
from pathlib import PurePosixPath

SUFFIXES = (".pt", ".pth", ".ckpt")
# `.bin` is any binary; only these names promise torch.save.
BIN_NAMES = ("pytorch_model", "training_args")
ZIP_MAGIC = b"PK\x03\x04"
# A legacy (pre-1.6) torch.save file starts with the pickled magic number 0x1950a86a20f9469cfc6c.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
HEAD_BYTES = len(LEGACY_MAGIC)


def claimed(path: str) -> bool:
    """Whether the file's name promises torch.save."""
    name = PurePosixPath(path).name
    return name.endswith(SUFFIXES) or (name.endswith(".bin") and name.startswith(BIN_NAMES))


def looks(head: bytes) -> bool:
    """Whether the file's first bytes are torch.save's (a zip is confirmed by zip_holds)."""
    return head.startswith(ZIP_MAGIC) or head.startswith(LEGACY_MAGIC)


def candidate(path: str, head: bytes) -> tuple[bool, bool]:
    """(to be inspected as a torch file, claimed to be one by its name)."""
    promised = claimed(path)
    return looks(head) or promised, promised


def zip_holds_torch(path) -> bool:
    """A torch zip has `<archive>/data.pkl`; any other zip is not torch's."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def is_torch_file(path) -> bool:
    """Whether the file at `path` is one torch.load can read, by its bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return False
    if head.startswith(LEGACY_MAGIC):
        return True
    return head.startswith(ZIP_MAGIC) and zip_holds_torch(path)
