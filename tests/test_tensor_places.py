"""The rule of docs/validation.md, "Where a value lives", case by case (pure Python: the
same function the load check uses on every tensor)."""

from __future__ import annotations

import pytest

from webapp.domain.validation.tensor_places import (
    BOOKKEEPING,
    MODEL,
    OPTIMIZER,
    dcp_roles,
    dotted,
    path_name,
    role_of,
)

MC = "ModelCheckpoint{'monitor': None, 'mode': 'min'}"


@pytest.mark.parametrize(
    ("file", "path", "numel", "role"),
    [
        # Lightning: the state dict, the optimizer states, the callbacks' scores.
        ("last.ckpt", ("state_dict", "layer.weight"), 12, MODEL),
        ("last.ckpt", ("state_dict", "logit_scale"), 1, MODEL),  # a scalar parameter
        ("last.ckpt", ("optimizer_states", 0, "state", "3", "exp_avg"), 12, OPTIMIZER),
        ("last.ckpt", ("optimizer_states", 0, "state", "3", "step"), 1, OPTIMIZER),
        ("last.ckpt", ("callbacks", MC, "kth_value"), 1, BOOKKEEPING),
        ("last.ckpt", ("callbacks", "EarlyStopping{}", "best_score"), 1, BOOKKEEPING),
        ("last.ckpt", ("loops", "fit_loop", "x"), 1, BOOKKEEPING),
        ("last.ckpt", ("lr_schedulers", 0, "base_lrs"), 1, BOOKKEEPING),
        # A larger tensor kept by a callback (SWA's averaged weights) is checked.
        ("last.ckpt", ("callbacks", "SWA", "average_model_state", "w"), 16, MODEL),
        # Hand-written loops.
        ("step.pt", ("model", "fc.weight"), 8, MODEL),
        ("step.pt", ("optimizer", "state", "0", "exp_avg"), 8, OPTIMIZER),
        ("step.pt", ("best_loss",), 1, BOOKKEEPING),
        ("step.pt", ("scaler", "scale"), 1, BOOKKEEPING),
        ("step.pt", ("rng_states", "cuda", 0), 1, BOOKKEEPING),
        ("step.pt", ("fc.weight",), 8, MODEL),
        # A key with dots is named by its last part: a head called score is weights.
        ("model.safetensors", ("score.weight",), 1, MODEL),
        ("model.safetensors", ("head.score",), 1, BOOKKEEPING),
        # Files: HF Trainer, accelerate, DeepSpeed.
        ("ckpt/optimizer.pt", ("state", "0", "exp_avg_sq"), 8, OPTIMIZER),
        ("ckpt/optimizer.bin", ("state", "0", "exp_avg_sq"), 8, OPTIMIZER),
        ("ckpt/zero_pp_rank_0_mp_rank_00_optim_states.pt", ("x",), 8, OPTIMIZER),
        ("ckpt/scheduler.pt", ("last_epoch",), 1, BOOKKEEPING),
        ("ckpt/rng_state_3.pth", ("cpu",), 1, BOOKKEEPING),
        ("ckpt/random_states_0.pkl", ("step",), 1, BOOKKEEPING),
        ("ckpt/pytorch_model.bin", ("lm_head.weight",), 8, MODEL),
    ],
)
def test_a_value_has_the_role_its_place_gives(file, path, numel, role):
    assert role_of(file, path, numel) == role


def test_an_optimizer_state_dict_under_any_name_is_optimizer_state():
    path = ("ema_and_opt", "s", "state", "0", "exp_avg")
    assert role_of("c.pt", path, 8) == MODEL
    assert role_of("c.pt", path, 8, in_optimizer_state=True) == OPTIMIZER


def test_dcp_uses_the_paths_its_planner_recorded():
    fqns = ["app.model.scaler.weight", "app.opt.state.0.exp_avg", "app.opt.param_groups.0.lr"]
    planner = {
        "app.model.scaler.weight": ("app", "model", "scaler.weight"),
        "app.opt.state.0.exp_avg": ("app", "opt", "state", "0", "exp_avg"),
        "app.opt.param_groups.0.lr": ("app", "opt", "param_groups", 0, "lr"),
    }
    role = dcp_roles(".metadata", fqns, planner)
    # `scaler.weight` is one key of the model's state dict, not a `scaler` container.
    assert role("app.model.scaler.weight", 1) == MODEL
    # `opt` holds `param_groups`: its `state` is optimizer state under any name.
    assert role("app.opt.state.0.exp_avg", 8) == OPTIMIZER


def test_names_are_paths_and_compare_with_the_dotted_names_of_before():
    assert path_name(("optimizer_states", 0, "state", "3", "exp_avg")) == (
        "optimizer_states[0]/state/3/exp_avg"
    )
    assert path_name(("state_dict", "layer.weight")) == "state_dict/layer.weight"
    assert dotted("a.ckpt:optimizer_states[0]/state/3/exp_avg") == (
        "a.ckpt:optimizer_states.0.state.3.exp_avg"
    )
    assert dotted(".metadata:model.w") == ".metadata:model.w"
