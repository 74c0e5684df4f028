"""Restore tests (queue `restore`, or `gpu` while a GPU worker is alive): see
webapp/domain/recovery/restore_test.py. Tasks take ids and are safe to run twice."""

from __future__ import annotations

import contextlib
import socket
import threading

from celery import current_app, shared_task
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from webapp.domain.recovery import restore_test as rt


@shared_task(name="workers.restore.restore_test", ignore_result=True, acks_late=True)
def restore_test(validation_id: int) -> str:
    return rt.run(validation_id)


@shared_task(name="workers.restore.schedule", ignore_result=True)
def schedule() -> int:
    """Beat, hourly: a restore test for the latest verified checkpoint of every active
    run that had none for RESTORE_TEST_EVERY_S."""

    return len(rt.schedule())


_stop = threading.Event()
RESTORE_QUEUES = {"restore", "gpu"}


def _consumes(app) -> set[str]:
    return set(getattr(app.amqp.queues, "consume_from", {}) or {})


@worker_process_init.connect(weak=False)
def _start_warm_loader(**_):
    """Each pool process of a restore worker starts its warm loader at once, so the first
    restore test finds torch imported (see restore_test._child_load). Pools that send no
    worker_process_init (threads) start it at their first restore test instead."""
    if not _consumes(current_app) & RESTORE_QUEUES:
        return

    rt.start_warm_loader()


@worker_ready.connect(weak=False)
def _announce_gpu(sender=None, **_):
    """A worker that consumes the `gpu` queue on a host with a GPU says so in Redis every
    minute, so restore tests are routed to it while it lives."""

    queues = _consumes(sender.app)
    if "gpu" not in queues or not rt.has_gpu():
        return
    name = f"{socket.gethostname()}:{id(sender)}"

    def beat():
        while not _stop.is_set():
            # Redis away: try again next minute.
            with contextlib.suppress(Exception):
                rt.mark_gpu_worker(name)
            _stop.wait(60)

    threading.Thread(target=beat, name="lifeboat-gpu-announce", daemon=True).start()


@worker_shutdown.connect(weak=False)
def _stop_announcing(**_):
    _stop.set()
