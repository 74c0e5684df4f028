"""The PostgreSQL function that applies a small group of events in one statement
(webapp/domain/ingest_in_sql.py says why and which events it takes).

Changing the ingest rules for these events means changing both this function (in a new
migration that replaces it) and webapp/domain/ingest/apply.py's _Applier: tests/test_ingest_in_sql.py
runs the same events through both and compares every row they write."""

from django.db import migrations

FUNCTION = r"""
CREATE OR REPLACE FUNCTION lifeboat_ingest_v1(p_project bigint, p_now timestamptz, p_events jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  keys text[];
  locked int;
  new_ids uuid[];
  to_validate bigint[] := '{}';
  e record;
  c record;
  c_id bigint;
BEGIN
  SELECT array_agg(DISTINCT x->>'run') INTO keys FROM jsonb_array_elements(p_events) x;
  -- The runs first, in id order, as the other way locks them: two transactions that
  -- touch the same run (or send the same event) wait for each other here.
  SELECT count(*) INTO locked FROM (
    SELECT id FROM domain_run WHERE project_id = p_project AND key = ANY(keys)
    ORDER BY id FOR UPDATE) AS r;
  IF locked < cardinality(keys) THEN
    RAISE EXCEPTION 'a run of these events does not exist yet' USING ERRCODE = 'LBF01';
  END IF;

  WITH inserted AS (
    INSERT INTO domain_event (project_id, run_id, event_id, type, step, time, received_at,
                              actor, data, message)
    SELECT p_project, r.id, (x->>'id')::uuid, x->>'type', (x->>'step')::bigint,
           (x->>'time')::timestamptz, p_now, x->>'actor', x->'data', ''
    FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(x, n)
    JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'
    ORDER BY n
    ON CONFLICT (project_id, event_id) DO NOTHING
    RETURNING event_id)
  SELECT coalesce(array_agg(event_id), '{}') INTO new_ids FROM inserted;

  -- The new events in time order, so the newest value of a field wins.
  FOR e IN
    SELECT x, r.id AS run_id, (x->>'time')::timestamptz AS at, (x->>'step')::bigint AS step,
           x->>'type' AS type
    FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(x, n)
    JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'
    WHERE (x->>'id')::uuid = ANY(new_ids)
    ORDER BY 3, n
  LOOP
    IF e.type = 'run.heartbeat' THEN
      UPDATE domain_run SET
        last_seen_at = greatest(last_seen_at, e.at),
        last_heartbeat_at = CASE WHEN last_heartbeat_at IS NULL OR e.at >= last_heartbeat_at
                                 THEN e.at ELSE last_heartbeat_at END,
        last_step = CASE WHEN (last_heartbeat_at IS NULL OR e.at >= last_heartbeat_at)
                               AND e.step IS NOT NULL
                         THEN e.step ELSE last_step END,
        last_metrics = CASE WHEN (last_heartbeat_at IS NULL OR e.at >= last_heartbeat_at)
                                  AND e.x->'metrics' <> '{}'::jsonb
                            THEN e.x->'metrics' ELSE last_metrics END
      WHERE id = e.run_id;
      CONTINUE;
    END IF;

    -- checkpoint.started, .failed, .saved
    UPDATE domain_run SET last_seen_at = greatest(last_seen_at, e.at),
                          last_step = greatest(last_step, e.step)
    WHERE id = e.run_id;
    SELECT id, status, saved_at, error INTO c FROM domain_checkpoint
    WHERE run_id = e.run_id AND step = e.step FOR UPDATE;

    IF NOT FOUND AND e.type <> 'checkpoint.saved' THEN
      -- Announced (or failed) before any save: a checkpoint being saved, as the Python
      -- way makes it before applying the event.
      INSERT INTO domain_checkpoint (project_id, run_id, step, epoch, saved_at, location, format,
        total_size, file_count, save_seconds, metrics, content, status, status_message, error,
        pinned, validation_enqueued_at, verified_at, deleted_at, created_at, updated_at)
      VALUES (p_project, e.run_id, e.step, NULL, NULL, '', '', 0, 0, NULL, '{}', '{}',
        'saving', '', '', false, NULL, NULL, NULL, p_now, p_now)
      RETURNING id, status, saved_at, error INTO c;
    END IF;

    IF e.type = 'checkpoint.started' THEN
      NULL;  -- nothing more than the row

    ELSIF e.type = 'checkpoint.failed' THEN
      IF c.status = 'saving' THEN
        UPDATE domain_checkpoint SET status = 'failed',
          status_message = 'The job reported that this save failed.', error = e.x->>'error',
          updated_at = p_now
        WHERE id = c.id;
      ELSIF c.error <> e.x->>'error' THEN
        -- A failure after a successful save: kept, validation decides what the files are
        -- worth.
        UPDATE domain_checkpoint SET error = e.x->>'error', updated_at = p_now WHERE id = c.id;
      END IF;

    ELSIF e.type = 'checkpoint.saved' THEN
      IF FOUND AND c.saved_at IS NOT NULL THEN
        -- Saved before: a repeat or a re-save, which webapp/domain/ingest/apply.py tells apart.
        RAISE EXCEPTION 'this step was saved before' USING ERRCODE = 'LBF02';
      ELSIF FOUND THEN
        UPDATE domain_checkpoint SET saved_at = e.at, epoch = (e.x->>'epoch')::integer,
          save_seconds = (e.x->>'save_seconds')::double precision, metrics = e.x->'metrics',
          format = e.x->>'format', location = e.x->>'location',
          total_size = (e.x->>'total_size')::bigint, file_count = (e.x->>'file_count')::integer,
          status = 'reported', status_message = '', verified_at = NULL, deleted_at = NULL,
          validation_enqueued_at = p_now, updated_at = p_now
        WHERE id = c.id;
        c_id := c.id;
      ELSE
        INSERT INTO domain_checkpoint (project_id, run_id, step, epoch, saved_at, location, format,
          total_size, file_count, save_seconds, metrics, content, status, status_message, error,
          pinned, validation_enqueued_at, verified_at, deleted_at, created_at, updated_at)
        VALUES (p_project, e.run_id, e.step, (e.x->>'epoch')::integer, e.at, e.x->>'location',
          e.x->>'format', (e.x->>'total_size')::bigint, (e.x->>'file_count')::integer,
          (e.x->>'save_seconds')::double precision, e.x->'metrics', '{}', 'reported', '', '',
          false, p_now, NULL, NULL, p_now, p_now)
        RETURNING id INTO c_id;
      END IF;
      INSERT INTO domain_checkpointfile (checkpoint_id, path, size, sha256)
      SELECT c_id, f->>0, (f->>1)::bigint, f->>2 FROM jsonb_array_elements(e.x->'files') f;
      to_validate := to_validate || c_id;

    ELSE
      RAISE EXCEPTION 'events of type % are applied by webapp/domain/ingest/apply.py', e.type
        USING ERRCODE = 'LBF02';
    END IF;
  END LOOP;
  RETURN jsonb_build_object('new', to_jsonb(new_ids), 'validate', to_jsonb(to_validate));
END
$fn$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(FUNCTION)  # no parameters: its % signs are PL/pgSQL's


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS lifeboat_ingest_v1(bigint, timestamptz, jsonb)"
        )


class Migration(migrations.Migration):
    dependencies = [("domain", "0004_fewer_ingest_indexes")]

    operations = [migrations.RunPython(create, drop)]
