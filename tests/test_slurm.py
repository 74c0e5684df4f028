"""The Slurm launcher (webapp/domain/launch/slurm.py) against a real single-node Slurm,
started by scripts/slurm_single_node.sh (Debian's packages, munge, no systemd).

Without root the script cannot run: these tests then skip, saying so, unless a Slurm is
already up. Under CI=true they fail instead: CI must not pass without having looked."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from webapp.domain.launch import slurm

ROOT = Path(__file__).resolve().parent.parent


def _submit(tmp_path: Path, body: str, *, name: str, env: dict[str, str] | None = None) -> str:
    return slurm.submit(
        "#!/bin/bash\n" + body,
        job_name=name,
        output_path=str(tmp_path / "out" / f"{name}.log"),
        workdir=str(tmp_path),
        env=env or {},
    )


def _output(tmp_path: Path, name: str) -> str:
    return (tmp_path / "out" / f"{name}.log").read_text()


def test_job_that_succeeds_is_followed_to_completed(slurm_cluster, tmp_path):
    marker = tmp_path / "marker"
    job = _submit(
        tmp_path,
        f"echo hello from $SLURM_JOB_ID\npwd\necho written > {shlex.quote(str(marker))}\n",
        name="lifeboat-test-ok",
    )
    assert job.isdigit()
    first = slurm.state(job)
    assert first.state in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED")
    final = slurm.wait(job, timeout=30, interval=0.2)
    assert (final.state, final.exit_code, final.final) == ("COMPLETED", 0, True)
    assert final.source in ("scontrol", "sacct")
    assert marker.read_text() == "written\n"
    assert _output(tmp_path, "lifeboat-test-ok") == f"hello from {job}\n{tmp_path}\n"
    # The script is kept beside the output, as it was submitted.
    script = tmp_path / "out" / "lifeboat-test-ok.sbatch"
    assert script.read_text().startswith("#!/bin/bash\necho hello")
    assert slurm.state(job) == final  # asking again changes nothing


def test_job_that_exits_3_is_failed_with_its_exit_code(slurm_cluster, tmp_path):
    job = _submit(tmp_path, "echo about to fail >&2\nexit 3\n", name="lifeboat-test-exit3")
    final = slurm.wait(job, timeout=30, interval=0.2)
    assert (final.state, final.exit_code, final.final) == ("FAILED", 3, True)
    assert final.signal is None
    assert final.reason == "NonZeroExitCode"
    assert _output(tmp_path, "lifeboat-test-exit3") == "about to fail\n"  # stderr too


def test_long_job_is_cancelled(slurm_cluster, tmp_path):
    job = _submit(tmp_path, "echo started\nexec sleep 300\n", name="lifeboat-test-cancel")
    deadline = time.monotonic() + 30
    while (now := slurm.state(job)).state != "RUNNING":
        assert not now.final, now
        assert time.monotonic() < deadline, f"job {job} never ran: {now}"
        time.sleep(0.2)
    assert now.exit_code is None
    started = time.monotonic()
    slurm.cancel(job)
    final = slurm.wait(job, timeout=30, interval=0.2)
    assert (final.state, final.final) == ("CANCELLED", True)
    assert time.monotonic() - started < 20
    slurm.cancel(job)  # cancelling an ended job again is not an error


def test_environment_reaches_the_job(slurm_cluster, tmp_path):
    value = "a,b c=d 'quoted' \"double\" $HOME ${PATH}"  # commas would split --export=
    job = _submit(
        tmp_path,
        'printf \'%s\\n\' "$LIFEBOAT_TEST_VALUE" "$LIFEBOAT_RUN"\n',
        name="lifeboat-test-env",
        env={"LIFEBOAT_TEST_VALUE": value, "LIFEBOAT_RUN": "run-7"},
    )
    final = slurm.wait(job, timeout=30, interval=0.2)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    assert _output(tmp_path, "lifeboat-test-env") == f"{value}\nrun-7\n"


def test_shell_metacharacters_stay_one_argument(slurm_cluster, tmp_path):
    value = f'a b; touch {tmp_path}/pwned-$$ "$(id)" `id` it\'s & | > {tmp_path}/pwned-redirect'
    command = f"printf '%s\\n' {shlex.quote(value)}\n"  # a template with a quoted value
    job = _submit(tmp_path, command, name="lifeboat-test-quote")
    final = slurm.wait(job, timeout=30, interval=0.2)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    lines = _output(tmp_path, "lifeboat-test-quote").splitlines()
    assert lines == [value]
    assert not list(tmp_path.glob("pwned-*"))


def test_sbatch_refusal_is_a_launch_error_with_its_message(slurm_cluster, tmp_path):
    with pytest.raises(slurm.LaunchError, match="(?i)invalid partition"):
        _submit(tmp_path, "#SBATCH --partition=no-such-partition\ntrue\n", name="lb-refused")


def test_job_slurm_does_not_know_is_unknown_and_final(slurm_cluster):
    now = slurm.state("999999")
    assert (now.state, now.final, now.exit_code) == ("UNKNOWN", True, None)
    slurm.cancel("999999")  # nothing to cancel: not an error


def test_bad_ids_names_and_workdirs_are_refused(tmp_path):
    with pytest.raises(ValueError):
        slurm.state("-u root")
    with pytest.raises(ValueError):
        slurm.cancel("12; rm -rf /")
    with pytest.raises(ValueError):
        slurm.submit("true", job_name="a b", output_path=str(tmp_path / "o"), workdir="/", env={})
    with pytest.raises(ValueError):
        slurm.submit(
            "true", job_name="ok", output_path=str(tmp_path / "o"), workdir="/", env={"A B": "1"}
        )
    with pytest.raises(slurm.LaunchError, match="working directory does not exist"):
        slurm.submit(
            "true",
            job_name="ok",
            output_path=str(tmp_path / "o"),
            workdir=str(tmp_path / "missing"),
            env={},
        )


def test_missing_slurm_client_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, squeue, scontrol, scancel here
    assert not slurm.available()
    with pytest.raises(slurm.LaunchError, match="sbatch not found: is this worker on a Slurm"):
        slurm.submit("true", job_name="ok", output_path=str(tmp_path / "o"), workdir="/", env={})
    with pytest.raises(slurm.LaunchError, match="squeue not found"):
        slurm.state("1")
    with pytest.raises(slurm.LaunchError, match="scancel not found"):
        slurm.cancel("1")


def _fake_commands(folder: Path, **scripts: str) -> None:
    """Stand-ins for Slurm's commands: name=bash body."""
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)


def test_controller_that_does_not_answer_is_unreachable_not_final(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    _fake_commands(
        bin_dir,
        squeue="echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    now = slurm.state("42")
    assert (now.state, now.final, now.exit_code) == ("UNREACHABLE", False, None)
    assert "Unable to contact slurm controller" in now.reason

    _fake_commands(bin_dir, squeue="exec sleep 5")
    monkeypatch.setattr(slurm, "QUERY_TIMEOUT_S", 0.3)
    now = slurm.state("42")
    assert (now.state, now.final) == ("UNREACHABLE", False)
    assert "did not answer within 0.3 s" in now.reason


def test_sacct_answers_once_scontrol_has_forgotten(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    _fake_commands(
        bin_dir,
        squeue="exit 0",  # an ended job: squeue prints nothing
        scontrol="echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
        sacct='[ "$*" = "-n -P -X -j 42 -o State,ExitCode" ] || exit 9; echo "CANCELLED by 0|0:15"',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    now = slurm.state("42")
    assert now == slurm.JobState("CANCELLED", 0, "", True, signal=15, source="sacct")


def test_submit_that_times_out_says_so(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    _fake_commands(bin_dir, sbatch="exec sleep 5")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(slurm, "SUBMIT_TIMEOUT_S", 0.3)
    with pytest.raises(slurm.LaunchTimeout, match="sbatch did not answer within 0.3 s"):
        slurm.submit("true", job_name="ok", output_path=str(tmp_path / "o"), workdir="/", env={})
