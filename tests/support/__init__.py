"""What the tests share that is not a test: builders of rows and checkpoints, the servers,
workers and jobs they start, and the fixtures more than one test module asks for (loaded
by tests/conftest.py through `pytest_plugins`). A test module imports its helpers from
here, never from another test module or from conftest.py (tests/test_support_layout.py).
Scripts the tests run as jobs are in jobs/."""

import pkgutil
import sys

if "pytest" in sys.modules:
    import pytest

    # As in the test modules, where these helpers were: a failed assert says what it saw.
    modules = [f"{__name__}.{module.name}" for module in pkgutil.iter_modules(__path__)]
    pytest.register_assert_rewrite(*modules)
