"""Project settings, for admins: API tokens (the secret is shown once, at creation, and
never stored), storage targets (credentials are named by reference, never entered or
shown here) and launch profiles. Each change leaves an audit Event."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.domain.models import ApiToken, Event, LaunchProfile, StorageTarget
from webapp.domain.models.projects import Role, Scope


def audit(request, type_: str, message: str, **data) -> None:
    Event.objects.create(
        project=request.project,
        type=type_,
        time=timezone.now(),
        actor=actor_of(request),
        message=message,
        data=data,
    )


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[Scope.INGEST]
    )


class StorageTargetForm(forms.ModelForm):
    endpoint_url = forms.URLField(
        required=False, assume_scheme="https", help_text="Empty for AWS S3."
    )

    class Meta:
        model = StorageTarget
        fields = ["name", "bucket", "prefix", "endpoint_url", "region", "credentials_ref"]


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
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        audit(
            request,
            "token.revoked",
            f"token {token.name!r} ({token.prefix}…) revoked",
            token=token.pk,
        )
        messages.success(request, f"Token {token.name} is revoked; requests with it now get 401.")
    return redirect("dashboard:settings-tokens", request.project.slug)


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def storage_targets(request):
    form = StorageTargetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        target = form.save(commit=False)
        target.project = request.project
        try:
            with transaction.atomic():
                target.save()
        except IntegrityError:
            form.add_error("name", "A storage target of this project already has this name.")
        else:
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
        profile = form.save(commit=False)
        profile.project = request.project
        try:
            with transaction.atomic():
                profile.save()
        except IntegrityError:
            form.add_error("name", "A launch profile of this project already has this name.")
        else:
            audit(
                request,
                "launch_profile.created",
                f"launch profile {profile.name!r} ({profile.kind}) created",
                launch_profile=profile.pk,
            )
            messages.success(request, f"Launch profile {profile.name} is added.")
            return redirect("dashboard:settings-profiles", request.project.slug)
    profiles = request.project.launch_profiles.order_by("name")
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
