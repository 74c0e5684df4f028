"""The operator's commands over the v1 API: runs, checkpoints, show, latest, validate,
restore-test, resume. Tables for people; `--json` prints the API's answer as it came,
for scripts; the exit status says how it went (lifeboat.ops_api.EXIT_CODES).

Standard library only, like the rest of the client."""

from __future__ import annotations

import argparse
import json
import os

from lifeboat import ops_format as fmt
from lifeboat import ops_goodput, ops_storage
from lifeboat.config import Config, process_rank, process_world_size
from lifeboat.ops_api import EXIT_CODES, NOT_VERIFIED, OK, USAGE, CommandFailed, OpsClient
from lifeboat.ops_wait import ended_before, follow
from lifeboat.parts import parts_from_env, rank_share
from lifeboat.restore import LatestError, restore_root, restored_copy, say_passed_over, usable_copy


def connection_options(parser: argparse.ArgumentParser, spool: bool = True) -> None:
    parser.add_argument("--url", help="the server (default: $LIFEBOAT_URL)")
    parser.add_argument("--token", help="an API token (default: $LIFEBOAT_TOKEN)")
    if spool:
        parser.add_argument("--spool-dir", help="the spool (default: $LIFEBOAT_SPOOL_DIR)")


def _client(args) -> OpsClient:
    return OpsClient(Config.resolve(url=args.url, token=args.token))


def _print_json(answer: dict) -> None:
    print(json.dumps(answer, indent=2))


def _runs(args) -> int:
    page = _client(args).runs(args.status, args.limit, args.offset)
    if args.json:
        _print_json(page)
        return OK
    runs = page.get("runs") or []
    health = any("health" in run for run in runs)
    headers = ["RUN", "STATUS", *(["HEALTH"] if health else []), "STEP", "LAST SEEN", "HOST"]
    rows = []
    for run in runs:
        state = run.get("health")
        if isinstance(state, dict):
            state = state.get("state") or state.get("status")
        rows.append(
            [run.get("key"), run.get("status"), *([state] if health else []),
             run.get("last_step"), fmt.ago(run.get("last_seen_at")), run.get("host") or "-"]
        )  # fmt: skip
    print(fmt.table(headers, rows, right=("STEP",)) if rows else "no runs")
    if page.get("next_offset") is not None:
        print(f"more: --offset {page['next_offset']}")
    return OK


def _checkpoints(args) -> int:
    page = _client(args).checkpoints(args.run, args.status, args.limit, args.before_step)
    if args.json:
        _print_json(page)
        return OK
    rows = [
        [c.get("id"), c.get("step"), c.get("status"), fmt.size(c.get("total_size")),
         c.get("file_count"), fmt.ago(c.get("saved_at")), fmt.ago(c.get("verified_at")),
         "pinned" if c.get("pinned") else ""]
        for c in page.get("checkpoints") or []
    ]  # fmt: skip
    headers = ["ID", "STEP", "STATUS", "SIZE", "FILES", "SAVED", "VERIFIED", "PIN"]
    print(fmt.table(headers, rows, right=("ID", "STEP", "SIZE", "FILES")) if rows else "none")
    if page.get("next_before_step") is not None:
        print(f"more: --before-step {page['next_before_step']}")
    return OK


def _show(args) -> int:
    c = _client(args).checkpoint(args.id)
    if args.json:
        _print_json(c)
        return OK
    content = c.get("content") or {}
    status = c.get("status")
    if c.get("status_message"):
        status = f"{status}: {c['status_message']}"
    epoch = f", epoch {c['epoch']}" if c.get("epoch") is not None else ""
    print(f"checkpoint {c.get('id')} of run {fmt.clean(c.get('run'))}, step {c.get('step')}{epoch}")
    took = f", written in {fmt.duration(c['save_seconds'])}" if c.get("save_seconds") else ""
    tensors = None
    if content.get("tensors") is not None:
        tensors = f"{content['tensors']:,} tensors, {content.get('parameters') or 0:,} parameters"
    print(
        fmt.fields([
            ("status", status),
            ("saved", fmt.when(c.get("saved_at")) + took),
            ("verified", fmt.when(c["verified_at"]) if c.get("verified_at") else None),
            ("location", c.get("location")),
            ("size", f"{fmt.size(c.get('total_size'))} in {c.get('file_count')} file(s)"),
            ("format", content.get("format") or c.get("format") or None),
            ("content", tensors),
            ("metrics", fmt.metrics(c.get("metrics"))),
            ("pinned", "yes" if c.get("pinned") else "no"),
        ])
    )  # fmt: skip
    _section(
        "files",
        ["PATH", "SIZE", "SHA256"],
        [[f.get("path"), fmt.size(f.get("size")), str(f.get("sha256"))[:16]]
         for f in c.get("files") or []],
        right=("SIZE",),
    )  # fmt: skip
    _section(
        "replicas",
        ["ID", "TARGET", "STATUS", "DONE", "VERIFIED", "ERROR"],
        [[r.get("id"), r.get("target"), r.get("status"),
          f"{fmt.size(r.get('bytes_done'))} / {fmt.size(r.get('bytes_total'))}",
          fmt.ago(r.get("verified_at")), r.get("last_error") or ""]
         for r in c.get("replicas") or []],
        right=("ID",),
    )  # fmt: skip
    _section(
        "checks",
        ["ID", "KIND", "STATUS", "FINISHED", "MESSAGE"],
        [[v.get("id"), v.get("kind"), v.get("status"), fmt.ago(v.get("finished_at")),
          v.get("message") or ""]
         for v in c.get("validations") or []],
        right=("ID",),
    )  # fmt: skip
    return OK


def _section(title: str, headers: list[str], rows: list[list], right=()) -> None:
    if rows:
        print(f"\n{title}:")
        print(fmt.table(headers, rows, right=right))


def _latest(args) -> int:
    run = args.run or os.environ.get("LIFEBOAT_RUN")
    if not run:
        raise CommandFailed("which run? name it or set LIFEBOAT_RUN", USAGE)
    config = Config.resolve(url=args.url, token=args.token, spool_dir=args.spool_dir)
    checkpoint = OpsClient(config).latest(run, args.checkpoint)
    if args.info or (args.json and not args.download):
        _print_json(checkpoint)
        return OK
    if not args.quiet:
        say_passed_over(checkpoint)
    rank, world_size = args.rank, args.world_size
    if (rank is None) != (world_size is None):
        raise CommandFailed("--rank and --world-size go together", USAGE)
    if rank is None and parts_from_env():
        rank, world_size = process_rank(), process_world_size()
    share = rank_share(checkpoint, rank, world_size)
    wanted, partial = (share, True) if share is not None else (checkpoint, False)
    try:
        if args.download:
            path = restored_copy(
                wanted, run, args.download, progress=not args.quiet, partial=partial
            )
        else:
            root = restore_root(config, args.dest)
            path = usable_copy(wanted, run, root, not args.quiet, partial=partial)
    except LatestError as exc:
        raise CommandFailed(fmt.clean(exc)) from None
    if args.json:
        _print_json({**checkpoint, "path": str(path)})
    else:
        print(path)
    return OK


def _check(args, kind: str) -> int:
    client = _client(args)
    # Before the request, the checks that have ended: the new one is none of them (for
    # a server whose answer does not name the check it queued).
    ended = ended_before(client.checkpoint(args.id)) if args.wait else set()
    answer = client.validate(args.id) if kind == "integrity" else client.restore_test(args.id)
    if not args.wait:
        if args.json:
            _print_json(answer)
        else:
            print(f"checkpoint {args.id}: {_queued(answer, kind)}")
        return OK
    check, detail = follow(
        client, args.id, answer, kind, ended,
        timeout=args.timeout, interval=max(args.interval, 0.1), progress=not args.quiet,
    )  # fmt: skip
    if args.json:
        _print_json(check)
    else:
        took = fmt.took(check.get("started_at"), check.get("finished_at"))
        print(
            f"check {check['id']} ({check.get('kind')}) of checkpoint {args.id}: "
            f"{fmt.clean(check.get('status'))} in {took}: {fmt.clean(check.get('message'))}"
        )
        print(
            f"checkpoint {args.id} (step {detail.get('step')}) is {fmt.clean(detail.get('status'))}"
        )
    return OK if check.get("status") == "passed" else NOT_VERIFIED


def _queued(answer: dict, kind: str) -> str:
    """What the action's answer says was queued, in words. An answer without the check's
    id (validate, before the API named it) carries the checkpoint's status, not the
    check's: only "queued" is said of it then."""
    what = "restore test" if kind == "restore" else "check"
    if not answer.get("validation"):
        return f"a {what} is queued"
    name, status = f"{what} {answer['validation']}", fmt.clean(answer.get("status"))
    if answer.get("coalesced"):
        return f"{name} is already {status}; not queued again"
    return f"{name} {status}"


def _resume(args) -> int:
    answer = _client(args).resume(args.id, args.profile, args.world_size)
    if args.json:
        _print_json(answer)
        return OK
    print(
        f"resume {answer.get('id')} of run {fmt.clean(answer.get('run'))} from checkpoint "
        f"{answer.get('checkpoint')} with profile {fmt.clean(answer.get('profile'))}: "
        f"{fmt.clean(answer.get('status'))}"
        + (f" on {answer['world_size']} ranks" if isinstance(answer.get("world_size"), int) else "")
    )
    if answer.get("command"):
        print(f"command: {fmt.clean(answer['command'])}")
    return OK


def _goodput(args) -> int:
    return ops_goodput.run(_client(args), args)


def _storage(args) -> int:
    return ops_storage.run(_client(args), args)


def add_commands(commands) -> dict:
    """Add the operator's commands to `commands` (the subparsers); returns their
    handlers by name."""

    def command(name: str, help_: str, **kwargs) -> argparse.ArgumentParser:
        parser = commands.add_parser(
            name, help=help_, description=help_, epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs,
        )  # fmt: skip
        return parser

    def output(parser, spool=False) -> None:
        parser.add_argument("--json", action="store_true", help="the API's JSON, for scripts")
        connection_options(parser, spool=spool)

    runs = command("runs", "the project's runs, most recently active first")
    runs.add_argument("--status", help="only runs of this status (running, finished, failed…)")
    runs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    runs.add_argument("--offset", type=int, default=0, help="skip this many (paging)")
    output(runs)

    checkpoints = command("checkpoints", "a run's checkpoints, newest step first")
    checkpoints.add_argument("run", help="the run key")
    checkpoints.add_argument("--status", help="only checkpoints of this status (verified…)")
    checkpoints.add_argument("--limit", type=int, default=100, help="at most this many")
    checkpoints.add_argument("--before-step", type=int, help="only steps below this (paging)")
    output(checkpoints)

    show = command("show", "one checkpoint: files, replicas, content, its last checks")
    show.add_argument("id", type=int, help="the checkpoint id")
    output(show)

    latest = command(
        "latest",
        "the newest verified checkpoint of a run: print its local path (the job's copy if "
        "whole, else restored from a replica), or --download it",
    )
    latest.add_argument("run", nargs="?", help="the run key (default: $LIFEBOAT_RUN)")
    latest.add_argument("--dest", help="where to restore it if the local copy is unusable")
    latest.add_argument(
        "--download",
        metavar="DIR",
        help="download it from a verified replica into DIR/<run>/checkpoint-<id>/, every "
        "file checked against its sha256 (a whole copy already there is kept)",
    )
    latest.add_argument("--info", action="store_true", help="print the server's answer only")
    latest.add_argument(
        "--checkpoint", type=int, metavar="ID",
        help="that verified checkpoint of the run, not the newest (the one rank 0 chose)",
    )  # fmt: skip
    latest.add_argument(
        "--rank", type=int, metavar="R",
        help="only what rank R needs, when the job runs on the world size that wrote it "
        "(its files and the shared ones; default with LIFEBOAT_PARTS=1: the launcher's)",
    )  # fmt: skip
    latest.add_argument("--world-size", type=int, metavar="N", help="the job's world size")
    latest.add_argument("--quiet", action="store_true", help="no progress line")
    output(latest, spool=True)

    for name, help_ in (
        ("validate", "check a checkpoint again: sizes, sha256, that it loads"),
        ("restore-test", "prove a checkpoint comes back from its replica"),
    ):
        check = command(name, help_)
        check.add_argument("id", type=int, help="the checkpoint id")
        check.add_argument("--wait", action="store_true", help="follow the check to its verdict")
        check.add_argument("--timeout", type=float, help="with --wait: give up after S seconds")
        check.add_argument(
            "--interval",
            type=float,
            default=0.5,
            help="with --wait: seconds between looks (0.5; at least 0.1)",
        )
        check.add_argument("--quiet", action="store_true", help="no progress line")
        output(check)

    goodput = command(
        "goodput",
        "how much GPU time became kept progress, and where the rest went: of one training "
        "(RUN), else of the project",
    )
    goodput.add_argument("run", nargs="?", help="a run of the training (any of its attempts)")
    goodput.add_argument("--since", help="the project's view: runs active since (ISO 8601 time)")
    goodput.add_argument(
        "--by", choices=("run", "tag", "host"), default="run", help="the project's view's groups"
    )
    goodput.add_argument("--limit", type=int, default=10, help="groups shown (10)")
    output(goodput)

    storage = command(
        "storage",
        "what the checkpoints take on each storage target and locally, what it costs, what "
        "retention freed and would free, and what each target's audit found",
    )
    storage.add_argument("--limit", type=int, default=10, help="runs shown (10)")
    storage.add_argument("--audit", metavar="TARGET", help="list this target now (operate)")
    storage.add_argument(
        "--clean", type=int, metavar="AUDIT",
        help="delete what this audit found, each object checked again first (operate)",
    )  # fmt: skip
    output(storage)

    resume = command("resume", "restart a run from a checkpoint with a launch profile")
    resume.add_argument("id", type=int, help="the checkpoint id")
    resume.add_argument("--profile", required=True, help="the launch profile's name")
    resume.add_argument(
        "--world-size", type=int, metavar="N",
        help="launch on N ranks (a profile with {{world_size}}); a DCP checkpoint saved by "
        "another world size is first loaded on N, and the job starts only if that passes",
    )  # fmt: skip
    output(resume)

    return {
        "runs": _runs,
        "checkpoints": _checkpoints,
        "show": _show,
        "latest": _latest,
        "validate": lambda args: _check(args, "integrity"),
        "restore-test": lambda args: _check(args, "restore"),
        "resume": _resume,
        "goodput": _goodput,
        "storage": _storage,
    }
