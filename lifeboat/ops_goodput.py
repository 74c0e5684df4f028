"""`lifeboat goodput [RUN]`: how much GPU time became kept progress, and where the rest
went, for one training or the whole project (docs/analytics.md, "Goodput").

Standard library only, like the rest of the client."""

from __future__ import annotations

import json

from lifeboat import ops_format as fmt
from lifeboat.ops_api import OK


def run(client, args) -> int:
    return training(client, args) if args.run else project(client, args)


CAUSES = (
    ("lost_work", "lost work (redone after a failure)"),
    ("restart", "restart (failure to the next start)"),
    ("restore", "restore (start to first step)"),
    ("checkpoint_save", "checkpoint saves"),
    ("idle", "idle (silent, no step gained)"),
    ("other", "other (startup, gaps)"),
)


def training(client, args) -> int:
    answer = client.goodput(args.run)
    if args.json:
        print(json.dumps(answer, indent=2))
        return OK
    wall = answer.get("wall_seconds") or 0
    attempts = answer.get("attempts") or []
    print(
        f"training of {fmt.clean(args.run)}: {len(attempts)} attempt{'s' * (len(attempts) != 1)}"
        f", {answer.get('failures', 0)} failed, {answer.get('preemptions', 0)} preempted"
    )
    money = f", cost {answer['cost']:,.2f}" if answer.get("cost") is not None else ""
    print(
        f"goodput {fmt.share(answer.get('goodput'))} of {fmt.duration(wall)}: "
        f"{fmt.duration(answer.get('productive_seconds'))} became kept progress "
        f"({answer.get('productive_gpu_hours', 0):,.2f} of {answer.get('gpu_hours', 0):,.2f} "
        f"GPU-hours{money})"
    )
    _print_badput("where the rest went", answer.get("badput") or {}, wall)
    if answer.get("lost_cost") is not None:
        print(f"lost: {answer['lost_cost']:,.2f}")
    rows = [
        [a.get("run"), a.get("status"), fmt.duration(a.get("seconds")),
         fmt.duration(a.get("productive")), fmt.duration(a.get("lost_work")),
         fmt.duration(a.get("restore"))]
        for a in attempts
    ]  # fmt: skip
    print("\nattempts")
    print(fmt.table(
        ["run", "status", "time", "productive", "lost", "restore"], rows,
        right=("time", "productive", "lost", "restore"),
    ))  # fmt: skip
    return OK


def _print_badput(title: str, badput: dict, wall: float) -> None:
    rows = [
        [
            label,
            fmt.duration(badput.get(key)),
            fmt.share(badput.get(key, 0) / wall if wall else None),
        ]
        for key, label in CAUSES
    ]
    print(f"\n{title}")
    print(fmt.table(["cause", "time", "share"], rows, right=("time", "share")))


def project(client, args) -> int:
    answer = client.project_goodput(args.since, args.by, args.limit)
    if args.json:
        print(json.dumps(answer, indent=2))
        return OK
    wall = answer.get("wall_seconds") or 0
    money = ""
    if answer.get("cost") is not None:
        money = f", cost {answer['cost']:,.2f} ({answer.get('lost_cost') or 0:,.2f} of it lost)"
    print(
        f"project: {answer.get('runs', 0)} runs, {answer.get('failures', 0)} failed, "
        f"{answer.get('preemptions', 0)} preempted"
        + (f", since {fmt.when(answer.get('since'))}" if answer.get("since") else "")
    )
    print(
        f"goodput {fmt.share(answer.get('gpu_goodput'))} of "
        f"{answer.get('gpu_hours', 0):,.2f} GPU-hours: "
        f"{answer.get('productive_gpu_hours', 0):,.2f} became kept progress{money}"
    )
    _print_badput("where the rest went (run time)", answer.get("badput") or {}, wall)
    mtbf = answer.get("mtbf") or {}
    if mtbf.get("note"):
        print(f"\nMTBF: {mtbf['note']}")
    if answer.get("lost_per_failure_gpu_hours") is not None:
        per = answer["lost_per_failure_gpu_hours"]
        cost = answer.get("lost_per_failure_cost")
        print(
            f"lost per failure: {per:,.2f} GPU-hours"
            + (f" ({cost:,.2f})" if cost is not None else "")
        )
    groups = answer.get("groups") or []
    label = {"run": "training", "tag": "tag", "host": "host"}[answer.get("group_by", "run")]
    rows = [
        [fmt.clean(g.get("key") if g.get("key") not in (None, "") else "(none)"),
         fmt.share(g.get("gpu_goodput")), f"{g.get('gpu_hours', 0):,.2f}",
         f"{g.get('lost_gpu_hours', 0):,.2f}", g.get("failures", 0)]
        for g in groups
    ]  # fmt: skip
    shown = f"{len(groups)} of {answer.get('groups_total', len(groups))}"
    print(f"\nthe {label}s that lost most ({shown})")
    print(fmt.table(
        [label, "goodput", "GPU-hours", "lost GPU-hours", "failures"], rows,
        right=("goodput", "GPU-hours", "lost GPU-hours", "failures"),
    ))  # fmt: skip
    if answer.get("as_of") is None:
        print("\nnot computed yet: the figures are computed every few minutes by the workers")
    else:
        print(f"\nas of {fmt.when(answer['as_of'])}")
    return OK
