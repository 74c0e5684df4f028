"""Which objects on a storage target one entry of a replica's file list stands for.

An entry is one file of the checkpoint. Most are one object (`key`, the file's own
bytes); a small file in a pack shares the pack's object (`key`, `object_size`:
packs.py); a large file cut at tensor boundaries is several (`pieces`: pieces.py).
Everything that counts, keeps or deletes a replica's objects (retention, the storage
audit, the ledger, deduplication) asks here, so a new way of storing a file is one
change in this module.
"""

from __future__ import annotations

from collections.abc import Iterable


def objects_of(entry) -> list[tuple[str, int]]:
    """[(key, object size)] of one entry; [] for anything that is not an entry."""
    if not isinstance(entry, dict):
        return []
    if "pieces" in entry:
        return [(p["key"], int(p["size"])) for p in entry["pieces"] if isinstance(p, dict)]
    if "key" not in entry:
        return []
    return [(entry["key"], int(entry.get("object_size", entry.get("size")) or 0))]


def keys_of(files: Iterable | None) -> set[str]:
    """Every object key a replica's file list names."""
    return {key for entry in files or [] for key, _ in objects_of(entry)}
