"""The project's own settings through the API (scope admin): recovery (the Recovery tab:
storage quota, automatic resume, quarantine and restart-loop limits, GPU-hour price,
restore-test levels) and the badge key. The same actions as the dashboard
(webapp/domain/actions/project_settings.py): each field that changes is one audit
Event with the old and the new value."""

from __future__ import annotations

from typing import Any

from ninja import Router, Schema
from pydantic import Field

from webapp.api.auth import admin_auth
from webapp.api.params import Name
from webapp.api.settings_common import ChangeIn, carry_out, sent
from webapp.domain import actions
from webapp.domain.actions.project_settings import GPU_HOUR_PRICE_MAX, RESTORE_CHECK_KEYS
from webapp.domain.ingest.event_schema import INT64_MAX

router = Router(tags=["settings"])


class RecoveryOut(Schema):
    storage_quota_bytes: int | None
    # The launch profile automatic resume uses; null: off.
    auto_resume_profile: str | None
    max_restarts: int
    quarantine_after: int
    loop_after: int
    gpu_hour_price: float | None
    restore_checks: dict[str, Any]


def _recovery(project) -> dict:
    profile = project.auto_resume_profile
    return {
        "storage_quota_bytes": project.storage_quota_bytes,
        "auto_resume_profile": profile.name if profile else None,
        "max_restarts": project.max_restarts,
        "quarantine_after": project.quarantine_after,
        "loop_after": project.loop_after,
        "gpu_hour_price": project.gpu_hour_price,
        "restore_checks": project.restore_checks or {},
    }


class RecoveryIn(ChangeIn):
    storage_quota_bytes: int | None = Field(None, ge=0, le=INT64_MAX)
    auto_resume_profile: Name | None = None
    max_restarts: int = Field(None, ge=0, le=100)
    quarantine_after: int = Field(None, ge=1, le=100)
    loop_after: int = Field(None, ge=1, le=100)
    gpu_hour_price: float | None = Field(None, ge=0, le=GPU_HOUR_PRICE_MAX, allow_inf_nan=False)
    # {"forward": "pkg.mod:fn", "replay": ..., "replay_steps", "replay_rtol",
    # "replay_metric", "file", "reshard": [2, 4]} (docs/restore.md); {} for none.
    restore_checks: dict[str, Any] = Field(None, max_length=len(RESTORE_CHECK_KEYS))


@router.get("/settings/recovery", auth=admin_auth, response={200: RecoveryOut})
def recovery(request):
    return _recovery(request.auth.project)


@router.patch("/settings/recovery", auth=admin_auth, response={200: RecoveryOut})
def update_recovery(request, body: RecoveryIn):
    """Change the fields sent; each that changes is audited (project.<field>_changed)."""
    project = request.auth.project
    carry_out(request, lambda c: actions.update_recovery(c, **sent(body)))
    project.refresh_from_db()
    return _recovery(project)


class BadgeKeyOut(Schema):
    # Badge URLs carry it: /badge/<key>/... (docs/api.md, "Status badges").
    badge_key: str


@router.post("/settings/badge-key", auth=admin_auth, response={200: BadgeKeyOut})
def regenerate_badge_key(request):
    """A new badge key: every badge URL given out so far answers 404."""
    return {"badge_key": carry_out(request, actions.regenerate_badge_key)}
