from django.urls import path, re_path

from webapp.dashboard import (
    alert_views,
    audit_views,
    badge_views,
    goodput_views,
    members_views,
    recovery_settings_views,
    recovery_views,
    resume_views,
    retention_views,
    run_views,
    settings_edit_views,
    settings_views,
    storage_audit_views,
    storage_views,
    views,
)

app_name = "dashboard"
urlpatterns = [
    path("", views.projects, name="projects"),
    path("p/<slug:slug>/", views.runs, name="runs"),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/", views.checkpoint_detail, name="checkpoint"
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/validate/",
        views.checkpoint_validate,
        name="checkpoint-validate",
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/pin/",
        views.checkpoint_pin,
        name="checkpoint-pin",
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/release/",
        recovery_views.checkpoint_release,
        name="checkpoint-release",
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/replicate/",
        views.checkpoint_replicate,
        name="checkpoint-replicate",
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/restore-test/",
        recovery_views.checkpoint_restore_test,
        name="checkpoint-restore-test",
    ),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/resume/",
        recovery_views.checkpoint_resume,
        name="checkpoint-resume",
    ),
    path(
        "p/<slug:slug>/retention/apply/",
        retention_views.retention_apply,
        name="retention-apply",
    ),
    path("p/<slug:slug>/badges/", badge_views.badges_page, name="badges"),
    path("p/<slug:slug>/goodput/", goodput_views.goodput_page, name="goodput"),
    path("p/<slug:slug>/storage/", storage_views.storage_page, name="storage"),
    path(
        "p/<slug:slug>/badges/regenerate/",
        badge_views.badges_regenerate,
        name="badges-regenerate",
    ),
    path("p/<slug:slug>/settings/tokens/", settings_views.tokens, name="settings-tokens"),
    path(
        "p/<slug:slug>/settings/tokens/<int:token_id>/revoke/",
        settings_views.token_revoke,
        name="settings-token-revoke",
    ),
    path(
        "p/<slug:slug>/settings/storage/", settings_views.storage_targets, name="settings-storage"
    ),
    path(
        "p/<slug:slug>/settings/launch-profiles/",
        settings_views.launch_profiles,
        name="settings-profiles",
    ),
    path("p/<slug:slug>/settings/alerts/", alert_views.alerts, name="settings-alerts"),
    path(
        "p/<slug:slug>/settings/alerts/<int:channel_id>/enabled/",
        alert_views.alert_channel_enabled,
        name="settings-alert-enabled",
    ),
    path(
        "p/<slug:slug>/settings/recovery/",
        recovery_settings_views.recovery,
        name="settings-recovery",
    ),
    # Members, editing and deleting (webapp/dashboard/members_views.py,
    # webapp/dashboard/settings_edit_views.py).
    path("p/<slug:slug>/settings/members/", members_views.members, name="settings-members"),
    path(
        "p/<slug:slug>/settings/members/<int:membership_id>/role/",
        members_views.member_role,
        name="settings-member-role",
    ),
    path(
        "p/<slug:slug>/settings/members/<int:membership_id>/remove/",
        members_views.member_remove,
        name="settings-member-remove",
    ),
    path(
        "p/<slug:slug>/settings/storage/<int:target_id>/",
        settings_edit_views.storage_target_edit,
        name="settings-storage-edit",
    ),
    path(
        "p/<slug:slug>/settings/storage/<int:target_id>/audit/",
        storage_audit_views.storage_audit,
        name="settings-storage-audit",
    ),
    path(
        "p/<slug:slug>/settings/storage/<int:target_id>/audit/run/",
        storage_audit_views.storage_audit_run,
        name="settings-storage-audit-run",
    ),
    path(
        "p/<slug:slug>/settings/storage/<int:target_id>/audit/<int:audit_id>/clean/",
        storage_audit_views.storage_audit_clean,
        name="settings-storage-audit-clean",
    ),
    path(
        "p/<slug:slug>/settings/storage/<int:target_id>/delete/",
        settings_edit_views.storage_target_delete,
        name="settings-storage-delete",
    ),
    path(
        "p/<slug:slug>/settings/launch-profiles/preview/",
        settings_edit_views.launch_profile_preview,
        name="settings-profile-preview",
    ),
    path(
        "p/<slug:slug>/settings/launch-profiles/<int:profile_id>/",
        settings_edit_views.launch_profile_edit,
        name="settings-profile-edit",
    ),
    path(
        "p/<slug:slug>/settings/launch-profiles/<int:profile_id>/delete/",
        settings_edit_views.launch_profile_delete,
        name="settings-profile-delete",
    ),
    path(
        "p/<slug:slug>/settings/alerts/<int:channel_id>/edit/",
        settings_edit_views.alert_channel_edit,
        name="settings-alert-edit",
    ),
    path(
        "p/<slug:slug>/settings/alerts/<int:channel_id>/delete/",
        settings_edit_views.alert_channel_delete,
        name="settings-alert-delete",
    ),
    path(
        "p/<slug:slug>/resumes/<int:resume_id>/cancel/",
        resume_views.resume_cancel,
        name="resume-cancel",
    ),
    path("p/<slug:slug>/settings/audit/", audit_views.audit_log, name="settings-audit"),
    # Badges: no sign-in; the badge key is the secret. Run keys and tags may hold "/".
    re_path(
        r"^badge/(?P<badge_key>[A-Za-z0-9_-]+)\.(?P<fmt>svg|json)$",
        badge_views.project_badge,
        name="badge-project",
    ),
    re_path(
        r"^badge/(?P<badge_key>[A-Za-z0-9_-]+)/tag/(?P<name_key>[A-Za-z0-9_-]{16})/"
        r"(?P<name>.+)\.(?P<fmt>svg|json)$",
        badge_views.tag_badge,
        name="badge-tag",
    ),
    re_path(
        r"^badge/(?P<badge_key>[A-Za-z0-9_-]+)/run/(?P<name_key>[A-Za-z0-9_-]{16})/"
        r"(?P<name>.+)\.(?P<fmt>svg|json)$",
        badge_views.run_badge,
        name="badge-run",
    ),
    # Last: run keys may contain "/".
    path("p/<slug:slug>/runs/<path:key>/", run_views.run_detail, name="run"),
]
