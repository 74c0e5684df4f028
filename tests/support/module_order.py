"""The order in which `make test`'s parallel processes take the test modules: the longest
first. Each process takes whole modules (`--dist loadscope`), so a long module taken last
leaves the other processes idle at the end; longest-first keeps that tail short.

How long a module takes comes from tests/module_seconds.json, written by a run with
`--store-durations` (`make test PYTEST_ARGS=--store-durations`, the pattern of
pytest-split's `.test_durations`); a module it does not name yet counts a second a test.
A stale file only makes the run a little longer: nothing depends on the order.
Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.support.servers import ROOT

DURATIONS = ROOT / "tests" / "module_seconds.json"


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each module's seconds to {DURATIONS.relative_to(ROOT)} at the end",
    )


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(trylast=True)  # after the markers and -m have settled the items
def pytest_collection_modifyitems(config, items):
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    tests = Counter(module_of(item.nodeid) for item in items)
    seconds = {module: known.get(module, float(count)) for module, count in tests.items()}
    # A stable sort: a module's tests keep their order, and so do modules of equal weight.
    items.sort(key=lambda item: -seconds[module_of(item.nodeid)])


class _Stopwatch:
    def __init__(self):
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report):
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):
            return  # the controller, which gets every process's reports, writes the file
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({m: round(s, 1) for m, s in self.seconds.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


def pytest_configure(config):
    if config.getoption("--store-durations"):
        config.pluginmanager.register(_Stopwatch(), "module-stopwatch")
