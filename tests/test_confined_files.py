"""Confined file operations: every component of a job's path walked from a root's
descriptor, symlinks out of the roots refused at any level, in-root links followed;
S3 downloads into scratch, the inspection's reads and a restore check's `file` too.
Real files and symlinks on disk throughout."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import time

import pytest
from django.core.exceptions import ValidationError

from webapp.dashboard.recovery_settings_views import clean_restore_checks
from webapp.domain.confined_files import Refused, Tree, relative_parts
from webapp.domain.recovery.restore_checks import ConfigRefused, _main_file
from webapp.domain.validation.integrity import FileSpec, check_local, check_s3


@pytest.fixture
def layout(tmp_path):
    """root/run-1/step-10/{model.pt, sub/state.json}; outside/ with a precious file."""
    root = tmp_path / "root"
    step = root / "run-1" / "step-10"
    (step / "sub").mkdir(parents=True)
    (step / "model.pt").write_bytes(b"weights")
    (step / "sub" / "state.json").write_bytes(b"{}")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "state.json").write_bytes(b"precious")
    (outside / "model.pt").write_bytes(b"precious")
    return root, step, outside


def read(tree: Tree, path: str) -> bytes:
    fd = tree.open_read(tree.locate(path))
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "path, rule",
    [
        ("../x", "contains '..'"),
        ("a/../../x", "contains '..'"),
        ("/etc/passwd", "is absolute"),
        ("a//b", "empty component"),
        ("a\x00b", "NUL byte"),
    ],
)
def test_hostile_relative_paths_are_refused_by_name(path, rule):
    with pytest.raises(Refused, match=rule):
        relative_parts(path)
    assert relative_parts("./a/b/") == ["a", "b"]


def test_reads_refuse_a_symlink_out_of_the_root_at_the_top_and_at_an_inner_level(layout):
    root, step, outside = layout
    with Tree([str(root)]) as tree:
        assert read(tree, f"{step}/sub/state.json") == b"{}"
        # Inner level: a directory of the checkpoint replaced by a link out of the root.
        os.rename(step / "sub", step / "sub.away")
        os.symlink(outside / "sub", step / "sub")
        with pytest.raises(Refused, match="outside the allowed roots") as refused:
            read(tree, f"{step}/sub/state.json")
        assert refused.value.kind == "symlink"
        # Top level: the run folder itself, just below the root.
        os.rename(root / "run-1", root / "run-1.away")
        os.symlink(outside, root / "run-1")
        with pytest.raises(Refused, match="leads by a symlink"):
            read(tree, f"{root}/run-1/model.pt")
        # A relative link that climbs out of the root is refused too.
        os.symlink("../../outside/model.pt", root / "climb.pt")
        with pytest.raises(Refused, match="out of the allowed root"):
            read(tree, f"{root}/climb.pt")


def test_in_root_symlinks_are_followed_by_the_walk(layout):
    """HF caches and shared tokenizers link inside the root: that keeps working."""
    root, step, _ = layout
    blobs = root / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"blob")
    os.symlink("../../blobs/abc", step / "tokenizer.json")  # relative, in the root
    os.symlink(str(step / "sub"), root / "shared")  # absolute, in the root
    with Tree([str(root)]) as tree:
        assert read(tree, f"{step}/tokenizer.json") == b"blob"
        assert read(tree, f"{root}/shared/state.json") == b"{}"
    os.symlink("loop", root / "loop")
    with Tree([str(root)]) as tree, pytest.raises(Refused, match="more than 40 symlinks"):
        read(tree, f"{root}/loop")


def test_writes_never_go_through_a_symlink(layout):
    root, step, outside = layout
    with Tree([str(root)]) as tree:
        os.symlink(outside / "model.pt", step / "link.pt")
        with pytest.raises(Refused, match="not written through"):
            tree.create_file(tree.locate(f"{step}/link.pt"), replace=True)
        os.symlink(outside, step / "out")
        with pytest.raises(Refused, match="outside the allowed roots"):
            tree.create_file(tree.locate(f"{step}/out/new.bin"))
        with pytest.raises(Refused, match="outside the allowed roots"):
            tree.rename(tree.locate(f"{step}/model.pt"), tree.locate(f"{step}/out/model.pt"))
    assert (outside / "model.pt").read_bytes() == b"precious"
    assert sorted(os.listdir(outside)) == ["model.pt", "sub"]


def test_deletes_remove_the_entry_never_the_target(layout):
    root, step, outside = layout
    os.symlink(outside, step / "out")
    with Tree([str(root)]) as tree:
        with pytest.raises(Refused):
            tree.unlink(tree.locate(f"{step}/out/model.pt"))
        tree.remove_tree(tree.locate(str(step)))
        with pytest.raises(Refused, match="never removed"):
            tree.remove_tree(tree.locate(str(root)))
    assert not step.exists()
    assert (outside / "model.pt").read_bytes() == b"precious"
    assert (outside / "sub" / "state.json").read_bytes() == b"precious"


def spec(path: str, data: bytes) -> FileSpec:
    return FileSpec(path, len(data), hashlib.sha256(data).hexdigest())


def test_s3_file_paths_with_dot_dot_or_absolute_never_write_outside_scratch(s3, tmp_path):
    """A job's files list names where each object lands in scratch: '..' and absolute
    paths are refused before anything is created or written."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    escape = tmp_path / "escaped"
    data = b"planted by a job"
    absolute = f"{escape}/abs/planted.bin"
    s3.put("run-1/step-10/model.pt", data)
    for key in (f"run-1/step-10/{absolute}", "run-1/step-10/../../escaped/dotdot/planted.bin"):
        # Where the store accepts such a key, the object is there to be fetched.
        with contextlib.suppress(Exception):
            s3.put(key, data)
    specs = [
        spec("model.pt", data),
        spec(absolute, data),
        spec("../../escaped/dotdot/planted.bin", data),
    ]
    report = check_s3(
        f"s3://{s3.bucket}/run-1/step-10",
        specs,
        [f"s3://{s3.bucket}/run-1"],
        s3.client,
        str(scratch),
    )
    assert [(f.code, f.file) for f in report.findings] == [
        ("path_escapes", absolute),
        ("path_escapes", "../../escaped/dotdot/planted.bin"),
    ]
    assert "is absolute" in report.findings[0].message
    assert "contains '..'" in report.findings[1].message
    assert not report.ok
    assert not escape.exists()
    assert os.listdir(scratch) == ["model.pt"]


def test_integrity_refuses_a_file_whose_folder_links_out_of_the_root(layout):
    root, step, outside = layout
    os.rename(step / "sub", step / "sub.away")
    os.symlink(outside / "sub", step / "sub")
    report = check_local(
        str(step), [spec("model.pt", b"weights"), spec("sub/state.json", b"precious")], [str(root)]
    )
    assert [f.code for f in report.findings] == ["symlink_escapes"]
    assert report.bytes_read == len(b"weights")


def test_a_restore_check_file_outside_the_checkpoint_is_refused(tmp_path):
    for bad in ("../../etc/passwd", "/etc/passwd", "a//b"):
        with pytest.raises(ValidationError):
            clean_restore_checks(f'{{"forward": "m:f", "file": "{bad}"}}')
    assert clean_restore_checks('{"file": "model/weights.pt"}') == {"file": "model/weights.pt"}
    files = ["model.pt", "optim.pt"]
    with pytest.raises(ConfigRefused, match="not one of the checkpoint's files"):
        _main_file(tmp_path, files, "../../etc/passwd")
    assert _main_file(tmp_path, files, "optim.pt") == tmp_path / "optim.pt"


def _swap_forever(root: str, outside: str, stop) -> None:
    folder = os.path.join(root, "run-1")
    swaps = 0
    while not stop.is_set():
        swaps += 1
        # Every 50th swap holds each state for a millisecond: on a loaded machine the
        # checks otherwise only ever land between the two (CI once saw 50,362 of them).
        hold = 0.001 if swaps % 50 == 0 else 0
        os.rename(folder, folder + ".real")
        os.symlink(outside, folder)
        time.sleep(hold)
        os.unlink(folder)
        os.rename(folder + ".real", folder)
        time.sleep(hold)


def test_a_folder_swapped_back_and_forth_during_checks_is_never_read_through(tmp_path):
    """Another process swaps the run folder for a symlink out of the root and back, as
    fast as it can, while integrity checks run: no check may ever read the bytes out
    there (realpath-then-open did, about once in a hundred checks) or crash."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "run-1" / "step-1").mkdir(parents=True)
    (outside / "step-1").mkdir(parents=True)
    good, planted = b"g" * 4096, b"p" * 4096
    (root / "run-1" / "step-1" / "model.pt").write_bytes(good)
    (outside / "step-1" / "model.pt").write_bytes(planted)
    stop = multiprocessing.get_context("fork").Event()
    swapper = multiprocessing.get_context("fork").Process(
        target=_swap_forever, args=(str(root), str(outside), stop)
    )
    swapper.start()
    seen: dict[str, int] = {}
    try:
        # At least 3 s of checks, and on until both states were met (at most 30 s).
        start = time.monotonic()
        while time.monotonic() < start + 3 or (
            time.monotonic() < start + 30
            and not (seen.get("ok") and seen.get("outside_allowed_roots"))
        ):
            report = check_local(
                str(root / "run-1" / "step-1"), [spec("model.pt", good)], [str(root)]
            )
            for code in [f.code for f in report.findings] or ["ok"]:
                seen[code] = seen.get(code, 0) + 1
    finally:
        stop.set()
        swapper.join(10)
    assert "checksum_mismatch" not in seen, seen  # the planted bytes were never read
    assert set(seen) <= {"ok", "outside_allowed_roots", "symlink_escapes", "location_missing",
                         "file_missing"}, seen  # fmt: skip
    assert seen.get("ok") and seen.get("outside_allowed_roots"), seen  # both states met
