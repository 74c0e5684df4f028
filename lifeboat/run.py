"""`lifeboat.Run`: what a training job holds while it runs.

    with lifeboat.Run("resnet-42") as run:
        for step in ...:
            ...
            run.log(step, loss=loss)
            if step % 1000 == 0:
                torch.save(state, path)
                run.checkpoint(path, step=step)

Nothing here blocks the training loop on the network or on hashing: events go to the
on-disk spool (lifeboat/spool.py) and a background thread delivers them; a checkpoint's
files are listed and hashed on another background thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
import traceback
import uuid
from datetime import datetime, timezone
from typing import Any

from lifeboat.config import Config, default_run_key, hostname, process_rank
from lifeboat.parts import Part, own_files, parts_from_env
from lifeboat.pending import RESCAN_S, PendingReports, build_event, label
from lifeboat.sender import Sender
from lifeboat.spool import Spool

log = logging.getLogger("lifeboat")

_current: Run | None = None


def current_run() -> Run | None:
    """The run started last in this process and not yet closed, if any."""
    return _current


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _numbers(values: dict | None) -> dict:
    """Metric values the contract accepts: plain numbers (tensors and numpy scalars too)."""
    out = {}
    for name, value in (values or {}).items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[str(name)] = value
    return out


def _lower_this_threads_priority() -> None:
    """Hash at the lowest CPU priority: on a busy machine the training loop comes first.
    Linux schedules threads on their own, so this touches only the calling thread."""
    # Not Linux, or not allowed: hash at normal priority.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class CheckpointReport:
    """The future of one reported checkpoint: `wait()` for its `checkpoint.saved` event."""

    def __init__(self, event_id: str, path: str, step: int):
        self.event_id = event_id
        self.path = path
        self.step = step
        self.event: dict | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> dict:
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint {self.path} is still being hashed")
        if self.error is not None:
            raise self.error
        return self.event


class Run:
    def __init__(
        self,
        key: str | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        project: str | None = None,
        name: str = "",
        config: dict | None = None,
        tags: list[str] | None = None,
        framework: str = "",
        world_size: int | None = None,
        expected_interval_s: float | None = None,
        resumed_from: int | str | None = None,
        heartbeat_s: float = 60.0,
        metrics_flush_s: float = 10.0,
        pending_rescan_s: float = RESCAN_S,
        spool_dir: str | os.PathLike | None = None,
        handle_signals: bool = True,
        enabled: bool | None = None,
        lifecycle: bool = True,
        parts: bool | None = None,
    ):
        # parts: every rank reports its own part of each checkpoint (lifeboat/parts.py);
        # off unless asked for here or by LIFEBOAT_PARTS=1.
        self.parts = parts_from_env() if parts is None else bool(parts)
        rank = process_rank()
        if enabled is None:
            enabled = os.environ.get("LIFEBOAT_DISABLED", "") not in ("1", "true", "yes")
            # In a distributed job only rank 0 speaks for the run; with parts, the other
            # ranks report their checkpoint parts and nothing else.
            enabled = enabled and (rank == 0 or self.parts)
        if self.parts and rank != 0:
            lifecycle = False
        self.enabled = enabled
        self.key = key or os.environ.get("LIFEBOAT_RUN") or default_run_key()
        self.name = name
        self.run_config = config or {}
        self.tags = list(tags or [])
        self.framework = framework
        self.world_size = world_size
        self.expected_interval_s = expected_interval_s
        self.resumed_from = resumed_from or os.environ.get("LIFEBOAT_RESUMED_FROM") or None
        self.heartbeat_s = heartbeat_s
        self.metrics_flush_s = metrics_flush_s
        # How often an idle hash thread completes reports that dead processes left.
        self.pending_rescan_s = pending_rescan_s
        self.handle_signals = handle_signals
        # False for a sidecar (`lifeboat watch`) and for ranks other than 0 with parts:
        # they report checkpoints, while the job's rank 0 owns run.started / finished /
        # failed, the heartbeats, the metrics and the signal handlers.
        self.lifecycle = lifecycle
        self.last_step: int | None = None
        self.last_metrics: dict = {}
        self.started = False
        self.closed = False
        self._points: list[dict] = []
        self._points_lock = threading.Lock()
        self._hash_queue: queue.Queue = queue.Queue()
        self._hash_thread: threading.Thread | None = None
        self._beat_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._previous_handlers: dict[int, Any] = {}
        if not self.enabled:
            self.config = None
            self.spool = None
            self.sender = None
            self.pending = None
            self.part = None
            return
        self.part = Part.of_this_process(world_size) if self.parts else None
        self.config = Config.resolve(url=url, token=token, project=project, spool_dir=spool_dir)
        self.spool = Spool(self.config.spool_dir, self.config.spool_max_bytes)
        self.sender = Sender(self.config, self.spool)
        self.pending = PendingReports(self.spool)
        # Records whose files this process could not read: not tried again every rescan.
        self._unreadable: set[str] = set()

    # -- life cycle -------------------------------------------------------------------

    def __enter__(self) -> Run:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        elif issubclass(exc_type, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            self.finish() if code == 0 else self.fail(f"exited with code {code}", code)
        elif issubclass(exc_type, KeyboardInterrupt):
            self.fail("interrupted (KeyboardInterrupt)", 130)
        else:
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            self.fail(text[-9000:], 1)

    def start(self) -> Run:
        global _current
        if self.started:
            return self
        self.started = True
        _current = self
        if not self.enabled:
            return self
        self._recover_pending()
        if self.lifecycle:
            self.emit(
                "run.started",
                name=self.name,
                host=hostname(),
                framework=self.framework,
                world_size=self.world_size,
                config=self.run_config,
                expected_interval_s=self.expected_interval_s,
                resumed_from=self.resumed_from,
                tags=self.tags,
            )
        self.sender.start()
        self._hash_thread = threading.Thread(
            target=self._hash_loop, name="lifeboat-hash", daemon=True
        )
        self._hash_thread.start()
        self._beat_thread = threading.Thread(
            target=self._beat_loop, name="lifeboat-heartbeat", daemon=True
        )
        if not self.lifecycle:
            return self
        self._beat_thread.start()
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGUSR1):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def finish(self, exit_code: int = 0) -> None:
        self._close("run.finished", exit_code=exit_code, error="")

    def fail(self, error: str = "", exit_code: int | None = 1) -> None:
        self._close("run.failed", exit_code=exit_code, error=error)

    def _close(self, type_: str, **fields) -> None:
        global _current
        if self.closed:
            return
        self.closed = True
        if _current is self:
            _current = None
        if not self.enabled or not self.started:
            return
        self._restore_signals()
        self._stop.set()
        # Reports still being hashed go out before the final event, so the timeline reads
        # in order; each is bounded by its own hashing time.
        self._hash_queue.put(None)
        if self._hash_thread is not None:
            self._hash_thread.join()
        self._flush_points()
        if self.lifecycle:
            self.emit(type_, **fields)
        timeout = float(os.environ.get("LIFEBOAT_EXIT_TIMEOUT_S", "10"))
        if not self.sender.stop(timeout):
            log.warning(
                "lifeboat: the server did not take every event within %.0f s; they stay in "
                "%s and the next lifeboat process (or `lifeboat flush`) delivers them",
                timeout,
                self.spool.dir,
            )

    # -- signals ------------------------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        # Schedulers send these before preemption or at the time limit: record it while
        # the process still can (run.preempted: not a failure, docs/client.md), then
        # behave as the program would have without us.
        self._close(
            "run.preempted",
            signal=name,
            exit_code=128 + signum,
            error=f"received {name} (preempted, the time limit near, or cancelled)",
        )
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handlers.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous_handlers.clear()

    # -- events -------------------------------------------------------------------------

    def emit(
        self,
        type_: str,
        *,
        event_id: str | None = None,
        time: str | None = None,
        run_key: str | None = None,
        **fields,
    ):
        """Spool one v1 event (None fields left out) and wake the sender."""
        if not self.enabled:
            return None
        event = build_event(
            type_, event_id or str(uuid.uuid4()), run_key or self.key, time or now_iso(), **fields
        )
        self.spool.put(event)
        self.sender.wake()
        return event

    def log(self, step: int, **values) -> None:
        """Per-step metrics (losses), sent in batches as `metrics` events. Cheap: it only
        appends to a list; a background thread sends them."""
        values = _numbers(values)
        self.last_step = int(step)
        self.last_metrics.update(values)
        if not self.enabled or not self.lifecycle or not values:
            return
        with self._points_lock:
            self._points.append({"step": int(step), "values": values})
            full = len(self._points) >= 1000
        if full:
            self._flush_points()

    def _flush_points(self) -> None:
        with self._points_lock:
            points, self._points = self._points, []
        for start in range(0, len(points), 1000):
            self.emit("metrics", points=points[start : start + 1000])

    def heartbeat(self, step: int | None = None, **metrics) -> None:
        if step is not None:
            self.last_step = int(step)
        self.last_metrics.update(_numbers(metrics))
        if not self.lifecycle:
            return
        self.emit("run.heartbeat", step=self.last_step, metrics=_numbers(self.last_metrics))

    def _beat_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        while not self._stop.wait(min(self.metrics_flush_s, self.heartbeat_s)):
            self._flush_points()
            if time.monotonic() >= next_beat:
                self.heartbeat()
                next_beat = time.monotonic() + self.heartbeat_s

    # -- checkpoints ----------------------------------------------------------------------

    def checkpoint_started(self, step: int) -> None:
        self.emit("checkpoint.started", step=int(step))

    def checkpoint_failed(self, step: int, error: str) -> None:
        self.emit("checkpoint.failed", step=int(step), error=str(error)[-9000:])

    def checkpoint(
        self,
        path: str | os.PathLike,
        step: int,
        *,
        epoch: int | None = None,
        metrics: dict | None = None,
        save_seconds: float | None = None,
        format: str | None = None,  # noqa: A002 (the contract's name)
        event_id: str | None = None,
        written: dict[str, dict] | None = None,
        files: list[str] | None = None,
        whole: bool = False,
        part: Part | None = None,
    ) -> CheckpointReport:
        """Report a checkpoint the job has finished writing at `path` (a file or a
        directory). Returns at once: the files are hashed on a background thread and sent
        as `checkpoint.saved`. A crash before that is survived: the report is on disk
        (lifeboat/pending.py) and any lifeboat process on this host with the same spool
        completes it. `written` ({relative path: {size, sha256}}, lifeboat.torch.save
        gives it) holds digests made while the files were written: those are not read.

        With parts on, the report is this rank's part: the files it wrote (`files`, paths
        inside the folder `path`; without it, found as lifeboat.parts.own_files says),
        listed and hashed here, and no others. Without parts, `files` is not used: rank
        0 reports everything at `path`. `whole=True` reports everything at `path` even
        with parts on, for a checkpoint one process wrote alone (a Lightning `.ckpt`
        under DDP: rank 0 writes it, and the other ranks have no part of it). `part`
        reports for another rank than this process's: `lifeboat watch --world-size` on
        a node reports the parts of the ranks whose files are there."""
        location = os.path.abspath(os.fspath(path))
        only = None
        part = None if whole else (part or self.part)
        if part is not None:
            location, only = own_files(location, part.rank, files=files, world_size=part.world_size)
        report = CheckpointReport(event_id or str(uuid.uuid4()), location, int(step))
        if not self.enabled:
            report.event = {}
            report._done.set()
            return report
        request = {
            "id": report.event_id,
            "run": self.key,
            "time": now_iso(),
            "location": location,
            "step": int(step),
            "epoch": epoch,
            "metrics": _numbers(metrics if metrics is not None else self.last_metrics),
            "save_seconds": save_seconds,
            "format": format,
            "pid": os.getpid(),
            "host": hostname(),
        }
        if written:
            request["written"] = written
        if part is not None:
            request["part"] = part.as_dict()
            request["only"] = only
        request = self.pending.add(request)
        if request is None:
            report.error = RuntimeError(
                f"checkpoint report {report.event_id} is pending already (reported twice?)"
            )
            report._done.set()
            return report
        self._hash_queue.put((request, report))
        return report

    def _hash_loop(self) -> None:
        _lower_this_threads_priority()
        while True:
            try:
                item = self._hash_queue.get(timeout=self.pending_rescan_s)
            except queue.Empty:
                # Idle: complete what a process that died meanwhile left (a sibling job
                # on this host with the same spool, a job beside this sidecar).
                self._recover_pending()
                continue
            if item is None:
                # Reports still queued (recovered while the run closed) stay on disk;
                # closing the owner frees them for the next process.
                self.pending.close()
                return
            request, report = item
            try:
                report.event = self.pending.complete(request)
                self.sender.wake()
                if report.event["type"] == "checkpoint.failed":
                    log.error("lifeboat: %s", report.event["error"])
            except BaseException as exc:  # noqa: BLE001 (handed to the waiter)
                if isinstance(exc, OSError):
                    self._unreadable.add(request["id"])
                    log.error("lifeboat: could not complete %s: %s", label(request), exc)
                    with contextlib.suppress(OSError):
                        self.pending.release(request)
                report.error = exc
            finally:
                report._done.set()

    def _recover_pending(self) -> None:
        """Queue the checkpoint reports that a dead process on this host left unfinished
        (hashed on the background thread like any other report)."""
        try:
            scan = self.pending.take_orphans()
        except OSError as exc:
            log.error("lifeboat: could not look at %s: %s", self.pending.dir, exc)
            return
        for request in scan.claimed:
            if request["id"] in self._unreadable:
                self.pending.release(request)
                continue
            log.info("lifeboat: completing the report of %s left by a dead process", label(request))
            report = CheckpointReport(request["id"], request["location"], request["step"])
            self._hash_queue.put((request, report))
