"""The tree's layers hold: one direction of dependency, no import cycles (docs/architecture.md).

``hw/spec`` (plain Python) -> ``hw/`` gateware and ``sim/golden`` -> ``sim/compiler``,
``sim/iss``, ``sim/rtl`` -> the typed API (``sim/api.py``) -> ``sim/cli`` (:data:`LAYERS`).
Every import of every module of ``hw`` and ``sim`` is parsed with ``ast``, at module level and
inside functions.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hw", "sim")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _comment_above(lines, line: int) -> bool:
    """A comment line right above ``line``, or above the run of import lines it ends."""
    k = line - 2
    while k >= 0 and lines[k].strip().startswith(("import ", "from ")):
        k -= 1
    return k >= 0 and lines[k].strip().startswith("#")


class _Import:
    def __init__(self, target: str, line: int, in_function: bool, commented: bool):
        self.target, self.line, self.in_function, self.commented = \
            target, line, in_function, commented


def _imports(name: str) -> list[_Import]:
    path = MODULES[name]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                line = child.lineno
                commented = "#" in lines[line - 1] or _comment_above(lines, line)
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                else:
                    base = _resolve(name, child)
                    # `from pkg import mod` imports the module pkg.mod when there is one.
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                               for a in child.names]
                out.extend(_Import(t, line, in_function, commented) for t in targets)
            visit(child, inner)

    visit(tree, False)
    return out


IMPORTS = {name: _imports(name) for name in MODULES}


def _project(target: str) -> str | None:
    """The project module ``target`` names (a module, or the package it is in), else None."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _graph() -> dict[str, set[str]]:
    """Module -> project modules it imports; importing ``a.b.c`` also runs ``a`` and ``a.b``,
    except the importer's own packages (already being imported)."""
    graph = {}
    for name, imports in IMPORTS.items():
        own = set(_ancestors(name))
        deps = set()
        for imp in imports:
            target = _project(imp.target)
            if target is None or target == name:
                continue
            deps.add(target)
            deps.update(a for a in _ancestors(target) if a not in own and a in MODULES)
        deps.discard(name)
        graph[name] = deps
    return graph


def _cycles(graph):
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(rule):
    return [f"{name}:{imp.line} imports {imp.target}" for name, imports in IMPORTS.items()
            for imp in imports if rule(name, imp.target)]


def test_the_tree_is_found():
    assert {"hw.spec", "hw.chip", "sim.iss", "sim.cli", "sim.api"} <= set(MODULES)


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The layers, lowest first: a module is in the layer of the longest entry it is within (a
#: module within none is unconstrained) and imports only from its own layer and those below.
LAYERS = (
    (
        "hw.spec",
    ),
    (
        "hw",
        "sim.golden",
    ),
    # The compiler, the ISS, the timing models, the RTL runs; the Verilog export, which the
    # Verilator backend builds; the errors every layer above raises.
    (
        "sim.compiler",
        "sim.iss",
        "sim.timing.cycle",
        "sim.timing.engines",
        "sim.timing.launch",
        "sim.timing.ring",
        "sim.rtl",
        "sim.rtl.export",
        "sim.errors",
    ),
    # The typed API and what it re-exports: the flows behind the commands, the strategy
    # registry, the planner, the report and its views, checkpoints and accuracy, sweeps and
    # benchmarks.
    (
        "sim.api",
        "sim.strategies",
        "sim.flows.simulate",
        "sim.planner.plan",
        "sim.report.core",
        "sim.report.timeline",
        "sim.report.plot",
        "sim.report.chrome_trace",
        "sim.flows.collective",
        "sim.flows.fpga",
        "sim.flows.board",
        "sim.flows.bench",
        "sim.benches",
        "sim.models.checkpoint",
        "sim.models.gguf_file",
        "sim.models.accuracy",
        "sim.sweep",
    ),
    (
        "sim.cli",
        "sim.__main__",
    ),
)

#: The timing models import the functional ISS (its errors), never the other way round.
TIMING_MODELS = (
    "sim.timing.cycle",
    "sim.timing.engines",
    "sim.timing.launch",
    "sim.timing.ring",
)


def _layer(name: str) -> int | None:
    best = None
    for k, entries in enumerate(LAYERS):
        for entry in entries:
            if _within(name, entry) and (best is None or len(entry) > len(best[1])):
                best = (k, entry)
    return None if best is None else best[0]


def test_imports_point_down_the_layers():
    graph = _graph()
    up = [f"{name} (layer {_layer(name)}) imports {dep} (layer {_layer(dep)})"
          for name in sorted(graph) for dep in sorted(graph[name])
          if _layer(name) is not None and _layer(dep) is not None and _layer(dep) > _layer(name)]
    assert up == []


def test_the_functional_iss_never_imports_the_timing_models():
    def timing(t):
        return any(_within(t, m) for m in TIMING_MODELS)
    assert _violations(lambda n, t: _within(n, "sim.iss") and not timing(n) and timing(t)) == []


def test_gateware_never_imports_sim():
    assert _violations(lambda n, t: _within(n, "hw") and _within(t, "sim")) == []


def test_spec_is_plain_python():
    """hw/spec imports neither Amaranth nor any of our modules outside it."""
    assert _violations(lambda n, t: _within(n, "hw.spec") and (
        _within(t, "amaranth") or ((_within(t, "hw") or _within(t, "sim"))
                                   and not _within(t, "hw.spec")))) == []


def test_golden_models_import_only_the_spec():
    assert _violations(lambda n, t: _within(n, "sim.golden") and _project(t) is not None
                       and not _within(t, "hw.spec") and not _within(t, "sim.golden")) == []


def test_golden_models_import_no_amaranth():
    assert _violations(lambda n, t: _within(n, "sim.golden") and _within(t, "amaranth")) == []


def test_iss_never_imports_the_compiler():
    assert _violations(lambda n, t: _within(n, "sim.iss") and _within(t, "sim.compiler")) == []


def test_nothing_imports_the_cli():
    assert _violations(lambda n, t: _within(t, "sim.cli") and not _within(n, "sim.cli")
                       and n != "sim.__main__") == []


def test_the_compiler_and_simulators_do_not_import_the_api():
    assert _violations(lambda n, t: _within(t, "sim.api") and not _within(n, "sim.cli")) == []


def test_function_level_imports_defer_only_optional_dependencies():
    """An import inside a function defers a heavy optional dependency and says so; our own
    modules are imported at module level (so the cycle check sees the real order)."""
    bad = [f"{name}:{imp.line} imports {imp.target} inside a function"
           + ("" if imp.commented else " without a comment")
           for name, imports in IMPORTS.items() for imp in imports
           if imp.in_function and (_project(imp.target) is not None or not imp.commented)]
    assert bad == []


@pytest.mark.parametrize("rule, name, target, broken", [
    ("hw imports sim", "hw.chip", "sim.iss", True),
    ("spec imports amaranth", "hw.spec.isa", "amaranth.hdl", True),
    ("iss imports compiler", "sim.iss.chip", "sim.compiler.single", True),
])
def test_rules_can_fail(rule, name, target, broken):
    checks = {
        "hw imports sim": lambda n, t: _within(n, "hw") and _within(t, "sim"),
        "spec imports amaranth": lambda n, t: _within(n, "hw.spec") and _within(t, "amaranth"),
        "iss imports compiler": lambda n, t: _within(n, "sim.iss") and _within(t, "sim.compiler"),
    }
    assert checks[rule](name, target) is broken
