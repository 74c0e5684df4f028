"""RunStats: each run's storage, checkpoint count and newest saved checkpoint, kept by
triggers on domain_checkpoint, so the dashboard reads one row per run instead of
summing every checkpoint (bench/pages.py: the project page sorted by storage summed
1,000,000 checkpoints for each request).

Why triggers: checkpoints are written by the ingest function (SQL), bulk SQL, Django
code, retention and the workers; a trigger is the one place that sees every write, in
the same transaction. PostgreSQL: statement-level triggers with transition tables for
INSERT and DELETE (a batch of saves costs one upsert per run, not one per row), and a
row-level trigger for UPDATE whose WHEN clause lets through only the updates that change
a total (a status change across deleted or saving/failed, a size, a step, a time), so
the frequent status updates of validation cost no function call. SQLite (development
and tests): row-level triggers with the same rule.

Rules, in both:
- storage_bytes: sum of total_size over checkpoints whose status is not 'deleted';
- checkpoint_count: every row;
- last_checkpoint_step/at: the saved checkpoint (status neither 'saving' nor 'failed')
  with the highest step. Inserts only move it up (a comparison with the row, so two
  transactions saving steps of the same run cannot undo each other); an update or a
  delete of that very checkpoint looks the newest one up again.
The DELETE triggers only update (never insert) a stats row: deleting a run deletes its
stats row and its checkpoints in an order Django chooses."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

PG_FORWARD = """
CREATE FUNCTION lifeboat_run_stats_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO domain_runstats AS s
    (run_id, storage_bytes, checkpoint_count, last_checkpoint_step, last_checkpoint_at)
  SELECT run_id,
         coalesce(sum(total_size) FILTER (WHERE status <> 'deleted'), 0),
         count(*),
         (array_agg(step ORDER BY step DESC)
            FILTER (WHERE status NOT IN ('saving', 'failed')))[1],
         (array_agg(saved_at ORDER BY step DESC)
            FILTER (WHERE status NOT IN ('saving', 'failed')))[1]
  FROM new_rows GROUP BY run_id
  ON CONFLICT (run_id) DO UPDATE SET
    storage_bytes = s.storage_bytes + EXCLUDED.storage_bytes,
    checkpoint_count = s.checkpoint_count + EXCLUDED.checkpoint_count,
    last_checkpoint_step = CASE
      WHEN EXCLUDED.last_checkpoint_step
           >= coalesce(s.last_checkpoint_step, EXCLUDED.last_checkpoint_step)
      THEN EXCLUDED.last_checkpoint_step ELSE s.last_checkpoint_step END,
    last_checkpoint_at = CASE
      WHEN EXCLUDED.last_checkpoint_step
           >= coalesce(s.last_checkpoint_step, EXCLUDED.last_checkpoint_step)
      THEN EXCLUDED.last_checkpoint_at ELSE s.last_checkpoint_at END;
  RETURN NULL;
END $$;

CREATE FUNCTION lifeboat_run_stats_newest(p_run bigint) RETURNS void LANGUAGE sql AS $$
  UPDATE domain_runstats s SET
    last_checkpoint_step = n.step, last_checkpoint_at = n.saved_at
  FROM (SELECT p_run AS run_id) r
  LEFT JOIN LATERAL (
    SELECT step, saved_at FROM domain_checkpoint
    WHERE run_id = p_run AND status NOT IN ('saving', 'failed') ORDER BY step DESC LIMIT 1
  ) n ON true
  WHERE s.run_id = r.run_id
$$;

CREATE FUNCTION lifeboat_run_stats_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  changed record;
BEGIN
  FOR changed IN
    WITH d AS (
      SELECT run_id, coalesce(sum(total_size) FILTER (WHERE status <> 'deleted'), 0) AS size,
             count(*) AS n, max(step) FILTER (WHERE status NOT IN ('saving', 'failed')) AS top
      FROM old_rows GROUP BY run_id)
    UPDATE domain_runstats s SET
      storage_bytes = s.storage_bytes - d.size, checkpoint_count = s.checkpoint_count - d.n
    FROM d WHERE s.run_id = d.run_id
    RETURNING s.run_id, coalesce(d.top >= s.last_checkpoint_step, false) AS lost_newest
  LOOP
    IF changed.lost_newest THEN
      PERFORM lifeboat_run_stats_newest(changed.run_id);
    END IF;
  END LOOP;
  RETURN NULL;
END $$;

CREATE FUNCTION lifeboat_run_stats_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  old_size bigint := CASE WHEN OLD.status <> 'deleted' THEN OLD.total_size ELSE 0 END;
  new_size bigint := CASE WHEN NEW.status <> 'deleted' THEN NEW.total_size ELSE 0 END;
  new_saved boolean := NEW.status NOT IN ('saving', 'failed');
  top bigint;
BEGIN
  IF OLD.run_id <> NEW.run_id THEN
    RAISE EXCEPTION 'a checkpoint does not move to another run';
  END IF;
  INSERT INTO domain_runstats AS s
    (run_id, storage_bytes, checkpoint_count, last_checkpoint_step, last_checkpoint_at)
  VALUES (NEW.run_id, new_size - old_size, 0,
          CASE WHEN new_saved THEN NEW.step END, CASE WHEN new_saved THEN NEW.saved_at END)
  ON CONFLICT (run_id) DO UPDATE SET
    storage_bytes = s.storage_bytes + EXCLUDED.storage_bytes,
    last_checkpoint_step = CASE
      WHEN EXCLUDED.last_checkpoint_step
           >= coalesce(s.last_checkpoint_step, EXCLUDED.last_checkpoint_step)
      THEN EXCLUDED.last_checkpoint_step ELSE s.last_checkpoint_step END,
    last_checkpoint_at = CASE
      WHEN EXCLUDED.last_checkpoint_step
           >= coalesce(s.last_checkpoint_step, EXCLUDED.last_checkpoint_step)
      THEN EXCLUDED.last_checkpoint_at ELSE s.last_checkpoint_at END
  RETURNING s.last_checkpoint_step INTO top;
  -- The newest saved checkpoint stopped being saved, or moved down: look it up again.
  IF OLD.step = top AND NOT (new_saved AND NEW.step >= top) THEN
    PERFORM lifeboat_run_stats_newest(NEW.run_id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER run_stats_insert AFTER INSERT ON domain_checkpoint
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION lifeboat_run_stats_insert();
CREATE TRIGGER run_stats_delete AFTER DELETE ON domain_checkpoint
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
  EXECUTE FUNCTION lifeboat_run_stats_delete();
CREATE TRIGGER run_stats_update AFTER UPDATE ON domain_checkpoint FOR EACH ROW
  WHEN (OLD.total_size IS DISTINCT FROM NEW.total_size
        OR OLD.step IS DISTINCT FROM NEW.step
        OR OLD.saved_at IS DISTINCT FROM NEW.saved_at
        OR OLD.run_id IS DISTINCT FROM NEW.run_id
        OR (OLD.status = 'deleted') IS DISTINCT FROM (NEW.status = 'deleted')
        OR (OLD.status IN ('saving', 'failed'))
           IS DISTINCT FROM (NEW.status IN ('saving', 'failed')))
  EXECUTE FUNCTION lifeboat_run_stats_update();
"""

PG_BACKWARD = """
DROP TRIGGER IF EXISTS run_stats_insert ON domain_checkpoint;
DROP TRIGGER IF EXISTS run_stats_delete ON domain_checkpoint;
DROP TRIGGER IF EXISTS run_stats_update ON domain_checkpoint;
DROP FUNCTION IF EXISTS lifeboat_run_stats_insert();
DROP FUNCTION IF EXISTS lifeboat_run_stats_delete();
DROP FUNCTION IF EXISTS lifeboat_run_stats_update();
DROP FUNCTION IF EXISTS lifeboat_run_stats_newest(bigint);
"""

# SQLite: row-level. The newest saved checkpoint is looked up again on every update and
# delete that passes the WHEN clause (one writer at a time: no race to care about).
SQLITE_NEWEST = """
  UPDATE domain_runstats SET
    last_checkpoint_step = (SELECT step FROM domain_checkpoint
      WHERE run_id = RUN AND status NOT IN ('saving', 'failed') ORDER BY step DESC LIMIT 1),
    last_checkpoint_at = (SELECT saved_at FROM domain_checkpoint
      WHERE run_id = RUN AND status NOT IN ('saving', 'failed') ORDER BY step DESC LIMIT 1)
  WHERE run_id = RUN;"""

SQLITE_FORWARD = [
    """
CREATE TRIGGER run_stats_insert AFTER INSERT ON domain_checkpoint BEGIN
  INSERT OR IGNORE INTO domain_runstats
    (run_id, storage_bytes, checkpoint_count, last_checkpoint_step, last_checkpoint_at)
    VALUES (NEW.run_id, 0, 0, NULL, NULL);
  UPDATE domain_runstats SET
    storage_bytes = storage_bytes
      + CASE WHEN NEW.status <> 'deleted' THEN NEW.total_size ELSE 0 END,
    checkpoint_count = checkpoint_count + 1,
    last_checkpoint_step = CASE WHEN NEW.status NOT IN ('saving', 'failed')
      AND NEW.step >= coalesce(last_checkpoint_step, NEW.step)
      THEN NEW.step ELSE last_checkpoint_step END,
    last_checkpoint_at = CASE WHEN NEW.status NOT IN ('saving', 'failed')
      AND NEW.step >= coalesce(last_checkpoint_step, NEW.step)
      THEN NEW.saved_at ELSE last_checkpoint_at END
  WHERE run_id = NEW.run_id;
END""",
    """
CREATE TRIGGER run_stats_update AFTER UPDATE ON domain_checkpoint
WHEN OLD.total_size IS NOT NEW.total_size OR OLD.step IS NOT NEW.step
  OR OLD.saved_at IS NOT NEW.saved_at OR OLD.run_id IS NOT NEW.run_id
  OR (OLD.status = 'deleted') IS NOT (NEW.status = 'deleted')
  OR (OLD.status IN ('saving', 'failed')) IS NOT (NEW.status IN ('saving', 'failed'))
BEGIN
  INSERT OR IGNORE INTO domain_runstats
    (run_id, storage_bytes, checkpoint_count, last_checkpoint_step, last_checkpoint_at)
    VALUES (NEW.run_id, 0, 0, NULL, NULL);
  UPDATE domain_runstats SET storage_bytes = storage_bytes
    - CASE WHEN OLD.status <> 'deleted' THEN OLD.total_size ELSE 0 END
    + CASE WHEN NEW.status <> 'deleted' THEN NEW.total_size ELSE 0 END
  WHERE run_id = NEW.run_id;
  NEWEST_OF_NEW_RUN
END""",
    """
CREATE TRIGGER run_stats_delete AFTER DELETE ON domain_checkpoint BEGIN
  UPDATE domain_runstats SET
    storage_bytes = storage_bytes
      - CASE WHEN OLD.status <> 'deleted' THEN OLD.total_size ELSE 0 END,
    checkpoint_count = checkpoint_count - 1
  WHERE run_id = OLD.run_id;
  NEWEST_OF_OLD_RUN
END""",
]
SQLITE_FORWARD = [
    statement.replace("NEWEST_OF_NEW_RUN", SQLITE_NEWEST.replace("RUN", "NEW.run_id")).replace(
        "NEWEST_OF_OLD_RUN", SQLITE_NEWEST.replace("RUN", "OLD.run_id")
    )
    for statement in SQLITE_FORWARD
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS run_stats_insert",
    "DROP TRIGGER IF EXISTS run_stats_update",
    "DROP TRIGGER IF EXISTS run_stats_delete",
]

# Existing runs: their totals from their checkpoints, once.
BACKFILL = """
INSERT INTO domain_runstats
  (run_id, storage_bytes, checkpoint_count, last_checkpoint_step, last_checkpoint_at)
SELECT r.id,
  coalesce((SELECT sum(total_size) FROM domain_checkpoint
            WHERE run_id = r.id AND status <> 'deleted'), 0),
  (SELECT count(*) FROM domain_checkpoint WHERE run_id = r.id),
  (SELECT step FROM domain_checkpoint WHERE run_id = r.id AND status NOT IN ('saving', 'failed')
   ORDER BY step DESC LIMIT 1),
  (SELECT saved_at FROM domain_checkpoint WHERE run_id = r.id AND status NOT IN ('saving', 'failed')
   ORDER BY step DESC LIMIT 1)
FROM domain_run r WHERE EXISTS (SELECT 1 FROM domain_checkpoint WHERE run_id = r.id)
"""


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    statements = {"postgresql": [PG_FORWARD], "sqlite": SQLITE_FORWARD}.get(vendor)
    if statements is None:
        raise RuntimeError(
            f"run stats triggers are written for PostgreSQL and SQLite, not {vendor}"
        )
    for statement in [*statements, BACKFILL]:
        schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    statements = [PG_BACKWARD] if vendor == "postgresql" else SQLITE_BACKWARD
    for statement in statements:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("domain", "0013_settings_tokens_natural_sort")]

    operations = [
        migrations.CreateModel(
            name="RunStats",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="stats",
                        serialize=False,
                        to="domain.run",
                    ),
                ),
                ("storage_bytes", models.BigIntegerField(default=0)),
                ("checkpoint_count", models.BigIntegerField(default=0)),
                ("last_checkpoint_step", models.BigIntegerField(blank=True, null=True)),
                ("last_checkpoint_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
