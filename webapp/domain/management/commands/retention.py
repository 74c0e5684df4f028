"""Show what the retention policies of a project would delete, and why; or do it.

    python manage.py retention my-project               # dry run: every decision
    python manage.py retention my-project --run exp-1   # one run
    python manage.py retention my-project --apply       # delete
    python manage.py retention my-project --json        # machine-readable dry run
    python manage.py retention my-project --limit 0     # every decision, however many

A dry run prints at most --limit decisions (default 200, deletions first) and says how
many more there are: a project with 100,000 checkpoints does not print 100,000 lines.

Deleting a local copy must run where the checkpoint files are visible (a host of the
validate queue); beat does it hourly through workers.retention."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from webapp.domain.models import Project
from webapp.domain.retention import policy as retention


class Command(BaseCommand):
    help = "Dry run (default) or apply the retention policies of a project."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--run", help="only this run (its key)")
        parser.add_argument("--apply", action="store_true", help="delete, not just show")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")
        parser.add_argument(
            "--limit",
            type=int,
            default=retention.DRY_RUN_LIMIT,
            help="show at most this many decisions, deletions first (0: all)",
        )

    def handle(self, slug, run=None, apply=False, json=False, limit=200, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}")
        run_row = None
        if run:
            run_row = project.runs.filter(key=run).first()
            if run_row is None:
                raise CommandError(f"no run {run!r} in {slug}")
        if not project.retention_policies.filter(enabled=True).exists():
            raise CommandError(f"project {slug} has no enabled retention policy")
        if apply:
            done = retention.apply(project, actor="manage.py retention", run=run_row)
            for decision in done if limit == 0 else done[:limit]:
                self.stdout.write(decision.describe())
            if limit and len(done) > limit:
                self.stdout.write(f"... {len(done) - limit} more (each in the event log)")
            self.stdout.write(f"{len(done)} deleted")
            return
        if limit < 0:
            raise CommandError("--limit must be 0 (all) or more")
        decisions = retention.plan(project, "local", run_row) + retention.plan(
            project, "replicas", run_row
        )
        # Deletions first (stable: in plan order within each group): what a person must see.
        ordered = sorted(decisions, key=lambda d: not d.delete)
        shown = ordered if limit == 0 else ordered[:limit]
        if json:
            self.stdout.write(_dumps([d.as_dict() for d in shown]))
            return
        for decision in shown:
            self.stdout.write(decision.describe())
        if len(shown) < len(decisions):
            self.stdout.write(
                f"... {len(decisions) - len(shown)} more decisions not shown "
                "(--limit 0 shows all, --run one run)"
            )
        deleting = sum(d.delete for d in decisions)
        self.stdout.write(
            f"dry run: {deleting} would be deleted, {len(decisions) - deleting} kept "
            "(--apply to delete)"
        )


def _dumps(value) -> str:
    return json.dumps(value, indent=1)
