"""The storage ledger and the storage audit in the API.

The ledger (scope read): what the project's checkpoints take on each target and locally,
what it costs, what retention freed and would free (webapp/domain/replication/ledger.py).
The audit (webapp/domain/retention/orphans.py): each target's newest audit (scope read),
one audit with what it found, and the two actions the dashboard offers (scope operate, as
POST /retention/apply, which deletes too): audit a target now, and clean what the newest
audit found, through webapp.domain.actions as the dashboard's buttons."""

from __future__ import annotations

from datetime import datetime

from ninja import Router, Schema, Status

from webapp.api.auth import operate_auth, read_auth
from webapp.api.errors import ApiError, ErrorOut
from webapp.api.lookups import run_in_project
from webapp.api.params import AuditId, Limit, Name, RunKeyQuery
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.models import StorageAudit, StorageTarget
from webapp.domain.replication import ledger

router = Router(tags=["storage"])


class OrphanOut(Schema):
    key: str
    bytes: int
    modified: str


class UploadOut(Schema):
    key: str
    upload_id: str
    initiated: str
    bytes: int


class AuditOut(Schema):
    id: int
    target: str
    status: str
    error: str
    actor: str
    started_at: datetime
    finished_at: datetime | None
    listed_objects: int
    listed_bytes: int
    accounted_objects: int
    accounted_bytes: int
    recent_objects: int
    orphan_objects: int
    orphan_bytes: int
    upload_bytes: int
    unaccounted_bytes: int
    cleaned_at: datetime | None
    cleaned_by: str
    cleaned_objects: int
    cleaned_bytes: int
    cleaned_uploads: int

    @staticmethod
    def resolve_target(obj) -> str:
        return obj.target.name


class AuditDetailOut(AuditOut):
    # The largest first, at most 1,000; orphan_objects counts them all.
    orphans: list[OrphanOut]
    uploads: list[UploadOut]


class TargetAuditOut(Schema):
    target: str
    audit: AuditOut | None


class QueuedOut(Schema):
    message: str


def _audit(request, audit_id: AuditId) -> StorageAudit:
    row = (
        StorageAudit.objects.select_related("target")
        .filter(target__project=request.auth.project, pk=audit_id)
        .first()
    )
    if row is None:
        raise ApiError(404, f"no storage audit {audit_id} in this project")
    return row


@router.get("/storage/audits", auth=read_auth, response={200: list[TargetAuditOut]})
def list_audits(request):
    """Each storage target of the project with its newest audit (None: never audited)."""
    found = []
    for target in StorageTarget.objects.filter(project=request.auth.project).order_by("name"):
        newest = target.audits.order_by("-started_at").first()
        found.append({"target": target.name, "audit": newest})
    return found


@router.get(
    "/storage/audits/{audit_id}",
    auth=read_auth,
    response={200: AuditDetailOut, 404: ErrorOut},
)
def get_audit(request, audit_id: AuditId):
    """One audit, with the objects and unfinished uploads no record accounts for."""
    return _audit(request, audit_id)


class AuditIn(Schema):
    target: Name


@router.post("/storage/audits", auth=operate_auth, response={202: QueuedOut, 404: ErrorOut})
def audit_target(request, body: AuditIn):
    """List the target now (on a replicate worker); GET /storage/audits shows the result."""
    target = StorageTarget.objects.filter(project=request.auth.project, name=body.target).first()
    if target is None:
        raise ApiError(404, f"no storage target {body.target!r} in this project")
    actions.audit_storage(target, request.auth.actor)
    return Status(202, {"message": f"storage target {target.name} is being audited"})


@router.post(
    "/storage/audits/{audit_id}/clean",
    auth=operate_auth,
    response={202: QueuedOut, 404: ErrorOut, 409: ErrorOut},
)
def clean_audit(request, audit_id: AuditId):
    """Delete what the newest audit of a target found, each object checked again first;
    a `storage.cleaned` event says what went."""
    try:
        actions.clean_storage(_audit(request, audit_id), request.auth.actor)
    except ActionRefused as exc:
        raise ApiError(409, str(exc)) from None
    return Status(202, {"message": f"the findings of audit {audit_id} are being cleaned"})


class ReplicaTotalsOut(Schema):
    copies: int
    stored_bytes: int
    stored_objects: int
    logical_bytes: int
    saved_bytes: int
    would_free_bytes: int
    freed_bytes: int
    freed_bytes_30d: int
    monthly_cost: float | None


class TargetLedgerOut(ReplicaTotalsOut):
    target: str
    bucket: str
    prefix: str
    gb_month_price: float | None


class LocalLedgerOut(Schema):
    stored_bytes: int
    stored_files: int
    would_free_bytes: int
    freed_bytes: int
    freed_bytes_30d: int


class RunStoredOut(Schema):
    run: str
    stored_bytes: int


class CheckpointStoredOut(Schema):
    target: str
    step: int
    checkpoint: int
    logical_bytes: int
    # What it added, as of the ledger's last pass; None for a copy made since.
    added_bytes: int | None


class LedgerOut(Schema):
    taken_at: datetime
    targets: list[TargetLedgerOut]
    replicas: ReplicaTotalsOut
    local: LocalLedgerOut
    runs: list[RunStoredOut]
    runs_total: int
    # With ?run=: that run's checkpoints, what each added on each target.
    checkpoints: list[CheckpointStoredOut] | None = None


@router.get("/storage", auth=read_auth, response={200: LedgerOut, 404: ErrorOut})
def storage_ledger(request, run: RunKeyQuery = None, limit: Limit = 20):
    """The project's storage ledger as of the workers' newest pass (`taken_at`; every
    STORAGE_LEDGER_S): each target (each object counted once, `logical_bytes` each copy
    whole), the local copies, the `limit` runs that store most; with `run`, what each of
    its checkpoints added, as of the same pass (None for a copy made since)."""
    project = request.auth.project
    answer = ledger.latest(project, runs_limit=limit)
    if run is not None:
        answer["checkpoints"] = ledger.run_checkpoints(project, run_in_project(request, run))
    return answer
