"""A Hugging Face `TrainerCallback` that reports every checkpoint the Trainer writes.

    from lifeboat.hf import LifeboatHFCallback
    trainer = Trainer(..., callbacks=[LifeboatHFCallback()])

The Trainer calls `on_save` once `checkpoint-N/` is complete (model, optimizer,
scheduler, RNG state and trainer_state.json written); the callback reports that folder
with the step, epoch and the last logged metrics, and sends every `on_log` as metrics.
Without parts, the main process reports each folder whole. With parts
(`LIFEBOAT_PARTS=1`, or a `run` made with `parts=True`), every process reports its own
part: the files whose names carry its rank (`rng_state_<rank>.pth`, DCP shards of an
FSDP sharded save), and the main process the rest (lifeboat/parts.py, `own_files`).
Without a `run`, it opens one from the environment for the training (on every process
with parts, the main one alone otherwise) and closes it at the end.
"""

from __future__ import annotations

import logging
import os

import transformers
from transformers import TrainerCallback

from lifeboat.parts import parts_from_env
from lifeboat.run import Run, _numbers

log = logging.getLogger("lifeboat")


class LifeboatHFCallback(TrainerCallback):
    def __init__(self, run: Run | None = None, **run_kwargs):
        self.run = run
        self._owns_run = run is None
        self._run_kwargs = run_kwargs
        self._last_metrics: dict = {}

    def _reports(self, state) -> bool:
        """This process reports checkpoints: the main one, or every one with parts."""
        return self.run is not None and (state.is_world_process_zero or self.run.parts)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.run is not None:
            return
        parts = self._run_kwargs.get("parts")
        if state.is_world_process_zero or (parts_from_env() if parts is None else parts):
            self._run_kwargs.setdefault("framework", f"transformers {transformers.__version__}")
            self._run_kwargs.setdefault("world_size", args.world_size)
            self.run = Run(**self._run_kwargs).start()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not state.is_world_process_zero:
            return
        values = _numbers(logs)
        if values:
            self._last_metrics.update(values)
            self.run.log(state.global_step, **values)

    def on_save(self, args, state, control, **kwargs):
        if not self._reports(state):
            return
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(path):
            return
        try:
            self.run.checkpoint(
                path,
                step=state.global_step,
                epoch=int(state.epoch) if state.epoch is not None else None,
                metrics=dict(self._last_metrics),
                format="hf",
            )
        except ValueError as exc:
            # With parts, a process that wrote nothing named as its own (save_only_model
            # skips the RNG state files): training goes on, and the server says which
            # rank never reported once the deadline passes.
            log.warning("lifeboat: checkpoint-%d not reported: %s", state.global_step, exc)

    def on_train_end(self, args, state, control, **kwargs):
        if self._owns_run and self.run is not None:
            self.run.finish()
