"""The ingest rules live in one place, webapp/domain/ingest/rules.py: the PL/pgSQL
function lifeboat_ingest_v1 (migrations 0005, 0007 and 0008, kept so that existing
databases migrate) is no longer called and goes. Reversing loads 0008's text again."""

from __future__ import annotations

import importlib

from django.db import migrations

_0008 = importlib.import_module("webapp.domain.migrations.0008_ingest_function_runs_by_key")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS lifeboat_ingest_v1(bigint, timestamptz, jsonb)"
        )


class Migration(migrations.Migration):
    dependencies = [("domain", "0014_run_stats")]

    operations = [migrations.RunPython(drop, _0008._create(_0008.FUNCTION))]
