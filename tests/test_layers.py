"""The package's folders are its layers, imports only go down, and no modules import each other in a circle.

The order below is the design; the test reads every import of every
module under ``src/mutor`` (lazy ones inside functions too) and fails on one that goes up or sideways.
Within a folder imports may go either way, so the circle check reads the same imports, module by module
(an import under ``if TYPE_CHECKING:`` never runs, and is not one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mutor"

# lower rank = lower layer; a module imports only from its own folder and from folders of lower rank
LAYERS = {
    "utils": 0,
    "core": 1, "models": 1,
    "methods": 2,
    "data": 3, "integrations": 3, "generation": 3,
    "image": 4,
    "eval": 5,
    "run": 6,
    "testing": 7,                              # helpers for tests and demos: the package never imports them
}
FACADES = {"mutor", "mutor.__main__"}          # the public API re-exports from every layer


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``mutor`` import in ``path``."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:             # `from . import x`: x is the module
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, t) for line, t in found if t == "mutor" or t.startswith("mutor.")]


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports when it runs (at module level or in a function; not under
    ``if TYPE_CHECKING:``); ``from a.b import c`` is module ``a.b.c`` when there is one, else ``a.b``."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def type_checking(node: ast.AST) -> bool:
        test = node.test if isinstance(node, ast.If) else None
        return isinstance(test, (ast.Name, ast.Attribute)) and ast.unparse(test).endswith("TYPE_CHECKING")

    def visit(node: ast.AST) -> None:
        if type_checking(node):
            return
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != module}


def _a_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in ``graph`` (module -> the modules it imports), as ``[a, b, ..., a]``; [] if none."""
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> list[str]:
        for n in sorted(graph[m]):
            if n in path:
                return path[path.index(n):] + [n]
            if n not in done:
                circle = visit(n, path + [n])
                if circle:
                    return circle
        done.add(m)
        return []

    for m in sorted(graph):
        circle = [] if m in done else visit(m, [m])
        if circle:
            return circle
    return []


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = sorted(p for p in SRC.rglob("*.py"))


def test_every_module_sits_in_a_layer_folder():
    loose = [str(p.relative_to(SRC)) for p in MODULES if _module(p) not in FACADES and _layer(_module(p)) not in LAYERS]
    assert not loose, f"modules outside the layer folders {sorted(LAYERS)}: {loose}"


@pytest.mark.parametrize("path", [p for p in MODULES if _module(p) not in FACADES],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_imports_only_go_down(path):
    here = _layer(_module(path))
    wrong = []
    for line, target in _imports(path):
        there = _layer(target)
        if there == here:
            continue
        if there not in LAYERS or LAYERS[there] >= LAYERS[here]:
            wrong.append(f"line {line}: {target} ({there or 'the facade'})")
    assert not wrong, f"{path.relative_to(SRC)} ({here}, rank {LAYERS[here]}) imports up or sideways: {wrong}"


def test_no_modules_import_each_other_in_a_circle():
    modules = {_module(p) for p in MODULES}
    graph = {_module(p): _runtime_imports(p, modules) for p in MODULES}
    circle = _a_circle(graph)
    assert not circle, f"modules import each other in a circle: {' -> '.join(circle)}"


def test_the_circle_check_finds_a_circle():
    assert _a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_public_api_imports_from_the_top():
    import mutor

    for name in mutor.__all__:
        assert getattr(mutor, name) is not None, name
    from mutor import MuToRSFTTrainer, MuToRTrainer  # imported on first use
    from mutor.integrations.trainer import MuToRTrainer as Trainer
    from mutor.integrations.trl import MuToRSFTTrainer as SFT

    assert MuToRTrainer is Trainer and MuToRSFTTrainer is SFT
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        mutor.nothing
