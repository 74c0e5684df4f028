"""Structured logs: every line a task writes carries its task, and the run and checkpoint
it works on, in plain text or (LOG_FORMAT=json) one JSON object per line.

The fields live in a context variable, bound for the length of a Celery task by the
task_prerun/task_postrun signals (workers/celery.py) from the task's own id arguments
(`checkpoint_id`, `replica_id`, `validation_id`, ...): no task has to remember to log
them, and a line can never carry the ids of the previous task.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import logging
import re
from datetime import UTC, datetime

from celery.signals import task_postrun, task_prerun
from django.apps import apps

_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lifeboat_log", default=None)


@contextlib.contextmanager
def bound(**fields):
    token = _context.set(
        {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    )
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields) -> contextvars.Token:
    return _context.set(
        {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    )


def current() -> dict:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.context = _context.get() or {}
        return True


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """A value from a job (a run key, an error message) on one log line: a newline in it
    must not start a line of its own that reads like Lifeboat's."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class PlainFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = one_line(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)  # a traceback after the line stays as it is
        context = getattr(record, "context", None) or {}
        if context:
            line += " [" + " ".join(f"{k}={one_line(str(v))}" for k, v in context.items()) + "]"
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **(getattr(record, "context", None) or {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# -- Celery ----------------------------------------------------------------------------

_ID_OWNERS = {
    "checkpoint_id": ("domain.Checkpoint", ("run_id",)),
    "replica_id": ("domain.Replica", ("checkpoint_id", "checkpoint__run_id")),
    "validation_id": ("domain.Validation", ("checkpoint_id", "checkpoint__run_id")),
    "resume_id": ("domain.Resume", ("checkpoint_id", "run_id")),
}


def task_fields(task, args, kwargs) -> dict:
    """The task's name and id, its `*_id` arguments, and the run and checkpoint they lead
    to (one indexed query)."""
    fields = {"task": task.name}
    try:
        bound_args = inspect.signature(task.run).bind_partial(*(args or ()), **(kwargs or {}))
    except TypeError:
        return fields
    for name, value in bound_args.arguments.items():
        if name.endswith("_id") and isinstance(value, int):
            fields[name] = value
    for name, (model, related) in _ID_OWNERS.items():
        if name not in fields or ("run_id" in fields and "checkpoint_id" in fields):
            continue
        found = apps.get_model(model).objects.filter(pk=fields[name]).values_list(*related).first()
        if found:
            keys = ["checkpoint_id", "run_id"] if len(related) == 2 else ["run_id"]
            for key, value in zip(keys, found, strict=False):
                fields.setdefault(key, value)
    return fields


def connect_celery_signals() -> None:
    tokens: dict[str, contextvars.Token] = {}

    @task_prerun.connect(weak=False)
    def _bind(task_id=None, task=None, args=None, kwargs=None, **_):
        try:
            fields = task_fields(task, args, kwargs)
        except Exception:  # noqa: BLE001 (logging context must never fail a task)
            fields = {"task": getattr(task, "name", "?")}
        tokens[task_id] = bind(task_id=task_id, **fields)

    @task_postrun.connect(weak=False)
    def _unbind(task_id=None, **_):
        token = tokens.pop(task_id, None)
        if token is not None:
            _context.reset(token)
