"""From findings to a checkpoint status and a sentence a person understands.

Order of severity: corrupt > missing > suspicious > verified. "verified" needs every
file's bytes read, hashed and matched, and nothing worse than "info" found."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from lifeboat.units import human_size
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ValidationStatus
from webapp.domain.validation.integrity import Finding
from webapp.domain.validation.tensor_places import dotted

# A checkpoint this much smaller than the run's usual size is probably cut short.
TRUNCATION_RATIO = 0.5
GROWTH_RATIO = 2.0


@dataclass
class Verdict:
    status: str
    validation_status: str
    message: str
    findings: list[Finding]


def _single_file(keys: dict) -> str | None:
    """The file name if every key ("<file>:<dotted.key>") comes from one file."""
    files = {key.split(":", 1)[0] for key in keys}
    return files.pop() if len(files) == 1 else None


def _comparable(key: str) -> str:
    """`<file>:<path>`, or the path alone once file names were set aside, dotted."""
    return dotted(key) if ":" in key else dotted(":" + key)[1:]


def compare_keys(current: dict, previous: dict, previous_step: int) -> list[Finding]:
    """Keys added, removed or reshaped since the run's previous verified checkpoint."""
    if not current or not previous:
        return []
    now_file, then_file = _single_file(current), _single_file(previous)
    if now_file and then_file and now_file != then_file:
        # One file each, named after its step (epoch-001-step-46.pt): the same tensors
        # under another file name are not a change.
        current = {key.split(":", 1)[1]: value for key, value in current.items()}
        previous = {key.split(":", 1)[1]: value for key, value in previous.items()}
    # Compared in the dotted form, which names stored before tensors were named by their
    # path (`state.0.exp_avg`, not `state/0/exp_avg`) share with names made now; each
    # side is shown under its own names.
    now = {_comparable(k): k for k in current}
    then = {_comparable(k): k for k in previous}
    added = sorted(now[d] for d in now.keys() - then.keys())
    removed = sorted(then[d] for d in then.keys() - now.keys())
    reshaped = sorted(
        now[d] for d in now.keys() & then.keys() if current[now[d]] != previous[then[d]]
    )
    findings = []
    for names, what in (
        (removed, "removed"),
        (added, "added"),
        (reshaped, "changed shape or dtype"),
    ):
        if not names:
            continue
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        if what == "changed shape or dtype":
            k = names[0]
            shown += f" (e.g. {k}: {previous[then[_comparable(k)]]} → {current[k]})"
        findings.append(
            Finding(
                "suspicious",
                f"keys_{what.split()[0]}",
                f"{len(names)} tensor{'s' if len(names) > 1 else ''} {what} since the verified "
                f"checkpoint at step {previous_step}: {shown}",
                tensors=names[:1000],
            )
        )
    return findings


def compare_size(total_size: int, usual_sizes: list[int]) -> list[Finding]:
    if len(usual_sizes) < 2 or total_size <= 0:
        return []
    usual = statistics.median(usual_sizes)
    if usual <= 0:
        return []
    if total_size < usual * TRUNCATION_RATIO:
        return [
            Finding(
                "suspicious",
                "size_drop",
                f"possibly truncated: {human_size(total_size)} against a usual {human_size(usual)} "
                f"for this run",
            )
        ]
    if total_size > usual * GROWTH_RATIO:
        return [
            Finding(
                "info",
                "size_growth",
                f"{human_size(total_size)} is much larger than this run's usual "
                f"{human_size(usual)}",
            )
        ]
    return []


def decide(findings: list[Finding], bytes_read: int, file_count: int, content: dict) -> Verdict:
    by = {s: [f for f in findings if f.severity == s] for s in ("corrupt", "missing")}
    doubtful = [f for f in findings if f.severity in ("suspicious", "refused", "error")]
    if by["corrupt"]:
        return Verdict(
            CheckpointStatus.CORRUPT, ValidationStatus.FAILED, _join(by["corrupt"]), findings
        )
    if by["missing"]:
        return Verdict(
            CheckpointStatus.MISSING, ValidationStatus.FAILED, _join(by["missing"]), findings
        )
    if doubtful:
        return Verdict(
            CheckpointStatus.SUSPICIOUS, ValidationStatus.WARNING, _join(doubtful), findings
        )
    message = (
        f"All {file_count} files match their sha256"
        if file_count != 1
        else "The file matches its sha256"
    ) + f" ({human_size(bytes_read)} read)"
    if content.get("tensors"):
        message += (
            f"; {content['tensors']:,} tensors, {content.get('parameters', 0):,} parameters "
            "load safely and are finite"
        )
    notes = [f.message for f in findings if f.severity == "info"]
    return Verdict(
        CheckpointStatus.VERIFIED,
        ValidationStatus.PASSED,
        message + "." + ("".join(f" Note: {n}." for n in notes)),
        findings,
    )


def _join(findings: list[Finding]) -> str:
    shown = [f.message for f in findings[:3]]
    more = len(findings) - len(shown)
    return "; ".join(shown) + (
        f"; and {more} more problem{'s' if more > 1 else ''}" if more else ""
    )
