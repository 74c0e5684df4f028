"""Which projects a signed-in person may see, and with what role.

Roles rank viewer < operator < admin: viewers see, operators act on checkpoints
(validate, pin), admins configure the project (tokens, storage targets, launch
profiles). A superuser is an admin of every project."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import F
from django.http import Http404

from webapp.domain.models import Project
from webapp.domain.models.projects import Role

RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}

# What each role may do, in words, for the buttons a person may not press.
NEEDS = {
    Role.OPERATOR: "Only operators and admins of this project can do this.",
    Role.ADMIN: "Only admins of this project can change its settings.",
}


def visible_projects(user):
    if user.is_superuser:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)


def project_and_role(user, slug: str) -> tuple[Project, str]:
    """The project and the user's role in it, in one query; 404 when it is not theirs."""
    if user.is_superuser:
        project = Project.objects.filter(slug=slug).first()
        role = Role.ADMIN
    else:
        project = (
            Project.objects.filter(slug=slug, memberships__user=user)
            .annotate(member_role=F("memberships__role"))
            .first()
        )
        role = project.member_role if project is not None else None
    if project is None:
        # Not 403: a project one cannot see does not exist for them.
        raise Http404("no such project")
    return project, role


def project_for(user, slug: str) -> Project:
    return project_and_role(user, slug)[0]


def allows(role: str | None, needed: str) -> bool:
    return role is not None and RANK.get(role, -1) >= RANK[needed]


class Access:
    """What the templates ask: `access.role`, `access.can_operate`, `access.can_admin`."""

    def __init__(self, role: str):
        self.role = role
        self.can_operate = allows(role, Role.OPERATOR)
        self.can_admin = allows(role, Role.ADMIN)
        self.operate_refusal = NEEDS[Role.OPERATOR] + f" You are a {role}."
        self.admin_refusal = NEEDS[Role.ADMIN] + f" You are a {role}."


def project_view(needed: str = Role.VIEWER):
    """Decorator: sign-in required; resolves `slug` to request.project and request.access,
    answers 404 to non-members and 403 to members whose role is below `needed`."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapped(request, slug: str, *args, **kwargs):
            project, role = project_and_role(request.user, slug)
            if not allows(role, needed):
                raise PermissionDenied(NEEDS.get(needed, "Not allowed.") + f" You are a {role}.")
            request.project = project
            request.access = Access(role)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def actor_of(request) -> str:
    """How the audit log names a person: user:<username>, beside token:<name> and
    worker:<queue> for the API and the workers."""
    return f"user:{request.user.get_username()}"
