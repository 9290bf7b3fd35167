"""The house's shape, checked from the code itself: layers that import one way, no import circles
(imports inside functions included), small classes and functions, a new rollout mode that is one
class of the RL layer, and a design record whose layer diagram names exactly the packages there are."""

from __future__ import annotations

import ast
import pathlib
import re

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DORA = ROOT / "dora"

# What each layer may import (besides itself). The graph layer reaches op code only through import
# paths its declarations name (strings, imported when a pipeline is checked), never an import.
MAY_IMPORT = {
    "dora.algos": set(),
    "dora.graph": set(),
    "dora.observe": {"dora.graph"},
    "dora.ops": {"dora.algos", "dora.graph"},
    "dora.runtime": {"dora.ops", "dora.graph"},
    "dora.rl": {"dora.runtime", "dora.observe", "dora.ops", "dora.algos", "dora.graph"},
    "dora.sim": {"dora.rl", "dora.observe", "dora.graph"},
    "dora.cli": {"dora.graph", "dora"},   # `dora run` and `dora simulate` are dispatched by name
    "dora.api": {"dora.graph", "dora.rl"},   # the Python front door: dora.run is `dora run`
    "dora": {"dora.api", "dora.graph", "dora.rl"},   # its names, imported at first use (dora/__init__.py)
}
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 80


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in DORA.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """Every module of dora/ that `name` imports, at any depth (functions and TYPE_CHECKING blocks too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    out = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


@pytest.fixture(scope="module")
def import_graph() -> nx.DiGraph:
    known = _modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        g.add_edges_from((name, t) for t in _imports(name, path, known))
    return g


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def test_no_import_circles(import_graph):
    circles = [sorted(c) for c in nx.strongly_connected_components(import_graph) if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_layers_import_one_way(import_graph):
    """graph -> ops/algos -> runtime -> rl -> sim; observe beside them reads run files and states:
    the runtime knows nothing of RL, nothing below the RL layer imports it."""
    bad = [f"{a} -> {b}" for a, b in import_graph.edges
           if _layer(a) != _layer(b) and _layer(b) not in MAY_IMPORT[_layer(a)]]
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_no_long_classes_or_functions():
    long = []
    for path in DORA.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "end_lineno") else 0
            if isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
                long.append(f"class {node.name} ({path.relative_to(ROOT)}:{node.lineno}): {size} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
                long.append(f"function {node.name} ({path.relative_to(ROOT)}:{node.lineno}): {size} lines")
    assert not long, "\n".join(long)


def test_the_design_record_names_every_package():
    """docs/architecture.md's layer diagram lists exactly the packages under dora/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    diagram = text.split("## Layers", 1)[1].split("```")[1]
    listed = set(re.findall(r"\b(dora(?:/\w+)*)/", diagram)) - {"dora"}   # (dora/cli.py is a module)
    packages = {str(p.parent.relative_to(ROOT)) for p in DORA.rglob("__init__.py")} - {"dora"}
    assert not listed - packages, f"listed but not packages: {sorted(listed - packages)}"
    assert not packages - listed, f"packages the diagram does not list: {sorted(packages - listed)}"
    for package in sorted(p for p in packages if p.count("/") == 1):   # each layer has its section
        assert f"({package})" in text or f"({package}/" in text or f"({package}," in text, \
            f"no section of docs/architecture.md points to {package}"


def test_a_new_rollout_mode_is_one_class_in_the_rl_layer():
    """Declaring a RolloutPolicy subclass is all a new mode takes: `dora validate` accepts its name
    with the K/RBS rules it declares, and the rollout control code runs it (here, in the simulator)."""
    from dora.graph.diagnostics import errors_of
    from dora.graph.resolve import resolve
    from dora.graph.validate import validate
    from dora.graph.yaml_io import load_graph
    from dora.rl.rollout import POLICIES
    from dora.rl.rollout.policies.rollout_policy import RolloutPolicy
    from dora.sim.simulator import SimConfig, simulate

    class NewestOnlyPolicy(RolloutPolicy):   # streaming on the newest version, K fixed at 2
        name = "test_newest_only"
        staleness = 2

    quickstart = str(ROOT / "pipelines" / "quickstart.yaml")
    try:
        graph = load_graph(quickstart, ["async.mode=test_newest_only", "async.max_staleness=1"])
        assert not errors_of(validate(graph))
        settings = resolve(graph).async_
        assert (settings.mode, settings.max_staleness, settings.rollout_batch) == ("test_newest_only", 2, 96)
        typo = validate(load_graph(quickstart, ["async.mode=test_newest_onyl"]))
        assert any("did you mean 'test_newest_only'" in d.message for d in errors_of(typo))
        row = simulate(SimConfig(mode="test_newest_only", model="qwen2.5-1.5b", gpus=8, steps=3,
                                 train_batch=256, group_size=8, max_staleness=1))
        assert row["staleness_max"] <= 2 and row["lost"] == 0 and row["c1_violations"] == row["c2_violations"] == 0
    finally:
        del POLICIES["test_newest_only"]
