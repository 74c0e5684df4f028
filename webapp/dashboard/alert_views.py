"""Alert channels, for a project's admins: list, add, disable, and the recent flips with
each notification and every attempt at sending it.

A channel's target is checked by its kind's transport (webapp/domain/channels), a URL
against the deployment's outbound policy (webapp/domain/outbound.py; checked again at
every delivery). A URL's whole form and the signing secret appear on this admin page
only; everything else (the audit message, the event log) shows it masked to
scheme://host/…."""

from __future__ import annotations

from django import forms
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.setting_changes import added, change
from webapp.dashboard.settings_views import _settings_context
from webapp.domain import actions, channels
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

    # The target is checked by its kind's transport in the action
    # (webapp/domain/actions/alert_channels.py), for this page and the API alike.


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def alerts(request):
    """Alert channels (list, add, disable) and the recent flips, with each notification
    and every attempt at sending it."""
    form = AlertChannelForm(request.POST or None)
    if done := added(
        request, form, actions.create_channel, "Alert channel", "dashboard:settings-alerts"
    ):
        return done
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
    verb = "enabled" if enabled else "disabled"
    return change(
        request,
        lambda caller: actions.set_channel_enabled(caller, channel, enabled),
        "dashboard:settings-alerts",
        done=lambda changed: (
            f"Alert channel {channel.name} is {verb}"
            + ("." if enabled else ": it gets no notifications until enabled again.")
            if changed
            else None
        ),
    )
