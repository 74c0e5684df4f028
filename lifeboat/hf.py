"""A Hugging Face `TrainerCallback` that reports every checkpoint the Trainer writes.

    from lifeboat.hf import LifeboatHFCallback
    trainer = Trainer(..., callbacks=[LifeboatHFCallback()])

The Trainer calls `on_save` once `checkpoint-N/` is complete (model, optimizer,
scheduler, RNG state and trainer_state.json written); the callback reports that folder
with the step, epoch and the last logged metrics, and sends every `on_log` as metrics.
Only the main process reports, and it reports each folder whole: the Trainer does not
say which rank wrote which file, so the callback does not report per-rank parts (a
`run` with parts on is refused; its own run has them off, whatever LIFEBOAT_PARTS says).
Without a `run`, it opens one from the environment for the training and closes it at the
end.
"""

from __future__ import annotations

import os

import transformers
from transformers import TrainerCallback

from lifeboat.run import Run, _numbers


class LifeboatHFCallback(TrainerCallback):
    def __init__(self, run: Run | None = None, **run_kwargs):
        if getattr(run, "parts", False) or run_kwargs.get("parts"):
            raise ValueError(
                "LifeboatHFCallback reports whole checkpoints from the main process: give "
                "it a Run without parts (docs/client.md, 'Many ranks')"
            )
        run_kwargs["parts"] = False
        self.run = run
        self._owns_run = run is None
        self._run_kwargs = run_kwargs
        self._last_metrics: dict = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if self.run is None and state.is_world_process_zero:
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
        if self.run is None or not state.is_world_process_zero:
            return
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(path):
            self.run.checkpoint(
                path,
                step=state.global_step,
                epoch=int(state.epoch) if state.epoch is not None else None,
                metrics=dict(self._last_metrics),
                format="hf",
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self._owns_run and self.run is not None:
            self.run.finish()
