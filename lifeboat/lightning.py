"""A PyTorch Lightning callback that reports every checkpoint Lightning writes.

    from lifeboat.lightning import LifeboatCallback
    trainer = Trainer(callbacks=[ModelCheckpoint(...), LifeboatCallback()])

Lightning calls `on_save_checkpoint` before the file is written, so the callback only
notes the step there; at the next hook (the end of the batch, epoch, validation or fit)
it reports every file a ModelCheckpoint wrote since, with the step and the logged
metrics of that moment. Without parts, global rank 0 reports each checkpoint whole.
With parts (`LIFEBOAT_PARTS=1`, or a `run` made with `parts=True`), every rank reports
its own part of a sharded checkpoint folder (FSDP's `state_dict_type="sharded"`, DCP
shards named by rank, lifeboat/parts.py), while a single `.ckpt` file, which rank 0
alone writes, is still reported whole by rank 0. Without a `run`, the callback opens one
from the environment (LIFEBOAT_URL, LIFEBOAT_TOKEN, LIFEBOAT_RUN) for the fit and closes
it as finished or failed.
"""

from __future__ import annotations

import os
import re
import time
import traceback

import lightning.pytorch as pl

from lifeboat.parts import parts_from_env
from lifeboat.run import Run, _numbers


class LifeboatCallback(pl.Callback):
    def __init__(self, run: Run | None = None, *, log_metrics: bool = True, **run_kwargs):
        self.run = run
        self._owns_run = run is None
        self._run_kwargs = run_kwargs
        self.log_metrics = log_metrics
        self._saves: list[tuple[float, int, int, dict]] = []  # (time, step, epoch, metrics)
        self._reported: set[tuple[str, int]] = set()

    # -- the run ------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.run is not None:
            return
        parts = self._run_kwargs.get("parts")
        if not trainer.is_global_zero and not (parts_from_env() if parts is None else parts):
            return
        self._run_kwargs.setdefault("framework", f"lightning {pl.__version__}")
        self._run_kwargs.setdefault("world_size", trainer.world_size)
        self.run = Run(**self._run_kwargs).start()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._report_new(trainer)
        if self._owns_run and self.run is not None:
            self.run.finish()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._report_new(trainer)
        if self._owns_run and self.run is not None:
            text = "".join(traceback.format_exception(exception))
            self.run.fail(text[-9000:], 1)

    # -- checkpoints ----------------------------------------------------------------------

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.run is None:
            return
        metrics = _numbers(dict(trainer.callback_metrics))
        # The file is written after this hook returns; anything newer than now is it.
        self._saves.append((time.time() - 1.0, trainer.global_step, trainer.current_epoch, metrics))

    def _report_new(self, trainer) -> None:
        if self.run is None or not self._saves:
            return
        since = self._saves[0][0]
        _, last_step, epoch, metrics = self._saves[-1]
        for callback in trainer.checkpoint_callbacks:
            paths = {callback.last_model_path, callback.best_model_path}
            paths |= set(getattr(callback, "best_k_models", {}) or {})
            paths.add(getattr(callback, "_last_checkpoint_saved", "") or "")
            for path in sorted(p for p in paths if p):
                try:
                    modified = os.stat(path).st_mtime_ns
                except FileNotFoundError:
                    continue
                key = (os.path.realpath(path), modified)
                if modified / 1e9 < since or key in self._reported:
                    continue
                # A file is rank 0's alone; a sharded folder is every rank's, with parts.
                whole = os.path.isfile(path)
                if not trainer.is_global_zero and (whole or not self.run.parts):
                    continue
                self._reported.add(key)
                # Lightning's default names carry the step ("epoch=1-step=200.ckpt"); it
                # is exact even when two saves happened before this report.
                named = re.search(r"step=(\d+)", os.path.basename(path))
                step = int(named.group(1)) if named else last_step
                self.run.checkpoint(
                    path, step=step, epoch=epoch, metrics=metrics, format="lightning",
                    whole=whole,
                )  # fmt: skip
        self._saves.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.run is None:
            return
        self._report_new(trainer)
        step = trainer.global_step
        # Every log_every_n_steps only: .item() on a GPU tensor waits for the GPU.
        if self.log_metrics and step % max(trainer.log_every_n_steps, 1) == 0:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "item"):
                self.run.log(step, loss=loss.detach().float().item())

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._report_new(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._report_new(trainer)
