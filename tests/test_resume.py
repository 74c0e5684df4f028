"""One-click resume with the `local` profile: examples/train_digits.py restarted from a
chosen checkpoint whose local copy was deleted (restored from S3 first), the new run a
child of that checkpoint; shell metacharacters in a value stay one argument; only
operators may resume."""

from __future__ import annotations

import hashlib
import shlex
import sys
import uuid

import pytest

from tests.support.celery_workers import queued_tasks
from tests.support.client_scripts import train_digits
from tests.support.events import saved
from tests.support.resume import follow_until_done
from tests.support.servers import ROOT
from webapp.domain.models import Checkpoint, LaunchProfile, Replica, Resume, Run, StorageTarget
from webapp.domain.recovery import resume as resumes
from webapp.domain.replication import policy
from workers.launch import follow_resume, launch_resume
from workers.replicate import replicate
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_resume_restores_a_deleted_checkpoint_then_restarts_the_job(
    kind, request, server, s3, api, token, project, tmp_path, queues, settings
):
    if kind == "slurm":
        request.getfixturevalue("slurm_cluster")  # a real single-node Slurm
    settings.VAR_DIR = tmp_path / "var"
    settings.LAUNCH_LIFEBOAT_URL = server.url  # where the resumed job reports, with its token
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    env = train_digits(server, token, tmp_path, "digits")
    del env["LIFEBOAT_TOKEN"]  # the job gets a token of its own
    del env["PATH"]  # the deployment's (LAUNCH_BASE_ENV): a profile may not set it
    chosen = Checkpoint.objects.get(run__key="digits", step=23)
    validate_checkpoint(chosen.pk)
    target = StorageTarget.objects.create(
        project=project,
        name="backup",
        bucket=s3.bucket,
        prefix=f"resume-{uuid.uuid4().hex[:6]}",
        endpoint_url=s3.endpoint,
    )
    (replica_id,) = policy.request(Checkpoint.objects.get(pk=chosen.pk), [target], by_policy=False)
    replicate(replica_id)
    assert Replica.objects.get(pk=replica_id).status == "verified"
    local = tmp_path / "ckpt" / "digits" / "epoch-000-step-23.pt"
    original_sha = hashlib.sha256(local.read_bytes()).hexdigest()
    local.unlink()  # the node that held it is gone

    LaunchProfile.objects.create(
        project=project,
        name="again",
        kind=kind,
        command_template=(
            f"{shlex.quote(sys.executable)} examples/train_digits.py --run {{{{new_run_key}}}} "
            f"--epochs 3 --resume-from {{{{checkpoint_path}}}} "
            f"--checkpoint-dir {shlex.quote(str(tmp_path / 'ckpt'))}"
        ),
        options={"workdir": str(ROOT), "env": env},
    )
    answer = api.post(token, f"/checkpoints/{chosen.pk}/resume", {"profile": "again"})
    assert answer.status_code == 202, answer.content
    resume_id = answer.json()["id"]
    assert '--resume-from "${LIFEBOAT_CHECKPOINT_PATH}"' in answer.json()["command"]
    (task,) = queued_tasks(queues, "launch")
    assert task == {"task": "workers.launch.launch_resume", "args": [resume_id], "kwargs": {}}

    launch_resume(resume_id)  # what the launch worker does with that message
    assert hashlib.sha256(local.read_bytes()).hexdigest() == original_sha  # restored
    external = Resume.objects.get(pk=resume_id).external_id
    assert external.startswith("slurm:" if kind == "slurm" else "pid:")
    resume = follow_until_done(resume_id)
    assert resume.status == "succeeded", resume.error
    assert f"resumed from {local} (epoch 0, step 23)" in resumes.output_tail(resume)
    child = Run.objects.get(key=f"digits-resume-{resume_id}")
    assert child.resumed_from_id == chosen.pk and child.status == "finished"
    assert resume.new_run_id == child.pk
    assert sorted(child.checkpoints.values_list("step", flat=True)) == [46, 69]
    # Following it again changes nothing.
    assert follow_resume(resume_id) == "succeeded"
    shown = api.get(token, f"/resumes/{resume_id}").json()
    assert shown["new_run"] == child.key and "epoch 2" in shown["output"]
    # The job reported with its own token, revoked now that the resume has ended.
    assert resume.token.scopes == ["ingest", "read"] and resume.token.revoked_at is not None


def test_a_value_with_shell_metacharacters_stays_one_argument(
    api, token, project, tmp_path, queues, settings
):
    settings.VAR_DIR = tmp_path / "var"
    nasty = "x; touch pwned $(touch pwned2) `touch pwned3` 'q\" && echo"
    project.allowed_roots = ["/data"]
    project.save()
    assert api.post_events(token, saved(run=nasty, step=1)).status_code == 202
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    LaunchProfile.objects.create(
        project=project,
        name="echo",
        kind="local",
        command_template="printf '%s\\n' {{run_key}} > args.txt",
        options={"workdir": str(tmp_path)},
    )
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "echo"})
    assert answer.status_code == 202, answer.content
    resume = Resume.objects.get()
    # The checkpoint's files are not on this machine and it has no replica: preparing
    # fails, clearly, and nothing runs.
    launch_resume(resume.pk)
    resume.refresh_from_db()
    assert resume.status == "failed" and "no verified replica" in resume.error
    # Started directly, the command prints the value as one line, and runs nothing else.
    resume.status = "launching"
    resume.save()
    resumes.start(resume)
    assert follow_until_done(resume.pk, 30).status == "succeeded"
    assert (tmp_path / "args.txt").read_text() == nasty + "\n"
    assert not any((tmp_path / name).exists() for name in ("pwned", "pwned2", "pwned3"))


def test_templates_are_checked_and_only_operators_resume(api, token, read_token, project, queues):
    assert api.post_events(token, saved(run="r", step=1)).status_code == 202
    checkpoint = Checkpoint.objects.get()
    LaunchProfile.objects.create(
        project=project,
        name="bad",
        kind="local",
        command_template="train --from {{checkpont_path}}",
    )
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "bad"})
    assert answer.status_code == 409
    assert "checkpoint" in answer.json()["error"]  # not verified yet
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "bad"})
    assert answer.status_code == 409
    assert "unknown placeholder {{checkpont_path}}" in answer.json()["error"]
    assert (
        api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "nope"}).status_code
        == 404
    )
    refused = api.client.post(
        f"/api/v1/checkpoints/{checkpoint.pk}/resume",
        data='{"profile": "bad"}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {read_token}",
    )
    assert refused.status_code == 403
    assert not Resume.objects.exists()
