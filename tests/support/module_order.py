"""The order in which `make test`'s parallel processes take the test modules: the longest
first. Each process takes whole modules (`--dist loadscope`), so a long module taken last
leaves the other processes idle at the end; longest-first keeps that tail short.

How long a module takes is the sum of the seconds of its tests that were selected, from
tests/test_seconds.json, written by a run with `--store-durations` (`make test
PYTEST_ARGS=--store-durations`, the pattern of pytest-split's `.test_durations`); a test
it does not name yet counts a second. Per test, not per module, because `make
test-quick` leaves a module's stack tests out: a module long in the whole suite can be
short there. A stale file only makes the run a little longer: nothing depends on the
order.
Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.support.servers import ROOT

DURATIONS = ROOT / "tests" / "test_seconds.json"


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's seconds to {DURATIONS.relative_to(ROOT)} at the end",
    )


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(trylast=True)  # after the markers and -m have settled the items
def pytest_collection_modifyitems(config, items):
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds: Counter[str] = Counter()
    for item in items:
        seconds[module_of(item.nodeid)] += known.get(item.nodeid, 1.0)
    # A stable sort: a module's tests keep their order, and so do modules of equal weight.
    items.sort(key=lambda item: -seconds[module_of(item.nodeid)])


class _Stopwatch:
    def __init__(self):
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration  # setup, call and teardown

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):
            return  # the controller, which gets every process's reports, writes the file
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({m: round(s, 1) for m, s in self.seconds.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


def pytest_configure(config):
    if config.getoption("--store-durations"):
        config.pluginmanager.register(_Stopwatch(), "module-stopwatch")
