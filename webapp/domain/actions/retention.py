"""Carry the project's retention policies out now (rather than at beat's next hour)."""

from __future__ import annotations

from django.db import transaction

from webapp.domain import publish
from webapp.domain.locks import for_update
from webapp.domain.models import Event, Project


def apply_retention(project: Project, actor: str) -> Event:
    """Queue the deletions the policies ask for, on a worker that sees the checkpoint
    files (the validate queue): each deletion is recorded in the event log there. The
    project's row is locked so that requests at the same moment are audited in turn.
    Returns the audit Event."""
    with transaction.atomic():
        for_update(Project.objects.filter(pk=project.pk)).exists()
        event = Event.record(
            "retention.requested",
            project=project,
            actor=actor,
            message=f"{actor} asked for the retention policies to be applied",
        )
        publish.after_commit("workers.retention.apply_project", (project.pk,))
    return event
