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

Settings, for a project's admins (a Caller: a member with role admin, or a token with the
`admin` scope; NotAllowed otherwise), each with one audit Event (actions/admin.py):

    create_token(caller, name, scopes) -> Issued (the secret, once); revoke_token
    create_target, update_target, delete_target          (storage targets)
    create_profile, update_profile, delete_profile       (launch profiles)
    create_channel, update_channel, set_channel_enabled, delete_channel
    add_member, change_role, remove_member
    update_recovery(caller, **fields) -> fields changed; regenerate_badge_key(caller)

A refused value raises SettingInvalid (naming the field), a refusal by the project's
state SettingConflict (a name in use, the last admin, a profile history names).

The caller finds the row in its own project first (a row of another project is simply
not found); an action that cannot apply raises ActionRefused with the reason (NoSuchTarget
for replicate's unknown target)."""

from webapp.domain.actions.admin import (
    Caller,
    NotAllowed,
    NotInProject,
    SettingConflict,
    SettingInvalid,
)
from webapp.domain.actions.alert_channels import (
    create_channel,
    delete_channel,
    set_channel_enabled,
    update_channel,
)
from webapp.domain.actions.checkpoints import pin, release, replicate, restore_test, validate
from webapp.domain.actions.common import ActionRefused, NoSuchTarget, Requested
from webapp.domain.actions.launch_profiles import create_profile, delete_profile, update_profile
from webapp.domain.actions.members import add_member, change_role, remove_member
from webapp.domain.actions.project_settings import regenerate_badge_key, update_recovery
from webapp.domain.actions.resumes import cancel_resume, resume
from webapp.domain.actions.retention import apply_retention, audit_storage, clean_storage
from webapp.domain.actions.storage_targets import create_target, delete_target, update_target
from webapp.domain.actions.tokens import Issued, create_token, revoke_token

__all__ = [
    "ActionRefused",
    "Caller",
    "Issued",
    "NoSuchTarget",
    "NotAllowed",
    "NotInProject",
    "Requested",
    "SettingConflict",
    "SettingInvalid",
    "add_member",
    "change_role",
    "create_channel",
    "create_profile",
    "create_target",
    "create_token",
    "delete_channel",
    "delete_profile",
    "delete_target",
    "regenerate_badge_key",
    "remove_member",
    "revoke_token",
    "set_channel_enabled",
    "update_channel",
    "update_profile",
    "update_recovery",
    "update_target",
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
