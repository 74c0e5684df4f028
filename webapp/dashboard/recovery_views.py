"""Recovery from the checkpoint page: a restore test (fetch from a verified replica, load,
time each phase) and a resume (restart the run from this checkpoint with a launch
profile, after a confirmation that shows exactly the command that will run).

Both are for operators; both call the same functions as the API
(webapp.domain.actions.restore_test, .resume, .cancel_resume), which queue their tasks
only once their transaction commits."""

from __future__ import annotations

import hashlib

from django.contrib import messages
from django.db.models import Q
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling

from webapp.dashboard.access import actor_of, project_view
from webapp.dashboard.views import _after_action, _get_checkpoint
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.health import families
from webapp.domain.launch.template import PLACEHOLDER, env_name, uses
from webapp.domain.models import Checkpoint
from webapp.domain.models.projects import Role
from webapp.domain.models.runs import Health, RunStatus
from webapp.domain.recovery import auto_resume
from webapp.domain.recovery import resume as resumes
from webapp.domain.recovery.reshard import saved_world_size
from webapp.domain.recovery.resume import FINAL

# The run page's resume rows poll this often while one is on its way: the launch worker
# looks at the job every LAUNCH_FOLLOW_S, so a change shows within a few seconds.
RESUME_POLL_MS = 2000


@require_POST
@project_view(Role.OPERATOR)
def checkpoint_release(request, checkpoint_id: int):
    """Out of quarantine (webapp.domain.actions.release, as the API's POST .../release)."""
    checkpoint = _get_checkpoint(request, checkpoint_id)
    if actions.release(checkpoint, actor_of(request)):
        text = f"Step {checkpoint.step} is released: resumes may start from it again."
        return _after_action(request, checkpoint, text)
    return _after_action(request, checkpoint, f"Step {checkpoint.step} was not quarantined.")


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


def preview_values(checkpoint, world_size: int | None = None) -> dict:
    """The values the resume will get, before it exists: its number shows as N."""

    return resumes.template_values(checkpoint, "N", world_size)


def _world_size(data) -> tuple[int | None, str]:
    """The world size asked for (blank: the checkpoint's own), or the reason it is not one."""
    text = (data.get("world_size") or "").strip()
    if not text:
        return None, ""
    if not text.isdigit() or not 1 <= int(text) <= 100_000:
        return None, "the world size must be a whole number of at least 1"
    return int(text), ""


def _variables_used(profile, values) -> list[tuple[str, str]]:
    """The job's variables that the command refers to, with the values they will hold:
    what a person reads to know what will run."""

    if profile is None:
        return []
    names = dict.fromkeys(m.group(1) for m in PLACEHOLDER.finditer(profile.command_template))
    return [(env_name(n), str(values[n])) for n in names if n in values]


@require_http_methods(["GET", "POST"])
@project_view(Role.OPERATOR)
def checkpoint_resume(request, checkpoint_id: int):
    """GET ?profile=<id>: what will run, to confirm. POST (profile, digest): do it."""

    checkpoint = _get_checkpoint(request, checkpoint_id)
    profiles = list(request.project.launch_profiles.order_by("name"))
    chosen = request.POST.get("profile") if request.method == "POST" else request.GET.get("profile")
    profile = next((p for p in profiles if str(p.pk) == str(chosen)), None)
    error = checkpoint.resume_refusal()
    if not profiles:
        error = error or "this project has no launch profile; an admin adds one in Settings"
    elif profile is None and chosen:
        error = "choose one of this project's launch profiles"
    form = request.POST if request.method == "POST" else request.GET
    world_size, bad_size = _world_size(form)
    error = error or bad_size
    takes_world_size = profile is not None and uses(profile.command_template, "world_size")
    values = preview_values(checkpoint, world_size if takes_world_size else None)
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
                resume = actions.resume(
                    checkpoint, profile, actor_of(request), user=request.user,
                    world_size=world_size if takes_world_size else None,
                )  # fmt: skip
            except ActionRefused as exc:
                error, blocked = str(exc), True
            else:
                messages.success(
                    request,
                    f"Resume {resume.pk} of step {checkpoint.step} with {profile.name} is "
                    f"queued for launch: {resume.command}",
                )
                # Post/redirect/get, to the resume's live row on the run page.
                run_page = reverse("dashboard:run", args=[request.project.slug, checkpoint.run.key])
                return redirect(f"{run_page}#resume-{resume.pk}")

    context = {
        "project": request.project,
        "access": request.access,
        "checkpoint": checkpoint,
        "profiles": profiles,
        "profile": profile,
        "command": command,
        # Wrapped between words only: a word's own hyphens are no place to break it.
        "command_words": command.split(" "),
        "template_words": profile.command_template.split(" ") if profile is not None else [],
        "digest": template_digest(profile) if profile is not None else "",
        "values": values,
        "variables": _variables_used(profile, values),
        "error": error,
        "blocked": blocked,
        "takes_world_size": takes_world_size,
        "world_size": world_size,
        "saved_world_size": saved_world_size(checkpoint),
    }
    status = 400 if request.method == "POST" and error else 200
    return render(request, "dashboard/checkpoint_resume.html", context, status=status)


# --- The run page: recovery where the trouble shows --------------------------------------


def recovery_offer(request, run, family) -> dict | None:
    """For a failed or overdue run: the newest checkpoint a resume can start from along
    its lineage (resume.latest_resumable, the one rule) and the launch profiles to start
    it with; None for a run that is fine, or whose family has recovered already (its
    lineage lines say so)."""

    if run.status != RunStatus.FAILED and run.health != Health.OVERDUE:
        return None
    if family.state in (families.RECOVERED, families.RECOVERED_RUNNING):
        return None
    chain = auto_resume.lineage(run)
    checkpoint = auto_resume.latest_resumable(chain)
    # The newer ones it passes over because they are quarantined: said on the page.
    newer = Q(step__gt=checkpoint.step) if checkpoint is not None else Q()
    quarantined = list(
        Checkpoint.objects.filter(run__in=chain, quarantined_at__isnull=False)
        .filter(newer)
        .order_by("-step")[:5]
    )
    return {
        "why": "failed" if run.status == RunStatus.FAILED else "overdue",
        "resuming": family.resuming,
        "checkpoint": checkpoint,
        "quarantined": quarantined,
        "via_replica": checkpoint is not None and checkpoint.status != "verified",
        "profiles": list(request.project.launch_profiles.order_by("name")),
    }


def resumes_context(request, run) -> dict:
    """The resumes from the run's checkpoints, newest first, and whether to keep polling."""

    resumes = list(
        run.resumes.select_related("checkpoint", "profile", "requested_by", "new_run").order_by(
            "-created_at"
        )[:20]
    )
    children = [r.new_run_id for r in resumes if r.new_run_id]
    labels = families.families_of(request.project.pk, children) if children else {}
    for resume in resumes:
        resume.is_final = resume.status in FINAL
        if resume.new_run_id:
            resume.new_run_label = labels[resume.new_run_id].label(resume.new_run_id)
    return {
        "resumes": resumes,
        "resumes_polling": any(not r.is_final for r in resumes),
        "resume_poll_ms": RESUME_POLL_MS,
        "resumes_url": f"{request.path}?resumes=1",
    }


def resumes_fragment(request, run):
    """The resume rows, and out of band the family's state and the recovery offer,
    which a resume's progress changes."""

    family = families.families_of(request.project.pk, [run])[run.pk]
    context = {
        "project": request.project,
        "access": request.access,
        "run": run,
        "family": family,
        "recover": recovery_offer(request, run, family),
        "oob": True,
        **resumes_context(request, run),
    }
    response = render(request, "dashboard/run_detail.html#resumes", context)
    if not context["resumes_polling"]:
        response.status_code = HttpResponseStopPolling.status_code
    return response
