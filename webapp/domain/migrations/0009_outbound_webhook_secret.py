"""Every alert channel gets its own signing secret (webapp/domain/webhook_delivery.py);
existing channels get one each, not one shared default."""

from __future__ import annotations

from django.db import migrations, models

import webapp.domain.webhook_delivery


def give_each_a_secret(apps, schema_editor):
    AlertChannel = apps.get_model("domain", "AlertChannel")
    for channel in AlertChannel.objects.all().only("pk"):
        AlertChannel.objects.filter(pk=channel.pk).update(
            secret=webapp.domain.webhook_delivery.new_secret()
        )


class Migration(migrations.Migration):
    dependencies = [("domain", "0008_ingest_function_runs_by_key")]

    operations = [
        migrations.AddField(
            model_name="alertchannel",
            name="secret",
            field=models.CharField(default="", editable=False, max_length=100),
            preserve_default=False,
        ),
        migrations.RunPython(give_each_a_secret, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="alertchannel",
            name="secret",
            field=models.CharField(
                default=webapp.domain.webhook_delivery.new_secret, editable=False, max_length=100
            ),
        ),
    ]
