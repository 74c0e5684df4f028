from django.contrib import admin

from webapp.domain.models import (
    AlertChannel,
    ApiToken,
    Checkpoint,
    CheckpointFile,
    Event,
    Flip,
    LaunchProfile,
    Membership,
    Notification,
    Project,
    Replica,
    Resume,
    RetentionPolicy,
    Run,
    StorageTarget,
    Validation,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "created_at")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # The digest is not the secret, but there is no reason to show it either.
    list_display = (
        "name",
        "project",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("project",)
    exclude = ("digest",)
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def has_add_permission(self, request):
        # Tokens are created with `manage.py create_project`/`create_token`, which show
        # the secret once; the admin cannot show it.
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("key", "project", "status", "host", "last_step", "last_seen_at")
    list_filter = ("project", "status")
    search_fields = ("key", "name", "host")
    raw_id_fields = ("resumed_from",)


class CheckpointFileInline(admin.TabularInline):
    model = CheckpointFile
    extra = 0


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "status", "total_size", "pinned", "saved_at")
    list_filter = ("project", "status", "pinned")
    raw_id_fields = ("run",)
    inlines = [CheckpointFileInline]


@admin.register(Validation)
class ValidationAdmin(admin.ModelAdmin):
    list_display = ("checkpoint", "kind", "status", "device", "created_at")
    list_filter = ("kind", "status")
    raw_id_fields = ("checkpoint",)


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("checkpoint", "target", "status", "bytes_done", "bytes_total", "attempts")
    list_filter = ("status", "target")
    raw_id_fields = ("checkpoint",)


@admin.register(Resume)
class ResumeAdmin(admin.ModelAdmin):
    list_display = ("run", "checkpoint", "status", "external_id", "created_at")
    list_filter = ("status",)
    raw_id_fields = ("run", "checkpoint", "new_run")


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("type", "project", "run", "step", "time", "actor")
    list_filter = ("project", "type")
    raw_id_fields = ("run",)


@admin.register(StorageTarget)
class StorageTargetAdmin(admin.ModelAdmin):
    # credentials_ref names environment variables on the workers; no secret is stored.
    list_display = ("name", "project", "bucket", "prefix", "endpoint_url", "policy", "enabled")
    list_filter = ("project", "policy", "enabled")


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    list_display = (
        "project", "applies_to", "keep_last", "keep_best", "metric", "keep_every_n_steps",
        "enabled",
    )  # fmt: skip
    list_filter = ("applies_to", "enabled")


admin.site.register(LaunchProfile)


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "target", "kinds", "enabled")
    list_filter = ("kind", "enabled")


class NotificationInline(admin.TabularInline):
    model = Notification
    extra = 0
    readonly_fields = ("channel", "status", "attempts", "last_error", "sent_at")


@admin.register(Flip)
class FlipAdmin(admin.ModelAdmin):
    list_display = ("kind", "project", "run", "message", "created_at", "processed_at")
    list_filter = ("kind",)
    inlines = [NotificationInline]
