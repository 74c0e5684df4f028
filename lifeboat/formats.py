"""The checkpoint formats as the client sees them: what `lifeboat watch` takes for a
checkpoint of each format, and when it takes one for complete. One entry per format in
FORMATS; the watcher (watch.py) only reads this table.

The server has its own side of each format (webapp/domain/formats: how it is checked and
loaded); the client imports nothing of the server, so the two are kept in step by a test
(tests/test_formats.py) that checks they name the same formats, and that what the client
reports as each format's hint means that format to the server. Standard library only
(Python 3.9: the annotations are never evaluated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A folder holding one of these is complete, whatever its format: the writer says so.
MARKERS = ("COMPLETE", ".complete", "_SUCCESS")
# What a folder that is a checkpoint of no format below, but holds a marker, is reported as.
DIRECTORY = "directory"


@dataclass(frozen=True)
class Format:
    """One format's completeness rules for `lifeboat watch`."""

    name: str  # the server's name for the format (webapp/domain/formats)
    hint: str  # what the watcher reports as the checkpoint's format
    # A file whose name ends so is one checkpoint of this format.
    file_suffixes: tuple[str, ...] = ()
    # A folder holding one of these names is one checkpoint of this format.
    folder_holds: tuple[str, ...] = ()
    # A folder whose name matches is one checkpoint of this format.
    folder_named: re.Pattern | None = None
    # A folder of this format holding one of these is complete (as with a marker): the
    # writer writes it last.
    complete_with: tuple[str, ...] = ()
    # A folder of this format is reported only once it is complete: quiet is not enough,
    # since the writer may pause between its files. With parts (--world-size), a node
    # other than rank 0's never sees the completing file, and quiet is all there is.
    needs_complete: bool = False

    def is_folder(self, name: str, names: list) -> bool:
        return any(n in names for n in self.folder_holds) or bool(
            self.folder_named and self.folder_named.fullmatch(name)
        )


# In the order they are tried: the first whose rule matches a folder or a file takes it
# (a `checkpoint-N/` folder holding DCP's `.metadata` is DCP's).
FORMATS: tuple[Format, ...] = (
    # torch.distributed.checkpoint: the coordinator writes `.metadata` last.
    Format("dcp", "dcp", folder_holds=(".metadata",), complete_with=(".metadata",)),
    # Hugging Face Trainer: `checkpoint-N/`, complete once `trainer_state.json` is there.
    Format(
        "hf-trainer",
        "hf",
        folder_named=re.compile(r"checkpoint-\d+"),
        complete_with=("trainer_state.json",),
        needs_complete=True,
    ),
    Format("lightning", "lightning", file_suffixes=(".ckpt",)),
    Format("safetensors", "safetensors", file_suffixes=(".safetensors",)),
    Format("torch", "torch", file_suffixes=(".pt", ".pth")),
)


def file_format(name: str) -> Format | None:
    """The format of a file named `name` that is a checkpoint by itself, if any."""
    return next((f for f in FORMATS if f.file_suffixes and name.endswith(f.file_suffixes)), None)


def folder_format(name: str, names: list) -> Format | None:
    """The format of a folder named `name` holding `names`, if it is a checkpoint of one."""
    return next((f for f in FORMATS if f.is_folder(name, names)), None)
