"""Tokens in use have distinct names within a project (tokens that already share a name
are renamed first: "trainer", "trainer (2)", ..., the oldest keeping the name).

On PostgreSQL, the runs list's name sort in natural order (run-3 before run-28): an ICU
collation with numeric ordering and an index on the expression the list sorts by
(webapp/dashboard/natural_sort.py). SQLite registers the collation on each connection
and has no index for it."""

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


NATURAL_SQL = [
    "CREATE COLLATION IF NOT EXISTS natural_sort (provider = icu, locale = 'und-u-kn-true')",
    "CREATE INDEX IF NOT EXISTS run_project_name_natural ON domain_run "
    "(project_id, (COALESCE(NULLIF(name, ''), key) COLLATE natural_sort), key)",
]
NATURAL_UNDO = [
    "DROP INDEX IF EXISTS run_project_name_natural",
    "DROP COLLATION IF EXISTS natural_sort",
]


def natural_sort(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in NATURAL_SQL:
            schema_editor.execute(sql)


def no_natural_sort(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in NATURAL_UNDO:
            schema_editor.execute(sql)


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
        migrations.RunPython(natural_sort, no_natural_sort),
    ]
