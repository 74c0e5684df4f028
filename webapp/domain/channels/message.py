"""What an alert says, whatever carries it: the links, the severity and the facts every
kind renders in its own shape."""

from __future__ import annotations

from django.conf import settings

SEVERITY_ICON = {
    "run.overdue": "🔴",
    "run.failed": "🔴",
    "checkpoint.corrupt": "🔴",
    "checkpoint.missing": "🔴",
    "replica.failed": "🔴",
    "restore.failed": "🔴",
    "checkpoint.suspicious": "🟠",
    "save.slow": "🟠",
    "storage.over_quota": "🟠",
    "checkpoint.incomplete": "🔴",
    "host.no_worker": "🔴",
    "checkpoint.quarantined": "🔴",
    "run.restart_loop": "🔴",
    "storage.delete_unconfirmed": "🟠",
    "storage.orphans": "🟠",
    "run.up": "🟢",
}

# The flips whose run the page offers to resume (dashboard recovery_views.recovery_offer).
RECOVERABLE = ("run.failed", "run.overdue")

RESUME_LABEL = "Resume from the latest verified checkpoint"


def url(flip) -> str:
    """The page that shows what the flip is about: its checkpoint, its run, or the project."""
    base = settings.SITE_URL.rstrip("/")
    if flip.checkpoint_id:
        return f"{base}/p/{flip.project.slug}/checkpoints/{flip.checkpoint_id}/"
    link = f"{base}/p/{flip.project.slug}/"
    if flip.run_id:
        link += f"runs/{flip.run.key}/"
    return link


def resume_url(flip) -> str | None:
    """Recovery where the trouble shows: the run page's "Resume from the latest verified
    checkpoint" (templates/dashboard/run_detail.html, #recover), for a failed or overdue
    run; None for every other kind."""
    if flip.kind in RECOVERABLE and flip.run_id:
        return f"{url(flip)}#recover"
    return None


def facts(flip) -> dict:
    """The flip as data: what the webhook's `lifeboat` object and the JSON kind's `data`
    carry."""
    return {
        "kind": flip.kind,
        "project": flip.project.slug,
        "run": flip.run.key if flip.run_id else None,
        "checkpoint": flip.checkpoint_id,
        "message": flip.message,
        "url": url(flip),
        "resume_url": resume_url(flip),
        "time": flip.created_at.isoformat(),
        "data": flip.data,
    }
