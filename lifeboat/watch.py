"""`lifeboat watch DIR`: a sidecar for jobs that cannot be changed.

It polls DIR and reports every complete checkpoint once:

* files: torch (`*.pt`, `*.pth`), Lightning (`*.ckpt`), safetensors (`*.safetensors`);
* directories: Hugging Face Trainer (`checkpoint-N/`, complete once `trainer_state.json`
  is there), torch.distributed.checkpoint (complete once its `.metadata` is there: the
  coordinator writes it last), and any directory with a completion marker (`COMPLETE`,
  `.complete`, `_SUCCESS`).

Each format's rules are one entry of lifeboat/formats.py's table; this module reads it.

"Complete" also means quiet: nothing in it changed size or mtime for `settle` seconds,
so a checkpoint still being written is never reported half-way. Temporary names
(hidden files, `*.tmp`, `*.part`, `*.partial`, `*~`) are never reported: a job that
writes to a temporary name and renames is reported right after the rename settles.

With `--world-size N` (node-local checkpoints, docs/client.md "Many ranks"), the watcher
on each node reports, for every checkpoint folder, one part per rank whose files are on
this node (names that carry the rank: `__<rank>_<n>.distcp`, `rng_state_<rank>.pth`,
`rank-<rank>.pt`; lifeboat/parts.py), rank 0's with the files that name no rank; a
folder holding such files is a checkpoint even without DCP's `.metadata` (written on rank
0's node only), complete once quiet. The server joins the parts from every node.

The step comes from the name (`step=1200`, `checkpoint-1200`, `step_1200`, `iter-1200`,
`global_step1200`, else the last number in it); a name without one is skipped with a
message, or pass --step-regex. Each report's event id is derived from the path and the
files' sizes and mtimes, and the reported ones are remembered in a state file, so a
restarted watcher does not report them again (and if it did, the server would
deduplicate the id).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from lifeboat import formats
from lifeboat.parts import Part, files_by_rank, part_host, rank_of_name
from lifeboat.run import Run

log = logging.getLogger("lifeboat")

TEMPORARY = re.compile(r"(^\.|\.tmp$|\.temp$|\.part$|\.partial$|~$|\.lifeboat-)")
STEP_PATTERNS = [
    re.compile(r"(?:^|[^a-z])step[=_-]?(\d+)", re.I),
    re.compile(r"checkpoint[-_](\d+)", re.I),
    re.compile(r"global_step[-_]?(\d+)", re.I),
    re.compile(r"iter(?:ation)?[=_-]?(\d+)", re.I),
]
EPOCH_PATTERN = re.compile(r"epoch[=_-]?(\d+)", re.I)
NAMESPACE = uuid.UUID("5b0e3c1e-8f3a-4a52-9a55-2f6c1d7e0b11")


@dataclass
class Candidate:
    path: Path
    kind: str  # the format hint it is reported with: a format's (formats.py) or "directory"
    complete_hint: bool  # a marker says the writer is done
    # Reported only once complete_hint (formats.Format.needs_complete), unless in parts.
    needs_complete: bool = False


def step_of(name: str, pattern: re.Pattern | None = None) -> int | None:
    for regex in [pattern] if pattern else STEP_PATTERNS:
        found = regex.search(name)
        if found:
            return int(found.group(1))
    if pattern:
        return None
    numbers = re.findall(r"\d+", Path(name).stem)
    return int(numbers[-1]) if numbers else None


def epoch_of(name: str) -> int | None:
    found = EPOCH_PATTERN.search(name)
    return int(found.group(1)) if found else None


def _kind_of_file(name: str) -> str | None:
    if TEMPORARY.search(name):
        return None
    found = formats.file_format(name)
    return found.hint if found else None


def _directory_kind(path: Path, names: list[str]) -> Candidate | None:
    if TEMPORARY.search(path.name):
        return None
    marker = any(m in names for m in formats.MARKERS)
    found = formats.folder_format(path.name, names)
    if found is not None:
        complete = marker or any(n in names for n in found.complete_with)
        return Candidate(path, found.hint, complete, found.needs_complete)
    if marker:
        return Candidate(path, formats.DIRECTORY, True)
    return None


def _holds_ranked(folder: Path, names: list[str]) -> bool:
    return any(rank_of_name(name) is not None and not TEMPORARY.search(name) for name in names)


def signature(candidate: Candidate) -> tuple | None:
    """Sizes and mtimes of everything in the candidate; None if it vanished meanwhile."""
    try:
        if candidate.path.is_file():
            stat = candidate.path.stat()
            return ((candidate.path.name, stat.st_size, stat.st_mtime_ns),)
        entries = []
        for folder, dirs, names in os.walk(candidate.path):
            dirs.sort()
            for name in sorted(names):
                path = Path(folder) / name
                stat = path.stat()
                relative = str(path.relative_to(candidate.path))
                entries.append((relative, stat.st_size, stat.st_mtime_ns))
        return tuple(entries)
    except FileNotFoundError:
        return None


class Watcher:
    def __init__(
        self,
        root: str | os.PathLike,
        run: Run,
        *,
        settle_s: float = 5.0,
        step_regex: str | None = None,
        state_path: str | os.PathLike | None = None,
        world_size: int | None = None,
    ):
        self.root = Path(root).resolve()
        self.run = run
        self.settle_s = settle_s
        self.step_pattern = re.compile(step_regex) if step_regex else None
        self.state_path = Path(state_path) if state_path else self._default_state_path()
        self.reported: set[str] = set()
        self.seen: dict[Path, tuple[tuple, float]] = {}
        self.skipped: set[Path] = set()
        # Set: report the parts of the ranks whose files are here, for a job of this size.
        self.world_size = world_size
        self.host = part_host() if world_size else ""
        self._load_state()

    def _default_state_path(self) -> Path:
        if self.run.spool is None:
            return self.root / ".lifeboat-watch.json"
        name = uuid.uuid5(NAMESPACE, f"{self.run.key}|{self.root}").hex[:16]
        return self.run.spool.dir / f"watch-{name}.json"

    def _load_state(self) -> None:
        try:
            self.reported = set(json.loads(self.state_path.read_text())["reported"])
        except (FileNotFoundError, ValueError, KeyError):
            self.reported = set()

    def _save_state(self) -> None:
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"reported": sorted(self.reported)}))
        os.replace(temporary, self.state_path)

    def candidates(self) -> list[Candidate]:
        found = []
        for folder, dirs, names in os.walk(self.root):
            here = Path(folder)
            if here != self.root:
                directory = _directory_kind(here, names)
                if directory is None and self.world_size and _holds_ranked(here, names):
                    directory = Candidate(here, "directory", False)
                if directory is not None:
                    found.append(directory)
                    dirs[:] = []  # its files belong to it
                    continue
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") or d == ".metadata")
            for name in sorted(names):
                kind = _kind_of_file(name)
                if kind:
                    found.append(Candidate(here / name, kind, False))
        return found

    def poll(self, now: float | None = None) -> list[dict]:
        """One look at the directory; reports what became complete. Returns the events."""
        now = time.time() if now is None else now
        events = []
        for candidate in self.candidates():
            sig = signature(candidate)
            if not sig:
                continue
            key = uuid.uuid5(NAMESPACE, f"{self.run.key}|{candidate.path}|{sig}").hex
            if key in self.reported:
                continue
            previous = self.seen.get(candidate.path)
            if previous is None or previous[0] != sig:
                self.seen[candidate.path] = (sig, now)
                first_seen = now
            else:
                first_seen = previous[1]
            newest = max(entry[2] for entry in sig) / 1e9
            # Quiet: unchanged across our own looks for `settle` seconds, or not modified
            # for that long (a watcher started after the job wrote it).
            quiet = now - first_seen >= self.settle_s or now - newest >= self.settle_s
            if candidate.complete_hint:
                # The writer said it is done; one unchanged look more is enough.
                ready = quiet or first_seen < now
            else:
                # An HF folder is done once trainer_state.json is there (complete_hint);
                # with parts, on a node other than rank 0's it never is, and quiet is all
                # there is.
                ready = quiet and (not candidate.needs_complete or bool(self.world_size))
            if not ready:
                continue
            step = step_of(candidate.path.name, self.step_pattern)
            if step is None:
                if candidate.path not in self.skipped:
                    self.skipped.add(candidate.path)
                    log.warning(
                        "lifeboat watch: no step in %s; skipped (see --step-regex)",
                        candidate.path.name,
                    )
                continue
            for part, files, event_id in self._reports(candidate, key):
                report = self.run.checkpoint(
                    candidate.path,
                    step=step,
                    epoch=epoch_of(candidate.path.name),
                    format=candidate.kind,
                    event_id=event_id,
                    metrics={},
                    files=files,
                    part=part,
                )
                events.append({"path": str(candidate.path), "step": step, "report": report})
                log.info("lifeboat watch: reported %s (step %d)", candidate.path, step)
            self.reported.add(key)
            self._save_state()
        return events

    def _reports(self, candidate: Candidate, key: str) -> list[tuple]:
        """(part, files, event id) of each report this candidate makes: one, whole; or,
        with parts, one per rank whose files are here."""
        if not self.world_size or not candidate.path.is_dir():
            return [(None, None, str(uuid.UUID(key)))]
        by_rank = files_by_rank(candidate.path)
        reports = []
        for rank in sorted(r for r in by_rank if r is not None and r < self.world_size):
            files = by_rank[rank] + (by_rank.get(None, []) if rank == 0 else [])
            part = Part(rank, self.world_size, self.host)
            event_id = str(uuid.uuid5(NAMESPACE, f"{key}|rank {rank}"))
            reports.append((part, files, event_id))
        if not reports:
            log.warning(
                "lifeboat watch: %s holds no file named as a rank's below %d; not reported",
                candidate.path, self.world_size,
            )  # fmt: skip
        return reports

    def forever(self, interval_s: float = 2.0, stop=None) -> None:
        while stop is None or not stop.is_set():
            self.poll()
            if stop is not None:
                stop.wait(interval_s)
            else:
                time.sleep(interval_s)
