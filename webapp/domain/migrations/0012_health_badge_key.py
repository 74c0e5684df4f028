"""Project.badge_key: the unguessable part of status badge URLs. Existing projects get
one each (a column default would give them all the same key)."""

from __future__ import annotations

from django.db import migrations, models

import webapp.domain.models.projects


def give_each_a_key(apps, schema_editor):
    Project = apps.get_model("domain", "Project")
    for project in Project.objects.all().only("pk"):
        Project.objects.filter(pk=project.pk).update(
            badge_key=webapp.domain.models.projects.new_badge_key()
        )


class Migration(migrations.Migration):
    dependencies = [("domain", "0011_confine_checkpoint_deleting")]

    operations = [
        migrations.AddField(
            model_name="project",
            name="badge_key",
            field=models.CharField(max_length=32, null=True),
        ),
        migrations.RunPython(give_each_a_key, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="project",
            name="badge_key",
            field=models.CharField(
                default=webapp.domain.models.projects.new_badge_key, max_length=32, unique=True
            ),
        ),
    ]
