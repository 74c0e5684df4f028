"""Storage targets saved before StorageTarget.save normalised them: the same place in
one spelling (webapp/domain/replication/spelling.py)."""

from django.db import migrations


def normalise(apps, schema_editor):
    # Here, not at the top: every `migrate` loads this module; only this step needs it.
    from webapp.domain.replication.spelling import normal_endpoint, normal_prefix

    StorageTarget = apps.get_model("domain", "StorageTarget")
    for target in StorageTarget.objects.all():
        prefix, endpoint = normal_prefix(target.prefix), normal_endpoint(target.endpoint_url)
        if (prefix, endpoint) != (target.prefix, target.endpoint_url):
            StorageTarget.objects.filter(pk=target.pk).update(prefix=prefix, endpoint_url=endpoint)


class Migration(migrations.Migration):
    dependencies = [("domain", "0018_sweeper_leases")]

    operations = [migrations.RunPython(normalise, migrations.RunPython.noop)]
