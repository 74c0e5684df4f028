"""Project settings, for admins: API tokens (the secret is shown once, at creation, and
never stored), storage targets (credentials are named by reference, never entered or
shown here), launch profiles and recovery (storage quota, automatic resume, restore-test
levels); alert channels are in webapp/dashboard/alert_views.py. Each change is an
action (webapp/domain/actions/, as the API's /settings/ routes), which writes its audit
Event."""

from __future__ import annotations

import time

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Count, OuterRef, Subquery
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.setting_changes import added, change, submitted
from webapp.domain import actions
from webapp.domain.launch import template
from webapp.domain.launch.job_env import _NAME, refusal
from webapp.domain.models import ApiToken, LaunchProfile, StorageAudit, StorageTarget
from webapp.domain.models.projects import Role, Scope
from webapp.domain.replication import storage_access


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[Scope.INGEST]
    )


class StorageTargetForm(forms.ModelForm):
    """The fields as typed; the action checks the endpoint and the credentials' name
    against what the deployment allows this project (webapp.domain.replication.storage_access),
    and they are checked again on every use."""

    endpoint_url = forms.URLField(
        required=False,
        assume_scheme="https",
        help_text="Empty for the deployment's own store.",
    )

    class Meta:
        model = StorageTarget
        fields = [
            "name", "bucket", "prefix", "endpoint_url", "region", "credentials_ref",
            "gb_month_price",
        ]  # fmt: skip
        help_texts = {
            "gb_month_price": "What a GB (2**30 bytes) stored for a month costs there, in your "
            "currency: the storage page then says what the copies cost. Empty: no money figures."
        }

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["endpoint_url"].help_text = "Empty for the deployment's own store: " + (
            settings.S3_ENDPOINT_URL or "AWS S3"
        )
        granted = storage_access.refs_for(project.slug)
        self.fields["credentials_ref"].help_text = (
            "Granted to this project by the deployment's administrator: "
            + (", ".join(granted) or "none")
            + ". Empty: the deployment's own keys."
        )

    # The endpoint and the credentials' name are checked by the action
    # (webapp/domain/actions/storage_targets.py), for this page and the API alike.


class LaunchProfileForm(forms.ModelForm):
    """The command template and the two options the launcher reads (docs/slurm.md):
    `workdir`, where the job starts, and `env`, extra variables for the job."""

    workdir = forms.CharField(
        required=False,
        max_length=1000,
        help_text="Where the job starts (an absolute path on the launch host). "
        "Empty: the Lifeboat checkout.",
    )
    env = forms.CharField(
        label="Environment",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="Extra variables for the job, one NAME=value a line.",
    )

    class Meta:
        model = LaunchProfile
        fields = ["name", "kind", "host", "command_template"]
        widgets = {
            "command_template": forms.Textarea(
                attrs={
                    "rows": 4,
                    "spellcheck": "false",
                    "hx-trigger": "input changed delay:300ms, load",
                    "hx-target": "#profile-preview",
                    "hx-include": "this",
                }
            )
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        options = self.instance.options or {}
        self.fields["workdir"].initial = options.get("workdir", "")
        self.fields["env"].initial = "\n".join(
            f"{k}={v}" for k, v in (options.get("env") or {}).items()
        )

    # The workdir is checked by the action (webapp/domain/actions/launch_profiles.py);
    # the env text is read here, line by line, so a refusal can name its line.

    def clean_env(self):
        env = {}
        for number, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep or not _NAME.match(name):
                raise ValidationError(
                    f"Line {number}: write NAME=value, NAME of letters, digits and _."
                )
            if "\0" in value:
                raise ValidationError(f"Line {number}: a value cannot hold a NUL byte.")
            if why := refusal(name):
                raise ValidationError(f"Line {number}: {why}.")
            env[name] = value
        return env


# What the preview puts in each placeholder's variable: plausible, not real.
SAMPLE_VALUES = {
    "checkpoint_path": "/data/ckpt/run-3/step-1200.pt",
    "checkpoint_dir": "/data/ckpt/run-3",
    "checkpoint_id": 4711,
    "step": 1200,
    "run_key": "run-3",
    "new_run_key": "run-3-r1",
    "resume_id": 17,
    "world_size": 8,
}


def placeholder_rows() -> list[dict]:
    """Each placeholder the launcher knows, the variable that carries it to the job, and
    the sample value the preview uses."""

    return [
        {"name": name, "variable": template.env_name(name), "sample": SAMPLE_VALUES[name]}
        for name in template.NAMES
    ]


def profile_form(request, **kwargs) -> LaunchProfileForm:
    form = LaunchProfileForm(request.POST or None, **kwargs)
    form.fields["command_template"].widget.attrs["hx-post"] = reverse(
        "dashboard:settings-profile-preview", args=[request.project.slug]
    )
    return form


def _settings_context(request, **extra) -> dict:
    return {"project": request.project, "access": request.access, **extra}


# A secret left in the session (the page after the redirect never came) is not shown later.
NEW_TOKEN_SHOWN_FOR_S = 300
NEW_TOKEN_KEY = "lifeboat.new_token"  # noqa: S105 (a session key, not a secret)


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def tokens(request):
    """Post/redirect/get: the POST creates the token and puts its secret in the session;
    the GET after the redirect takes it out and shows it, once. A reload shows the page
    without the secret and creates nothing."""
    form = TokenForm(request.POST or None)

    def issue(caller):
        issued = actions.create_token(
            caller, form.cleaned_data["name"], form.cleaned_data["scopes"]
        )
        request.session[NEW_TOKEN_KEY] = {
            "project": request.project.pk,
            "token": issued.token.pk,
            "secret": issued.secret,
            "until": time.time() + NEW_TOKEN_SHOWN_FOR_S,
        }

    if done := submitted(request, form, issue, "dashboard:settings-tokens"):
        return done
    created = None
    shown = request.session.pop(NEW_TOKEN_KEY, None) if request.method == "GET" else None
    if shown and shown.get("project") == request.project.pk and shown.get("until", 0) > time.time():
        token = request.project.tokens.filter(pk=shown["token"]).first()
        if token is not None:
            created = {"token": token, "secret": shown["secret"]}
    token_list = request.project.tokens.order_by("revoked_at", "-created_at").select_related(
        "created_by"
    )
    response = render(
        request,
        "dashboard/settings_tokens.html",
        _settings_context(request, form=form, tokens=token_list, created=created, tab="tokens"),
    )
    response["Cache-Control"] = "no-store"  # the secret must not stay in a cache
    return response


@require_POST
@project_view(Role.ADMIN)
def token_revoke(request, token_id: int):
    token = get_object_or_404(ApiToken, project=request.project, pk=token_id)
    return change(
        request,
        lambda caller: actions.revoke_token(caller, token),
        "dashboard:settings-tokens",
        done=lambda revoked: (
            f"Token {token.name} is revoked; requests with it now get 401." if revoked else None
        ),
    )


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def storage_targets(request):
    form = StorageTargetForm(request.POST or None, project=request.project)
    if done := added(
        request, form, actions.create_target, "Storage target", "dashboard:settings-storage"
    ):
        return done
    newest_audit = StorageAudit.objects.filter(target=OuterRef("pk")).order_by("-started_at")
    targets = list(
        request.project.storage_targets.annotate(
            replica_count=Count("replicas"), last_audit_id=Subquery(newest_audit.values("pk")[:1])
        ).order_by("name")
    )
    audits = StorageAudit.objects.in_bulk([t.last_audit_id for t in targets if t.last_audit_id])
    for target in targets:
        target.last_audit = audits.get(target.last_audit_id)
        # Where the copies really go: the target's own endpoint, else the deployment's.
        target.shown_endpoint = target.endpoint_url or settings.S3_ENDPOINT_URL
        target.endpoint_is_default = not target.endpoint_url
    return render(
        request,
        "dashboard/settings_storage.html",
        _settings_context(request, form=form, targets=targets, tab="storage"),
    )


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def launch_profiles(request):
    form = profile_form(request)
    if done := added(
        request, form, actions.create_profile, "Launch profile", "dashboard:settings-profiles"
    ):
        return done
    profiles = list(request.project.launch_profiles.annotate(used=Count("resume")).order_by("name"))
    for profile in profiles:
        # A profile saved before templates were checked: say so, it will not launch.
        try:
            profile.clean()
        except ValidationError as exc:
            profile.refusal = " ".join(exc.messages)
    return render(
        request,
        "dashboard/settings_profiles.html",
        _settings_context(
            request,
            form=form,
            profiles=profiles,
            placeholders=placeholder_rows(),
            preview=True,
            tab="profiles",
        ),
    )
