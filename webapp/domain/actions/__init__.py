"""What a person asks of Lifeboat, one function per action, called by the API
(webapp/api/actions.py) and the dashboard alike, so both take the same lock, write the
same audit Event and publish the same task:

    validate(checkpoint, actor) -> Requested
    pin(checkpoint, actor, pinned=True) -> bool (changed)
    release(checkpoint, actor) -> bool (it was quarantined)
    restore_test(checkpoint, actor) -> Requested
    replicate(checkpoint, actor, target=None) -> list of replica ids queued
    resume(checkpoint, profile, actor, user=None) -> Resume
    cancel_resume(resume, actor) -> Resume
    apply_retention(project, actor) -> Event
    audit_storage(target, actor) -> Event
    clean_storage(audit, actor) -> Event

The caller finds the row in its own project first (a row of another project is simply
not found); an action that cannot apply raises ActionRefused with the reason (NoSuchTarget
for replicate's unknown target)."""

from webapp.domain.actions.checkpoints import pin, release, replicate, restore_test, validate
from webapp.domain.actions.common import ActionRefused, NoSuchTarget, Requested
from webapp.domain.actions.resumes import cancel_resume, resume
from webapp.domain.actions.retention import apply_retention, audit_storage, clean_storage

__all__ = [
    "ActionRefused",
    "NoSuchTarget",
    "Requested",
    "apply_retention",
    "audit_storage",
    "cancel_resume",
    "clean_storage",
    "pin",
    "release",
    "replicate",
    "restore_test",
    "resume",
    "validate",
]
