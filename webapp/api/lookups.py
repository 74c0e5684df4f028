"""The run, checkpoint or resume a request names, looked up within the token's project: one of
another project is not found (404), exactly as if it did not exist."""

from __future__ import annotations

from django.shortcuts import get_object_or_404

from webapp.api.errors import ApiError
from webapp.domain.models import Checkpoint, Resume, Run


def run_in_project(request, key: str) -> Run:
    run = Run.objects.filter(project=request.auth.project, key=key).first()
    if run is None:
        raise ApiError(404, f"no run {key!r} in this project")
    return run


def checkpoint_in_project(request, checkpoint_id: int) -> Checkpoint:
    checkpoint = (
        Checkpoint.objects.select_related("run")
        .filter(project=request.auth.project, pk=checkpoint_id)
        .first()
    )
    if checkpoint is None:
        raise ApiError(404, f"no checkpoint {checkpoint_id} in this project")
    return checkpoint


def resume_in_project(request, resume_id: int) -> Resume:
    return get_object_or_404(
        Resume.objects.select_related("run", "profile", "new_run"),
        project=request.auth.project,
        pk=resume_id,
    )
