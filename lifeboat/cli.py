"""The `lifeboat` command: watch a directory, fetch the latest checkpoint, deliver the
spool. Settings come from flags or LIFEBOAT_URL / LIFEBOAT_TOKEN / LIFEBOAT_RUN."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from lifeboat.config import Config, ConfigError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the server (default: $LIFEBOAT_URL)")
    parser.add_argument("--token", help="an API token (default: $LIFEBOAT_TOKEN)")
    parser.add_argument("--spool-dir", help="the spool (default: $LIFEBOAT_SPOOL_DIR)")


def _watch(args) -> int:
    from lifeboat.run import Run
    from lifeboat.watch import Watcher

    run = Run(
        args.run,
        url=args.url,
        token=args.token,
        spool_dir=args.spool_dir,
        lifecycle=False,
        enabled=True,
    )
    run.start()
    watcher = Watcher(args.dir, run, settle_s=args.settle, step_regex=args.step_regex)
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


def _latest(args) -> int:
    from lifeboat.restore import LatestError, latest, latest_info

    try:
        if args.info:
            config = Config.resolve(url=args.url, token=args.token)
            print(json.dumps(latest_info(args.run, config), indent=2))
            return 0
        path = latest(
            args.run, url=args.url, token=args.token, dest=args.dest, progress=not args.quiet
        )
    except LatestError as exc:
        print(f"lifeboat: {exc}", file=sys.stderr)
        return 3
    print(path)
    return 0


def _flush(args) -> int:
    from lifeboat.sender import Sender
    from lifeboat.spool import Spool

    config = Config.resolve(url=args.url, token=args.token, spool_dir=args.spool_dir)
    spool = Spool(config.spool_dir, config.spool_max_bytes)
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
    return 0 if empty else 4


def _spool(args) -> int:
    from lifeboat.spool import Spool

    config = Config.resolve(url=args.url, token=args.token, spool_dir=args.spool_dir)
    print(json.dumps(Spool(config.spool_dir, config.spool_max_bytes).stats(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lifeboat", description=__doc__)
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
    _common(watch)

    latest = commands.add_parser(
        "latest", help="print the local path of the newest verified checkpoint"
    )
    latest.add_argument("run", nargs="?", help="the run key (default: $LIFEBOAT_RUN)")
    latest.add_argument("--dest", help="where to restore it if the local copy is unusable")
    latest.add_argument("--info", action="store_true", help="print the server's answer only")
    latest.add_argument("--quiet", action="store_true", help="no progress bar")
    _common(latest)

    flush = commands.add_parser("flush", help="deliver the spooled events now")
    flush.add_argument("--timeout", type=float, default=60.0)
    _common(flush)

    spool = commands.add_parser("spool", help="what is waiting in the spool")
    _common(spool)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    handlers = {"watch": _watch, "latest": _latest, "flush": _flush, "spool": _spool}
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"lifeboat: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
