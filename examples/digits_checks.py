"""The deeper restore-test levels for examples/train_digits.py, registered in a project's
settings as:

    {"forward": "examples.digits_checks:forward",
     "replay": "examples.digits_checks:replay", "replay_steps": 5}

Lifeboat calls them in a child process on a restore worker (docs/restore.md).
"""

from __future__ import annotations

import torch

from examples.train_digits import DigitsCNN, build, data, epoch_order, train_step

BATCH_SIZE = 64
SEED = 0


def forward():
    """The model, and a sample batch of eight digits."""
    (x_train, _), _ = data(SEED)
    return DigitsCNN(), x_train[:8]


def replay(checkpoint_path: str, steps: int) -> list[tuple[int, float]]:
    """Resume training from the checkpoint for `steps` steps, exactly as the job does,
    and return each step's loss."""
    (x_train, y_train), _ = data(SEED)
    model, optimizer = build(SEED)
    state = torch.load(checkpoint_path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step, epoch = state["step"], state["epoch"] + 1
    losses = []
    while len(losses) < steps:
        order = epoch_order(len(x_train), SEED, epoch)
        for first in range(0, len(x_train), BATCH_SIZE):
            index = order[first : first + BATCH_SIZE]
            step += 1
            losses.append((step, train_step(model, optimizer, x_train[index], y_train[index])))
            if len(losses) == steps:
                break
        epoch += 1
    return losses
