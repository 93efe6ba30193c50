"""The package's folders are its layers, and imports only go down.

The order below is the design; the test reads every import of every
module under ``src/mutor`` (lazy ones inside functions too) and fails on one that goes up or sideways.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mutor"

# lower rank = lower layer; a module imports only from its own folder and from folders of lower rank
LAYERS = {
    "utils": 0, "testing": 0,
    "core": 1, "models": 1,
    "methods": 2,
    "data": 3, "integrations": 3,
    "image": 4,
    "eval": 5,
    "run": 6,
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
