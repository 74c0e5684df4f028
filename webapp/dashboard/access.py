"""Which projects a signed-in person may see, and with what role."""

from __future__ import annotations

from django.http import Http404

from webapp.domain.models import Project


def visible_projects(user):
    if user.is_superuser:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)


def project_for(user, slug: str) -> Project:
    project = visible_projects(user).filter(slug=slug).first()
    if project is None:
        # Not 403: a project one cannot see does not exist for them.
        raise Http404("no such project")
    return project
