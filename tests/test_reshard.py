"""Restore on another world size (docs/restore.md, "On another world size"): a DCP
checkpoint written by 8 real ranks, verified, replicated to the test S3 (SeaweedFS) and
restore-tested on 2 and on 4 ranks (gloo, processes of their own), every share compared bit
for bit with the saved tensors; a shard altered in S3 afterwards fails and names the
tensors it holds; chunks that leave a gap are named; a format that cannot be resharded says
so; and a resume on another world size loads the checkpoint on it before the job starts."""

from __future__ import annotations

import pickle
import shlex
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.dcp_ranks import save_on_ranks
from tests.support.events import saved
from tests.support.restore import damage, replicate_checkpoint, restore
from tests.support.resume import follow_until_done
from webapp.domain.models import (
    Checkpoint,
    Event,
    LaunchProfile,
    Replica,
    Resume,
    SavedChunks,
    StorageTarget,
)
from webapp.domain.recovery import reshard
from webapp.domain.replication import policy
from workers.launch import launch_resume
from workers.replicate import replicate
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory) -> Path:
    """A DCP folder saved by 8 gloo ranks (tests/support/dcp_ranks.py), written once."""
    folder = tmp_path_factory.mktemp("dcp8") / "step-7"
    save_on_ranks(folder, 8)
    return folder


def replicated_dcp(source: Path, api, token, project, s3, tmp_path, settings, run="r"):
    """`source` copied under the project's root, reported, verified and replicated."""
    from tests.support.validation import file_entry

    settings.SCRATCH_DIR = tmp_path / "scratch"
    directory = tmp_path / "ckpts" / run / "step-7"
    directory.mkdir(parents=True)
    for path in source.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    project.allowed_roots = [str(tmp_path / "ckpts")]
    project.save()
    entries = [file_entry(p, p.name) for p in sorted(directory.iterdir())]
    body = saved(run=run, step=7, location=str(directory), files=entries)
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get(run__key=run)
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status
    target = StorageTarget.objects.create(
        project=project, name="backup", bucket=s3.bucket,
        prefix=f"reshard-{uuid.uuid4().hex[:6]}", endpoint_url=s3.endpoint,
    )  # fmt: skip
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    replicate(replica_id)
    assert Replica.objects.get(pk=replica_id).status == "verified"
    return checkpoint


def resume_on(api, token, checkpoint, profile: str, world_size: int):
    body = {"profile": profile, "world_size": world_size}
    return api.post(token, f"/checkpoints/{checkpoint.pk}/resume", body)


def test_8_ranks_restore_on_2_and_4_and_an_altered_shard_names_its_tensors(
    eight_ranks, api, token, project, s3, tmp_path, settings, queues
):
    checkpoint = replicated_dcp(eight_ranks, api, token, project, s3, tmp_path, settings)
    project.restore_checks = {"reshard": [2, 4]}
    project.save()

    validation = restore(checkpoint)

    assert validation.status == "passed", validation.message
    levels = [f for f in validation.findings if f["level"] == "reshard"]
    assert [(f["saved_world_size"], f["world_size"], f["ok"]) for f in levels] == [
        (8, 2, True),
        (8, 4, True),
    ]
    assert "Reshard: saved by 8 ranks, loaded by 2: 6 tensors identical bit for bit" in (
        validation.message
    )
    assert validation.timings["reshard_s"] > 0
    recorded = SavedChunks.objects.get(checkpoint=checkpoint).chunks
    # 5 tensors in rows over 8 ranks (13 rows leave some ranks none), a scalar on each.
    assert {c[0] for c in recorded} == {
        "model.embed.weight", "model.layers.0.weight", "model.layers.1.weight",
        "model.layers.1.bias", "model.head.weight", "optim.step",
    }  # fmt: skip

    # Rank 3's shard changes in S3 after all that: one byte inside its chunk of
    # model.layers.0.weight (rows 15-19).
    fqn, offsets, path, offset, length, _ = next(
        c for c in recorded if c[0] == "model.layers.0.weight" and c[2] == "__3_0.distcp"
    )
    assert offsets == [15, 0]
    damage(s3, path, offset + length // 2)

    again = restore(checkpoint)

    assert again.status == "failed", again.message
    assert "__3_0.distcp does not match its sha256" in again.message
    assert (
        "the tensors altered since it last passed: model.layers.0.weight (its chunk at [15, 0])"
        in (again.message)
    )
    assert "model.embed.weight" not in again.message  # the shard's other chunks are intact


def test_saved_chunks_that_leave_a_gap_are_named_on_every_world_size(eight_ranks, tmp_path):
    """Metadata that lists no chunk for some rows: a resharded load would fill them with
    zeros without a word; the check compares against what was saved and names them."""
    folder = tmp_path / "gap"
    folder.mkdir()
    for path in eight_ranks.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # noqa: S301 (written above)
    item = metadata.state_dict_metadata["model.embed.weight"]
    gone = item.chunks.pop(2)
    for index in [i for i in metadata.storage_data if i.fqn == "model.embed.weight"]:
        if list(index.offset) == list(gone.offsets):
            del metadata.storage_data[index]
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    files = sorted(p.name for p in folder.iterdir())

    result = reshard.run_child(folder, files, [2, 8])

    assert [r["ok"] for r in result["results"]] == [False, False]
    assert result["results"][0]["message"] == (
        "model.embed.weight (saved by 8 ranks, loaded by 2): 192 of its 1,536 elements are "
        "in no saved chunk"
    )


def test_a_format_that_cannot_be_resharded_says_so(
    api, token, project, s3, tmp_path, settings, queues
):
    import torch

    project.restore_checks = {"reshard": [2]}
    project.save()
    checkpoint = replicate_checkpoint(
        {"model.pt": {"w": torch.ones(4, 4)}}, api, token, project, s3, tmp_path, settings
    )

    validation = restore(checkpoint)

    assert validation.status == "passed", validation.message
    (level,) = [f for f in validation.findings if f["level"] == "reshard"]
    assert level["message"].startswith(
        "not run: only torch.distributed.checkpoint folders can be loaded on another world size"
    )
    # And a resume on another world size is refused before anything runs.
    checkpoint.run.world_size = 8
    checkpoint.run.save()
    LaunchProfile.objects.create(
        project=project, name="ranks", kind="local",
        command_template="echo {{world_size}}", options={"workdir": str(tmp_path)},
    )  # fmt: skip
    answer = api.post(
        token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "ranks", "world_size": 4}
    )
    assert answer.status_code == 409, answer.content
    assert "saved by 8 ranks in a format Lifeboat cannot reshard" in answer.json()["error"]
    assert not Resume.objects.exists()


def test_a_resume_on_another_world_size_loads_it_there_first(
    eight_ranks, api, token, project, s3, tmp_path, settings, queues
):
    settings.VAR_DIR = tmp_path / "var"
    checkpoint = replicated_dcp(eight_ranks, api, token, project, s3, tmp_path, settings)
    LaunchProfile.objects.create(
        project=project, name="ranks", kind="local",
        command_template=f"{shlex.quote(sys.executable)} -c 'import os; print(\"ranks\", "
        "os.environ[\"LIFEBOAT_WORLD_SIZE\"])' {{world_size}}",
        options={"workdir": str(tmp_path)},
    )  # fmt: skip
    plain = LaunchProfile.objects.create(
        project=project, name="plain", kind="local", command_template="true",
        options={"workdir": str(tmp_path)},
    )  # fmt: skip
    refused = api.post(
        token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": plain.name, "world_size": 4}
    )
    assert refused.status_code == 409
    assert "takes no world size" in refused.json()["error"]

    answer = api.post(
        token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "ranks", "world_size": 4}
    )
    assert answer.status_code == 202, answer.content
    assert answer.json()["world_size"] == 4
    launch_resume(answer.json()["id"])

    resume = follow_until_done(answer.json()["id"], 60)
    assert resume.status == "succeeded", resume.error
    (loaded,) = Event.objects.filter(type="resume.resharded")
    assert loaded.message == (
        "Loaded on 4 ranks: saved by 8 ranks, loaded by 4: 6 tensors identical bit for bit"
    )
    from webapp.domain.recovery import resume as resumes

    assert "ranks 4" in resumes.output_tail(resume)


def test_a_resume_on_another_world_size_without_a_replica_never_launches(
    eight_ranks, api, token, project, tmp_path, settings, queues
):
    """The load on the new world size runs on bytes that match their sha256, in the
    worker's own folder: from a verified replica. Without one, the job is not started."""
    from tests.support.validation import file_entry

    settings.VAR_DIR = tmp_path / "var"
    project.allowed_roots = [str(eight_ranks.parent)]
    project.save()
    entries = [file_entry(p, p.name) for p in sorted(eight_ranks.iterdir())]
    body = saved(run="r", step=7, location=str(eight_ranks), files=entries)
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get()
    validate_checkpoint(checkpoint.pk)
    LaunchProfile.objects.create(
        project=project, name="ranks", kind="local",
        command_template="touch started {{world_size}}", options={"workdir": str(tmp_path)},
    )  # fmt: skip

    answer = api.post(
        token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "ranks", "world_size": 2}
    )
    assert answer.status_code == 202, answer.content
    launch_resume(answer.json()["id"])

    resume = Resume.objects.get()
    assert resume.status == "failed"
    assert resume.error == (
        "saved by 8 ranks, to be resumed on 2: Lifeboat loads it on 2 ranks first, from a "
        "verified replica, and it has none"
    )
    assert not (tmp_path / "started").exists()


def test_validation_names_a_tensor_whose_chunks_leave_a_gap(eight_ranks, tmp_path):
    from tests.support.inspector import check

    folder = tmp_path / "gap"
    folder.mkdir()
    for path in eight_ranks.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # noqa: S301 (written above)
    metadata.state_dict_metadata["model.head.weight"].chunks.pop(0)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))

    report = check(folder, sorted(p.name for p in folder.iterdir()))

    gaps = [f for f in report["findings"] if f["code"] == "dcp_gap"]
    assert [(f["severity"], f["message"]) for f in gaps] == [(
        "corrupt",
        ".metadata: the chunks of model.head.weight hold 672 of its 768 elements: the rest "
        "are in no saved chunk",
    )]  # fmt: skip


def test_metadata_claiming_more_than_its_shards_hold_is_refused_before_any_allocation(
    eight_ranks, tmp_path
):
    """A .metadata that says a tensor has 10^12 rows: every rank would allocate its share
    of it. Refused, with both figures, before a rank is started."""
    folder = tmp_path / "huge"
    folder.mkdir()
    for path in eight_ranks.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # noqa: S301 (written above)
    item = metadata.state_dict_metadata["model.embed.weight"]
    item.size = type(item.size)([10**12, 16])
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))

    result = reshard.run_child(folder, sorted(p.name for p in folder.iterdir()), [2])

    assert result["results"] == []
    assert result["error"].startswith(".metadata describes 64,000,000,")
    assert "bytes of tensors but its shards hold" in result["error"]
