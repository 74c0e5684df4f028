"""Alert channels, for a project's admins: list, add, disable, and the recent flips with
each notification and every attempt at sending it.

A channel's target is checked by its kind's transport (webapp/domain/channels), a URL
against the deployment's outbound policy (webapp/domain/outbound.py; checked again at
every delivery). A URL's whole form and the signing secret appear on this admin page
only; everything else (the audit message, the event log) shows it masked to
scheme://host/…."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.db import IntegrityError, transaction
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import _settings_context, audit
from webapp.domain import channels
from webapp.domain.models.alerts import AlertChannel, AlertKind, Flip, Notification
from webapp.domain.models.projects import Role

FLIPS_SHOWN = 50

# Each kind says what its target is (webapp/domain/channels), so a new kind shows here.
TARGET_HELP = (
    "; ".join(f"{t.label}: {t.target_help}" for t in channels.KINDS.values())
    + ". The signed kinds carry Standard Webhooks headers (webhook-id, webhook-timestamp, "
    "webhook-signature)."
)


class AlertChannelForm(forms.ModelForm):
    kinds = forms.MultipleChoiceField(
        choices=AlertKind.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every kind.",
    )

    class Meta:
        model = AlertChannel
        fields = ["name", "kind", "target", "kinds"]
        widgets = {"kind": forms.Select, "target": forms.TextInput(attrs={"size": 60})}
        help_texts = {"target": TARGET_HELP}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = channels.choices()  # no empty choice
        self.fields["kind"].initial = next(iter(channels.KINDS))

    def clean(self):
        data = super().clean()
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if not kind or not target:
            return data
        # The kind's own check (webapp/domain/channels/<kind>.py); the field's choices
        # made sure the kind is in the table.
        try:
            data["target"] = channels.KINDS[kind].clean_target(target)
        except channels.TargetInvalid as exc:
            self.add_error("target", str(exc))
        return data


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def alerts(request):
    """Alert channels (list, add, disable) and the recent flips, with each notification
    and every attempt at sending it."""
    form = AlertChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        channel = form.save(commit=False)
        channel.project = request.project
        channel.target = form.cleaned_data["target"]
        try:
            with transaction.atomic():
                channel.save()
        except IntegrityError:
            form.add_error("name", "An alert channel of this project already has this name.")
        else:
            kinds = ", ".join(channel.kinds) or "every kind"
            audit(
                request,
                "alert_channel.created",
                f"alert channel {channel.name!r} ({channel.kind} to {channel.shown_target}) "
                f"created for {kinds}",
                alert_channel=channel.pk,
            )
            messages.success(request, f"Alert channel {channel.name} is added.")
            return redirect("dashboard:settings-alerts", request.project.slug)
    channels = request.project.alert_channels.annotate(sent=Count("notifications")).order_by("name")
    flips = (
        Flip.objects.filter(project=request.project)
        .select_related("run")
        .prefetch_related(
            Prefetch(
                "notifications",
                queryset=Notification.objects.select_related("channel").order_by("channel__name"),
            )
        )
        .order_by("-created_at", "-id")[:FLIPS_SHOWN]
    )
    response = render(
        request,
        "dashboard/settings_alerts.html",
        _settings_context(
            request,
            form=form,
            channels=channels,
            flips=flips,
            kind_labels=dict(AlertKind.choices),
            tab="alerts",
        ),
    )
    response["Cache-Control"] = "no-store"  # the webhooks' URLs and signing secrets
    return response


@require_POST
@project_view(Role.ADMIN)
def alert_channel_enabled(request, channel_id: int):
    channel = get_object_or_404(AlertChannel, project=request.project, pk=channel_id)
    enabled = request.POST.get("enabled", "0") not in ("0", "false", "")
    if AlertChannel.objects.filter(pk=channel.pk).exclude(enabled=enabled).update(enabled=enabled):
        verb = "enabled" if enabled else "disabled"
        audit(
            request,
            f"alert_channel.{verb}",
            f"alert channel {channel.name!r} {verb}",
            alert_channel=channel.pk,
        )
        messages.success(
            request,
            f"Alert channel {channel.name} is {verb}"
            + ("." if enabled else ": it gets no notifications until enabled again."),
        )
    return redirect("dashboard:settings-alerts", request.project.slug)
