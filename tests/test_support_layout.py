"""Where the tests' shared parts live: helpers and shared fixtures in tests/support/
(fixtures loaded by conftest.py's `pytest_plugins`), so that no test module, nor
conftest.py, nor a support module imports a test module or conftest.py."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, anywhere in it (a function's imports too), by line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from tests import test_x`: a module, named as a name.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def is_test_module_or_conftest(module: str) -> bool:
    parts = module.split(".")
    return (
        len(parts) >= 2
        and parts[0] == "tests"
        and (parts[1].startswith("test_") or parts[1] == "conftest")
    )


def test_no_test_module_conftest_or_support_module_imports_a_test_module_or_conftest():
    paths = sorted(TESTS.glob("*.py")) + sorted((TESTS / "support").rglob("*.py"))
    wrong = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in paths
        for line, module in imported_modules(path)
        if is_test_module_or_conftest(module)
    ]
    assert not wrong, "move what they share to tests/support/:\n" + "\n".join(wrong)


def test_the_tests_folder_holds_only_test_modules_and_conftest():
    loose = [
        path.name
        for path in TESTS.glob("*.py")
        if not path.name.startswith("test_") and path.name not in ("conftest.py", "__init__.py")
    ]
    assert not loose, f"helpers belong in tests/support/: {loose}"
