"""The `lifeboat` command: watch a directory, fetch the latest checkpoint, deliver the
spool, and the operator's commands over the API (runs, checkpoints, show, validate,
restore-test, resume). Settings come from flags or LIFEBOAT_URL /
LIFEBOAT_TOKEN / LIFEBOAT_RUN."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from lifeboat.config import Config, ConfigError
from lifeboat.files import total_size
from lifeboat.ops_api import EXIT_CODES, USAGE, CommandFailed
from lifeboat.ops_cli import add_commands, connection_options
from lifeboat.pending import PendingReports, label
from lifeboat.progress import Progress
from lifeboat.run import Run
from lifeboat.sender import Sender
from lifeboat.spool import Spool
from lifeboat.watch import Watcher

PROGRESS_FROM = 64 * 1024 * 1024  # a checkpoint this big gets a progress line when hashed
FLUSH_HELP = """Deliver the spool now, e.g. after a crash.

First it completes the checkpoint reports that a dead lifeboat process on this host
left in the spool's pending/ (a job killed while it hashed a checkpoint): it hashes the
files that are there and spools checkpoint.saved with the event id the job chose, or
checkpoint.failed with the reason when the files are gone or changed while they were
hashed. A report another live process is working on is left to it; two flushes at once
complete each report once. A record that cannot be read is moved to rejected/. Then it
sends every spooled event. Exit status 0 when all is delivered, 4 when something is
left (the server is unreachable, or a report could not be completed)."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return value


def _watch(args) -> int:
    run = Run(
        args.run,
        url=args.url,
        token=args.token,
        spool_dir=args.spool_dir,
        lifecycle=False,
        enabled=True,
        # A sidecar is no rank of the job: with --world-size it reports the parts of the
        # ranks whose files are on its node, else each checkpoint whole.
        parts=False,
    )
    run.start()
    watcher = Watcher(
        args.dir, run, settle_s=args.settle, step_regex=args.step_regex,
        world_size=args.world_size,
    )  # fmt: skip
    print(f"lifeboat: watching {watcher.root} for run {run.key!r}", file=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        if args.once:
            watcher.poll()
        else:
            watcher.forever(args.interval, stop)
    finally:
        # Reports still being hashed are finished and delivered before we go.
        run.finish()
    return 0


def _complete_pending(spool) -> bool:
    """Complete the checkpoint reports that dead processes on this host left, saying what
    became of each; a progress line while a big one is hashed. False if one could not be
    completed (it stays for a later try)."""

    reports = PendingReports(spool)
    try:
        return _complete_each(reports, reports.take_orphans())
    finally:
        reports.close()  # what could not be completed is free for the next process


def _complete_each(reports, scan) -> bool:

    # Damaged records set aside are logged (with where they are kept) by take_orphans.
    for request, holder in scan.busy:
        print(f"lifeboat: {label(request)} is being completed by {holder}")
    hosts = sorted({str(request.get("host")) for request in scan.foreign})
    if hosts:
        print(
            f"lifeboat: {len(scan.foreign)} pending checkpoint report(s) of host(s) "
            f"{', '.join(hosts)} are left for a lifeboat process there"
        )
    complete = True
    for request in scan.claimed:
        try:
            total = total_size(request["location"]) if "event" not in request else 0
        except OSError:
            total = 0
        bar = Progress(total, f"hashing {request['location']}", enabled=total >= PROGRESS_FROM)
        try:
            event = reports.complete(request, bar.add)
        except OSError as exc:
            print(f"lifeboat: could not complete {label(request)}: {exc}", file=sys.stderr)
            complete = False
            continue
        finally:
            bar.close()
        if event["type"] == "checkpoint.saved":
            size = sum(f["size"] for f in event["files"])
            print(
                f"lifeboat: completed the report of {label(request)}: checkpoint.saved, "
                f"{len(event['files'])} file(s), {size:,} bytes"
            )
        else:
            print(f"lifeboat: reported {label(request)} as checkpoint.failed: {event['error']}")
    return complete


def _flush(args) -> int:
    config = Config.resolve(url=args.url, token=args.token, spool_dir=args.spool_dir)
    spool = Spool(config.spool_dir, config.spool_max_bytes)
    completed = _complete_pending(spool)
    sender = Sender(config, spool)
    before = len(spool.names())
    empty = sender.flush(args.timeout)
    left = len(spool.names())
    print(f"lifeboat: delivered {sender.delivered} of {before} events; {left} left in {spool.dir}")
    if sender.last_error:
        print(f"lifeboat: last error: {sender.last_error}", file=sys.stderr)
    if left and sender._lock_file is None:
        print(
            "lifeboat: another lifeboat process is this spool's sender; it delivers them",
            file=sys.stderr,
        )
    return 0 if empty and completed else 4


def _spool(args) -> int:
    config = Config.resolve(url=args.url, token=args.token, spool_dir=args.spool_dir)
    print(json.dumps(Spool(config.spool_dir, config.spool_max_bytes).stats(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lifeboat",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    watch = commands.add_parser("watch", help="report the checkpoints a job writes in DIR")
    watch.add_argument("dir")
    watch.add_argument("--run", help="the run key (default: $LIFEBOAT_RUN)")
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between looks")
    watch.add_argument(
        "--settle", type=float, default=5.0, help="seconds a checkpoint must be unchanged"
    )
    watch.add_argument("--step-regex", help="a regex whose first group is the step")
    watch.add_argument("--once", action="store_true", help="look once, report, exit")
    watch.add_argument(
        "--world-size", type=_positive, metavar="N",
        help="the job's world size: report, per checkpoint folder, the part of each rank "
        "whose files are on this node (node-local checkpoints; docs/client.md)",
    )  # fmt: skip
    connection_options(watch)

    flush = commands.add_parser(
        "flush",
        help="complete left checkpoint reports and deliver the spool now",
        description=FLUSH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flush.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to keep delivering (default 60)"
    )
    connection_options(flush)

    spool = commands.add_parser("spool", help="what is waiting in the spool")
    connection_options(spool)

    handlers = {"watch": _watch, "flush": _flush, "spool": _spool, **add_commands(commands)}
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"lifeboat: {exc}", file=sys.stderr)
        return USAGE
    except CommandFailed as exc:
        print(f"lifeboat: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nlifeboat: interrupted (a check or resume asked for goes on)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
