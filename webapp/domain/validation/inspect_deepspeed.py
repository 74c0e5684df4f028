"""DeepSpeed folders in the inspection child. A ZeRO checkpoint is one
`mp_rank_<mp>_model_states.pt` per model-parallel rank and, with ZeRO stage 1 or more, one
`zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt` per data-parallel rank: the model states
file says how many (`dp_world_size`), so a rank's missing optimizer file is named, which
DeepSpeed itself only finds when a resume fails. Each file is a torch.save file, loaded
and scanned by inspect_torch; this module only adds what the folder as a whole must hold.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from webapp.domain.validation.inspect_common import Report, join, parent_dir

MODEL_STATES = re.compile(r"mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


def note_model_states(rel: str, obj, report: Report) -> None:
    """Called with each loaded torch file: remembers what a model states file says about
    its folder's ranks."""
    match = MODEL_STATES.match(PurePosixPath(rel).name)
    if match is None or not isinstance(obj, dict):
        return
    world = obj.get("dp_world_size")
    config = obj.get("ds_config") if isinstance(obj.get("ds_config"), dict) else {}
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return
    report.deepspeed[rel] = {"mp": match.group(1), "dp_world_size": world, "stage": stage}


def check_folders(files: list[str], report: Report) -> None:
    """Every data-parallel rank's optimizer file is present beside its model states."""
    present = set(files)
    for rel, info in sorted(report.deepspeed.items()):
        folder = parent_dir(rel)
        prefix = (
            "bf16_"
            if any(
                PurePosixPath(p).name.startswith("bf16_zero_pp_rank_") and parent_dir(p) == folder
                for p in files
            )
            else ""
        )
        has_optim = any(
            OPTIM_STATES.match(PurePosixPath(p).name) and parent_dir(p) == folder for p in files
        )
        if not has_optim and not (isinstance(info["stage"], int) and info["stage"] >= 1):
            continue  # ZeRO stage 0: the optimizer state is in the model states file
        width = len(info["mp"])
        for rank in range(info["dp_world_size"]):
            name = f"{prefix}zero_pp_rank_{rank}_mp_rank_{info['mp']:0>{width}}_optim_states.pt"
            path = join(folder, name)
            if path not in present:
                report.add(
                    "corrupt",
                    "missing_shard",
                    f"{path} is missing: {rel} was saved by {info['dp_world_size']} "
                    f"data-parallel ranks, and DeepSpeed cannot resume without rank {rank}'s "
                    "optimizer state",
                    path,
                )
