"""One-click resume: restart a run from a chosen checkpoint with a launch profile.

1. request(): an operator picks a checkpoint and a profile. The command is rendered from
   the profile's template (written by a project admin): no value ever enters its text,
   each placeholder becomes a reference to an environment variable of the job
   (webapp/domain/launch/template.py), and a Resume row is queued for the `launch` queue
   (`launch.<host>` when the profile pins a host), after the transaction commits.
2. prepare(): the checkpoint must be where the job expects it. The local copy is checked
   (sizes and sha256, like the validation); when it is missing or damaged it is restored
   from a verified replica into its own location, verified, the damaged copy moved aside.
3. start(): `local` runs the command as a process of the launch worker's host, its output
   kept in var/launch/resume-<id>/output.log and its exit status in `exit_code`; `slurm`
   submits it with sbatch (webapp/domain/launch/slurm.py). The job's environment is built,
   never inherited (webapp/domain/launch/job_env.py): LIFEBOAT_RUN (the new run's key),
   LIFEBOAT_RESUMED_FROM (the checkpoint's id), LIFEBOAT_CHECKPOINT (its path),
   LIFEBOAT_URL and a LIFEBOAT_TOKEN made for this resume (ingest and read, revoked when
   the resume ends), so the client reports `run.started` with `resumed_from` and the new
   run appears as a child of that checkpoint.
4. follow(): until the job ends (the process's exit status, or Slurm's final state); the
   end of its output is kept redacted in Resume.output, for operators.

Template placeholders are written {{name}} so that shell braces (${HOME}) stay as they
are: checkpoint_path, checkpoint_dir, checkpoint_id, step, run_key, new_run_key,
resume_id; {{name}} reaches the job as LIFEBOAT_<NAME>.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webapp.domain import confined_files, publish
from webapp.domain.launch import job_env as envs
from webapp.domain.launch import job_token, run_as, slurm
from webapp.domain.launch import template as templates
from webapp.domain.launch.redact import redact
from webapp.domain.launch.template import NAMES, PLACEHOLDER  # noqa: F401 (re-exported)
from webapp.domain.models import Event, Resume, Run
from webapp.domain.models.recovery import ReplicaStatus, ResumeStatus
from webapp.domain.recovery import reshard
from webapp.domain.recovery.errors import ResumeError
from webapp.domain.recovery.reshard import saved_world_size
from webapp.domain.replication.restore import RestoreError, restore_replica
from webapp.domain.validation.integrity import FileSpec, check_local

FINAL = ("succeeded", "failed", "cancelled")
LAUNCH = "workers.launch.launch_resume"


def check_template(template: str) -> None:
    """ResumeError when the template is refused (webapp/domain/launch/template.py)."""
    try:
        templates.check(template)
    except templates.TemplateRefused as exc:
        raise ResumeError(str(exc)) from None


def render(template: str) -> str:
    """The command as it runs: every {{name}} a reference to the job's LIFEBOAT_<NAME>
    variable, so that no value can become code (ResumeError when refused)."""
    try:
        return templates.render(template)
    except templates.TemplateRefused as exc:
        raise ResumeError(str(exc)) from None


def template_values(checkpoint, resume_id, world_size: int | None = None) -> dict:
    """What the placeholders stand for. `resume_id` is the Resume's id, or a stand-in
    ("N") for the confirmation a person reads before it exists; `world_size` the one the
    job is launched on (the checkpoint's own when None; '' when nobody knows it)."""
    location = checkpoint.location.rstrip("/")
    single = (
        checkpoint.file_count == 1
        and checkpoint.files.filter(path=os.path.basename(location)).exists()
    )
    return {
        "checkpoint_path": location,
        "checkpoint_dir": os.path.dirname(location) if single else location,
        "checkpoint_id": checkpoint.pk,
        "step": checkpoint.step,
        "run_key": checkpoint.run.key,
        "new_run_key": f"{checkpoint.run.key}-resume-{resume_id}"[:200],
        "resume_id": resume_id,
        "world_size": world_size or saved_world_size(checkpoint) or "",
    }


def values_for(resume) -> dict:
    return template_values(resume.checkpoint, resume.pk, resume.world_size)


def new_run_key(resume) -> str:
    return template_values(resume.checkpoint, resume.pk)["new_run_key"]


def queue_for(profile) -> str:
    return f"launch.{profile.host}" if profile.host else "launch"


def request(
    checkpoint, profile, *, user=None, actor: str = "", automatic: bool = False,
    world_size: int | None = None,
):  # fmt: skip
    """Create the Resume and queue its launch after commit. Call inside a transaction.
    `world_size`: launch on that many ranks ({{world_size}} in the profile's command);
    the checkpoint is loaded on it before the job starts when it is not its own."""
    refusal = checkpoint.resume_refusal()  # the one rule (models/checkpoints.resumable_q)
    if refusal:
        raise ResumeError(refusal)
    if profile.project_id != checkpoint.project_id:
        raise ResumeError("that launch profile belongs to another project")
    try:
        check_template(profile.command_template)
    except ResumeError as exc:
        raise ResumeError(
            f"launch profile {profile.name} cannot be used until an admin rewrites its "
            f"command: {exc}"
        ) from None
    if world_size is not None:
        if not templates.uses(profile.command_template, "world_size"):
            raise ResumeError(
                f"launch profile {profile.name} takes no world size: its command has no "
                "{{world_size}}"
            )
        refused = reshard.refusal(checkpoint, world_size)
        if refused:
            raise ResumeError(refused)
    resume = Resume.objects.create(
        world_size=world_size,
        project_id=checkpoint.project_id,
        run_id=checkpoint.run_id,
        checkpoint=checkpoint,
        profile=profile,
        requested_by=user,
        automatic=automatic,
    )
    resume.command = render(profile.command_template)
    resume.save(update_fields=["command"])
    Event.record(
        "resume.requested",
        checkpoint=checkpoint,
        actor=actor or (f"user:{user.get_username()}" if user else "system"),
        message=f"Resume from step {checkpoint.step} with profile {profile.name}"
        + (f" on {world_size} ranks" if world_size else ""),
        data={
            "resume": resume.pk,
            "profile": profile.name,
            "command": resume.command,
            "world_size": world_size,
        },  # fmt: skip
    )
    transaction.on_commit(lambda: enqueue_launch(resume.pk, queue_for(profile)))
    return resume


def enqueue_launch(resume_id: int, queue: str) -> None:
    publish.send(LAUNCH, (resume_id,), queue=queue)


def enqueue_follow(resume, countdown: float = 0) -> None:
    queue = queue_for(resume.profile) if resume.profile else "launch"
    publish.send("workers.launch.follow_resume", (resume.pk,), queue=queue, countdown=countdown)


def follow_due(resume_id: int) -> bool:
    """Take this look at the job: False when another follow task looked within the last
    interval, so that a second chain of follow tasks (one the sweeper started while the
    first was only late) ends instead of doubling every look."""

    now = timezone.now()
    recent = now - timedelta(seconds=settings.LAUNCH_FOLLOW_S * 0.8)
    due = Q(followed_at__isnull=True) | Q(followed_at__lt=recent)
    return Resume.objects.filter(due, pk=resume_id).update(followed_at=now) == 1


def _set(resume, **fields) -> None:
    """Save these fields; a final status also revokes the job's token."""
    for name, value in fields.items():
        setattr(resume, name, value)
    resume.updated_at = timezone.now()
    resume.save(update_fields=[*fields, "updated_at"])
    if fields.get("status") in FINAL:
        job_token.revoke(resume)


def claim(resume_id: int):
    """Take a requested resume; None if another worker has it or it is past that."""

    taken = Resume.objects.filter(pk=resume_id, status=ResumeStatus.REQUESTED).update(
        status=ResumeStatus.RESTORING, updated_at=timezone.now()
    )
    if taken != 1:
        return None
    return Resume.objects.select_related("checkpoint", "run", "profile", "project").get(
        pk=resume_id
    )


# -- 2. the checkpoint where the job expects it ---------------------------------------------------


def prepare(resume) -> str:
    """Make sure the checkpoint's files are at its location, whole. Returns what was done.

    Every file operation walks from an allowed root's descriptor (confined_files): the
    damaged copy moved aside, the staging folder, the files moved into place. A location
    that leads out of the roots, by '..' or by a symlink at any level (even one swapped
    in now), is a ResumeError; nothing is written anywhere else."""

    checkpoint = resume.checkpoint
    user = job_user(resume)  # refused before anything is written, not after
    if checkpoint.location.startswith("s3://"):
        return "the checkpoint lives in object storage; the job reads it from there"
    specs = [FileSpec(*row) for row in checkpoint.files.values_list("path", "size", "sha256")]
    report = check_local(checkpoint.location, specs, checkpoint.project.allowed_roots)
    if report.ok:
        return "the local copy is whole"
    replica = (
        checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED)
        .select_related("target")
        .order_by("-verified_at")
        .first()
    )
    why = "; ".join(f.message for f in report.findings[:3]) or "it is not whole"
    if replica is None:
        raise ResumeError(f"the local copy is unusable ({why}) and there is no verified replica")
    try:
        with confined_files.Tree(checkpoint.project.allowed_roots) as tree:
            _restore_in_place(tree, resume, checkpoint, specs, replica, user)
    except confined_files.Refused as exc:
        raise ResumeError(f"not restoring into {checkpoint.location}: refused: {exc}") from None
    return f"the local copy was {why}; restored from {replica.target.name}, verified"


def job_user(resume):
    """The Unix user a local job runs as (None: the worker's own, where the deployment
    allows it); a Slurm job runs as Slurm starts it, on its node. ResumeError when the
    deployment cannot start it without handing it the worker's secrets."""
    if resume.profile.kind == "slurm":
        return None
    try:
        return run_as.for_project(resume.project.slug)
    except run_as.RunAsRefused as exc:
        raise ResumeError(str(exc)) from None


def _restore_in_place(tree, resume, checkpoint, specs, replica, user=None) -> None:
    location = tree.locate(checkpoint.location.rstrip("/"), "checkpoint location")
    if not location.parts:
        raise confined_files.Refused(f"{location} is an allowed root itself, not a checkpoint")
    single = len(specs) == 1 and specs[0].path == location.name
    target_dir = location.parent if single else location
    if not target_dir.parts:
        raise confined_files.Refused(f"{target_dir} is an allowed root; it is not replaced")
    with contextlib.suppress(FileNotFoundError):
        tree.lstat(location)
        # Keep the damaged copy for a person to look at; never overwrite evidence. The
        # entry is moved, never what a symlink there points to.
        aside = location.parent.join(f"{location.name}.damaged-{timezone.now():%Y%m%d%H%M%S}")
        tree.rename(location, aside)
    staging = target_dir.parent.join(f".{target_dir.name}.restoring-{resume.pk}")
    tree.remove_tree(staging)
    tree.mkdir(staging, 0o700)
    # The download writes through the staging folder's descriptor (/proc/self/fd/N):
    # the folder it checked, whatever happens to the names above it meanwhile.
    staging_fd = tree.open_dir(staging)
    try:
        restore_replica(replica, confined_files.fd_path(staging_fd))
        run_as.hand_over(user, staging_fd)  # the job reads (and replaces) its checkpoint
    except RestoreError as exc:
        tree.remove_tree(staging)
        raise ResumeError(f"restoring from {replica.target.name} failed: {exc}") from None
    finally:
        os.close(staging_fd)
    if single:
        tree.rename(staging.join(location.name), location)
        tree.remove_tree(staging)
    else:
        tree.rename(staging, target_dir)


# -- 3. start, 4. follow --------------------------------------------------------------------------


def launch_dir(resume) -> Path:
    return Path(settings.VAR_DIR) / "launch" / f"resume-{resume.pk}"


def job_env(resume, token: str) -> dict[str, str]:
    """The job's whole environment (webapp/domain/launch/job_env.py)."""

    try:
        return envs.build(
            values_for(resume),
            profile_env=resume.profile.options.get("env") or {},
            checkpoint_id=resume.checkpoint_id,
            token=token,
        )
    except envs.JobEnvError as exc:
        raise ResumeError(str(exc)) from None


def start(resume) -> None:
    """Launch the job. The template is checked again and must still give the command that
    was shown and stored (a profile edited since, or a resume queued before templates
    were checked, is refused). Raises ResumeError."""

    command = render(resume.profile.command_template)
    if command != resume.command:
        raise ResumeError(
            f"launch profile {resume.profile.name} changed since this resume was requested; "
            "request it again to see the command that would run"
        )
    env = job_env(resume, job_token.issue(resume))
    folder = launch_dir(resume)
    folder.mkdir(parents=True, exist_ok=True)
    workdir = resume.profile.options.get("workdir") or str(settings.BASE_DIR)
    log_path = folder / "output.log"
    if resume.profile.kind == "slurm":
        job_id = slurm.submit(
            "#!/bin/bash\n" + command + "\n",
            job_name=f"lifeboat-resume-{resume.pk}",
            output_path=str(log_path),
            workdir=workdir,
            env=env,
        )
        _set(resume, status=ResumeStatus.LAUNCHING, external_id=f"slurm:{job_id}")
        return
    user = job_user(resume)
    if user is not None:
        # Nothing of the worker's var/ is the job's to read: it writes through the
        # descriptors the wrapper (the worker's user) opens for it.
        for private in (Path(settings.VAR_DIR), folder.parent, folder):
            private.chmod(0o700)
    script = folder / "command.sh"
    script.write_text("#!/bin/bash\n" + command + "\n")
    exit_file = folder / "exit_code"
    exit_file.unlink(missing_ok=True)
    # The wrapper records the exit status in a file: the follow task may run in another
    # process than the one that started the job, and only a parent can wait() for it. It
    # runs as the worker's user; the job itself as the project's job user (run_as.py),
    # its script and its log opened for it by the wrapper (descriptor 3, and 1 and 2).
    bash = shutil.which("bash") or "/bin/bash"
    as_user = " ".join(shlex.quote(a) for a in run_as.prefix(user))
    wrapper = (
        f"{as_user} {shlex.quote(bash)} /dev/fd/3 3< {shlex.quote(str(script))} "
        f"> {shlex.quote(str(log_path))} 2>&1; echo $? > {shlex.quote(str(exit_file))}"
    ).lstrip()
    process = subprocess.Popen(
        [bash, "-c", wrapper],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _set(resume, status=ResumeStatus.RUNNING, external_id=f"pid:{process.pid}")


def output_tail(resume, lines: int = 40) -> str:
    """The end of the job's output, secrets redacted: the log file on this host while it
    is there, else what was kept when the job ended. For operators and above only."""

    path = launch_dir(resume) / "output.log"
    try:
        return redact("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
    except FileNotFoundError:
        return "\n".join(resume.output.splitlines()[-lines:])


def follow(resume) -> bool:
    """Look once; True when the job has ended (and the Resume says how)."""

    if resume.new_run_id is None:
        child = Run.objects.filter(project_id=resume.project_id, key=new_run_key(resume)).first()
        if child is not None:
            _set(resume, new_run=child)
    kind, _, ident = resume.external_id.partition(":")
    if kind == "slurm":
        state = slurm.state(ident)
        if not state.final:
            if state.state == "RUNNING" and resume.status != ResumeStatus.RUNNING:
                _set(resume, status=ResumeStatus.RUNNING)
            return False
        ok = state.state == "COMPLETED" and state.exit_code == 0
        cancelled = state.state == "CANCELLED"
        detail = f"Slurm job {ident} ended {state.state} with exit code {state.exit_code}"
    else:
        exit_file = launch_dir(resume) / "exit_code"
        if not exit_file.exists():
            pid = int(ident or 0)
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                # Gone without writing its status: killed with its wrapper, or the host
                # rebooted. Read once more: it may have finished just now.
                if not exit_file.exists():
                    _set(
                        resume,
                        status=ResumeStatus.FAILED,
                        error="the process ended without an exit status (killed?)",
                        output=output_tail(resume, 40),
                    )
                    return True
            except PermissionError:
                return False
        code = int(exit_file.read_text().strip() or 1)
        ok, cancelled = code == 0, resume.status == ResumeStatus.CANCELLED
        detail = f"the process exited with code {code}"
    # The tail is kept apart from the error: the error is shown to every member, the
    # output to operators and above only.
    output = output_tail(resume, 40)
    if cancelled:
        _set(resume, status=ResumeStatus.CANCELLED, error=detail, output=output)
    elif ok:
        _set(resume, status=ResumeStatus.SUCCEEDED, error="", output=output)
    else:
        _set(resume, status=ResumeStatus.FAILED, error=detail, output=output)
    Event.record(
        f"resume.{resume.status}",
        checkpoint=resume.checkpoint,
        actor="worker:launch",
        message=detail,
        data={"resume": resume.pk},
    )
    return True


def cancel(resume) -> None:
    kind, _, ident = resume.external_id.partition(":")
    if kind == "slurm":
        slurm.cancel(ident)
    elif kind == "pid" and ident:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(ident), signal.SIGTERM)
    _set(resume, status=ResumeStatus.CANCELLED)
