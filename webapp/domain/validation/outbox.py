"""Validation messages of a web process, published together.

Why: publishing one Celery message costs about 1.2 ms of CPU (building the message,
a Redis client, the round trip): as much as a third of a single event's whole cost on
the ingest path (bench/ingest.py). Checkpoints committed by many requests need not each
pay for their own message: a worker fans one dispatch message out to a task per
checkpoint (workers/validate.dispatch_validations).

How: after its transaction commits, ingest hands the ids of the checkpoints to check to
this process's outbox. One thread publishes what is waiting: at once when it was idle,
so a lone job's checkpoint is on the queue within a millisecond or two as before; under
load at most one message every VALIDATION_PUBLISH_MS, holding everything that
committed meanwhile.

What is not lost: the checkpoints are stamped validation_enqueued_at in the
transaction. A publish that fails sets that back to NULL, and workers.sweeper requeues
them; a process that is stopped publishes what it holds on the way out (the ASGI
lifespan's shutdown in webapp/api/ingest_asgi.py, and atexit); one that is killed in
the window loses only messages the sweeper sends again later.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from django.conf import settings

from webapp.domain import publish
from webapp.domain.validation.publish import enqueue_validations

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, interval_ms: int):
        self.interval_s = interval_ms / 1000
        self._ids: list[int] = []
        self._lock = threading.Lock()
        # Held while a message is being sent, so that the flush on exit waits for it
        # instead of ending the process under it.
        self._sending = threading.Lock()
        self._waiting = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, checkpoint_ids: list[int]) -> None:
        with self._lock:
            self._ids.extend(checkpoint_ids)
            if self._thread is None or not self._thread.is_alive():
                # Started on first use, after gunicorn's fork (a thread does not
                # survive one).
                self._thread = threading.Thread(
                    target=self._run, name="lifeboat-validation-outbox", daemon=True
                )
                self._thread.start()
        self._waiting.set()

    def flush(self) -> int:
        """Publish what is waiting now; the number of checkpoints published."""

        with self._sending:
            with self._lock:
                ids, self._ids = self._ids, []
                self._waiting.clear()
            if ids:
                try:
                    enqueue_validations(sorted(set(ids)))
                except Exception:  # enqueue_validations logs; this thread must live on
                    log.exception("validation outbox: publishing %d checkpoints failed", len(ids))
        return len(ids)

    def _run(self) -> None:
        while True:
            self._waiting.wait()
            self.flush()
            # What commits during this pause goes out together in the next message.
            time.sleep(self.interval_s)


_outbox: Outbox | None = None
_outbox_lock = threading.Lock()


def publish_after_commit(checkpoint_ids: list[int]) -> None:
    """Called on commit with the checkpoints to validate."""
    global _outbox
    if not settings.VALIDATION_PUBLISH_MS:
        enqueue_validations(checkpoint_ids)
        return
    if _outbox is None:
        with _outbox_lock:
            if _outbox is None:
                publish.app()  # built here, not in the thread

                _outbox = Outbox(settings.VALIDATION_PUBLISH_MS)
    _outbox.add(checkpoint_ids)


@atexit.register
def flush_outbox() -> int:
    """Publish what this process holds (on its way out); the number of checkpoints."""
    return _outbox.flush() if _outbox is not None else 0
