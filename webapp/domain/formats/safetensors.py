"""safetensors files (`*.safetensors`): the header checked against the format and the
file's length, the data mapped and scanned (webapp/domain/validation/inspect_safetensors.py);
the restore test loads them with the safetensors library."""

from __future__ import annotations

from webapp.domain.formats.base import Format, Inspection

SUFFIX = ".safetensors"


class Safetensors(Format):
    name = "safetensors"
    precedence = 50
    child_modules = ("webapp.domain.validation.inspect_safetensors",)

    def claims(self, rel: str, head: bytes) -> bool:
        return rel.endswith(SUFFIX)

    def promised(self, rel: str) -> bool:
        return rel.endswith(SUFFIX)

    def inspect_file(self, job: Inspection, rel: str, size: int, head: bytes) -> None:
        # Imported here: torch, which the parent side that reads the registry must not load.
        from webapp.domain.validation.inspect_safetensors import inspect_safetensors_file

        job.report.formats.add(self.name)
        inspect_safetensors_file(job.path(rel), rel, size, job.report)

    def loads(self, rel: str, full: str) -> bool:
        return rel.endswith(SUFFIX)

    def load_file(self, full: str):
        # safetensors loads only where a checkpoint is opened
        from safetensors.torch import load_file

        return load_file(full, device="cpu")
