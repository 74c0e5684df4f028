"""Rows the dashboard tests build directly in the database (runs, checkpoints, a replica,
a launch profile) and a Django test client signed in as a user (`as_user`)."""

from __future__ import annotations

from django.test import Client
from django.utils import timezone

from webapp.domain.models import Checkpoint, LaunchProfile, Replica, Run, StorageTarget


def make_run(project, key: str, **fields) -> Run:
    fields.setdefault("last_seen_at", timezone.now())
    return Run.objects.create(project=project, key=key, **fields)


def make_checkpoint(run, step: int, status: str = "verified", **fields) -> Checkpoint:
    fields.setdefault("saved_at", timezone.now())
    fields.setdefault("total_size", 1000)
    fields.setdefault("save_seconds", 1.0)
    return Checkpoint.objects.create(
        project=run.project, run=run, step=step, status=status, location=f"/data/{step}", **fields
    )


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def with_replica(checkpoint, status: str = "verified") -> Replica:
    target, _ = StorageTarget.objects.get_or_create(
        project=checkpoint.project, name="backup", defaults={"bucket": "b"}
    )
    return Replica.objects.create(checkpoint=checkpoint, target=target, status=status)


def profile(project, name: str = "local-echo", template: str = "echo resumed {{checkpoint_id}}"):
    return LaunchProfile.objects.create(
        project=project, name=name, kind="local", command_template=template
    )
