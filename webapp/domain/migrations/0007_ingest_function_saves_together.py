"""lifeboat_ingest_v1 (migration 0005) with one more block: a group whose events are all
saves of steps not known yet, which is what training jobs send most, is applied with a
handful of set-based statements for the whole group instead of four statements per
event in the loop. Same rules, same rows (tests/test_ingest_in_sql.py compares them with
the Python way's); any other group goes on to the loop as before.

Why: each statement of the loop has a cost of its own in PostgreSQL, and under load from
single-event clients the web process's committer hands the function groups of several
saves. Measured here (docs/benchmarks.md, fifth session): 8 saves per call, 1.17-1.23 ms
of PostgreSQL CPU against 1.37-1.40 with the loop; served single events 1,968-2,014/s
against 1,790-1,870, alternated twice."""

import importlib

from django.db import migrations

LOOP = importlib.import_module("webapp.domain.migrations.0005_ingest_function").FUNCTION

# Before the loop's first statement: the runs are locked by then, so no other
# transaction can add a checkpoint to them until this one ends.
BEFORE = "  WITH inserted AS ("
SAVES_TOGETHER = r"""
  -- Only saves, each of a step that has no checkpoint row yet and is saved once in the
  -- group: all of them are new checkpoints, whatever their order. (A repeated event
  -- saves a step that has a row, so repeats take the loop.)
  IF NOT EXISTS (SELECT FROM jsonb_array_elements(p_events) x
                 WHERE x->>'type' <> 'checkpoint.saved')
     AND (SELECT count(DISTINCT (x->>'run', x->>'step')) = count(*)
          FROM jsonb_array_elements(p_events) x)
     -- One index lookup per event (LATERAL ... LIMIT 1): as a plain EXISTS, a plan made
     -- while the table was small (never analyzed) hashes the whole table on every call.
     AND NOT EXISTS (
       SELECT FROM jsonb_array_elements(p_events) x
       JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'
       CROSS JOIN LATERAL (
         SELECT FROM domain_checkpoint known
         WHERE known.run_id = r.id AND known.step = (x->>'step')::bigint LIMIT 1) AS hit)
  THEN
    WITH ev AS (
      SELECT x, n, r.id AS run_id, (x->>'id')::uuid AS event_id,
             (x->>'time')::timestamptz AS at, (x->>'step')::bigint AS step
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(x, n)
      JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'),
    inserted AS (
      INSERT INTO domain_event (project_id, run_id, event_id, type, step, time, received_at,
                                actor, data, message)
      SELECT p_project, run_id, event_id, 'checkpoint.saved', step, at, p_now, x->>'actor',
             x->'data', ''
      FROM ev ORDER BY n
      -- An id stored before with other content (its step has no row): not applied
      -- again, as in the loop.
      ON CONFLICT (project_id, event_id) DO NOTHING
      RETURNING event_id),
    fresh AS (SELECT ev.* FROM ev JOIN inserted USING (event_id)),
    checkpoints AS (
      INSERT INTO domain_checkpoint (project_id, run_id, step, epoch, saved_at, location, format,
        total_size, file_count, save_seconds, metrics, content, status, status_message, error,
        pinned, validation_enqueued_at, verified_at, deleted_at, created_at, updated_at)
      SELECT p_project, run_id, step, (x->>'epoch')::integer, at, x->>'location',
        x->>'format', (x->>'total_size')::bigint, (x->>'file_count')::integer,
        (x->>'save_seconds')::double precision, x->'metrics', '{}', 'reported', '', '',
        false, p_now, NULL, NULL, p_now, p_now
      FROM fresh ORDER BY at, n
      RETURNING id, run_id, step),
    files AS (
      INSERT INTO domain_checkpointfile (checkpoint_id, path, size, sha256)
      SELECT made.id, f->>0, (f->>1)::bigint, f->>2
      FROM checkpoints made JOIN fresh USING (run_id, step),
           jsonb_array_elements(fresh.x->'files') f),
    runs AS (
      -- What the loop's one update per save adds up to: greatest() of each.
      UPDATE domain_run r SET last_seen_at = greatest(r.last_seen_at, m.at),
                              last_step = greatest(r.last_step, m.step)
      FROM (SELECT run_id, max(at) AS at, max(step) AS step FROM fresh GROUP BY run_id) m
      WHERE r.id = m.run_id)
    SELECT coalesce((SELECT array_agg(event_id) FROM inserted), '{}'),
           coalesce((SELECT array_agg(id) FROM checkpoints), '{}')
    INTO new_ids, to_validate;
    RETURN jsonb_build_object('new', to_jsonb(new_ids), 'validate', to_jsonb(to_validate));
  END IF;

"""
assert LOOP.count(BEFORE) == 1
# (Its aliases are not c or e, which name variables of the function.)
FUNCTION = LOOP.replace(BEFORE, SAVES_TOGETHER + BEFORE)


def _create(function: str):
    def create(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(function)  # no parameters: its % signs are PL/pgSQL's

    return create


class Migration(migrations.Migration):
    dependencies = [("domain", "0006_checkpoint_lookup_by_unique_index")]

    operations = [migrations.RunPython(_create(FUNCTION), _create(LOOP))]
