"""lifeboat_ingest_v1 (migration 0007) finding each run of a call once, by its key.

Why: the function found the runs of its events with `key = ANY(keys)` (to lock them)
and with joins on `r.key = x->>'run'` in its statements. With many runs in a project (a
sweep of 20,000), PostgreSQL read every run of the project at each call: an index scan
bounded by the project alone with the key as a filter (three indexes start with the
project), or a hash join over all of them. Measured in one connection
(docs/benchmarks.md, sixth session): a call with one save cost 0.37 ms of PostgreSQL CPU
with one run in the project, 10.3 ms once 20,000 more runs were added, and still 6.0 ms
in a new connection after ANALYZE.

Now each key is looked up once per call by a statement planned at each call (EXECUTE),
so with the table's current size and statistics; the runs are locked one by one in id
order, as before; the other statements take the run ids from that lookup instead of
joining domain_run; and the saves applied together update their runs one by one by
primary key. What is left: on a server that never analyzes (autovacuum off) a small
table can still be planned with the project's index (tests/test_ingest_in_sql.py runs
ANALYZE, as autovacuum would)."""

import importlib

from django.db import migrations

PREVIOUS = importlib.import_module(
    "webapp.domain.migrations.0007_ingest_function_saves_together"
).FUNCTION

LOCK_BEFORE = """  SELECT count(*) INTO locked FROM (
    SELECT id FROM domain_run WHERE project_id = p_project AND key = ANY(keys)
    ORDER BY id FOR UPDATE) AS r;
"""
LOCK_NOW = """  -- Each run by its key, planned at each call (EXECUTE): a plan made once per
  -- connection, while the table was small, used an index on the project alone (three
  -- start with it) and read every run of the project at each lookup. Then the runs are
  -- locked in id order, as before.
  run_map := '{}';
  FOREACH locked_key IN ARRAY keys LOOP
    EXECUTE 'SELECT id FROM domain_run WHERE project_id = $1 AND key = $2'
      INTO locked_id USING p_project, locked_key;
    IF locked_id IS NOT NULL THEN
      run_map := run_map || jsonb_build_object(locked_key, locked_id);
    END IF;
  END LOOP;
  locked := 0;
  FOR locked_id IN SELECT value::bigint FROM jsonb_each_text(run_map) ORDER BY 1 LOOP
    PERFORM FROM domain_run WHERE id = locked_id FOR UPDATE;
    IF FOUND THEN
      locked := locked + 1;
    END IF;
  END LOOP;
"""
JOIN_BEFORE = "JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'"
# The runs found above, instead of a join on domain_run (planned as a hash of all the
# project's runs, or as the lookup above). Every key is there: a missing run ended the
# call already.
JOIN_NOW = "CROSS JOIN LATERAL (SELECT (run_map->>(x->>'run'))::bigint AS id) AS r"
# The saves applied together: the runs' new state was one UPDATE ... FROM a join, which
# PostgreSQL planned as a hash join over a scan of every run; now one update by primary
# key per run, in id order.
RUNS_BEFORE = """    runs AS (
      -- What the loop's one update per save adds up to: greatest() of each.
      UPDATE domain_run r SET last_seen_at = greatest(r.last_seen_at, m.at),
                              last_step = greatest(r.last_step, m.step)
      FROM (SELECT run_id, max(at) AS at, max(step) AS step FROM fresh GROUP BY run_id) m
      WHERE r.id = m.run_id)
    SELECT coalesce((SELECT array_agg(event_id) FROM inserted), '{}'),
           coalesce((SELECT array_agg(id) FROM checkpoints), '{}')
    INTO new_ids, to_validate;
"""
RUNS_NOW = """    -- What the loop's one update per save adds up to: greatest() of each.
    per_run AS (SELECT run_id, max(at) AS at, max(step) AS step FROM fresh GROUP BY run_id)
    SELECT coalesce((SELECT array_agg(event_id) FROM inserted), '{}'),
           coalesce((SELECT array_agg(id) FROM checkpoints), '{}'),
           (SELECT array_agg(run_id ORDER BY run_id) FROM per_run),
           (SELECT array_agg(at ORDER BY run_id) FROM per_run),
           (SELECT array_agg(step ORDER BY run_id) FROM per_run)
    INTO new_ids, to_validate, run_ids, run_ats, run_steps;
    FOR i IN 1 .. coalesce(cardinality(run_ids), 0) LOOP
      UPDATE domain_run SET last_seen_at = greatest(last_seen_at, run_ats[i]),
                            last_step = greatest(last_step, run_steps[i])
      WHERE id = run_ids[i];
    END LOOP;
"""
DECLARE_BEFORE = "  c_id bigint;\n"
DECLARE_NOW = """  c_id bigint;
  locked_id bigint;
  locked_key text;
  run_map jsonb;
  run_ids bigint[];
  run_ats timestamptz[];
  run_steps bigint[];
"""

assert PREVIOUS.count(LOCK_BEFORE) == 1
assert PREVIOUS.count(JOIN_BEFORE) == 4
assert PREVIOUS.count(DECLARE_BEFORE) == 1
assert PREVIOUS.count(RUNS_BEFORE) == 1
FUNCTION = (
    PREVIOUS.replace(LOCK_BEFORE, LOCK_NOW)
    .replace(RUNS_BEFORE, RUNS_NOW)
    .replace(JOIN_BEFORE, JOIN_NOW)
    .replace(DECLARE_BEFORE, DECLARE_NOW)
)


def _create(function: str):
    def create(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(function)  # no parameters: its % signs are PL/pgSQL's

    return create


class Migration(migrations.Migration):
    dependencies = [("domain", "0007_ingest_function_saves_together")]

    operations = [migrations.RunPython(_create(FUNCTION), _create(PREVIOUS))]
