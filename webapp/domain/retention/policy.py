"""Retention: which checkpoints a project keeps, and deleting the others safely.

The rules of a RetentionPolicy are a union, as in Determined's checkpoint GC: a
checkpoint stays if any rule keeps it. Always kept, whatever the policy: pinned
checkpoints, the checkpoints a run was resumed from, and each run's latest verified.
Rules that rank (last N, best K) rank a run's verified checkpoints; a checkpoint that is
not verified (still being checked, suspicious, corrupt) is never deleted by a policy.

- Local copies (where the job wrote them) are deleted only when a verified replica
  exists, so every deletion leaves a restorable copy; a checkpoint is recorded `deleted`
  only once its files are gone (webapp/domain/retention/local_deletion.py).
- Replicas follow their own policy; a replica's objects are content-addressed and shared,
  so an object goes only when no other live replica in the same store names it.

`plan` is the dry run: every decision with its reasons. `apply` carries them out, each
after re-checking the facts it rests on under a row lock; deletions are idempotent,
tolerate files and objects already gone, and are recorded in the event log.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, Replica, Run
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.models.retention import RetentionScope
from webapp.domain.retention import local_deletion, replica_objects

log = logging.getLogger(__name__)


@dataclass
class Decision:
    scope: str  # "local" or "replicas"
    run: str
    step: int
    checkpoint_id: int
    delete: bool
    reasons: list[str] = field(default_factory=list)
    replica_id: int | None = None
    target: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        what = "local copy" if self.scope == "local" else f"replica on {self.target}"
        verb = "DELETE" if self.delete else "keep  "
        return f"{verb} {self.run} step {self.step} {what}: {'; '.join(self.reasons)}"


def _metric(checkpoint, name: str) -> float | None:
    value = (checkpoint.metrics or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def keep_reasons(policy, ranked: list, always: dict[int, list[str]]) -> dict[int, list[str]]:
    """Why each of `ranked` (one run's checkpoints, any order) is kept; absent: not kept."""
    reasons: dict[int, list[str]] = defaultdict(list)
    for checkpoint_id, why in always.items():
        reasons[checkpoint_id] += why
    by_step = sorted(ranked, key=lambda c: c.step, reverse=True)
    if policy.keep_last:
        for checkpoint in by_step[: policy.keep_last]:
            reasons[checkpoint.pk].append(f"one of the last {policy.keep_last}")
    if policy.keep_best and policy.metric:
        scored = [(v, c) for c in by_step if (v := _metric(c, policy.metric)) is not None]
        scored.sort(key=lambda vc: vc[0], reverse=policy.mode == "max")
        for value, checkpoint in scored[: policy.keep_best]:
            reasons[checkpoint.pk].append(
                f"one of the best {policy.keep_best} by {policy.metric} ({value:g})"
            )
    if policy.keep_every_n_steps:
        for checkpoint in by_step:
            if checkpoint.step % policy.keep_every_n_steps == 0:
                reasons[checkpoint.pk].append(f"step is a multiple of {policy.keep_every_n_steps}")
    return reasons


def _always_kept(run, checkpoints: list) -> dict[int, list[str]]:
    always: dict[int, list[str]] = defaultdict(list)
    ids = [c.pk for c in checkpoints]
    for checkpoint in checkpoints:
        if checkpoint.pinned:
            always[checkpoint.pk].append("pinned")
    for checkpoint_id in Run.objects.filter(resumed_from_id__in=ids).values_list(
        "resumed_from_id", flat=True
    ):
        if "a run was resumed from it" not in always[checkpoint_id]:
            always[checkpoint_id].append("a run was resumed from it")
    latest = run.checkpoints.filter(status=CheckpointStatus.VERIFIED).order_by("-step").first()
    if latest is not None:
        always[latest.pk].append("latest verified")
    return always


def _policy(project, scope: str):
    return project.retention_policies.filter(applies_to=scope, enabled=True).first()


def plan(project, scope: str = "local", run=None) -> list[Decision]:
    """What retention would do now, checkpoint by checkpoint, and why."""

    policy = _policy(project, scope)
    if policy is None:
        return []
    runs = [run] if run is not None else list(project.runs.order_by("key"))
    planner = _plan_local if scope == RetentionScope.LOCAL else _plan_replicas
    decisions = []
    for one in runs:
        decisions += planner(policy, one)
    return decisions


# A dry run shows at most this many decisions of each scope at once (the API pages on with
# `offset`; the command says how many more there are): a project with 100,000
# checkpoints must not answer with 100,000 lines.
DRY_RUN_LIMIT = 200
DRY_RUN_MAX_LIMIT = 1000


def page(decisions: list[Decision], offset: int = 0, limit: int = DRY_RUN_LIMIT) -> dict:
    """One page of a dry run, with the counts of the whole plan."""
    return {
        "total": len(decisions),
        "deleting": sum(d.delete for d in decisions),
        "decisions": decisions[offset : offset + limit],
    }


def dry_run_page(project, run=None, offset: int = 0, limit: int = DRY_RUN_LIMIT) -> dict:
    """What the API answers: `limit` (at most DRY_RUN_MAX_LIMIT) decisions of each scope
    from `offset` on, the totals of the whole plan, and the next page's offset."""
    limit = max(1, min(limit, DRY_RUN_MAX_LIMIT))
    offset = max(0, offset)
    body: dict = {"offset": offset, "limit": limit}
    for scope in ("local", "replicas"):
        shown = page(plan(project, scope, run), offset, limit)
        body[scope] = [d.as_dict() for d in shown["decisions"]]
        body[f"{scope}_total"], body[f"{scope}_deleting"] = shown["total"], shown["deleting"]
    more = max(body["local_total"], body["replicas_total"]) > offset + limit
    body["next_offset"] = offset + limit if more else None
    return body


def _plan_local(policy, run) -> list[Decision]:
    checkpoints = list(
        run.checkpoints.exclude(
            status__in=(
                CheckpointStatus.DELETED,
                CheckpointStatus.DELETING,
                CheckpointStatus.SAVING,
                CheckpointStatus.FAILED,
                CheckpointStatus.INCOMPLETE,
            )
        ).order_by("step")
    )
    verified = [c for c in checkpoints if c.status == CheckpointStatus.VERIFIED]
    reasons = keep_reasons(policy, verified, _always_kept(run, checkpoints))
    copies: dict[int, list[str]] = defaultdict(list)
    for checkpoint_id, target in Replica.objects.filter(
        checkpoint__run=run, status=ReplicaStatus.VERIFIED
    ).values_list("checkpoint_id", "target__name"):
        copies[checkpoint_id].append(target)
    decisions = []
    for checkpoint in checkpoints:
        decision = Decision("local", run.key, checkpoint.step, checkpoint.pk, delete=False)
        if checkpoint.status != CheckpointStatus.VERIFIED:
            decision.reasons = [f"{checkpoint.status}, not verified: never deleted by a policy"]
        elif reasons.get(checkpoint.pk):
            decision.reasons = reasons[checkpoint.pk]
        elif not copies.get(checkpoint.pk):
            decision.reasons = ["no rule keeps it, but it has no verified replica yet"]
        else:
            decision.delete = True
            decision.reasons = [
                "no rule keeps it",
                f"verified replica on {', '.join(sorted(copies[checkpoint.pk]))}",
            ]
        decisions.append(decision)
    return decisions


def _plan_replicas(policy, run) -> list[Decision]:
    replicas = list(
        Replica.objects.filter(checkpoint__run=run, status=ReplicaStatus.VERIFIED)
        .select_related("checkpoint", "target")
        .order_by("checkpoint__step", "target__name")
    )
    checkpoints = list({r.checkpoint_id: r.checkpoint for r in replicas}.values())
    reasons = keep_reasons(policy, checkpoints, _always_kept(run, checkpoints))
    decisions = []
    for replica in replicas:
        checkpoint = replica.checkpoint
        kept = reasons.get(checkpoint.pk)
        decisions.append(
            Decision(
                "replicas",
                run.key,
                checkpoint.step,
                checkpoint.pk,
                delete=not kept,
                reasons=kept or ["no rule keeps it"],
                replica_id=replica.pk,
                target=replica.target.name,
            )
        )
    return decisions


# --- carrying it out -------------------------------------------------------------------


def apply(project, actor: str = "retention", run=None) -> list[Decision]:
    """Carry out the plan for local copies, then for replicas. Returns the decisions
    that were carried out (each re-checked first; one that no longer holds is skipped)."""
    done = []
    finish_interrupted(project, actor)
    for decision in plan(project, "local", run):
        if decision.delete and delete_local(decision, actor):
            done.append(decision)
    for decision in plan(project, "replicas", run):
        if decision.delete and delete_replica(decision, actor):
            done.append(decision)
    return done


def _still_deletable_locally(checkpoint) -> str | None:
    """Re-checked under the row lock: None if the local copy may go, else why not."""

    if checkpoint.status != CheckpointStatus.VERIFIED:
        return f"it is {checkpoint.status} now"
    if checkpoint.pinned:
        return "it was pinned"
    if Run.objects.filter(resumed_from=checkpoint).exists():
        return "a run was resumed from it"
    latest = checkpoint.run.latest_verified_checkpoint()
    if latest is not None and latest.pk == checkpoint.pk:
        return "it is the latest verified"
    if not checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED).exists():
        return "it has no verified replica"
    return None


def delete_local(decision: Decision, actor: str) -> bool:
    """Re-checks the decision under the row lock and marks the checkpoint `deleting`;
    then removes its files, and only then records it `deleted` (local_deletion). A
    failure puts it back to `verified` with the error in the event log. True when the
    local copy is gone."""

    with transaction.atomic():
        checkpoint = (
            for_update(Checkpoint.objects.select_related("run", "project"))
            .filter(pk=decision.checkpoint_id)
            .first()
        )
        if checkpoint is None:
            return False
        why_not = _still_deletable_locally(checkpoint)
        if why_not:
            log.info("retention: keeping %s, since %s", checkpoint, why_not)
            return False
        previous_message = checkpoint.status_message
        checkpoint.status = CheckpointStatus.DELETING
        checkpoint.updated_at = timezone.now()
        checkpoint.save(update_fields=["status", "updated_at"])
    # No disk work inside a transaction: a worker killed from here on leaves the
    # checkpoint `deleting`, which the next apply finishes (finish_interrupted).
    return local_deletion.carry_out(
        checkpoint.pk, actor, "; ".join(decision.reasons), previous_message
    )


def finish_interrupted(project, actor: str = "retention", before=None) -> None:
    """Deletions started but not finished (the worker died between the steps); with
    `before`, only those started before then (the sweeper's: not one a live worker is
    carrying out)."""

    local_deletion.finish_interrupted(project, actor, before)
    replicas = Replica.objects.filter(
        target__project=project, status=ReplicaStatus.DELETED, deleted_at__isnull=True
    )
    if before is not None:
        replicas = replicas.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=before))
    for replica in replicas.select_related("target", "checkpoint__run"):
        try:
            replica_objects.finish(replica, actor)
        except Exception:  # noqa: BLE001 (logged; tried again by the next run)
            log.exception("retention: removing the objects of replica %s failed", replica.pk)


def delete_replica(decision: Decision, actor: str) -> bool:
    now = timezone.now()
    with transaction.atomic():
        replica = (
            for_update(Replica.objects.select_related("checkpoint__run", "target"))
            .filter(pk=decision.replica_id)
            .first()
        )
        if replica is None or replica.status != ReplicaStatus.VERIFIED:
            return False
        checkpoint = replica.checkpoint
        always = _always_kept(checkpoint.run, [checkpoint])
        if always.get(checkpoint.pk):
            return False
        replica.status = ReplicaStatus.DELETED
        # Until then its objects are being removed; a lapse means the worker died
        # (the sweeper finishes it: webapp/domain/retention/owed.py).
        replica.lease_until = now + timedelta(seconds=settings.SWEEP_STUCK_S)
        replica.save(update_fields=["status", "lease_until"])
        Event.record(
            "replica.deleted",
            checkpoint=checkpoint,
            time=now,
            actor=actor,
            message=(
                f"Replica on {replica.target.name} deleted by the retention policy "
                f"({'; '.join(decision.reasons)})."
            ),
            data={"scope": "replicas", "replica": replica.pk, "target": replica.target.name},
        )
    # deleted_at is written once the store lists nothing of it (replica_objects.py).
    replica_objects.finish(replica, actor)
    return True
