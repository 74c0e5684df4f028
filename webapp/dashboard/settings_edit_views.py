"""Editing and deleting what the settings pages list: storage targets, launch profiles
and alert channels, and the launch profile's live preview.

What history refers to is not deleted: a storage target that holds replicas and an alert
channel that has been notified are kept, disabled (the replicas stay restorable, the
deliveries stay readable); a launch profile that resumes used, or that automatic resume
names, is refused. The page says which and why. Every change is an audit Event."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.alert_views import AlertChannelForm
from webapp.dashboard.setting_changes import change, submitted
from webapp.dashboard.settings_views import (
    SAMPLE_VALUES,
    StorageTargetForm,
    _settings_context,
    placeholder_rows,
    profile_form,
)
from webapp.domain import actions
from webapp.domain.actions.alert_channels import history as channel_history
from webapp.domain.actions.launch_profiles import history as profile_history
from webapp.domain.actions.storage_targets import FIXED_FIELDS
from webapp.domain.launch import template
from webapp.domain.models import LaunchProfile, StorageTarget
from webapp.domain.models.alerts import AlertChannel
from webapp.domain.models.projects import Role

# --- Storage targets -----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def storage_target_edit(request, target_id: int):
    target = get_object_or_404(StorageTarget, project=request.project, pk=target_id)
    replicas = target.replicas.count()
    form = StorageTargetForm(request.POST or None, instance=target, project=request.project)
    form.fields["enabled"] = StorageTarget._meta.get_field("enabled").formfield()
    form.fields["enabled"].initial = target.enabled
    if replicas:
        for name in FIXED_FIELDS:
            form.fields[name].disabled = True
            form.fields[name].help_text = f"Fixed: {replicas} replicas are stored there."

    def update(caller):
        # Only what the form changed: fixed fields are disabled and keep their value.
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        return actions.update_target(caller, target, **changes)

    shown = f"{replicas} replicas" if replicas else ""
    return _edit(request, form, target, "storage target", "storage", lambda _: shown, update)


def _edit(request, form, row, what: str, tab: str, history, update, **context):
    """The edit page of a settings row (`what`, listed on the page `tab`): a valid POST
    is `update(caller)`, then back to the list saying "<name> is saved."; otherwise the
    form, with what refers to the row (`history(row)`, asked only when the page is
    shown)."""
    to = f"dashboard:settings-{tab}"
    if done := submitted(request, form, update, to, lambda fields: f"{row.name} is saved."):
        return done
    return render(
        request,
        "dashboard/settings_edit.html",
        _settings_context(
            request, form=form, obj=row, what=what, tab=tab,
            back=reverse(to, args=[request.project.slug]), history=history(row), **context,
        ),
    )  # fmt: skip


def _delete(request, action, row, kind: str, tab: str, kept: str):
    """Delete `row` through `action`, then back to the list (the page `tab`); the action
    keeps it, disabled, when history refers to it, and the page then says why (`kept`)."""

    def say(outcome: str) -> None:
        if outcome == "disabled":
            messages.warning(request, f"{kind.capitalize()} {row.name} is kept, disabled: {kept}")
        else:
            messages.success(request, f"{kind.capitalize()} {row.name} is deleted.")

    return change(
        request, lambda caller: action(caller, row), f"dashboard:settings-{tab}", done=say
    )


@require_POST
@project_view(Role.ADMIN)
def storage_target_delete(request, target_id: int):
    target = get_object_or_404(StorageTarget, project=request.project, pk=target_id)
    replicas = target.replicas.count()
    kept = f"{replicas} replicas are stored there and stay restorable. Nothing new is copied to it."
    return _delete(request, actions.delete_target, target, "storage target", "storage", kept)


# --- Launch profiles -----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def launch_profile_edit(request, profile_id: int):
    profile = get_object_or_404(LaunchProfile, project=request.project, pk=profile_id)
    form = profile_form(request, instance=profile)
    return _edit(
        request, form, profile, "launch profile", "profiles", profile_history,
        lambda caller: actions.update_profile(caller, profile, **form.cleaned_data),
        placeholders=placeholder_rows(), preview=True,
    )  # fmt: skip


@require_POST
@project_view(Role.ADMIN)
def launch_profile_delete(request, profile_id: int):
    profile = get_object_or_404(
        LaunchProfile.objects.select_related("project"), project=request.project, pk=profile_id
    )
    return change(
        request,
        lambda caller: actions.delete_profile(caller, profile),
        "dashboard:settings-profiles",
        done=lambda _: f"Launch profile {profile.name} is deleted.",
    )


@require_POST
@project_view(Role.ADMIN)
def launch_profile_preview(request):
    """The command as the launcher would run it (template.render, the launcher's own
    function) and the variables it would receive, with sample values."""
    text = request.POST.get("command_template", "")
    context = {"text": text}
    try:
        context["command"] = template.render(text)
    except template.TemplateRefused as exc:
        context["refusal"] = str(exc)
    else:
        used = {m.group(1) for m in template.PLACEHOLDER.finditer(text)}
        variables = template.variables(SAMPLE_VALUES)
        context["variables"] = [
            (template.env_name(n), variables[template.env_name(n)])
            for n in template.NAMES
            if n in used
        ]
    return render(request, "dashboard/_profile_preview.html", context)


# --- Alert channels ------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def alert_channel_edit(request, channel_id: int):
    channel = get_object_or_404(AlertChannel, project=request.project, pk=channel_id)
    form = AlertChannelForm(request.POST or None, instance=channel)
    return _edit(
        request, form, channel, "alert channel", "alerts", channel_history,
        lambda caller: actions.update_channel(caller, channel, **form.cleaned_data),
    )  # fmt: skip


@require_POST
@project_view(Role.ADMIN)
def alert_channel_delete(request, channel_id: int):
    channel = get_object_or_404(AlertChannel, project=request.project, pk=channel_id)
    sent = channel.notifications.count()
    kept = f"{sent} notifications were sent to it and stay in the record. It gets no new ones."
    return _delete(request, actions.delete_channel, channel, "alert channel", "alerts", kept)
