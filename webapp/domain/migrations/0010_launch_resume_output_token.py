"""Resume.output (the job's output tail, redacted, for operators) and Resume.token (the
job's own token). A failed resume's error used to end with the output tail, shown to
every viewer: it moves, redacted, into `output`."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


def move_tails(apps, schema_editor):
    from webapp.domain.launch.redact import redact

    Resume = apps.get_model("domain", "Resume")
    for resume in Resume.objects.filter(status="failed", error__contains="\n").iterator():
        first, _, tail = resume.error.partition("\n")
        resume.error, resume.output = first, redact(tail)
        resume.save(update_fields=["error", "output"])


class Migration(migrations.Migration):
    dependencies = [("domain", "0009_outbound_webhook_secret")]

    operations = [
        migrations.AddField(
            model_name="resume",
            name="output",
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name="resume",
            name="token",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="domain.apitoken",
            ),
        ),
        migrations.RunPython(move_tails, migrations.RunPython.noop),
    ]
