"""Families of runs: a run and the runs resumed from its checkpoints, and theirs.

A resumed run inherits its parent's name, so six rows can all read "digits CNN". The
family tells them apart (attempt 1, 2, 3 in the order they started) and says how the
family as a whole stands: a failed first attempt whose resume finished has "recovered".

The links are Run.resumed_from (a checkpoint of the parent). Few runs are resumes, so
all the links of a project are read at once (the index on resumed_from finds
them), and a page of runs costs two or three queries whatever its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webapp.domain.models import Resume, Run
from webapp.domain.recovery.resume import FINAL

# (state, tone): tone picks the badge colour (badge-tone-<tone>).
RECOVERED = ("recovered", "ok")
RECOVERED_RUNNING = ("recovered, running", "ok")
RESUMING = ("failed, resuming", "warn")
RESUMING_RUNNING = ("resuming", "warn")  # a resume of a run that did not fail
FAILED = ("failed, not resumed", "bad")
FAILED_AGAIN = ("failed again", "bad")


@dataclass
class Member:
    id: int
    key: str
    name: str
    status: str
    attempt: int = 0
    parent_id: int | None = None
    from_step: int | None = None  # the parent's step it was resumed from

    @property
    def title(self) -> str:
        return self.name or self.key


@dataclass
class Family:
    root_id: int
    members: list[Member] = field(default_factory=list)  # attempt order
    resuming: bool = False  # a resume of one of its runs is on its way

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def newest(self) -> Member:
        return self.members[-1]

    @property
    def state(self) -> tuple[str, str] | None:
        """None for a run on its own with nothing in flight; else (state, tone)."""
        if self.size == 1 and not self.resuming:
            return None
        newest = self.newest.status
        if newest == "failed":
            if self.resuming:
                return RESUMING
            return FAILED_AGAIN if self.size > 1 else FAILED
        if self.size == 1:  # running or finished, with a resume asked for anyway
            return RESUMING_RUNNING
        return RECOVERED if newest == "finished" else RECOVERED_RUNNING

    def label(self, run_id: int) -> str:
        member = self.get(run_id)
        if self.size == 1:
            return member.title
        return f"{member.title} · attempt {member.attempt}"

    def __contains__(self, run_id) -> bool:
        return any(m.id == run_id for m in self.members)

    def get(self, run_id: int) -> Member:
        return next(m for m in self.members if m.id == run_id)

    def children_of(self, run_id: int) -> list[Member]:
        return [m for m in self.members if m.parent_id == run_id]


FIELDS = ("id", "key", "name", "status", "created_at")


def families_of(project_id: int, runs) -> dict[int, Family]:
    """{run id: its Family} for these runs of the project (Run objects or ids): the
    links, the resumes on their way and, when a family has runs not given here, those
    runs: two or three queries however many runs."""

    runs = list(runs)
    known = {r.pk: {f: getattr(r, f) for f in FIELDS} for r in runs if isinstance(r, Run)}
    run_ids = [r.pk if isinstance(r, Run) else r for r in runs]
    links = {
        child: (parent, step)
        for child, parent, step in Run.objects.filter(
            project_id=project_id, resumed_from__isnull=False
        ).values_list("id", "resumed_from__run_id", "resumed_from__step")
        if parent is not None and parent != child
    }
    children: dict[int, list[int]] = {}
    parent: int | None  # None below for a run resumed from none
    for child, (parent, _) in links.items():
        children.setdefault(parent, []).append(child)

    def root_of(run_id: int) -> int:
        seen = {run_id}
        while run_id in links and links[run_id][0] not in seen:
            run_id = links[run_id][0]
            seen.add(run_id)
        return run_id

    def descendants(root: int) -> list[int]:
        out, todo = [root], [root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in out:
                    out.append(child)
                    todo.append(child)
        return out

    roots = {run_id: root_of(run_id) for run_id in run_ids}
    member_ids = {root: descendants(root) for root in set(roots.values())}
    every = [m for ids in member_ids.values() for m in ids]
    rows = dict(known)
    missing = [i for i in every if i not in rows]
    if missing:
        rows.update((row["id"], row) for row in Run.objects.filter(pk__in=missing).values(*FIELDS))
    resuming = set(
        Resume.objects.filter(run_id__in=every, new_run__isnull=True)
        .exclude(status__in=FINAL)
        .values_list("run_id", flat=True)
    )
    families = {}
    for root, ids in member_ids.items():
        ordered = sorted(
            (rows[i] for i in ids if i in rows), key=lambda r: (r["created_at"], r["id"])
        )
        family = Family(root_id=root, resuming=any(i in resuming for i in ids))
        for attempt, row in enumerate(ordered, start=1):
            parent, step = links.get(row["id"], (None, None))
            family.members.append(
                Member(
                    id=row["id"], key=row["key"], name=row["name"], status=row["status"],
                    attempt=attempt, parent_id=parent, from_step=step,
                )
            )  # fmt: skip
        families[root] = family
    return {run_id: families[root] for run_id, root in roots.items()}


def grouped(project_id: int, runs) -> list[dict]:
    """The page's runs with the members of a family together, where its first member
    on the page stands, in attempt order: [{"family": Family or None, "runs": [...]}].
    Each run gets `label` (what tells it apart) and `member` (its place in the family)."""
    runs = list(runs)
    by_run = families_of(project_id, runs)
    groups: list[dict[str, Any]]
    placed: dict[int, dict[str, Any]]
    groups, placed = [], {}
    for run in runs:
        family = by_run[run.pk]
        run.label, run.member = family.label(run.pk), family.get(run.pk)
        if family.size == 1 and not family.resuming:
            groups.append({"family": None, "runs": [run]})
        elif family.root_id in placed:
            placed[family.root_id]["runs"].append(run)
        else:
            placed[family.root_id] = {"family": family, "runs": [run]}
            groups.append(placed[family.root_id])
    for group in placed.values():
        group["runs"].sort(key=lambda r: r.member.attempt)
    return groups
