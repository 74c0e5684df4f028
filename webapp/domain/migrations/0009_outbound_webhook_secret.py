"""Every alert channel gets its own signing secret (webapp/domain/health/webhook_delivery.py);
existing channels get one each, not one shared default. Webhook answers stored by
earlier versions ("HTTP 404: <the first bytes of the body>") keep their status only."""

from __future__ import annotations

import re

from django.db import migrations, models

import webapp.domain.health.webhook_delivery

_WITH_BODY = re.compile(r"^(HTTP \d{3}): .*", re.S)


def _status_only(text):
    return _WITH_BODY.sub(r"\1", text) if isinstance(text, str) else text


def drop_stored_bodies(apps, schema_editor):
    Notification = apps.get_model("domain", "Notification")
    for notification in Notification.objects.filter(last_error__startswith="HTTP ").iterator():
        notification.last_error = _status_only(notification.last_error)
        notification.attempts = [
            {**a, "error": _status_only(a.get("error"))} if isinstance(a, dict) else a
            for a in notification.attempts or []
        ]
        notification.save(update_fields=["last_error", "attempts"])


def give_each_a_secret(apps, schema_editor):
    AlertChannel = apps.get_model("domain", "AlertChannel")
    for channel in AlertChannel.objects.all().only("pk"):
        AlertChannel.objects.filter(pk=channel.pk).update(
            secret=webapp.domain.health.webhook_delivery.new_secret()
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
        migrations.RunPython(drop_stored_bodies, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="alertchannel",
            name="secret",
            field=models.CharField(
                default=webapp.domain.health.webhook_delivery.new_secret, editable=False, max_length=100
            ),
        ),
    ]
