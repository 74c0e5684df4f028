"""Carry the project's retention policies out now (rather than at beat's next hour)."""

from __future__ import annotations

from django.db import transaction

from webapp.domain import publish
from webapp.domain.actions.common import ActionRefused
from webapp.domain.locks import for_update
from webapp.domain.models import Event, Project, StorageAudit
from webapp.domain.models.storage_audit import AuditStatus


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


def audit_storage(target, actor: str) -> Event:
    """List the target now for objects no record accounts for (the workers'
    workers.replicate.audit_target, on the replicate queue that holds the store's keys);
    the audit is the dry run of a cleanup."""
    with transaction.atomic():
        event = Event.record(
            "storage.audit_requested",
            project=target.project_id,
            actor=actor,
            message=f"{actor} asked for storage target {target.name} to be audited",
            data={"scope": "storage", "target": target.name},
        )
        publish.after_commit("workers.replicate.audit_target", (target.pk, actor))
    return event


def clean_storage(audit, actor: str) -> Event:
    """Delete what the audit found, checked again by the worker (orphans.clean): only the
    newest finished audit of its target, once."""

    with transaction.atomic():
        row = for_update(StorageAudit.objects.filter(pk=audit.pk)).select_related("target").get()
        newest = StorageAudit.objects.filter(target=row.target).order_by("-started_at").first()
        if row.status != AuditStatus.DONE or row.cleaned_at is not None or newest != row:
            raise ActionRefused("only the newest finished audit of a target can be cleaned, once")
        if not (row.orphan_objects or row.uploads):
            raise ActionRefused("this audit found nothing to clean")
        event = Event.record(
            "storage.clean_requested",
            project=row.target.project_id,
            actor=actor,
            message=(
                f"{actor} asked for the {row.orphan_objects:,} objects ({row.orphan_bytes:,} "
                f"bytes) and {len(row.uploads)} unfinished uploads that audit {row.pk} of "
                f"{row.target.name} found to be deleted"
            ),
            data={"scope": "storage", "target": row.target.name, "audit": row.pk},
        )
        publish.after_commit("workers.replicate.clean_storage", (row.pk, actor))
    return event
