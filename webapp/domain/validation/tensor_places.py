"""Where a value lives in a checkpoint, and so what a NaN, an Inf or an all-zero matrix
there means (the rule is written out in docs/validation.md, "Where a value lives").

A value's place is its path from the top of the file: dict keys and list indices, e.g.
`state_dict/layer.weight` or `optimizer_states[0]/state/3/exp_avg` (a list index is
written `[i]`, every other step after a `/`; a dict key is one step even when it holds
dots, as the keys of a model's state dict do). Its role is one of

- MODEL: the model's parameters and buffers, and anything not recognised below;
- OPTIMIZER: an optimizer's state (moments, momentum buffers, step counts);
- BOOKKEEPING: a single number that a trainer or callback keeps for itself (the best and
  k-th best scores of ModelCheckpoint, EarlyStopping's best_score, an AMP scale, ...).

NaN or Inf in MODEL or OPTIMIZER values makes a checkpoint corrupt, and an all-zero
matrix there is suspicious; in BOOKKEEPING values they are normal (ModelCheckpoint starts
`kth_value` at inf) and are reported as information only.

This module is pure Python (no torch), so the rule can be read and tested on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

MODEL = "model"
OPTIMIZER = "optimizer"
BOOKKEEPING = "bookkeeping"

ROLE_WORDS = {MODEL: "model weights", OPTIMIZER: "optimizer state", BOOKKEEPING: "bookkeeping"}

# Containers that trainers and callbacks keep their own state in (Lightning's top-level
# keys, the usual names of hand-written loops, DeepSpeed's model_states file).
BOOKKEEPING_KEYS = frozenset(
    {
        "callbacks",
        "loops",
        "lr_schedulers",
        "lr_scheduler",
        "scheduler",
        "schedulers",
        "scheduler_state",
        "scaler",
        "grad_scaler",
        "amp",
        "amp_scaler",
        "hyper_parameters",
        "datamodule_hyper_parameters",
        "hparams",
        "trainer_state",
        "random_state",
        "random_states",
    }
)
# Files that trainers write only for their own state: HF Trainer's scheduler.pt,
# rng_state*.pth and training_args.bin, accelerate's scheduler.bin, scaler.pt and
# random_states_*.pkl.
BOOKKEEPING_FILE = re.compile(
    r"^(scheduler|lr_scheduler|rng_state|random_states|scaler|training_args)([._-].*)?$"
)
OPTIMIZER_KEYS = frozenset(
    {
        "optimizer",
        "optimizers",
        "optimizer_states",
        "optimizer_state",
        "optimizer_state_dict",
        "optim",
        "optim_state",
        "optim_state_dict",
        "base_optimizer_state",
    }
)
# HF Trainer's optimizer.pt, accelerate's optimizer.bin / optimizer_1.bin, DeepSpeed's
# zero_pp_rank_0_mp_rank_00_optim_states.pt.
OPTIMIZER_FILE = re.compile(r"^(optimizer([._-].*)?|.*optim_states(\..*)?)$")
# The own key of a single number that names a score: best_model_score, kth_value,
# best_score, current_score, best_metric, ...
SCORE_KEY = re.compile(r"^(best|kth)|(score|metric)$")


def path_name(path: Sequence[str | int]) -> str:
    """`state_dict/layer.weight`, `optimizer_states[0]/state/3/exp_avg`: ints are list
    indices, strings dict keys."""
    name = ""
    for step in path:
        if isinstance(step, int):
            name += f"[{step}]"
        else:
            name += f"/{step}" if name else str(step)
    return name


def dotted(name: str) -> str:
    """A `<file>:<path>` name in the dotted form that Lifeboat used before paths
    (`optimizer.pt:state.0.exp_avg`), so that names stored then compare with names made
    now. A name without a path part is returned as it is."""
    file, sep, path = name.partition(":")
    if not sep:
        return name
    return file + sep + re.sub(r"\[(\d+)\]", r".\1", path).replace("/", ".").lstrip(".")


def role_of(
    file: str, path: Sequence[str | int], numel: int, *, in_optimizer_state: bool = False
) -> str:
    """The role of one value: the file it is in (relative path), its path in that file,
    how many elements it has, and whether it lies under the `state` of a dict that also
    holds `param_groups` (an optimizer's state dict, under whatever name).

    BOOKKEEPING: a value of at most one element that lies under a bookkeeping container
    (any key above it in BOOKKEEPING_KEYS or holding "rng"), or in a bookkeeping file, or
    whose own key names a score. A larger value in those places (a copy of the weights
    that a callback keeps, as StochasticWeightAveraging does) is checked like the rest.
    OPTIMIZER: in an optimizer state dict, under a key in OPTIMIZER_KEYS, or in an
    optimizer file. MODEL: everything else."""
    stem = PurePosixPath(file).name
    containers = [str(step).lower() for step in path[:-1] if not isinstance(step, int)]
    if numel <= 1 and _is_bookkeeping(stem, containers, path):
        return BOOKKEEPING
    if (
        in_optimizer_state
        or OPTIMIZER_FILE.match(stem)
        or any(c in OPTIMIZER_KEYS for c in containers)
    ):
        return OPTIMIZER
    return MODEL


def is_optimizer_state_dict(value: object) -> bool:
    return isinstance(value, dict) and "state" in value and "param_groups" in value


def _is_bookkeeping(stem: str, containers: list[str], path: Sequence[str | int]) -> bool:
    if BOOKKEEPING_FILE.match(stem):
        return True
    if any(c in BOOKKEEPING_KEYS or "rng" in c for c in containers):
        return True
    own = path[-1] if path else ""
    if isinstance(own, int):
        return False
    # A model's state dict key is dotted (`head.score.weight`): its last part is its name.
    return bool(SCORE_KEY.search(str(own).lower().rsplit(".", 1)[-1]))


def optimizer_roots(paths) -> set[tuple]:
    """Where optimizer state dicts sit in a flattened checkpoint (DCP): the paths of the
    dicts that hold a `param_groups` entry, given every value's full path."""
    roots = set()
    for path in paths:
        for i, step in enumerate(path):
            if step == "param_groups":
                roots.add(tuple(path[:i]))
    return roots


def under_optimizer_state(path: Sequence[str | int], roots: set[tuple]) -> bool:
    """Whether `path` passes through the `state` of one of the optimizer state dicts at
    `roots` (see optimizer_roots)."""
    return any(step == "state" and tuple(path[:i]) in roots for i, step in enumerate(path))


def dcp_roles(file: str, fqns: list[str], planner) -> Callable[[str, int], str]:
    """role(fqn, numel) for the tensors of one DCP checkpoint (`file` its .metadata). DCP
    flattens nested state into dotted fqns; its planner data keeps each one's path as a
    tuple of keys (("optim", "state", 0, "exp_avg")), which is used; without it, the
    fqn's dotted parts stand in."""
    planner = planner if isinstance(planner, dict) else {}
    paths = {}
    for fqn in fqns:
        path = planner.get(fqn)
        paths[fqn] = path if isinstance(path, tuple) and path else tuple(str(fqn).split("."))
    roots = optimizer_roots(paths.values())

    def role(fqn: str, numel: int) -> str:
        path = paths.get(fqn) or tuple(fqn.split("."))
        in_state = under_optimizer_state(path, roots)
        return role_of(file, path, numel, in_optimizer_state=in_state)

    return role
