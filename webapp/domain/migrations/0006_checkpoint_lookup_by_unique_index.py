"""The run's storage sum moves into the unique index on (run, step), as INCLUDE columns,
and the index of its own on run (checkpoint_run_size) goes.

Why: PostgreSQL chose between the two for "the checkpoint of this run at this step"
by their estimated cost, and while the table was small or never analyzed (a new
install; a server with autovacuum off) the estimates were equal and it took the one
on run alone, reading every checkpoint of the run to find the step. A plan is made
once per connection and kept (lifeboat_ingest_v1 is PL/pgSQL; the ingest transaction
asks for generic plans), so each event cost more as the run grew: in bench/ingest.py's
single-event phase, 18,134 lookups read 20.5 million index entries. With the unique
index the only one that starts with run and step, no estimate can pick otherwise; and
each new checkpoint writes one index entry less. docs/benchmarks.md has the figures.

On PostgreSQL the unique index is built again, in this migration's transaction and
under a lock on the table, so writes to checkpoints wait while it is built.
docs/deployment.md says how long that took here."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('domain', '0005_ingest_function'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='checkpoint',
            name='checkpoint_run_step_unique',
        ),
        migrations.RemoveIndex(
            model_name='checkpoint',
            name='checkpoint_run_size',
        ),
        migrations.AddConstraint(
            model_name='checkpoint',
            constraint=models.UniqueConstraint(fields=('run', 'step'), include=('total_size', 'status'), name='checkpoint_run_step_unique'),
        ),
    ]
