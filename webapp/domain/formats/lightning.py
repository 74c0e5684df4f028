"""PyTorch Lightning checkpoints: torch.save files (`.ckpt` by custom) whose object is a
dict with a `state_dict` and Lightning's bookkeeping (`global_step`, `epoch`). Recognised
from the loaded object, which the torch format shows to every format; checked and loaded
as torch files."""

from __future__ import annotations

from typing import Any

from webapp.domain.formats.base import Format, Inspection


def is_lightning(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("state_dict"), dict)
        and ("global_step" in obj or "epoch" in obj)
    )


class Lightning(Format):
    name = "lightning"
    aliases = ("pytorch-lightning",)
    precedence = 30

    def observe(self, job: Inspection, rel: str, obj: Any) -> None:
        if is_lightning(obj):
            job.report.formats.add(self.name)
