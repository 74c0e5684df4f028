"""The settings API as the tests call it: with one token of a project (`Admin`), the error
an answer names, and the project's audit lines."""

from __future__ import annotations

import json

from django.test import Client

from webapp.domain.models import Event


class Admin:
    """The API with one token of `project` (scopes as given)."""

    def __init__(self, project, scopes=("admin",), name="boss"):
        self.token, self.secret = project.issue_token(name, list(scopes))
        self.client = Client()

    def call(self, method: str, path: str, body=None):
        return getattr(self.client, method)(
            f"/api/v1/settings{path}",
            data=json.dumps(body) if body is not None else "",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.secret}",
        )

    def get(self, path):
        return self.call("get", path)

    def post(self, path, body):
        return self.call("post", path, body)

    def patch(self, path, body):
        return self.call("patch", path, body)

    def delete(self, path):
        return self.call("delete", path)


def error_of(response) -> str:
    return response.json()["error"]


def audit_lines(project) -> list[tuple[str, str, str]]:
    return list(Event.objects.filter(project=project).order_by("pk").values_list(
        "type", "actor", "message"
    ))  # fmt: skip
