"""Project settings, for admins: API tokens (the secret is shown once, at creation, and
never stored), storage targets (credentials are named by reference, never entered or
shown here), launch profiles and recovery (storage quota, automatic resume, restore-test
levels); alert channels are in webapp/dashboard/alert_views.py. Each change leaves an
audit Event."""

from __future__ import annotations

import json
import re

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.domain import storage_access
from webapp.domain.models import ApiToken, Event, LaunchProfile, StorageTarget
from webapp.domain.models.projects import Role, Scope


def audit(request, type_: str, message: str, **data) -> None:
    Event.record(
        type_, project=request.project, actor=actor_of(request), message=message, data=data
    )


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[Scope.INGEST]
    )


class StorageTargetForm(forms.ModelForm):
    """The endpoint and the credentials' name are checked against what the deployment
    allows this project (webapp.domain.storage_access), here and again on every use."""

    endpoint_url = forms.URLField(
        required=False,
        assume_scheme="https",
        help_text="Empty for the deployment's own store (AWS S3 if it has none).",
    )

    class Meta:
        model = StorageTarget
        fields = ["name", "bucket", "prefix", "endpoint_url", "region", "credentials_ref"]

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        granted = storage_access.refs_for(project.slug)
        self.fields["credentials_ref"].help_text = (
            "Granted to this project by the deployment's administrator: "
            + (", ".join(granted) or "none")
            + ". Empty: the deployment's own keys."
        )

    def clean_endpoint_url(self):
        url = self.cleaned_data.get("endpoint_url") or ""
        try:
            storage_access.check_endpoint(url, saving=True)
        except storage_access.TargetRefused as exc:
            raise ValidationError(str(exc)) from None
        return url

    def clean_credentials_ref(self):
        ref = (self.cleaned_data.get("credentials_ref") or "").strip()
        try:
            storage_access.check_credentials_ref(self.project.slug, ref)
        except storage_access.TargetRefused as exc:
            raise ValidationError(str(exc)) from None
        return ref


class LaunchProfileForm(forms.ModelForm):
    class Meta:
        model = LaunchProfile
        fields = ["name", "kind", "host", "command_template"]
        widgets = {"command_template": forms.Textarea(attrs={"rows": 3})}


def _settings_context(request, **extra) -> dict:
    return {"project": request.project, "access": request.access, **extra}


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def tokens(request):
    form = TokenForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        token, secret = request.project.issue_token(
            form.cleaned_data["name"], form.cleaned_data["scopes"], created_by=request.user
        )
        audit(
            request,
            "token.created",
            f"token {token.name!r} ({token.prefix}…) created with {', '.join(token.scopes)}",
            token=token.pk,
        )
        # The secret is in this one response and nowhere else; no redirect, so that a
        # reload does not show it again (the browser asks before re-posting).
        created = {"token": token, "secret": secret}
        form = TokenForm()
    token_list = request.project.tokens.order_by("revoked_at", "-created_at").select_related(
        "created_by"
    )
    response = render(
        request,
        "dashboard/settings_tokens.html",
        _settings_context(request, form=form, tokens=token_list, created=created, tab="tokens"),
    )
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@project_view(Role.ADMIN)
def token_revoke(request, token_id: int):
    token = get_object_or_404(ApiToken, project=request.project, pk=token_id)
    if token.revoke():
        audit(
            request,
            "token.revoked",
            f"token {token.name!r} ({token.prefix}…) revoked",
            token=token.pk,
        )
        messages.success(request, f"Token {token.name} is revoked; requests with it now get 401.")
    return redirect("dashboard:settings-tokens", request.project.slug)


def _create_in_project(request, form, what: str):
    """Save a valid model form's object in this project; None (and a form error) when the
    project already has one of that name (the unique constraint, not a racy lookup)."""
    obj = form.save(commit=False)
    obj.project = request.project
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError:
        form.add_error("name", f"{what} of this project already has this name.")
        return None
    return obj


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def storage_targets(request):
    form = StorageTargetForm(request.POST or None, project=request.project)
    if request.method == "POST" and form.is_valid():
        target = _create_in_project(request, form, "A storage target")
        if target is not None:
            audit(
                request,
                "storage_target.created",
                f"storage target {target.name!r} (s3://{target.bucket}/{target.prefix}) created",
                storage_target=target.pk,
            )
            messages.success(request, f"Storage target {target.name} is added.")
            return redirect("dashboard:settings-storage", request.project.slug)
    targets = request.project.storage_targets.order_by("name")
    return render(
        request,
        "dashboard/settings_storage.html",
        _settings_context(request, form=form, targets=targets, tab="storage"),
    )


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def launch_profiles(request):
    form = LaunchProfileForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        profile = _create_in_project(request, form, "A launch profile")
        if profile is not None:
            audit(
                request,
                "launch_profile.created",
                f"launch profile {profile.name!r} ({profile.kind}) created",
                launch_profile=profile.pk,
            )
            messages.success(request, f"Launch profile {profile.name} is added.")
            return redirect("dashboard:settings-profiles", request.project.slug)
    profiles = list(request.project.launch_profiles.order_by("name"))
    for profile in profiles:
        # A profile saved before templates were checked: say so, it will not launch.
        try:
            profile.clean()
        except ValidationError as exc:
            profile.refusal = " ".join(exc.messages)
    return render(
        request,
        "dashboard/settings_profiles.html",
        _settings_context(request, form=form, profiles=profiles, tab="profiles"),
    )


@project_view(Role.ADMIN)
def audit_log(request):
    events = (
        Event.objects.filter(project=request.project)
        .exclude(actor="")
        .filter(actor__startswith="user:")
        .select_related("run")
        .order_by("-received_at", "-id")[:200]
    )
    return render(
        request,
        "dashboard/settings_audit.html",
        _settings_context(request, events=events, tab="audit"),
    )


# --- Recovery: quota, automatic resume, restore-test levels ------------------------------

RESTORE_CHECK_KEYS = ("forward", "replay", "replay_steps", "replay_rtol", "replay_metric", "file")


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
    restore_checks = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "cols": 70, "spellcheck": "false"}),
        help_text='Deeper restore-test levels, e.g. {"forward": "examples.digits_checks:forward", '
        '"replay": "examples.digits_checks:replay", "replay_steps": 5, "replay_rtol": 1e-4}. '
        "Keys: " + ", ".join(RESTORE_CHECK_KEYS) + ".",
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
            "restore_checks": data["restore_checks"],
        }
        old = {
            "storage_quota_bytes": project.storage_quota_bytes,
            "auto_resume_profile": project.auto_resume_profile.name
            if project.auto_resume_profile_id
            else None,
            "max_restarts": project.max_restarts,
            "restore_checks": project.restore_checks,
        }
        changed = [name for name in new if new[name] != old[name]]
        if changed:
            with transaction.atomic():
                project.storage_quota_bytes = new["storage_quota_bytes"]
                project.auto_resume_profile = profile
                project.max_restarts = new["max_restarts"]
                project.restore_checks = new["restore_checks"]
                project.save(
                    update_fields=[
                        "storage_quota_bytes",
                        "auto_resume_profile",
                        "max_restarts",
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
