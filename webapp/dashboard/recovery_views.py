"""Recovery from the checkpoint page: a restore test (fetch from a verified replica, load,
time each phase) and a resume (restart the run from this checkpoint with a launch
profile, after a confirmation that shows exactly the command that will run).

Both are for operators; both call the same functions as the API
(webapp.domain.actions.restore_test, .resume, .cancel_resume), which queue their tasks
only once their transaction commits."""

from __future__ import annotations

import hashlib

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.dashboard.views import _after_action, _get_checkpoint, resume_refusal
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.models.projects import Role


@require_POST
@project_view(Role.OPERATOR)
def checkpoint_restore_test(request, checkpoint_id: int):
    """Queue a restore test, unless one is already queued or running (then say so)."""
    checkpoint = _get_checkpoint(request, checkpoint_id)
    try:
        requested = actions.restore_test(checkpoint, actor_of(request))
    except ActionRefused as exc:
        return _after_action(request, checkpoint, f"No restore test: {exc}.", messages.ERROR)
    if requested.coalesced:
        return _after_action(
            request,
            checkpoint,
            f"A restore test of step {checkpoint.step} is already {requested.validation.status}.",
            messages.INFO,
        )
    return _after_action(
        request,
        checkpoint,
        f"Step {checkpoint.step} is queued for a restore test: download from a replica, "
        "load, and move to the device, each phase timed.",
    )


# --- Resume ---------------------------------------------------------------------------


def template_digest(profile) -> str:
    """What the person confirmed: if an admin edits the profile in between, the command
    that would run is not the one they saw, and the confirmation is asked again."""
    return hashlib.sha256(profile.command_template.encode()).hexdigest()[:16]


def preview_values(checkpoint) -> dict:
    """The values the resume will get, before it exists: its number shows as N."""
    from webapp.domain import resume as resumes

    return resumes.template_values(checkpoint, "N")


def _variables_used(profile, values) -> list[tuple[str, str]]:
    """The job's variables that the command refers to, with the values they will hold:
    what a person reads to know what will run."""
    from webapp.domain.launch.template import PLACEHOLDER, env_name

    if profile is None:
        return []
    names = dict.fromkeys(m.group(1) for m in PLACEHOLDER.finditer(profile.command_template))
    return [(env_name(n), str(values[n])) for n in names if n in values]


@require_http_methods(["GET", "POST"])
@project_view(Role.OPERATOR)
def checkpoint_resume(request, checkpoint_id: int):
    """GET ?profile=<id>: what will run, to confirm. POST (profile, digest): do it."""
    from webapp.domain import resume as resumes

    checkpoint = _get_checkpoint(request, checkpoint_id)
    profiles = list(request.project.launch_profiles.order_by("name"))
    chosen = request.POST.get("profile") if request.method == "POST" else request.GET.get("profile")
    profile = next((p for p in profiles if str(p.pk) == str(chosen)), None)
    error = resume_refusal(checkpoint)
    if not profiles:
        error = error or "this project has no launch profile; an admin adds one in Settings"
    elif profile is None and chosen:
        error = "choose one of this project's launch profiles"
    values = preview_values(checkpoint)
    command = ""
    if profile is not None:
        try:
            command = resumes.render(profile.command_template)
        except resumes.ResumeError as exc:
            error = error or str(exc)

    blocked = bool(error)
    if request.method == "POST" and profile is not None and not error:
        if request.POST.get("digest") != template_digest(profile):
            error = (
                f"launch profile {profile.name} changed since you looked: check the command "
                "below again"
            )
        else:
            try:
                resume = actions.resume(checkpoint, profile, actor_of(request), user=request.user)
            except ActionRefused as exc:
                error, blocked = str(exc), True
            else:
                messages.success(
                    request,
                    f"Resume {resume.pk} of step {checkpoint.step} with {profile.name} is "
                    f"queued for launch: {resume.command}",
                )
                return redirect("dashboard:checkpoint", request.project.slug, checkpoint.pk)

    context = {
        "project": request.project,
        "access": request.access,
        "checkpoint": checkpoint,
        "profiles": profiles,
        "profile": profile,
        "command": command,
        "digest": template_digest(profile) if profile is not None else "",
        "values": values,
        "variables": _variables_used(profile, values),
        "error": error,
        "blocked": blocked,
    }
    status = 400 if request.method == "POST" and error else 200
    return render(request, "dashboard/checkpoint_resume.html", context, status=status)
