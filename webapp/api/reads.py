"""Reads of runs, checkpoints, resumes and retention (scope read): reads only; every
action (scope operate) is in actions.py.

Every query starts from request.auth.project: a run key or checkpoint id of another
project is simply not found."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.urls import reverse
from ninja import Router, Schema

from webapp.api.auth import read_auth
from webapp.api.errors import ApiError, ErrorOut, error_response
from webapp.api.lookups import checkpoint_in_project as _checkpoint
from webapp.api.lookups import resume_in_project
from webapp.api.lookups import run_in_project as _run
from webapp.api.params import (
    BeforeStep,
    CheckpointId,
    CheckpointQuery,
    CheckpointStatusFilter,
    HealthFilter,
    Limit,
    MtbfHours,
    Offset,
    ResumeId,
    RunKeyPath,
    RunKeyQuery,
    RunStatusFilter,
)
from webapp.domain.health import analytics, goodput, run_health
from webapp.domain.models import Checkpoint, Run
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.recovery.resume import output_tail
from webapp.domain.replication.restore import replica_files
from webapp.domain.retention import policy as retention

router = Router(tags=["runs and checkpoints"])

# The status line's reason is what urllib (a client's download) puts in its error.
CUT_REASON = "Gone: this file is stored in pieces; upgrade the lifeboat client to fetch it"


class RunOut(Schema):
    key: str
    name: str
    status: str
    host: str
    framework: str
    world_size: int | None
    config: dict[str, Any]
    tags: list[str]
    expected_interval_s: float | None
    resumed_from: int | None
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    error: str
    last_seen_at: datetime | None
    last_heartbeat_at: datetime | None
    last_step: int | None
    last_metrics: dict[str, Any]
    # up / late / overdue against expected_interval_s; not_watched when the run ended or
    # has no interval (webapp/domain/health/run_health.py, the dashboard's rule).
    health: Literal["up", "late", "overdue", "not_watched"]
    # When it turns late (while up) or overdue (while late); null otherwise.
    next_deadline: datetime | None

    @staticmethod
    def resolve_resumed_from(run: Run) -> int | None:
        return run.resumed_from_id

    @staticmethod
    def resolve_health(run: Run) -> str:
        return run_health.of(run).api_state

    @staticmethod
    def resolve_next_deadline(run: Run) -> datetime | None:
        return run_health.of(run).next_deadline


class FileOut(Schema):
    path: str
    size: int
    sha256: str
    rank: int | None  # the rank whose part reported it; None: reported whole


class PartOut(Schema):
    """One rank's part of a checkpoint written by many ranks."""

    rank: int
    host: str
    file_count: int
    total_size: int
    saved_at: datetime


class ReplicaPieceOut(Schema):
    url: str
    size: int
    sha256: str


class ReplicaFileOut(Schema):
    path: str
    size: int
    sha256: str
    # For a file cut at tensor boundaries, its bytes are at its `pieces`' URLs and `url`
    # answers 410 with the reason (`cut_file` below), which a client from before pieces
    # reports as a failed download instead of crashing on a missing URL.
    url: str | None = None
    # A small file sent in a pack (docs/replication.md): its `size` bytes from here on in
    # the object at `url`; absent for a file stored alone.
    offset: int | None = None
    # A large file cut at tensor boundaries (docs/replication.md): its bytes are the
    # pieces' one after the other, each an object of its own; absent otherwise.
    pieces: list[ReplicaPieceOut] | None = None


class ReplicaOut(Schema):
    """A copy on a storage target. Its credentials are never part of it. A verified
    replica lists its files with presigned GET URLs (REPLICATION_URL_EXPIRES_S, 1 h), so
    a client can fetch them with a plain HTTP client and check each sha256."""

    id: int
    target: str
    bucket: str
    prefix: str
    endpoint_url: str
    status: str
    bytes_total: int
    bytes_done: int
    attempts: int
    last_error: str
    manifest_key: str
    verified_at: datetime | None
    progress: dict[str, Any]
    files: list[ReplicaFileOut] | None

    @staticmethod
    def resolve_progress(replica) -> dict:
        return replica.progress()

    @staticmethod
    def resolve_files(replica, context):
        if replica.status != ReplicaStatus.VERIFIED:
            return None
        files = replica_files(replica)
        if any("pieces" in one for one in files):
            cut = context["request"].build_absolute_uri(reverse("api:cut_file"))
            for one in files:
                if "pieces" in one:
                    one["url"] = cut
        return files

    @staticmethod
    def resolve_target(replica) -> str:
        return replica.target.name

    @staticmethod
    def resolve_bucket(replica) -> str:
        return replica.target.bucket

    @staticmethod
    def resolve_prefix(replica) -> str:
        return replica.target.prefix

    @staticmethod
    def resolve_endpoint_url(replica) -> str:
        return replica.target.endpoint_url


class ValidationOut(Schema):
    id: int
    kind: str
    status: str
    device: str
    message: str
    findings: list[Any]
    timings: dict[str, Any]
    progress: dict[str, Any]
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @staticmethod
    def resolve_progress(validation) -> dict:
        return validation.progress()


class CheckpointOut(Schema):
    id: int
    run: str
    step: int
    epoch: int | None
    saved_at: datetime | None
    location: str
    format: str
    total_size: int
    file_count: int
    save_seconds: float | None
    metrics: dict[str, Any]
    status: str
    status_message: str
    pinned: bool
    verified_at: datetime | None
    # Ranks that each report their part; None when one process reported it whole.
    world_size: int | None
    # Set aside: resumes from it failed before any progress, or it did not load in a
    # restore test (docs/restore.md, "Quarantine").
    quarantined_at: datetime | None
    quarantine_reason: str

    @staticmethod
    def resolve_run(checkpoint: Checkpoint) -> str:
        return checkpoint.run.key


class CheckpointDetailOut(CheckpointOut):
    content: dict[str, Any]
    files: list[FileOut]
    parts: list[PartOut]
    replicas: list[ReplicaOut]
    validations: list[ValidationOut]

    @staticmethod
    def resolve_files(checkpoint: Checkpoint):
        return list(checkpoint.files.order_by("path"))

    @staticmethod
    def resolve_parts(checkpoint: Checkpoint):
        return list(checkpoint.parts.order_by("rank"))

    @staticmethod
    def resolve_replicas(checkpoint: Checkpoint):
        return list(checkpoint.replicas.select_related("target").exclude(status="deleted"))

    @staticmethod
    def resolve_validations(checkpoint: Checkpoint):
        return list(checkpoint.validations.order_by("-created_at")[:20])


class PassedOverOut(Schema):
    id: int
    step: int
    quarantine_reason: str


class LatestOut(CheckpointDetailOut):
    """The newest verified checkpoint and its verified replicas: what a restarting job
    asks for; with the newer verified ones it passed over because they are quarantined."""

    passed_over: list[PassedOverOut]

    @staticmethod
    def resolve_passed_over(checkpoint: Checkpoint):
        return list(
            checkpoint.run.checkpoints.filter(
                status=CheckpointStatus.VERIFIED,
                quarantined_at__isnull=False,
                step__gt=checkpoint.step,
            ).order_by("-step")[:20]
        )

    @staticmethod
    def resolve_replicas(checkpoint: Checkpoint):
        return list(
            checkpoint.replicas.select_related("target").filter(status=ReplicaStatus.VERIFIED)
        )


class RunPage(Schema):
    runs: list[RunOut]
    next_offset: int | None


class CheckpointPage(Schema):
    checkpoints: list[CheckpointOut]
    next_before_step: int | None


@router.get("/runs", auth=read_auth, response={200: RunPage})
def list_runs(
    request,
    status: RunStatusFilter = None,
    health: HealthFilter = None,
    limit: Limit = 100,
    offset: Offset = 0,
):
    """Runs of the project, most recently active first; filter by status or health."""
    runs = Run.objects.filter(project=request.auth.project).with_health()
    if status:
        runs = runs.filter(status=status)
    if health:
        runs = runs.filter(run_health.api_filter(health))
    page = list(runs.order_by("-last_seen_at", "-id")[offset : offset + limit + 1])
    more = len(page) > limit
    return {"runs": page[:limit], "next_offset": offset + limit if more else None}


# Routes with a suffix come before the bare run route: run keys may contain "/".
@router.get(
    "/runs/{path:key}/checkpoints", auth=read_auth, response={200: CheckpointPage, 404: ErrorOut}
)
def list_checkpoints(
    request,
    key: RunKeyPath,
    status: CheckpointStatusFilter = None,
    limit: Limit = 100,
    before_step: BeforeStep = None,
):
    """Checkpoints of a run, newest step first; filter by status, page with before_step."""
    run = _run(request, key)
    checkpoints = run.checkpoints.select_related("run")
    if status:
        checkpoints = checkpoints.filter(status=status)
    if before_step is not None:
        checkpoints = checkpoints.filter(step__lt=before_step)
    page = list(checkpoints.order_by("-step")[: limit + 1])
    more = len(page) > limit
    return {
        "checkpoints": page[:limit],
        "next_before_step": page[limit - 1].step if more else None,
    }


@router.get("/runs/{path:key}/latest", auth=read_auth, response={200: LatestOut, 404: ErrorOut})
def latest_checkpoint(request, key: RunKeyPath, checkpoint: CheckpointQuery = None):
    """The newest verified checkpoint of a run, with its verified replicas; with
    `checkpoint=<id>`, that one, if it is a verified checkpoint of this run: the ranks of
    a job on many hosts restore the one checkpoint rank 0 chose, even if a newer one is
    verified meanwhile."""
    run = _run(request, key)
    if checkpoint is not None:
        chosen = run.checkpoints.filter(pk=checkpoint, status=CheckpointStatus.VERIFIED).first()
        if chosen is None:
            raise ApiError(404, f"run {key!r} has no verified checkpoint {checkpoint}")
        return chosen
    latest = run.latest_verified_checkpoint()
    if latest is None:
        raise ApiError(404, f"run {key!r} has no verified checkpoint yet")
    return latest


@router.get(
    "/runs/{path:key}/analytics", auth=read_auth, response={200: dict[str, Any], 404: ErrorOut}
)
def run_analytics(request, key: RunKeyPath, mtbf_hours: MtbfHours = None):
    """What checkpointing costs this run, and the Young and Daly intervals for its
    checkpoint time and the project's mean time between failures (docs/analytics.md)."""

    mtbf = mtbf_hours * 3600 if mtbf_hours is not None else None
    return analytics.for_run(_run(request, key), mtbf_seconds=mtbf).as_dict()


@router.get(
    "/runs/{path:key}/goodput", auth=read_auth, response={200: dict[str, Any], 404: ErrorOut}
)
def run_goodput(request, key: RunKeyPath, mtbf_hours: MtbfHours = None):
    """How much of this run's training (the run and the runs resumed from it, and theirs)
    became kept progress, where the rest went, and what Daly's interval would change
    (docs/analytics.md, "Goodput")."""

    run = _run(request, key)
    measured = goodput.for_run(run)
    mtbf = mtbf_hours * 3600 if mtbf_hours is not None else None
    return {
        **measured.as_dict(run.project.gpu_hour_price),
        "what_if": analytics.what_if(run, measured.wall_seconds, mtbf),
    }


@router.get("/runs/{path:key}", auth=read_auth, response={200: RunOut, 404: ErrorOut})
def get_run(request, key: RunKeyPath):
    return _run(request, key)


@router.get(
    "/checkpoints/{checkpoint_id}",
    auth=read_auth,
    response={200: CheckpointDetailOut, 404: ErrorOut},
)
def get_checkpoint(request, checkpoint_id: CheckpointId):
    return _checkpoint(request, checkpoint_id)


class ResumeOut(Schema):
    id: int
    run: str
    checkpoint: int
    profile: str | None
    status: str
    command: str
    external_id: str
    error: str
    new_run: str | None
    automatic: bool
    world_size: int | None
    created_at: datetime
    updated_at: datetime
    output: str

    @staticmethod
    def resolve_run(resume) -> str:
        return resume.run.key

    @staticmethod
    def resolve_checkpoint(resume) -> int:
        return resume.checkpoint_id

    @staticmethod
    def resolve_profile(resume) -> str | None:
        return resume.profile.name if resume.profile_id else None

    @staticmethod
    def resolve_new_run(resume) -> str | None:
        return resume.new_run.key if resume.new_run_id else None

    @staticmethod
    def resolve_output(resume, context) -> str:
        # output_tail is redacted, and shown to operate-scope tokens only
        auth = getattr((context or {}).get("request"), "auth", None)
        return output_tail(resume) if auth is not None and auth.allows("operate") else ""


@router.get("/resumes/{resume_id}", auth=read_auth, response={200: ResumeOut, 404: ErrorOut})
def get_resume(request, resume_id: ResumeId):
    return resume_in_project(request, resume_id)


class RetentionDecisionOut(Schema):
    scope: str
    run: str
    step: int
    checkpoint_id: int
    delete: bool
    reasons: list[str]
    replica_id: int | None
    target: str | None


class RetentionPlanOut(Schema):
    local: list[RetentionDecisionOut]
    replicas: list[RetentionDecisionOut]
    local_total: int
    local_deleting: int
    replicas_total: int
    replicas_deleting: int
    offset: int
    limit: int
    next_offset: int | None


@router.get("/retention", auth=read_auth, response={200: RetentionPlanOut, 404: ErrorOut})
def retention_plan(request, run: RunKeyQuery = None, offset: Offset = 0, limit: Limit = 200):
    """The dry run of the project's retention policies, paged: each checkpoint (local
    copies) and replica, whether it would be deleted, and why."""

    run_row = _run(request, run) if run else None
    return retention.dry_run_page(request.auth.project, run_row, offset, limit)


@router.get("/files/cut", auth=None, include_in_schema=False, url_name="cut_file")
def cut_file(request):
    """The `url` of a file stored in pieces: its bytes are at the pieces' URLs, which a
    client from before pieces does not read. It says so, to anyone (it holds nothing)."""
    answer = error_response(
        410, "this file is stored in pieces (its `pieces` list their URLs), which this "
        "client does not read: upgrade the lifeboat client to the server's release",
    )  # fmt: skip
    answer.reason_phrase = CUT_REASON
    return answer
