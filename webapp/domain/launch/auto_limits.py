"""Per-project bounds on automatic resumes, besides the per-lineage max_restarts: a
project whose many runs all fail (N new run keys, each failing) must not launch N jobs.
At most AUTO_RESUME_MAX_ACTIVE automatic resumes of a project are unfinished at once,
and at most AUTO_RESUME_MAX_PER_HOUR are requested in any hour. Call refusal() with the
project row locked (select_for_update), so two runs failing at once cannot both pass."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.domain.models import Resume

UNFINISHED = ("requested", "restoring", "launching", "running")


def refusal(project) -> str | None:
    """Why the project may not launch another automatic resume now, or None."""

    mine = Resume.objects.filter(project=project, automatic=True)
    active = mine.filter(status__in=UNFINISHED).count()
    if active >= settings.AUTO_RESUME_MAX_ACTIVE:
        return (
            f"{active} automatic resumes of this project are still running "
            f"(AUTO_RESUME_MAX_ACTIVE={settings.AUTO_RESUME_MAX_ACTIVE})"
        )
    recent = mine.filter(created_at__gte=timezone.now() - timedelta(hours=1)).count()
    if recent >= settings.AUTO_RESUME_MAX_PER_HOUR:
        return (
            f"{recent} automatic resumes of this project were launched in the last hour "
            f"(AUTO_RESUME_MAX_PER_HOUR={settings.AUTO_RESUME_MAX_PER_HOUR})"
        )
    return None
