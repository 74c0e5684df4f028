"""The Recovery settings tab, for a project's admins: the storage quota, automatic resume
and the restore tests' deeper levels (docs/restore.md). Each field that changes is one
audit Event."""

from __future__ import annotations

import json
import re

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import _settings_context, audit
from webapp.domain.models import LaunchProfile
from webapp.domain.models.projects import Role
from webapp.domain.recovery.reshard import MAX_WORLD_SIZE

RESTORE_CHECK_KEYS = (
    *("forward", "replay", "replay_steps", "replay_rtol", "replay_metric", "file"),
    "reshard",
)


def clean_restore_checks(text: str) -> dict:
    """The project's restore_checks: a JSON object with only the known keys, each of the
    right type (docs/restore.md, "Deeper levels")."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    if not isinstance(value, dict):
        raise ValidationError('It must be a JSON object, like {"forward": "pkg.mod:fn"}.')
    unknown = sorted(set(value) - set(RESTORE_CHECK_KEYS))
    if unknown:
        raise ValidationError(
            f"Unknown key {unknown[0]!r}; the keys are {', '.join(RESTORE_CHECK_KEYS)}."
        )
    for key in ("forward", "replay"):
        if key in value and not (
            isinstance(value[key], str) and re.fullmatch(r"[\w.]+:\w+", value[key])
        ):
            raise ValidationError(f'{key} must name a function as "package.module:function".')
    for key in ("replay_metric", "file"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            raise ValidationError(f"{key} must be a non-empty string.")
    if "file" in value:
        from webapp.domain.confined_files import Refused, relative_parts

        try:
            relative_parts(value["file"], "file")
        except Refused as exc:
            raise ValidationError(f"{exc}: it names one of the checkpoint's files.") from None
    reshard = value.get("reshard")
    if reshard is not None and not (
        isinstance(reshard, list)
        and 1 <= len(reshard) <= 4
        and all(type(m) is int and 1 <= m <= MAX_WORLD_SIZE for m in reshard)
    ):
        raise ValidationError(
            f"reshard must list one to four world sizes from 1 to {MAX_WORLD_SIZE}, like [2, 4]."
        )
    steps = value.get("replay_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValidationError("replay_steps must be a whole number of at least 1.")
    rtol = value.get("replay_rtol")
    if rtol is not None and (
        isinstance(rtol, bool) or not isinstance(rtol, int | float) or not 0 <= rtol < 1
    ):
        raise ValidationError("replay_rtol must be a number from 0 to 1, like 1e-4.")
    return value


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
        old = {
            "storage_quota_bytes": project.storage_quota_bytes,
            "auto_resume_profile": project.auto_resume_profile.name
            if project.auto_resume_profile_id
            else None,
            "max_restarts": project.max_restarts,
            "quarantine_after": project.quarantine_after,
            "loop_after": project.loop_after,
            "gpu_hour_price": project.gpu_hour_price,
            "restore_checks": project.restore_checks,
        }
        changed = [name for name in new if new[name] != old[name]]
        if changed:
            with transaction.atomic():
                project.storage_quota_bytes = new["storage_quota_bytes"]
                project.auto_resume_profile = profile
                project.max_restarts = new["max_restarts"]
                project.quarantine_after = new["quarantine_after"]
                project.loop_after = new["loop_after"]
                project.gpu_hour_price = new["gpu_hour_price"]
                project.restore_checks = new["restore_checks"]
                project.save(
                    update_fields=[
                        "storage_quota_bytes",
                        "auto_resume_profile",
                        "max_restarts",
                        "quarantine_after",
                        "loop_after",
                        "gpu_hour_price",
                        "restore_checks",
                    ]
                )
                for name in changed:
                    audit(
                        request,
                        f"project.{name}_changed",
                        f"{name.replace('_', ' ')}: {_shown(old[name])} → {_shown(new[name])}",
                        setting=name,
                        old=old[name],
                        new=new[name],
                    )
            messages.success(
                request, "Saved: " + ", ".join(n.replace("_", " ") for n in changed) + "."
            )
        else:
            messages.info(request, "Nothing changed.")
        return redirect("dashboard:settings-recovery", project.slug)
    return render(
        request,
        "dashboard/settings_recovery.html",
        _settings_context(request, form=form, tab="recovery"),
    )


def _shown(value) -> str:
    if value is None or value == {}:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)
