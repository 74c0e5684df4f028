"""The layers and the import graph.

The layers are import-linter contracts in pyproject.toml (`lint-imports`, run by `make
lint` and by the first test here): entry points above api, dashboard and workers, above
webapp.ops, above the domain, above the client; nothing under webapp/ imports workers/
(the web side publishes tasks by name, webapp/domain/publish.py); the client's core and
the inspection child import neither Django nor the network. Those contracts count every
import, inside functions too.

The contracts cannot say "no cycle among modules" across packages (the domain's stages
use each other's modules both ways, which acyclic_siblings counts as a cycle between the
packages). The walk below says it: no cycle among our modules at all, counting the
imports inside functions too (they hide a cycle, they do not remove it). Importing a.b.c
also runs a/__init__.py and a/b/__init__.py, so that counts as importing them too (except
where the importer is inside them).

An import inside a function is the exception and says why, in a comment on its line or
the line above (one comment may head a run of them): a cycle at import time, or a heavy or
optional library that a process should load only when it needs it."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("webapp", "workers", "lifeboat")


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, *, top_level_only: bool) -> set[str]:
    """The names this module imports (a.b.c for `from a.b import c` when a.b.c is a
    module of ours, else a.b)."""
    tree = ast.parse(path.read_text(), str(path))
    known = modules()
    if top_level_only:
        nodes = []
        stack = list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # never runs
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            nodes.append(node)
            stack.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, path.name == "__init__.py")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in known else base)
    return names


def graph(*, top_level_only: bool = False) -> dict[str, set[str]]:
    """Imports between our modules (all of them, or those at module level only), each
    also importing its parents."""
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        for name in imports(module, path, top_level_only=top_level_only):
            parts = name.split(".")
            for n in range(1, len(parts) + 1):
                target = ".".join(parts[:n])
                # The importer's own packages ran before it did: no edge back to them
                # unless it names one itself.
                own = module.startswith(target + ".") and target != name
                if target in known and target != module and not own:
                    edges[module].add(target)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (the graph has hundreds of modules)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts, on the packages found under root."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_declared_layers_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_contracts_see_an_arrow_up_the_layers(tmp_path):
    """Not vacuous: a copy of the code with webapp.domain importing workers, the client
    importing Django, and reshard.py importing resume.py back, breaks them (from inside
    a function, too)."""
    for top in TOP:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "webapp/domain/publish.py").open("a") as module:
        module.write("\n\ndef _late():\n    import workers.celery  # noqa\n")
    with (tmp_path / "lifeboat/units.py").open("a") as module:
        module.write("\n\nimport django  # noqa\n")
    with (tmp_path / "webapp/domain/recovery/reshard.py").open("a") as module:
        module.write("\n\ndef _late():\n    from webapp.domain.recovery import resume  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "nothing under webapp imports workers BROKEN" in out
    assert "HF only in their hooks) BROKEN" in out
    assert "webapp.domain.publish -> workers.celery" in out
    assert "(across packages: tests/test_import_graph.py) BROKEN" in out
    assert "No cycles are allowed in webapp.domain.recovery" in out


def test_no_import_cycle():
    assert strongly_connected(graph()) == []


def test_the_cycle_checker_sees_a_cycle(tmp_path):
    """The cycle check above is not vacuous, and counts imports inside functions."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    module = tmp_path / "enqueue.py"
    module.write_text("def later():\n    from workers.validate import validate_checkpoint\n")
    assert "workers.validate" in imports("webapp.domain.enqueue", module, top_level_only=False)
    assert "workers.validate" not in imports("webapp.domain.enqueue", module, top_level_only=True)
    assert graph()["workers.celery"] >= {"webapp.domain.publish"}
    # resume.py imports reshard.py at the top: one import back from inside a function
    # closes a cycle.
    edges = graph()
    edges["webapp.domain.recovery.reshard"].add("webapp.domain.recovery.resume")
    assert ["webapp.domain.recovery.reshard", "webapp.domain.recovery.resume"] in [
        c for c in strongly_connected(edges) if len(c) == 2
    ]


_NOT_A_REASON = re.compile(
    r"noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore\S*|fmt:\s*\w+"
)


def _says_why(line: str) -> bool:
    """The line holds a comment with words in it, not only a noqa or type: ignore."""
    comment = line.partition("#")[2] if line.lstrip().startswith("#") else line.partition("  #")[2]
    return bool(re.search(r"[A-Za-z]{3}", _NOT_A_REASON.sub("", comment)))


def unexplained_local_imports(path: Path) -> list[int]:
    """The lines of the imports inside functions that say nothing of why they are there:
    no comment on their first line or on the line above, and not one of a run of imports
    (blank lines between them allowed) whose first one says why."""
    source = path.read_text()
    lines = source.splitlines()
    local = {}
    for function in ast.walk(ast.parse(source, str(path))):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    local[node.lineno] = node
    explained, missing = set(), []
    ends = {node.end_lineno: node.lineno for node in local.values()}
    for lineno in sorted(local):
        above = lineno - 1
        while above > 0 and not lines[above - 1].strip():
            above -= 1
        if (
            _says_why(lines[lineno - 1])
            or (
                above > 0
                and lines[above - 1].lstrip().startswith("#")
                and above == lineno - 1
                and _says_why(lines[above - 1])
            )
            or ends.get(above) in explained
        ):
            explained.add(lineno)
        else:
            missing.append(lineno)
    return missing


def test_an_import_inside_a_function_says_why():
    """Imports sit at the top of a module; one inside a function (a cycle at import time,
    torch or boto3 kept out of a process that does not need them, an optional library)
    says why on its line or the line above, so the next reader does not hoist it blind."""
    missing = {
        f"{rel}:{lineno}"
        for top in TOP
        for path in sorted((ROOT / top).rglob("*.py"))
        if "migrations" not in path.parts and (rel := str(path.relative_to(ROOT)))
        for lineno in unexplained_local_imports(path)
    }
    assert not missing, f"imports inside functions with no comment saying why: {sorted(missing)}"


def test_the_local_import_check_sees_one_without_a_reason(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n\n\ndef f():\n    import json\n\n    # torch only here\n"
        "    import torch\n    import numpy\n\n    from x import y\n\n    y()\n"
        "    import csv  # noqa: F401\n    import gzip  # cycle: gzip imports us\n"
    )
    assert unexplained_local_imports(module) == [5, 14]


MAX_MODULE_LINES = 500


def test_no_module_is_over_500_lines():
    """Small modules with names that explain themselves: a module past 500 lines is split
    (a rule of the codebase; migrations, written by makemigrations, are left out)."""
    long = {
        str(path.relative_to(ROOT)): lines
        for top in (*TOP, "bench", "scripts", "tests")
        for path in (ROOT / top).rglob("*.py")
        if "migrations" not in path.parts
        and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
