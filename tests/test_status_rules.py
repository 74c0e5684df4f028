"""One test per status rule of docs/validation.md that no other test proves at the level
of the checkpoint's status, through the real validate task on real files. The rules that
other tests prove are named in RULES_PROVED_ELSEWHERE."""

from __future__ import annotations

import hashlib
import math
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.checkpoint_files import save_dcp, small_state_dict, write_safetensors
from tests.support.events import saved
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

# Rules of docs/validation.md proved by tests elsewhere (named here so that the list of
# rules and the list of tests can be read side by side).
RULES_PROVED_ELSEWHERE = {
    "verified: every byte hashed, loads, finite": "test_validation.py::"
    "test_a_good_checkpoint_is_verified_with_its_content",
    "corrupt: sha256 differs": "test_validation.py::test_one_flipped_byte_makes_it_corrupt",
    "corrupt: truncated torch file": "test_validation.py::"
    "test_a_truncated_torch_file_reported_with_its_truncated_size_is_corrupt",
    "corrupt: NaN in model weights": "test_validation.py::"
    "test_a_nan_tensor_makes_it_corrupt_and_is_named",
    "corrupt: NaN in optimizer state": "test_library_checkpoints.py::"
    "test_one_nan_planted_in_a_library_checkpoint_is_caught_and_named",
    "suspicious: keys changed": "test_validation.py::"
    "test_keys_that_change_between_checkpoints_are_suspicious",
    "suspicious: size far below usual": "test_validation.py::"
    "test_a_checkpoint_much_smaller_than_usual_is_possibly_truncated",
    "suspicious: a pickle that needs code": "test_validation.py::"
    "test_a_malicious_pickle_is_never_executed",
    "suspicious: location outside the roots": "test_validation.py::"
    "test_a_location_escaping_the_root_by_dot_dot_is_refused (and _by_symlink_)",
    "info: bookkeeping NaN/Inf (Lightning kth_value)": "test_library_checkpoints.py::"
    "test_lightnings_default_checkpoint_is_the_latest_and_its_inf_score_is_a_note",
    "info: library configuration classes": "test_library_checkpoints.py::"
    "test_a_checkpoint_written_by_the_library_is_verified[hf-trainer]",
    "a re-check keeps the status until its verdict": "test_validation.py::"
    "test_revalidation_keeps_the_verdict_until_the_new_one",
    "a step saved again during the check": "test_validation.py::"
    "test_a_step_saved_again_during_the_check_is_not_given_the_old_verdict",
    "a worker killed mid-check": "test_validation.py::"
    "test_a_worker_killed_mid_check_is_redelivered_and_finishes",
}


def report(api, token, directory: Path, step: int = 1, run: str = "run-1") -> Checkpoint:
    files = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files.append(
            {
                "path": str(path.relative_to(directory)),
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    body = saved(run=run, step=step, t=step, location=str(directory), files=files)
    response = api.post_events(token, body)
    assert response.status_code == 202, response.content
    return Checkpoint.objects.get(run__key=run, step=step)


def check(checkpoint: Checkpoint) -> Checkpoint:
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint


def findings(checkpoint: Checkpoint, code: str) -> list[dict]:
    return [f for f in checkpoint.validations.last().findings if f["code"] == code]


def model_and_optimizer() -> dict:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def save(directory: Path, obj, name: str = "model.pt") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(obj, directory / name)
    return directory


# --------------------------------------------------------------------------- missing


def test_a_location_that_is_gone_is_missing(api, token, root):
    checkpoint = report(api, token, save(root / "step-1", small_state_dict()))
    shutil.rmtree(root / "step-1")

    checkpoint = check(checkpoint)

    assert checkpoint.status == "missing", checkpoint.status_message


def test_a_file_that_is_gone_is_missing(api, token, root):
    directory = save(root / "step-1", small_state_dict())
    save(directory, model_and_optimizer()["optimizer"], "optimizer.pt")
    checkpoint = report(api, token, directory)
    (directory / "optimizer.pt").unlink()

    checkpoint = check(checkpoint)

    assert checkpoint.status == "missing"
    assert "optimizer.pt" in checkpoint.status_message


# --------------------------------------------------------------------------- corrupt


def test_a_size_other_than_reported_is_corrupt(api, token, root):
    checkpoint = report(api, token, save(root / "step-1", small_state_dict()))
    with open(root / "step-1" / "model.pt", "ab") as f:
        f.write(b"more")

    checkpoint = check(checkpoint)

    assert checkpoint.status == "corrupt"
    assert "model.pt" in checkpoint.status_message


def test_a_broken_safetensors_header_is_corrupt(api, token, root):
    write_safetensors(root / "step-1" / "model.safetensors", small_state_dict())
    path = root / "step-1" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8] = ord("[")  # the JSON header no longer an object
    path.write_bytes(bytes(data))

    checkpoint = check(report(api, token, root / "step-1"))

    assert checkpoint.status == "corrupt"
    assert findings(checkpoint, "bad_safetensors_header")


def test_a_missing_dcp_shard_named_by_the_metadata_is_corrupt(api, token, root):
    files = save_dcp(root / "step-1", {"model": small_state_dict()})
    shard = next(f for f in files if f.endswith(".distcp"))
    (root / "step-1" / shard).unlink()  # gone before the job reported: never in its list

    checkpoint = check(report(api, token, root / "step-1"))

    assert checkpoint.status == "corrupt"
    assert findings(checkpoint, "missing_shard")


def test_nan_in_a_numpy_array_of_weights_is_corrupt(api, token, root):
    weights = np.ones((3, 3), dtype=np.float32)
    weights[1, 1] = np.nan
    checkpoint = check(report(api, token, save(root / "step-1", {"w": weights})))

    assert checkpoint.status == "corrupt"
    assert findings(checkpoint, "nan_or_inf")[0]["tensors"] == ["model.pt:w"]


def test_a_large_tensor_under_callbacks_is_checked_like_weights(api, token, root):
    averaged = torch.ones(4, 4)
    averaged[0, 0] = math.nan
    state = {
        "state_dict": small_state_dict(),
        "callbacks": {"StochasticWeightAveraging": {"average_model_state": {"w": averaged}}},
    }
    checkpoint = check(report(api, token, save(root / "step-1", state, "last.ckpt")))

    assert checkpoint.status == "corrupt"
    assert findings(checkpoint, "nan_or_inf")[0]["tensors"] == [
        "last.ckpt:callbacks/StochasticWeightAveraging/average_model_state/w"
    ]


# --------------------------------------------------------------------------- suspicious


@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_an_all_zero_matrix_of_weights_or_optimizer_state_is_suspicious(api, token, root, where):
    state = model_and_optimizer()
    if where == "model":
        state["model"]["weight"].zero_()
        expected = "model.pt:model/weight"
    else:
        state["optimizer"]["state"][0]["exp_avg"].zero_()
        expected = "model.pt:optimizer/state/0/exp_avg"

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert checkpoint.status == "suspicious"
    assert findings(checkpoint, "all_zero")[0]["tensors"] == [expected]


def test_a_numpy_object_that_needs_a_function_is_suspicious(api, token, root):
    # Pickling a RandomState object names numpy's constructor function
    # (numpy.random._pickle.__randomstate_ctor): code, not data.
    state = {"model": small_state_dict(), "rng": np.random.RandomState(0)}

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert checkpoint.status == "suspicious"
    [finding] = findings(checkpoint, "unsafe_pickle")
    assert "numpy.random" in finding["message"]


class _CallsALibraryFunction:
    """Unpickling this calls a function of a training library (never run by Lifeboat)."""

    def __reduce__(self):
        from transformers.utils import hub

        return (hub.cached_file, ("gpt2", "config.json"))


def test_a_library_function_in_a_pickle_is_suspicious(api, token, root):
    state = {"model": small_state_dict(), "config": _CallsALibraryFunction()}

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert checkpoint.status == "suspicious"
    [finding] = findings(checkpoint, "unsafe_pickle")
    assert "transformers.utils.hub.cached_file" in finding["message"]


def test_a_load_check_that_could_not_finish_is_suspicious(api, token, root, settings):
    settings.VALIDATION_MEMORY_BYTES = 1 << 20  # far below what torch itself needs

    checkpoint = check(report(api, token, save(root / "step-1", small_state_dict())))

    assert checkpoint.status == "suspicious"
    assert findings(checkpoint, "load_out_of_memory")


def test_a_check_that_cannot_run_three_times_is_suspicious(api, token, project, settings, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings.SCRATCH_DIR = blocker / "scratch"  # every s3 check fails to make its scratch
    body = saved(
        step=1,
        location="s3://bucket/run/step-1",
        files=[{"path": "model.pt", "size": 10, "sha256": "ab" * 32}],
    )
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get(step=1)

    statuses = [check(checkpoint).status for _ in range(settings.VALIDATION_MAX_ERRORS)]

    assert statuses == ["reported"] * (settings.VALIDATION_MAX_ERRORS - 1) + ["suspicious"]
    assert checkpoint.status_message.startswith(
        f"Could not be checked after {settings.VALIDATION_MAX_ERRORS} attempts"
    )


# --------------------------------------------------------------------------- verified, notes


def test_a_numpy_rng_state_is_data_and_verifies_without_a_note(api, token, root):
    state = {
        **model_and_optimizer(),
        "rng": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert checkpoint.status == "verified", checkpoint.status_message
    assert "Note" not in checkpoint.status_message
    assert checkpoint.validations.get().findings == []


def test_a_best_score_of_a_hand_written_loop_is_a_note(api, token, root):
    state = {**model_and_optimizer(), "epoch": 0, "best_loss": torch.tensor(math.inf)}

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert checkpoint.status == "verified", checkpoint.status_message
    [note] = findings(checkpoint, "bookkeeping_not_finite")
    assert note["tensors"] == ["model.pt:best_loss"]
    assert "Note: 1 bookkeeping value is NaN or Inf" in checkpoint.status_message


def test_names_stored_before_paths_compare_with_names_made_now(api, token, root):
    """A checkpoint verified by an earlier Lifeboat has dotted names (state.0.exp_avg);
    the next one, named by paths (state/0/exp_avg), is not a change of keys."""
    first = check(report(api, token, save(root / "step-1", model_and_optimizer()), step=1))
    assert first.status == "verified"
    first.content["keys"] = {
        key.replace("/", "."): value for key, value in first.content["keys"].items()
    }
    first.save(update_fields=["content"])

    second = check(report(api, token, save(root / "step-2", model_and_optimizer()), step=2))

    assert second.status == "verified", second.status_message


def test_a_pickle_is_never_unpickled_with_arbitrary_globals(tmp_path):
    """The numpy allow-list is a fixed list of data globals: a pickle naming any other
    numpy global is not given the real object."""
    from webapp.domain.validation import pickle_policy

    with pytest.raises(ValueError):
        pickle_policy.numpy_data_objects(["numpy.random._pickle.__randomstate_ctor"])
    data = pickle.dumps(np.random.RandomState(0))
    assert b"__randomstate_ctor" in data  # what the test above relies on


def test_numpy_data_beside_a_malicious_object_loads_and_the_object_never_runs(
    api, token, root, tmp_path
):
    class CopyOnLoad:
        def __reduce__(self):
            return (shutil.copyfile, (__file__, str(victim)))

    victim = tmp_path / "pwned"
    weights = small_state_dict()
    weights["fc.weight"][0, 0] = math.nan
    state = {"model": weights, "rng": np.random.get_state(), "payload": CopyOnLoad()}

    checkpoint = check(report(api, token, save(root / "step-1", state)))

    assert not victim.exists()
    assert checkpoint.status == "corrupt"  # the tensors were still read, the NaN found
    assert findings(checkpoint, "nan_or_inf")[0]["tensors"] == ["model.pt:model/fc.weight"]
    [unsafe] = findings(checkpoint, "unsafe_pickle")
    assert unsafe["severity"] == "suspicious"
    assert "shutil.copyfile" in unsafe["message"]
    assert "numpy" not in unsafe["message"]  # numpy's arrays were data, not stubbed
