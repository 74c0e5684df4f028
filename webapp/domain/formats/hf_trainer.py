"""Hugging Face Trainer folders (`checkpoint-N/`): `trainer_state.json` names the format,
and the `*.index.json` of a sharded model must name shards that are there and hold the
tensors it puts in them. The weights themselves are safetensors or torch files, checked
and loaded by those formats. The checks are webapp/domain/validation/inspect_hf.py's."""

from __future__ import annotations

from pathlib import PurePosixPath

from webapp.domain.formats.base import Format, Inspection

TRAINER_STATE = "trainer_state.json"
INDEX_SUFFIX = ".index.json"


class HfTrainer(Format):
    name = "hf-trainer"
    aliases = ("hf", "huggingface", "transformers")
    precedence = 20
    child_modules = ("webapp.domain.validation.inspect_hf",)

    def claims(self, rel: str, head: bytes) -> bool:
        return PurePosixPath(rel).name == TRAINER_STATE or rel.endswith(INDEX_SUFFIX)

    def inspect_file(self, job: Inspection, rel: str, size: int, head: bytes) -> None:
        # Imported here: the child's modules, which the parent side must not load.
        from webapp.domain.validation.inspect_hf import inspect_hf_json

        job.report.formats.add(self.name)
        inspect_hf_json(job.base, rel, set(job.files), job.report)

    def inspect_checkpoint(self, job: Inspection) -> None:
        # trainer_state.json names the folder HF Trainer's even in a part that does not
        # read it (inspect_parts), so that every part names the checkpoint alike.
        if any(PurePosixPath(p).name == TRAINER_STATE for p in job.files):
            job.report.formats.add(self.name)
