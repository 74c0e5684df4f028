"""Retention policies: how many checkpoints a project keeps, on its own file system and
on its storage targets. The rules are a union, as in Determined's checkpoint GC: a
checkpoint stays if any rule keeps it (webapp.domain.retention.policy)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class RetentionScope(models.TextChoices):
    # The files where the job wrote them; deleted only once a verified replica exists.
    LOCAL = "local", "Local copies"
    # The copies on the project's storage targets.
    REPLICAS = "replicas", "Replicas"


class RetentionPolicy(models.Model):
    project = models.ForeignKey(
        "domain.Project", on_delete=models.CASCADE, related_name="retention_policies"
    )
    applies_to = models.CharField(
        max_length=16, choices=RetentionScope.choices, default=RetentionScope.LOCAL
    )
    # Each rule keeps some checkpoints of every run; None turns a rule off. Pinned ones,
    # the ones a run was resumed from and each run's latest verified are always kept.
    keep_last = models.PositiveIntegerField(null=True, blank=True)
    keep_best = models.PositiveIntegerField(null=True, blank=True)
    metric = models.CharField(max_length=100, blank=True)
    mode = models.CharField(
        max_length=3,
        choices=[("min", "lower is better"), ("max", "higher is better")],
        default="min",
    )
    keep_every_n_steps = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "applies_to"], name="retention_policy_unique"
            )
        ]

    def __str__(self) -> str:
        return f"retention of {self.applies_to} in {self.project_id}"
