"""Status badges, as healthchecks.io draws them: the state of a run, or the worst state
of a tag's or a project's runs, for a README or a wall screen.

A badge is served without a token at a URL that carries the project's badge_key
(Project.badge_key, 128 random bits, regenerable by an admin): whoever has the URL sees
one word and a name, nothing else. A run's or a tag's URL also carries name_key(), an
HMAC of the name under the badge key: one public badge URL does not let anyone ask
about other run or tag names (an oracle for guessed names). States, worst first:

  failed    the run failed
  overdue   no checkpoint for longer than its interval plus grace (run_health)
  late      past its interval, within the grace
  up        checkpointing on time
  running   running, but it never said (nor was learned) how often it checkpoints
  finished  it finished
  none      a tag or project with no run to count

A tag's or project's badge counts its running runs and those that ended within
BADGE_ENDED_HOURS; a failed run that was resumed (a run started from one of its
checkpoints) no longer counts: the resumed run carries on for it."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.domain.health import run_health
from webapp.domain.models import Run
from webapp.domain.models.runs import RunStatus

ORDER = ("failed", "overdue", "late", "preempted", "up", "running", "finished", "none")


def name_key(badge_key: str, kind: str, name: str) -> str:
    """16 URL-safe characters only the project's badge key makes for this run or tag."""
    mac = hmac.new(badge_key.encode(), f"{kind}\0{name}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:12]).decode()


def path(project, kind: str | None = None, name: str = "") -> str:
    """The badge's URL path without its .svg / .json: the project's, or a run's or a
    tag's (kind "run" or "tag")."""
    base = f"/badge/{project.badge_key}"
    if kind is None:
        return base
    shown = quote(name, safe="/" if kind == "run" else "")
    return f"{base}/{kind}/{name_key(project.badge_key, kind, name)}/{shown}"


# shields.io's palette, so that the badges sit well beside others in a README.
COLOURS = {
    "failed": "#e05d44",
    "overdue": "#e05d44",
    "late": "#fe7d37",
    "preempted": "#dfb317",
    "up": "#44cc11",
    "running": "#007ec6",
    "finished": "#9f9f9f",
    "none": "#9f9f9f",
}


def state_of(status: str, health: str) -> str:
    """A run's badge state from its status and its Health value."""
    if status == "failed":
        return "failed"
    if status in ("finished", "preempted"):
        return status
    return health if health in ("up", "late", "overdue") else "running"


def worst(states) -> str:
    states = list(states)
    return min(states, key=ORDER.index) if states else "none"


@dataclass
class Badge:
    label: str
    state: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def colour(self) -> str:
        return COLOURS[self.state]

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "status": self.state,
            "total": sum(self.counts.values()),
            "counts": self.counts,
        }


def for_run(run, now=None) -> Badge:
    state = state_of(run.status, run_health.of(run, now).health)
    return Badge(label=run.key, state=state, counts={state: 1})


def for_runs(project, tag: str | None = None, now=None) -> Badge:
    """The worst state among the project's counted runs (of `tag`, if given), with the
    number of runs in each state: one query, whatever the number of runs."""

    now = now or timezone.now()
    runs = Run.objects.filter(project=project)
    if tag is not None:
        runs = runs.tagged(tag)
    since = now - timedelta(hours=settings.BADGE_ENDED_HOURS)
    ended = Coalesce("ended_at", "last_seen_at", "created_at")
    resumed = Exists(Run.objects.filter(resumed_from__run=OuterRef("pk")))
    runs = (
        runs.alias(ended_or_seen=ended, was_resumed=resumed)
        .filter(Q(status=RunStatus.RUNNING) | Q(ended_or_seen__gte=since))
        .exclude(status__in=(RunStatus.FAILED, RunStatus.PREEMPTED), was_resumed=True)
        .with_health(now)
    )
    counts: dict[str, int] = {}
    for row in runs.order_by().values("status", "health").annotate(n=Count("pk")):
        state = state_of(row["status"], row["health"])
        counts[state] = counts.get(state, 0) + row["n"]
    return Badge(label=tag if tag is not None else project.name, state=worst(counts), counts=counts)


def svg_widths(label: str, state: str) -> dict:
    """Widths of the two halves, from an average glyph width of the 11 px sans-serif that
    shields.io uses (no font is fetched: the viewer's own sans-serif draws it)."""

    def width(text: str) -> int:
        return 10 + round(sum(_glyph(c) for c in text))

    left, right = width(label), width(state)
    return {"left": left, "right": right, "total": left + right}


def _glyph(char: str) -> float:
    if char in "iljI.,:;'|!":
        return 3.5
    if char in "mwMW@":
        return 10.0
    if char.isupper() or char.isdigit():
        return 7.5
    return 6.5
