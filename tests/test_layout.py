"""The package's shape, as docs/architecture.md promises it: no import cycle (function-level imports
counted), no function over 80 lines."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dlscale"
MAX_FUNCTION_LINES = 80


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """Each file parsed once for both tests (parsing the package is most of their time)."""
    return ast.parse(path.read_text())


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(tree: ast.AST):
    """Every import statement of a module, at module level or inside a function (a function-level
    import closes a cycle at call time just as well), except those under ``if TYPE_CHECKING:``."""
    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", None)) == "TYPE_CHECKING":
                yield from (n for c in child.orelse for n in [c, *walk(c)])
                continue
            yield child
            yield from walk(child)

    return [n for n in walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the dlscale modules it imports, wherever in the module the import stands."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(_tree(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            deps |= {t for t in targets if t in mods and t != name}
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v, path)):
                return found
        path.pop()
        state[u] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_are_in_the_graph():
    tree = ast.parse("import a\ndef f():\n    from b import c\nif TYPE_CHECKING:\n    import d\nelse:\n    import e\n")
    assert sorted(n.names[0].name if isinstance(n, ast.Import) else n.module for n in _imports(tree)) == ["a", "b", "e"]


def test_no_import_cycle():
    graph = import_graph()
    assert "dlscale.worker" in graph and graph["dlscale.report.render"]  # the graph is read at all
    assert "dlscale.report.html" in graph["dlscale.report.cli"]  # a function-level import is counted
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_function_over_80_lines():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(_tree(path)):

            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long
