"""The shape of core/ (docs/architecture.md §1): every package is a real
package, and the imports between core's modules form no circle."""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core"


def modules() -> dict[str, Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        parts = path.relative_to(CORE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The core modules a file imports, at any depth (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("core"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("core"))
    return {m for m in found if m in known}


def test_every_directory_of_python_modules_under_core_is_a_package():
    for directory in {p.parent for p in CORE.rglob("*.py")}:
        assert (directory / "__init__.py").exists(), f"{directory} has no __init__.py: a wheel would leave it out"


def test_the_imports_between_core_modules_form_no_circle():
    mods = modules()
    graph = {name: imports(path, set(mods)) - {name} for name, path in mods.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name, path):
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
