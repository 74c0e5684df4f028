"""The Recovery settings tab, for a project's admins: the storage quota, automatic resume
and the restore tests' deeper levels (docs/restore.md). Each field that changes is one
audit Event."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from webapp.dashboard.access import project_view
from webapp.dashboard.setting_changes import change
from webapp.dashboard.settings_views import _settings_context
from webapp.domain import actions
from webapp.domain.actions.project_settings import RESTORE_CHECK_KEYS, check_restore_checks
from webapp.domain.models import LaunchProfile
from webapp.domain.models.projects import Role


def clean_restore_checks(text: str) -> dict:
    """The project's restore_checks from the form's JSON text, checked by the action's
    own rules (webapp/domain/actions/project_settings.check_restore_checks)."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    try:
        return check_restore_checks(value)
    except actions.SettingInvalid as exc:
        raise ValidationError(exc.message) from None


class RecoveryForm(forms.Form):
    storage_quota_gib = forms.DecimalField(
        label="Storage quota (GiB)",
        required=False,
        min_value=0,
        decimal_places=3,
        help_text="Alert (storage.over_quota) when the project's checkpoints keep more. "
        "Empty: no quota.",
    )
    auto_resume_profile = forms.ModelChoiceField(
        queryset=LaunchProfile.objects.none(),
        required=False,
        empty_label="Off: never resume automatically",
        help_text="Failed or silent runs are resumed from their latest verified checkpoint "
        "with this profile.",
    )
    max_restarts = forms.IntegerField(
        min_value=0,
        max_value=100,
        help_text="At most this many automatic resumes along one lineage.",
    )
    quarantine_after = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        help_text="Quarantine a checkpoint after this many resumes from it failed before "
        "any progress; resumes then take the one before it.",
    )
    loop_after = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        help_text="Stop automatic resumes of a lineage (one alert) after this many "
        "attempts in a row made no progress.",
    )
    gpu_hour_price = forms.FloatField(
        required=False,
        min_value=0,
        max_value=10_000,
        help_text="What one GPU-hour costs, in your currency: the goodput figures then say "
        "what lost time cost. Empty: no money figures.",
    )
    restore_checks = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "cols": 70, "spellcheck": "false"}),
        help_text='Deeper restore-test levels, e.g. {"forward": "examples.digits_checks:forward", '
        '"replay": "examples.digits_checks:replay", "replay_steps": 5, "replay_rtol": 1e-4}; '
        '{"reshard": [2, 4]} also loads a DCP checkpoint on 2 and on 4 ranks. Keys: '
        + ", ".join(RESTORE_CHECK_KEYS)
        + ".",
    )

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["auto_resume_profile"].queryset = project.launch_profiles.order_by("name")

    def clean_restore_checks(self):
        return clean_restore_checks(self.cleaned_data.get("restore_checks", ""))


GIB = 1024**3


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def recovery(request):
    """The storage quota, automatic resume and the restore tests' deeper levels. Each
    field that changes is one audit Event, with the old and the new value."""
    project = request.project
    initial = {
        "storage_quota_gib": (
            round(project.storage_quota_bytes / GIB, 3)
            if project.storage_quota_bytes is not None
            else None
        ),
        "auto_resume_profile": project.auto_resume_profile_id,
        "max_restarts": project.max_restarts,
        "quarantine_after": project.quarantine_after,
        "loop_after": project.loop_after,
        "gpu_hour_price": project.gpu_hour_price,
        "restore_checks": json.dumps(project.restore_checks, indent=2)
        if project.restore_checks
        else "",
    }
    form = RecoveryForm(request.POST or None, initial=initial, project=project)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        quota = data["storage_quota_gib"]
        profile = data["auto_resume_profile"]
        new = {
            "storage_quota_bytes": int(quota * GIB) if quota is not None else None,
            "auto_resume_profile": profile.name if profile else None,
            "max_restarts": data["max_restarts"],
            # Left out (a script posting the older fields only): unchanged.
            "quarantine_after": data["quarantine_after"] or project.quarantine_after,
            "loop_after": data["loop_after"] or project.loop_after,
            "gpu_hour_price": data["gpu_hour_price"],
            "restore_checks": data["restore_checks"],
        }

        def say(changed: list[str]) -> None:
            if changed:
                messages.success(
                    request, "Saved: " + ", ".join(n.replace("_", " ") for n in changed) + "."
                )
            else:
                messages.info(request, "Nothing changed.")

        done = change(
            request,
            lambda caller: actions.update_recovery(caller, **new),
            "dashboard:settings-recovery",
            form=form,
            done=say,
        )
        if done is not None:
            return done
    return render(
        request,
        "dashboard/settings_recovery.html",
        _settings_context(request, form=form, tab="recovery"),
    )
