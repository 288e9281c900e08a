"""The house rules on imports, read from the source (every import statement, the ones inside
functions and under TYPE_CHECKING included): no cycle between the modules of amp_search and
cost_models, cost_models imports nothing from amp_search, and no module imports another
module's private name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("amp_search", "cost_models")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import statement of `module`,
    within amp_search and cost_models; `from pkg import submodule` counts as the submodule."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, None) if sub in MODULES else (target, a.name))
    return [(m, name) for m, name in out if m.split(".")[0] in PACKAGES]


GRAPH = {m: sorted({t for t, _ in _imports(m) if t in MODULES and t != m}) for m in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle as a path of modules, or None (depth-first search)."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in GRAPH[m]:
            # a package's __init__ imports its own submodules; a submodule importing its
            # package's name is the same module group, not a cycle through other code
            if state.get(t) == 1 and not m.startswith(t + "."):
                return path[path.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in MODULES:
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_module_list_is_read():
    assert {"amp_search.planner", "amp_search.costing.cost_model", "amp_search.simulate",
            "cost_models.pipeline"} <= set(MODULES)
    assert "amp_search.costing.cost_model" in GRAPH["amp_search.costing"]


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_finds_a_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "cost_models.pipeline",
                        GRAPH["cost_models.pipeline"] + ["amp_search.planner"])
    assert _cycle() is not None


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("cost_models")])
def test_cost_models_import_nothing_from_amp_search(module):
    assert not [t for t, _ in _imports(module) if t.startswith("amp_search")]


def test_no_private_name_crosses_modules():
    crossing = [f"{m} imports {name} from {t}" for m in MODULES for t, name in _imports(m)
                if name is not None and name.startswith("_") and not name.startswith("__")
                and t != m]
    assert not crossing


def test_every_package_is_in_the_wheel():
    """setup.cfg lists the packages by name: a new sub-package missing there installs from a
    checkout (editable) but not from the wheel."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts) for package in PACKAGES
             for p in (ROOT / package).rglob("__init__.py")}
    assert found <= listed, f"not in setup.cfg's packages: {sorted(found - listed)}"
