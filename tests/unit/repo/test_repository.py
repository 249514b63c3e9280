"""The repository explains itself (no tracked file points at documents outside it) and keeps
its shape (no import circles between the product's modules)."""

from __future__ import annotations

import ast
import re
import subprocess
from collections import deque
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# Spelled in pieces so that this file, checked like every other, does not hold them whole.
OUTSIDE = ("../" + "shared", "DESIGN" + ".md")


def test_no_tracked_file_refers_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    offenders = []
    for rel in filter(None, listed.split("\0")):
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [f"{rel}: {needle}" for needle in OUTSIDE if needle in text]
    assert offenders == []


def test_the_architecture_map_names_only_modules_that_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    pkg = REPO / "operator" / "gpujob_operator"
    named = set(
        re.findall(r"`((?:api|lifecycle|monitoring|observability|runtime)/[\w/]+\.py)", text)
    )
    assert named, "the map names no module"
    missing = sorted(rel for rel in named if not (pkg / rel).is_file())
    assert missing == []


def test_ci_runs_the_readme_test_command_then_the_chaos_tier() -> None:
    """A tier nobody runs stops proving anything: CI runs lint, the README's test command,
    then ``make chaos``, in that order, and stops at the first failure."""
    ci = (REPO / ".ci" / "run").read_text()
    readme_head = "\n".join((REPO / "README.md").read_text().splitlines()[:8])
    assert "$ make test" in readme_head
    assert "set -euo pipefail" in ci
    steps = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("make ")]
    assert steps == ["make lint", "make test", "make chaos"]


# -- import circles ------------------------------------------------------------------------
# import-linter checks the layers, but a circle inside one layer (two runtime modules) or one
# made only of annotations (`if TYPE_CHECKING:`) passes it. Such a circle still ties the
# modules together: neither can be read, tested or moved without the other. So every import
# counts here, wherever it is written (a function's body, under TYPE_CHECKING).
PACKAGES = {
    "gpujob_operator": REPO / "operator" / "gpujob_operator",
    "gpujob_trainer": REPO / "trainer_image" / "gpujob_trainer",
}


def package_modules(package: str, root: Path) -> dict[str, Path]:
    """Every module of a package by its dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that module ``name`` imports, anywhere in its text.

    ``from pkg import mod`` names the module ``pkg.mod`` where that is one, else ``pkg``; a
    relative import is resolved from the module's own package. The packages above an
    imported module, which Python runs first, are not counted: every module would then
    close a circle with its package's ``__init__`` that re-exports it.
    """
    package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . (the package), from .. (the one above), ...
                above = package[: len(package) - node.level + 1]
                base = ".".join([*above, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    return found - {name}


def import_graph(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, over all the given packages."""
    modules = {
        n: p for pkg, root in packages.items() for n, p in package_modules(pkg, root).items()
    }
    return {n: imported_modules(n, p, set(modules)) for n, p in modules.items()}


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: each a set of modules that all reach
    each other through imports (a lone module is its own)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_circle(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """One circle through a component's first module, as the imports run (for the message)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is no circle")


def circles(packages: Mapping[str, Path]) -> list[str]:
    """Each import circle among the packages' modules, named by one path around it."""
    graph = import_graph(packages)
    return [" -> ".join(a_circle(graph, c)) for c in strongly_connected(graph) if len(c) > 1]


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Not even for annotations: a narrow Protocol in a module of its own breaks such a
    circle (runtime/jobhandle.py, gpujob_trainer/recorder.py)."""
    graph = import_graph(PACKAGES)
    assert len(graph) > 100 and sum(map(len, graph.values())) > len(graph)  # no empty graph
    assert circles(PACKAGES) == []


def test_the_circle_finder_sees_annotations_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\nA = 1\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import C\n")
    (pkg / "c.py").write_text("from . import a\nC = 1\n")
    assert circles({"pkg": pkg}) == ["pkg.a -> pkg.sub.b -> pkg.c -> pkg.a"]
