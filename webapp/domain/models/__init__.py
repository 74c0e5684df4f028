"""The domain of docs/design.md: projects and their access, runs, checkpoints and what
happened to them."""

from webapp.domain.models.alerts import AlertChannel, Flip, Notification
from webapp.domain.models.checkpoints import (
    Checkpoint,
    CheckpointFile,
    CheckpointPart,
    MetricPoint,
)
from webapp.domain.models.events import Event
from webapp.domain.models.goodput import RunGoodput
from webapp.domain.models.projects import (
    ApiToken,
    LaunchProfile,
    Membership,
    Project,
    StorageTarget,
)
from webapp.domain.models.recovery import (
    Replica,
    Resume,
    SavedChunks,
    Validation,
    ValidationPart,
)
from webapp.domain.models.retention import RetentionPolicy
from webapp.domain.models.runs import Run, RunStats
from webapp.domain.models.storage_audit import StorageAudit
from webapp.domain.models.storage_ledger import StorageSnapshot

__all__ = [
    "AlertChannel",
    "ApiToken",
    "Checkpoint",
    "CheckpointFile",
    "CheckpointPart",
    "Event",
    "Flip",
    "LaunchProfile",
    "Membership",
    "MetricPoint",
    "Notification",
    "Project",
    "Replica",
    "Resume",
    "RetentionPolicy",
    "Run",
    "RunGoodput",
    "RunStats",
    "SavedChunks",
    "StorageAudit",
    "StorageSnapshot",
    "StorageTarget",
    "Validation",
    "ValidationPart",
]
