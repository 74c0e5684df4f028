"""The rules of launch templates (webapp/domain/launch/template.py): where a placeholder
becomes a reference to the job's variable and where it is refused; the redaction of a
job's output (webapp/domain/launch/redact.py), and who sees that output on the dashboard.
Real launched jobs are in tests/test_launch_hostile.py."""

from __future__ import annotations

import pytest

from tests.support.dashboard import as_user, make_checkpoint, make_run
from tests.support.people import member
from webapp.domain.models import LaunchProfile, Resume

ACCEPTED = [
    ("run {{run_key}}", 'run "${LIFEBOAT_RUN_KEY}"'),
    ('run "{{run_key}}"', 'run "${LIFEBOAT_RUN_KEY}"'),
    ("run --x={{step}}", 'run --x="${LIFEBOAT_STEP}"'),
    ('run "--x={{step}} y"', 'run "--x=${LIFEBOAT_STEP} y"'),
    ("X={{run_key}} run 2>&1 | tee log", 'X="${LIFEBOAT_RUN_KEY}" run 2>&1 | tee log'),
    ("bash -c 'run \"$1\"' _ {{run_key}}", 'bash -c \'run "$1"\' _ "${LIFEBOAT_RUN_KEY}"'),
    ("python train.py -c {{checkpoint_path}}", 'python train.py -c "${LIFEBOAT_CHECKPOINT_PATH}"'),
    ('#SBATCH --time=1\nsrun run "{{step}}"', '#SBATCH --time=1\nsrun run "${LIFEBOAT_STEP}"'),
    ('[ "{{step}}" -gt 0 ] && run', '[ "${LIFEBOAT_STEP}" -gt 0 ] && run'),
]
REFUSED = [
    ("run '{{run_key}}'", "inside single quotes"),
    ("run $'{{run_key}}'", "where nothing is expanded"),
    ("run `echo {{run_key}}`", "inside `...`"),
    ("run $(basename {{checkpoint_path}})", "inside $(...)"),
    ('run "$(basename {{checkpoint_path}})"', "inside $(...)"),
    ("run <(cat {{checkpoint_path}})", "inside $(...)"),
    ("run ${X:-{{run_key}}}", "inside ${...}"),
    ("run $(( {{step}} + 1 ))", "arithmetic"),
    ("(( {{step}} > 1 )) && run", "arithmetic"),
    ("[[ {{step}} -gt 1 ]] && run", "inside [[ ... ]]"),
    ("a[{{step}}]=1", "array subscript"),
    ("run # {{run_key}}", "comment"),
    ("#SBATCH --job-name={{new_run_key}}\nrun", "#SBATCH"),
    ("cat <<EOF\n{{run_key}}\nEOF", "here-document"),
    ("eval run {{run_key}}", "eval runs its arguments"),
    ('bash -c "run {{run_key}}"', "bash -c runs that argument as code"),
    ('srun bash -o pipefail -lc "run {{run_key}}"', "bash -lc runs"),
    ('python3 -c "print({{step}})"', "python3 -c runs"),
    ('su someone -c "run {{run_key}}"', "su -c runs"),
    ("ssh node1 run {{run_key}}", "ssh runs its arguments"),
    ("run ${{run_key}}", "not where bash reads a word"),
    ("run \\{{run_key}}", "not where bash reads a word"),
    ('run "{{run_key}}', "leaves a double quote open"),
    ("run {{checkpoint}}", "unknown placeholder {{checkpoint}}"),
]


@pytest.mark.parametrize(("template", "command"), ACCEPTED)
def test_placeholders_become_references_to_the_jobs_variables(template, command):
    from webapp.domain.launch import template as templates

    assert templates.render(template) == command


@pytest.mark.parametrize(("template", "why"), REFUSED)
def test_placeholders_where_no_value_can_be_made_safe_are_refused(template, why):
    from webapp.domain.launch import template as templates

    with pytest.raises(templates.TemplateRefused, match=None) as refused:
        templates.render(template)
    assert why in str(refused.value)


def test_redaction_hides_known_secrets_and_keeps_training_logs(monkeypatch, tmp_path):
    from webapp.domain.launch.redact import redact

    monkeypatch.setenv("S3_BACKUP_SECRET_ACCESS_KEY", "worker-value-0123456789")
    monkeypatch.chdir(tmp_path)
    hidden = {
        "SECRET_KEY=django-insecure-abc123": "SECRET_KEY=[redacted]",
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789": "HF_TOKEN=[redacted]",
        'client_secret: "abc def"': "client_secret: [redacted]",
        "GITHUB ghp_abcdefghijklmnopqrstuvwxyz0123456789": "GITHUB [redacted]",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----": "[redacted]",
        "key worker-value-0123456789 printed": "key [redacted] printed",
        "https://bob:s3cr3t@example.com/x": "https://bob:[redacted]@example.com/x",
    }
    for text, shown in hidden.items():
        assert redact(text) == shown
    kept = f"epoch 3 loss=0.25 max_tokens=512 tokens/s=1000 token_count: 9 in {tmp_path}"
    assert redact(kept) == kept


@pytest.mark.django_db
def test_the_resume_list_shows_the_output_to_operators_only_and_redacted(
    project, settings, tmp_path
):
    viewer, operator = member(project, "vera", "viewer"), member(project, "otto", "operator")
    settings.VAR_DIR = tmp_path
    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 10)
    child = make_run(project, "r-resume-1", name="R, resumed")
    echo = LaunchProfile.objects.create(project=project, name="p", command_template="echo hi")
    resume = Resume.objects.create(
        project=project, run=run, checkpoint=checkpoint, profile=echo,
        status="failed", command="echo hi", external_id="pid:4242", error="exit code 3",
        new_run=child,
    )  # fmt: skip
    folder = tmp_path / "launch" / f"resume-{resume.pk}"
    folder.mkdir(parents=True)
    secret = "lb_" + "s" * 43
    (folder / "output.log").write_text(
        "".join(f"line {i}\n" for i in range(98)) + f"LIFEBOAT_TOKEN={secret}\nline 99\n"
    )
    client = as_user(viewer)
    response = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/")
    row = response.content.decode().split(f'id="resume-{resume.pk}"')[1].split("</tr>")[0]
    assert "Failed" in row and "pid:4242" in row and "exit code 3" in row
    assert 'href="/p/alpha/runs/r-resume-1/"' in row
    assert "line 9" not in row and "[redacted]" not in row  # a viewer sees no output
    page = as_user(operator).get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    row = page.split(f'id="resume-{resume.pk}"')[1].split("</tr>")[0]
    assert "line 99" in row and "line 79" not in row  # the last 20 lines
    assert "LIFEBOAT_TOKEN=[redacted]" in row and secret[3:] not in page
    # Final: the page does not poll for it.
    poll = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/", HTTP_HX_REQUEST="true")
    assert poll.status_code == 286
