"""Alert channels, for a project's admins: list, add, disable, and the recent flips with
each notification and every attempt at sending it.

A webhook's URL is checked against the deployment's outbound policy when it is saved
(webapp.domain.health.outbound; checked again at every delivery). Its full URL and signing
secret appear on this admin page only; everything else (the audit message, the
event log) shows it masked to scheme://host/…."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import _settings_context, audit
from webapp.domain.health import outbound
from webapp.domain.models.alerts import (
    AlertChannel,
    AlertKind,
    ChannelKind,
    Flip,
    Notification,
)
from webapp.domain.models.projects import Role

FLIPS_SHOWN = 50


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
        help_texts = {
            "target": "A webhook's http(s) URL (Slack, Mattermost, or your own), or e-mail "
            "addresses separated by commas. Deliveries are signed (X-Lifeboat-Signature)."
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = ChannelKind.choices  # no empty choice
        self.fields["kind"].initial = ChannelKind.WEBHOOK

    def clean(self):
        data = super().clean()
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if not kind or not target:
            return data
        if kind == ChannelKind.WEBHOOK:
            # Not Django's URLValidator: it refuses single-label hosts, and a self-hosted
            # chat server is often one (http://mattermost:8065/hooks/...).
            # A host DNS cannot resolve now is accepted: every delivery checks again.
            try:
                outbound.check(target, what="The webhook URL")
            except outbound.OutboundRefused as exc:
                self.add_error("target", str(exc))
            except outbound.OutboundUnresolvable:
                pass
            data["target"] = target
        else:
            addresses = [a.strip() for a in target.split(",") if a.strip()]
            bad = []
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    bad.append(address)
            if bad or not addresses:
                self.add_error(
                    "target",
                    f"Not an e-mail address: {', '.join(bad)}."
                    if bad
                    else "Give at least one e-mail address.",
                )
            data["target"] = ", ".join(addresses)
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
