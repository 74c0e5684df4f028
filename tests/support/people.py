"""People in a project, by role (`member`; the `viewer`, `operator` and `admin` fixtures
in tests/conftest.py use it)."""

from __future__ import annotations


def member(project, name: str, role: str):
    from django.contrib.auth import get_user_model

    from webapp.domain.models import Membership

    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(project=project, user=user, role=role)
    return user
