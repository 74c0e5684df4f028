"""Tokens in use have distinct names within a project. Tokens that already share a name
are renamed first ("trainer", "trainer (2)", ...), oldest keeping the name."""

from django.db import migrations, models


def rename_duplicates(apps, schema_editor):
    ApiToken = apps.get_model("domain", "ApiToken")
    seen: dict[tuple[int, str], int] = {}
    taken = set(
        ApiToken.objects.filter(revoked_at__isnull=True).values_list("project_id", "name")
    )
    active = ApiToken.objects.filter(revoked_at__isnull=True).order_by("created_at", "pk")
    for token in active.only("pk", "project_id", "name"):
        key = (token.project_id, token.name)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            continue
        n = seen[key]
        while (token.project_id, f"{token.name} ({n})"[:100]) in taken:
            n += 1
        new = f"{token.name} ({n})"[:100]
        taken.add((token.project_id, new))
        ApiToken.objects.filter(pk=token.pk).update(name=new)


class Migration(migrations.Migration):
    dependencies = [("domain", "0012_health_badge_key")]

    operations = [
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.UniqueConstraint(
                condition=models.Q(revoked_at__isnull=True),
                fields=("project", "name"),
                name="api_token_name_unique",
            ),
        ),
    ]
