"""DeepSpeed ZeRO folders: torch.save files (checked and loaded by the torch format, and
the checkpoint is reported as torch) whose model states file says how many data-parallel
ranks saved the folder, so that a rank's missing optimizer file is named
(webapp/domain/validation/inspect_deepspeed.py). It never names a checkpoint: its
precedence is None, and a job's hint "deepspeed" is not compared with the files."""

from __future__ import annotations

from typing import Any

from webapp.domain.formats.base import Format, Inspection


class DeepSpeed(Format):
    name = "deepspeed"
    child_modules = ("webapp.domain.validation.inspect_deepspeed",)

    def observe(self, job: Inspection, rel: str, obj: Any) -> None:
        # Imported here: the child's modules, which the parent side must not load.
        from webapp.domain.validation.inspect_deepspeed import note_model_states

        note_model_states(rel, obj, job.report)

    def inspect_checkpoint(self, job: Inspection) -> None:
        # Imported here: the child's modules, which the parent side must not load.
        from webapp.domain.validation.inspect_deepspeed import check_folders

        check_folders(job.files, job.report)
