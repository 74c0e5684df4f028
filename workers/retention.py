"""Retention on a schedule (Celery beat), on the validate queue: deleting a local copy
needs a worker that sees the training file system. See webapp.domain.retention.policy."""

from __future__ import annotations

from celery import shared_task
from django.utils.dateparse import parse_datetime

from webapp.domain.models import Project, RetentionPolicy
from webapp.domain.retention import host_deletion
from webapp.domain.retention import policy as retention


@shared_task(name="workers.retention.apply_all", ignore_result=True)
def apply_all() -> int:
    """One task per project that has an enabled retention policy."""

    ids = sorted(
        set(RetentionPolicy.objects.filter(enabled=True).values_list("project_id", flat=True))
    )
    for project_id in ids:
        apply_project.delay(project_id)
    return len(ids)


@shared_task(name="workers.retention.apply_project", ignore_result=True)
def apply_project(project_id: int) -> int:
    """Safe to run twice, or in parallel: each deletion re-checks its reasons under a
    row lock, and one already done is skipped."""

    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    return len(retention.apply(project, actor="worker:retention"))


@shared_task(name="workers.retention.finish_interrupted", ignore_result=True)
def finish_interrupted(project_id: int, before: str) -> None:
    """The sweeper's: the deletions of the project marked before `before` and never
    finished (webapp/domain/retention/owed.py)."""

    project = Project.objects.filter(pk=project_id).first()
    if project is not None:
        retention.finish_interrupted(project, "system:sweeper", parse_datetime(before))


@shared_task(name="workers.retention.remove_share", ignore_result=True)
def remove_share(checkpoint_id: int, host: str, actor: str, why: str, previous) -> str:
    """One host's share of a node-local checkpoint's local copy, removed on that host
    (queue validate.<host>; webapp/domain/retention/host_deletion.py)."""

    return host_deletion.remove_share(checkpoint_id, host, actor, why, previous)
