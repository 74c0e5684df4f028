"""lifeboat_ingest_v1 (migration 0007) joining no statement on domain_run.

Why: with many runs in a project (a sweep of 20,000), a call read every run of the
project: its statements found the runs of their events by joins on `r.key = x->>'run'`,
which PostgreSQL planned as a hash join over all of the project's runs, and the saves
applied together updated their runs with an UPDATE ... FROM, planned the same way.
Measured in one connection (docs/benchmarks.md, sixth session): a call with one save
cost 0.37-0.40 ms of PostgreSQL CPU with one run in the project, 11 ms once 20,000 more
runs were added, and still 5.8-6.7 ms in a new connection after ANALYZE.

Now the statement that locks the runs (in id order, as before) also returns their ids
by key, and the other statements take the ids from there; the saves applied together
update their runs one by one by primary key. Then 0.40-0.47 ms with 20,000 runs, and
served single events within 2 % of 0007 with 8 runs. Tried first and not kept: each key
looked up by a statement planned at each call (EXECUTE), or one lookup and one lock per
run: 10-20 % fewer single events served, for each statement's own cost.

What is left: the lock's plan, made once per connection, can use the index on the
project alone (with the key as a filter) when it was made while the table was small and
never analyzed; then it reads the project's runs until the next ANALYZE, which
autovacuum runs (tests/test_ingest_in_sql.py runs ANALYZE, as autovacuum would)."""

import importlib

from django.db import migrations

_0007 = importlib.import_module("webapp.domain.migrations.0007_ingest_function_saves_together")
PREVIOUS = _0007.FUNCTION
_create = _0007._create  # CREATE OR REPLACE of a function text, on PostgreSQL only

LOCK_BEFORE = """  SELECT count(*) INTO locked FROM (
    SELECT id FROM domain_run WHERE project_id = p_project AND key = ANY(keys)
    ORDER BY id FOR UPDATE) AS r;
"""
LOCK_NOW = """  SELECT count(*), coalesce(jsonb_object_agg(r.key, r.id), '{}') INTO locked, run_map
  FROM (
    SELECT id, key FROM domain_run WHERE project_id = p_project AND key = ANY(keys)
    ORDER BY id FOR UPDATE) AS r;
"""
JOIN_BEFORE = "JOIN domain_run r ON r.project_id = p_project AND r.key = x->>'run'"
# The runs found by the lock, instead of a join on domain_run (planned as a hash of all
# the project's runs). Every key is there: a missing run ended the call already.
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


class Migration(migrations.Migration):
    dependencies = [("domain", "0007_ingest_function_saves_together")]

    operations = [migrations.RunPython(_create(FUNCTION), _create(PREVIOUS))]
