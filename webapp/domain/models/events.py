"""The event log: everything that happened, by whom. Client events keep their id, so a
repeated delivery is recognised; events Lifeboat writes itself have none."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Event(models.Model):
    # No indexes of their own: event_id_unique and event_project_received lead with the
    # project, event_run_time with the run, and every index is one more write per event.
    project = models.ForeignKey(
        "domain.Project", on_delete=models.CASCADE, related_name="events", db_index=False
    )
    run = models.ForeignKey(
        "domain.Run",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
    )
    # The client's UUID; unique per project so a token of one project can neither
    # collide with nor probe the ids of another.
    event_id = models.UUIDField(null=True, blank=True)
    type = models.CharField(max_length=50)
    # The step the event is about, when it has one (checkpoint timeline, heartbeats).
    step = models.BigIntegerField(null=True, blank=True)
    time = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "event_id"], name="event_id_unique")
        ]
        indexes = [
            models.Index(fields=["run", "time"], name="event_run_time"),
            models.Index(fields=["project", "-received_at"], name="event_project_received"),
        ]

    def __str__(self) -> str:
        return f"{self.type} at {self.time:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record(
        cls,
        type_: str,
        *,
        actor: str,
        message: str = "",
        project=None,
        run=None,
        checkpoint=None,
        step: int | None = None,
        data: dict | None = None,
        time=None,
    ) -> Event:
        """An event Lifeboat writes itself (an audit line, a worker's note): the one way
        in for those, so each carries its project, run, step, time and actor alike.
        `checkpoint` gives the project, run and step; `run` the project and run;
        `project` and `run` may be rows or ids."""
        if checkpoint is not None:
            project = project or checkpoint.project_id
            run = run or checkpoint.run_id
            step = checkpoint.step if step is None else step
        elif run is not None and not isinstance(run, int):
            project = project or run.project_id
        return cls.objects.create(
            project_id=getattr(project, "pk", project),
            run_id=getattr(run, "pk", run),
            type=type_,
            step=step,
            time=time or timezone.now(),
            actor=actor,
            message=message,
            data=data or {},
        )
