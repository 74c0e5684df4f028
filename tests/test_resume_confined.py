"""Resume restores a damaged checkpoint into its own location, and nowhere else: with the
folder that holds it replaced by a symlink out of the roots, the resume fails with the
reason (on the Resume and in the event log) and the files out there are untouched.
Real files and symlinks, a real replica in S3 (SeaweedFS)."""

from __future__ import annotations

import hashlib
import os

import pytest
from django.utils import timezone

from tests.support.replication import make_checkpoint, make_target, replicate_now
from webapp.domain.models import (
    Checkpoint,
    CheckpointFile,
    Event,
    LaunchProfile,
    Resume,
    Run,
)
from workers.launch import launch_resume

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path, project, settings):
    settings.VAR_DIR = tmp_path / "var"
    root = tmp_path / "ckpts"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    return root


def single_file(project, root) -> Checkpoint:
    run, _ = Run.objects.get_or_create(project=project, key="run-1")
    data = os.urandom(5000)
    (root / "run-1").mkdir()
    (root / "run-1" / "last.pt").write_bytes(data)
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=1, location=str(root / "run-1" / "last.pt"),
        total_size=len(data), file_count=1, status="verified", verified_at=timezone.now(),
    )  # fmt: skip
    sha256 = hashlib.sha256(data).hexdigest()
    CheckpointFile.objects.create(
        checkpoint=checkpoint, path="last.pt", size=len(data), sha256=sha256
    )
    return checkpoint


def resume_of(checkpoint) -> Resume:
    profile = LaunchProfile.objects.create(
        project=checkpoint.project, name="again", command_template="true"
    )
    # The stored command is the rendered template, as resume.request() stores it: start()
    # refuses a resume whose profile gives another command now.
    return Resume.objects.create(
        project=checkpoint.project, run=checkpoint.run, checkpoint=checkpoint, profile=profile,
        command="true",
    )  # fmt: skip


def snapshot(folder) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()  # noqa: SIM115
        for d, _, names in os.walk(folder)
        for f in names
    }


@pytest.mark.parametrize("shape", ["single file", "directory"])
def test_a_run_folder_swapped_for_a_symlink_out_of_the_roots_is_never_written(
    shape, project, root, tmp_path, s3
):
    make_target(project, s3, "main")
    if shape == "single file":
        checkpoint = single_file(project, root)
    else:
        checkpoint = make_checkpoint(
            project, root, 1, {"model.pt": os.urandom(3000), "sub/opt.pt": os.urandom(2000)}
        )
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "verified"
    # The job (or anyone who can write in the root) swaps the run folder for a link to a
    # directory outside the roots that holds files of the same names.
    outside = tmp_path / "outside"
    os.rename(root / "run-1", outside)
    for path in snapshot(outside):
        (outside / path).write_bytes(b"precious, not Lifeboat's")
    os.symlink(outside, root / "run-1")
    before = snapshot(outside)

    resume = resume_of(checkpoint)
    assert launch_resume(resume.pk) == "failed"

    assert snapshot(outside) == before  # nothing moved aside, written or replaced there
    assert sorted(os.listdir(outside)) == sorted({p.split("/")[0] for p in before})
    resume.refresh_from_db()
    assert resume.status == "failed"
    assert "refused" in resume.error and "outside the allowed roots" in resume.error
    event = Event.objects.get(type="resume.failed", data__resume=resume.pk)
    assert "outside the allowed roots" in event.message


def test_a_damaged_checkpoint_is_still_restored_into_its_place(project, root, s3):
    make_target(project, s3, "main")
    checkpoint = single_file(project, root)
    (replica,) = replicate_now(checkpoint)
    original = (root / "run-1" / "last.pt").read_bytes()
    (root / "run-1" / "last.pt").write_bytes(b"rotten")
    resume = resume_of(checkpoint)
    assert launch_resume(resume.pk) != "failed", Resume.objects.get(pk=resume.pk).error
    assert (root / "run-1" / "last.pt").read_bytes() == original
    aside = [n for n in os.listdir(root / "run-1") if n.startswith("last.pt.damaged-")]
    assert len(aside) == 1 and (root / "run-1" / aside[0]).read_bytes() == b"rotten"
    assert not [n for n in os.listdir(root) if ".restoring-" in n]
