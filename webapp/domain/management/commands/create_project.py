"""Create a project (or update its allowed roots) and issue an API token for it.

    python manage.py create_project my-project --root /data/checkpoints \
        --scopes ingest,read --token-name trainer

The token is printed once; only its hash is kept."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils.text import slugify

from webapp.domain.models import Membership, Project
from webapp.domain.models.projects import Role, Scope, validate_allowed_roots


class Command(BaseCommand):
    help = "Create a project with its allowed roots and print a new API token once."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="short name used in URLs, e.g. llama-pretrain")
        parser.add_argument("--name", help="display name (default: the slug)")
        parser.add_argument(
            "--root",
            action="append",
            default=[],
            dest="roots",
            help="a directory workers may read checkpoints from (repeatable)",
        )
        parser.add_argument(
            "--storage",
            choices=("shared", "node-local"),
            help="where its jobs write checkpoints: one shared file system (the default), "
            "or each node's own disk (work on each rank's part then runs on its host's "
            "queues, validate.<host>)",
        )
        parser.add_argument(
            "--scopes",
            default="ingest,read",
            help=f"comma-separated token scopes from {','.join(Scope.values)}",
        )
        parser.add_argument("--token-name", default="default")
        parser.add_argument("--no-token", action="store_true", help="create no token")
        parser.add_argument("--admin", help="username to make an admin of the project")
        parser.add_argument(
            "--quiet-token",
            action="store_true",
            help="print only the token (for scripts)",
        )

    def handle(self, *args, slug, name, roots, scopes, token_name, no_token, admin, **options):
        if slugify(slug) != slug:
            raise CommandError(f"{slug!r} is not a slug; try {slugify(slug)!r}")
        try:
            validate_allowed_roots(roots)
        except ValidationError as exc:
            raise CommandError(exc.messages[0]) from None
        scope_list = [s.strip() for s in scopes.split(",") if s.strip()]
        unknown = set(scope_list) - set(Scope.values)
        if unknown or not scope_list:
            raise CommandError(f"unknown scopes {sorted(unknown)}; choose from {Scope.values}")

        project, created = Project.objects.get_or_create(slug=slug, defaults={"name": name or slug})
        if roots:
            project.allowed_roots = sorted(set(project.allowed_roots) | set(roots))
            project.save(update_fields=["allowed_roots"])
        if options["storage"]:
            project.node_local = options["storage"] == "node-local"
            project.save(update_fields=["node_local"])
        if admin:
            user = get_user_model().objects.filter(username=admin).first()
            if user is None:
                raise CommandError(f"no user {admin!r}")
            Membership.objects.update_or_create(
                project=project, user=user, defaults={"role": Role.ADMIN}
            )
        quiet = options["quiet_token"]
        if not quiet:
            verb = "Created" if created else "Updated"
            storage = "node-local" if project.node_local else "shared"
            self.stdout.write(
                f"{verb} project {project.slug} (roots: {project.allowed_roots}; "
                f"checkpoints on {storage} storage)"
            )
        if no_token:
            return
        if project.tokens.filter(name=token_name, revoked_at__isnull=True).exists():
            # Token names are unique among a project's tokens in use (they say which is which).
            raise CommandError(
                f"project {project.slug} already has a token named {token_name!r} in use: "
                "give another --token-name, or --no-token"
            )
        token, secret = project.issue_token(token_name, scope_list)
        if quiet:
            self.stdout.write(secret)
        else:
            self.stdout.write(
                f"API token {token.name!r} with scopes {','.join(token.scopes)} "
                f"(shown once, store it now):\n{secret}"
            )
