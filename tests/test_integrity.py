"""Integrity: files under the allowed roots, with their reported sizes and sha256."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from webapp.domain.validation.integrity import FileSpec, check_local, check_s3, hash_file


def spec_of(base, name: str) -> FileSpec:
    data = (base / name).read_bytes()
    return FileSpec(name, len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "ckpts"
    (root / "run-1" / "step-10").mkdir(parents=True)
    (root / "run-1" / "step-10" / "model.pt").write_bytes(os.urandom(100_000))
    (root / "run-1" / "step-10" / "optim.pt").write_bytes(os.urandom(50_000))
    return root


def codes(report) -> list[str]:
    return [f.code for f in report.findings]


def test_good_files_pass_and_every_byte_is_read(root):
    location = root / "run-1" / "step-10"
    specs = [spec_of(location, "model.pt"), spec_of(location, "optim.pt")]
    seen = []
    report = check_local(str(location), specs, [str(root)], progress=seen.append)
    assert report.ok and report.findings == []
    assert report.bytes_read == 150_000 == sum(seen)


def test_a_single_file_location_names_itself(root):
    location = root / "run-1" / "step-10" / "model.pt"
    report = check_local(str(location), [spec_of(location.parent, "model.pt")], [str(root)])
    assert report.ok and report.single_file


def test_one_flipped_byte_is_a_checksum_mismatch(root):
    location = root / "run-1" / "step-10"
    spec = spec_of(location, "model.pt")
    data = bytearray((location / "model.pt").read_bytes())
    data[12345] ^= 0x01
    (location / "model.pt").write_bytes(bytes(data))
    report = check_local(str(location), [spec], [str(root)])
    assert codes(report) == ["checksum_mismatch"]
    assert "does not match its sha256" in report.findings[0].message
    assert report.findings[0].severity == "corrupt"


def test_a_truncated_file_is_named_with_both_sizes(root):
    location = root / "run-1" / "step-10"
    spec = spec_of(location, "model.pt")
    with open(location / "model.pt", "r+b") as handle:
        handle.truncate(60_000)
    report = check_local(str(location), [spec], [str(root)])
    assert codes(report) == ["size_mismatch"]
    assert report.findings[0].message == (
        "model.pt is truncated: 60,000 bytes on disk, 100,000 reported by the job"
    )


def test_a_missing_file_and_a_missing_location(root):
    location = root / "run-1" / "step-10"
    spec = spec_of(location, "model.pt")
    (location / "model.pt").unlink()
    assert codes(check_local(str(location), [spec], [str(root)])) == ["file_missing"]
    gone = check_local(str(root / "run-1" / "step-99"), [spec], [str(root)])
    assert codes(gone) == ["location_missing"]
    assert gone.findings[0].severity == "missing"


def test_a_location_outside_the_roots_is_refused_unread(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.pt").write_bytes(b"x")
    report = check_local(str(elsewhere), [spec_of(elsewhere, "model.pt")], [str(root)])
    assert codes(report) == ["outside_allowed_roots"]
    assert report.bytes_read == 0


def test_dot_dot_out_of_the_root_is_refused(root, tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "model.pt").write_bytes(b"x")
    sneaky = f"{root}/../secret"
    report = check_local(sneaky, [FileSpec("model.pt", 1, "0" * 64)], [str(root)])
    assert codes(report) == ["outside_allowed_roots"]
    assert "without '..'" in report.findings[0].message


def test_a_symlinked_location_out_of_the_root_is_refused(root, tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "model.pt").write_bytes(b"x")
    os.symlink(tmp_path / "secret", root / "run-1" / "step-20")
    report = check_local(
        str(root / "run-1" / "step-20"), [spec_of(tmp_path / "secret", "model.pt")], [str(root)]
    )
    assert codes(report) == ["outside_allowed_roots"]
    assert "by a symlink" in report.findings[0].message


def test_a_symlinked_file_out_of_the_root_is_refused(root, tmp_path):
    location = root / "run-1" / "step-10"
    (tmp_path / "passwd").write_bytes(b"root:x:0:0")
    os.symlink(tmp_path / "passwd", location / "config.json")
    spec = FileSpec("config.json", 10, hashlib.sha256(b"root:x:0:0").hexdigest())
    report = check_local(str(location), [spec], [str(root)])
    assert codes(report) == ["symlink_escapes"]
    assert report.bytes_read == 0


def test_a_project_without_roots_reads_nothing(root):
    location = root / "run-1" / "step-10"
    report = check_local(str(location), [spec_of(location, "model.pt")], [])
    assert codes(report) == ["outside_allowed_roots"]
    assert "no allowed root" in report.findings[0].message


def test_hash_file_matches_hashlib(tmp_path):
    data = os.urandom(20 * 1024 * 1024 + 17)  # crosses chunk boundaries
    (tmp_path / "big").write_bytes(data)
    assert hash_file(str(tmp_path / "big")) == (hashlib.sha256(data).hexdigest(), len(data))


def test_s3_objects_are_hashed_while_they_stream_to_scratch(s3, tmp_path):
    good, bad = os.urandom(70_000), os.urandom(30_000)
    s3.put("run-1/step-10/model.pt", good)
    s3.put("run-1/step-10/optim.pt", bad[:-1] + b"\x00")  # damaged in the bucket
    specs = [
        FileSpec("model.pt", len(good), hashlib.sha256(good).hexdigest()),
        FileSpec("optim.pt", len(bad), hashlib.sha256(bad).hexdigest()),
        FileSpec("extra.json", 2, hashlib.sha256(b"{}").hexdigest()),
    ]
    location = f"s3://{s3.bucket}/run-1/step-10"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = check_s3(location, specs, [f"s3://{s3.bucket}/run-1"], s3.client, str(scratch))
    assert codes(report) == ["checksum_mismatch", "file_missing"]
    assert (scratch / "model.pt").read_bytes() == good


def test_s3_objects_fetched_at_once_are_each_checked_and_named_in_order(s3, tmp_path):
    """Several objects on the wire at once (workers=4): every one is still hashed whole
    and compared; the findings name each bad file, in the order of the files, whichever
    finished first; the bytes read add up; a path out of scratch is refused, not fetched."""
    blobs = {f"shard-{i}.safetensors": os.urandom(50_000 + i) for i in range(8)}
    for name, data in blobs.items():
        damaged = name == "shard-5.safetensors"
        s3.put(f"run-1/step-20/{name}", data[:-1] + b"\x00" if damaged else data)
    specs = [FileSpec(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in blobs.items()]
    specs.insert(2, FileSpec("gone.json", 2, hashlib.sha256(b"{}").hexdigest()))
    specs.append(FileSpec("../outside", 1, "0" * 64))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    seen: list[tuple[str, int]] = []
    threads: set[str] = set()

    class Progress:
        def __call__(self, n: int, file: str = "") -> None:
            seen.append((file, n))
            threads.add(threading.current_thread().name)

        def file_done(self, path: str, size: int) -> None:
            seen.append((path, -1))

    report = check_s3(
        f"s3://{s3.bucket}/run-1/step-20", specs, [f"s3://{s3.bucket}/run-1"], s3.client,
        str(scratch), Progress(), workers=4,
    )  # fmt: skip

    assert [(f.code, f.file) for f in report.findings] == [
        ("file_missing", "gone.json"),
        ("checksum_mismatch", "shard-5.safetensors"),
        ("path_escapes", "../outside"),
    ]
    good = {n: d for n, d in blobs.items() if n != "shard-5.safetensors"}
    assert all((scratch / n).read_bytes() == d for n, d in good.items())
    assert report.bytes_read == sum(map(len, blobs.values()))
    assert not (tmp_path / "outside").exists()
    by_file = {n: sum(k for f, k in seen if f == n and k > 0) for n in blobs}
    assert by_file == {n: len(d) for n, d in blobs.items()}  # progress per file
    assert len(threads) > 1, threads  # fetched at once, not one after another


def test_s3_locations_outside_the_project_roots_are_refused(s3, tmp_path):
    report = check_s3(
        f"s3://{s3.bucket}/other-team/ckpt",
        [FileSpec("a", 1, "0" * 64)],
        [f"s3://{s3.bucket}/run-1", "/data"],
        s3.client,
        str(tmp_path),
    )
    assert codes(report) == ["outside_allowed_roots"]
