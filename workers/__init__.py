"""Celery workers: one module per kind of work, one queue per module."""

from workers.celery import app

__all__ = ["app"]
