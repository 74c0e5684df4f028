from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("domain", "0012_health_badge_key")]

    operations = [
        migrations.AddField(
            model_name="validation", name="files_total", field=models.IntegerField(default=0)
        ),
        migrations.AddField(
            model_name="validation", name="files_done", field=models.IntegerField(default=0)
        ),
        migrations.AddField(
            model_name="validation",
            name="files_running",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
