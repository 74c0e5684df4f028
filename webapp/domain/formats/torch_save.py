"""torch.save files: `.pt`, `.pth`, `.ckpt` and Hugging Face's `pytorch_model*.bin` /
`training_args.bin` by their name, any other file by its bytes (torch_files.py, the one
rule for validation and the restore loader alike). Checked with their zip directory and
torch.load(weights_only=True, mmap=True) (webapp/domain/validation/inspect_torch.py);
every loaded object is shown to the formats that read torch files' contents (Lightning,
DeepSpeed).

The module is torch_save, not torch: a module named torch in this package would read as
if it shadowed the library that its hooks import."""

from __future__ import annotations

import gc
import zipfile

from webapp.domain.formats.base import Format, Inspection
from webapp.domain.validation import torch_files


class TorchSave(Format):
    name = "torch"
    aliases = ("pytorch",)
    precedence = 40
    child_modules = ("webapp.domain.validation.inspect_torch",)

    def claims(self, rel: str, head: bytes) -> bool:
        return torch_files.candidate(rel, head)[0]

    def promised(self, rel: str) -> bool:
        return torch_files.claimed(rel)

    def inspect_file(self, job: Inspection, rel: str, size: int, head: bytes) -> None:
        # Imported here: torch, which the parent side that reads the registry must not load.
        from webapp.domain.validation.inspect_torch import inspect_torch_file

        job.report.formats.add(self.name)
        inspect_torch_file(job.path(rel), rel, size, head, job.report, observe=job.observe)
        # Drop the mapping of this file before the next one: under the address-space limit
        # only one file at a time should be mapped.
        gc.collect()

    def loads(self, rel: str, full: str) -> bool:
        return torch_files.is_torch_file(full)  # by its bytes, whatever its name

    def load_file(self, full: str):
        import torch  # torch loads only where a checkpoint is opened, never in the web

        # Memory-mapped where the format allows (zip, torch >= 1.6); a legacy pickle-stream
        # file can only be read whole.
        mmap = zipfile.is_zipfile(full)
        return torch.load(full, map_location="cpu", weights_only=True, mmap=mmap)
