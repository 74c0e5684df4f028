"""Editing and deleting what the settings pages list: storage targets, launch profiles
and alert channels, and the launch profile's live preview.

What history refers to is not deleted: a storage target that holds replicas and an alert
channel that has been notified are kept, disabled (the replicas stay restorable, the
deliveries stay readable); a launch profile that resumes used, or that automatic resume
names, is refused. The page says which and why. Every change is an audit Event."""

from __future__ import annotations

from django.contrib import messages
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.alert_views import AlertChannelForm
from webapp.dashboard.settings_views import (
    SAMPLE_VALUES,
    StorageTargetForm,
    _settings_context,
    audit,
    placeholder_rows,
    profile_form,
)
from webapp.domain.launch import template
from webapp.domain.models import LaunchProfile, StorageTarget
from webapp.domain.models.alerts import AlertChannel
from webapp.domain.models.projects import Role

# Where a replica is: fixed once copies exist, or they could no longer be found.
TARGET_FIXED_FIELDS = ("bucket", "prefix", "endpoint_url")


def _save_edit(request, form, what: str, type_: str, **data) -> bool:
    """Save an edit form; False (and a form error) on a duplicate name."""
    try:
        with transaction.atomic():
            obj = form.save()
    except IntegrityError:
        form.add_error("name", f"{what} of this project already has this name.")
        return False
    changed = ", ".join(form.changed_data) or "nothing"
    audit(request, type_, f"{what[2:].lower()} {obj.name!r} changed: {changed}", **data)
    messages.success(request, f"{obj.name} is saved.")
    return True


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
        for name in TARGET_FIXED_FIELDS:
            form.fields[name].disabled = True
            form.fields[name].help_text = f"Fixed: {replicas} replicas are stored there."
    if request.method == "POST" and form.is_valid():
        form.instance.enabled = form.cleaned_data["enabled"]
        if _save_edit(
            request, form, "A storage target", "storage_target.changed", storage_target=target.pk
        ):
            return redirect("dashboard:settings-storage", request.project.slug)
    return render(
        request,
        "dashboard/settings_edit.html",
        _settings_context(
            request, form=form, obj=target, what="storage target", tab="storage",
            back=reverse("dashboard:settings-storage", args=[request.project.slug]),
            history=f"{replicas} replicas" if replicas else "",
        ),
    )  # fmt: skip


def _disable_or_delete(request, obj, kind: str, uses: str, kept: str, gone: str) -> None:
    """One rule for what history refers to: with `uses` (e.g. "3 replicas") the row is
    kept, disabled, and the page says why; without, it is deleted. Audited either way."""
    key = kind.replace(" ", "_")
    if uses:
        type(obj).objects.filter(pk=obj.pk).update(enabled=False)
        audit(
            request,
            f"{key}.disabled",
            f"{kind} {obj.name!r} disabled, not deleted: {uses}",
            **{key: obj.pk},
        )
        messages.warning(request, f"{kind.capitalize()} {obj.name} is kept, disabled: {kept}")
    else:
        pk = obj.pk
        obj.delete()
        audit(request, f"{key}.deleted", f"{kind} {obj.name!r} ({gone}) deleted", **{key: pk})
        messages.success(request, f"{kind.capitalize()} {obj.name} is deleted.")


@require_POST
@project_view(Role.ADMIN)
def storage_target_delete(request, target_id: int):
    target = get_object_or_404(StorageTarget, project=request.project, pk=target_id)
    replicas = target.replicas.count()
    _disable_or_delete(
        request,
        target,
        "storage target",
        f"{replicas} replicas on it" if replicas else "",
        f"{replicas} replicas are stored there and stay restorable. Nothing new is copied to it.",
        f"s3://{target.bucket}/{target.prefix}",
    )
    return redirect("dashboard:settings-storage", request.project.slug)


# --- Launch profiles -----------------------------------------------------------------------


def profile_history(profile) -> str:
    """What refers to the profile, in words; empty when nothing does."""
    used = profile.resume_set.count()
    parts = [f"{used} resumes used it"] if used else []
    if profile.project.auto_resume_profile_id == profile.pk:
        parts.append("automatic resume uses it (Recovery)")
    return " and ".join(parts)


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def launch_profile_edit(request, profile_id: int):
    profile = get_object_or_404(LaunchProfile, project=request.project, pk=profile_id)
    form = profile_form(request, instance=profile)
    if (
        request.method == "POST"
        and form.is_valid()
        and _save_edit(
            request, form, "A launch profile", "launch_profile.changed", launch_profile=profile.pk
        )
    ):
        return redirect("dashboard:settings-profiles", request.project.slug)
    return render(
        request,
        "dashboard/settings_edit.html",
        _settings_context(
            request, form=form, obj=profile, what="launch profile", tab="profiles",
            back=reverse("dashboard:settings-profiles", args=[request.project.slug]),
            history=profile_history(profile), placeholders=placeholder_rows(), preview=True,
        ),
    )  # fmt: skip


@require_POST
@project_view(Role.ADMIN)
def launch_profile_delete(request, profile_id: int):
    profile = get_object_or_404(
        LaunchProfile.objects.select_related("project"), project=request.project, pk=profile_id
    )
    history = profile_history(profile)
    if history:
        messages.error(
            request,
            f"Launch profile {profile.name} is kept: {history}. Their records name it; "
            "edit it instead.",
        )
    else:
        profile.delete()
        audit(
            request,
            "launch_profile.deleted",
            f"launch profile {profile.name!r} ({profile.kind}) deleted",
            launch_profile=profile_id,
        )
        messages.success(request, f"Launch profile {profile.name} is deleted.")
    return redirect("dashboard:settings-profiles", request.project.slug)


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
    if request.method == "POST" and form.is_valid():
        form.instance.target = form.cleaned_data["target"]
        if _save_edit(
            request, form, "An alert channel", "alert_channel.changed", alert_channel=channel.pk
        ):
            return redirect("dashboard:settings-alerts", request.project.slug)
    sent = channel.notifications.count()
    return render(
        request,
        "dashboard/settings_edit.html",
        _settings_context(
            request, form=form, obj=channel, what="alert channel", tab="alerts",
            back=reverse("dashboard:settings-alerts", args=[request.project.slug]),
            history=f"{sent} notifications" if sent else "",
        ),
    )  # fmt: skip


@require_POST
@project_view(Role.ADMIN)
def alert_channel_delete(request, channel_id: int):
    channel = get_object_or_404(AlertChannel, project=request.project, pk=channel_id)
    sent = channel.notifications.count()
    _disable_or_delete(
        request,
        channel,
        "alert channel",
        f"{sent} notifications" if sent else "",
        f"{sent} notifications were sent to it and stay in the record. It gets no new ones.",
        f"{channel.kind} to {channel.shown_target}",
    )
    return redirect("dashboard:settings-alerts", request.project.slug)
