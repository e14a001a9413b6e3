"""The package's import structure (issue 14): no import cycle, and no import inside a function
except of an optional dependency (or of a module of ours that needs one at import)."""

from __future__ import annotations

import ast
from pathlib import Path

import modelopt

PACKAGE = Path(__file__).resolve().parents[1] / "modelopt"
# Extras a user may not have installed (pyproject.toml's optional dependencies): imported where used.
OPTIONAL = frozenset({"torchvision", "optuna", "optuna_dashboard", "onnx", "onnxruntime", "openvino", "bitsandbytes",
                      "matplotlib", "ray"})


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement loads (a `from pkg import name` loads pkg.name when it is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: None if is_package else -1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str) -> tuple[set[str], list[tuple[str, int]]]:
    """(modules imported when `module` is imported, [(module, line) imported inside a function])."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    top: set[str] = set()
    inner: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _type_checking(node):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(node, module, is_package):
                (inner.append((target, node.lineno)) if in_function else top.add(target))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    # Importing a.b.c runs a/b/__init__.py first: a package other than the importer's own (and the
    # root, the public facade, which Python has always begun) is imported too.
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
    top |= {".".join(t.split(".")[:i]) for t in set(top) for i in range(2, t.count(".") + 1)} & set(MODULES) - own
    return top, inner


GRAPH = {m: _imports(m) for m in MODULES}


def _needs_optional(module: str) -> bool:
    return any(t.split(".")[0] in OPTIONAL for t in GRAPH[module][0])


def test_no_import_cycle() -> None:
    """Counting imports inside functions too: deferring an import hides a cycle, it does not remove it."""
    edges = {m: sorted({t for t in [*GRAPH[m][0], *(t for t, _ in GRAPH[m][1])] if t in MODULES and t != m})
             for m in MODULES}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def dfs(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                dfs(t, stack)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            dfs(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The command line's entry imports the CLI inside `main` by design: a Ctrl-C while torch imports is caught there.
DEFERRED_BY_DESIGN = frozenset({"modelopt.cli.entry"})


def test_imports_inside_functions_are_optional_dependencies_only() -> None:
    bad = []
    for m in set(MODULES) - DEFERRED_BY_DESIGN:
        for target, line in GRAPH[m][1]:
            root = target.split(".")[0]
            if root in OPTIONAL or (target in MODULES and _needs_optional(target)):
                continue
            bad.append(f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not bad, f"{len(bad)} imports inside functions:\n" + "\n".join(bad)


MAX_FILE_LINES = 400
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def test_no_file_or_class_over_the_line_limit() -> None:
    """A file past MAX_FILE_LINES or a class past MAX_CLASS_LINES holds more than one idea (issue 57): split it at a
    seam, never at a line count (a method moved out of its class to fit is no seam)."""
    long = []
    for path in MODULES.values():
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            long.append(f"{path.relative_to(PACKAGE.parent)} ({n} lines)")
        for node in ast.walk(ast.parse(text)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if n > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} class {node.name} ({n} lines)")
    assert not long, "over the line limits:\n" + "\n".join(long)


def test_no_function_over_the_line_limit() -> None:
    """Docstrings count: a function whose documentation needs that much room does too much."""
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# The package root keeps the public API and the ideas every room shares; everything else lives in a room (issue 24).
MAX_ROOT_MODULES = 12


def test_the_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, (
        f"{len(root)} modules at modelopt/'s root (at most {MAX_ROOT_MODULES}): {root}; give the new one a room")


def test_packages_are_not_shadowed_by_the_api() -> None:
    """`modelopt.evaluate` is the verb: a subpackage of the same name would replace it on first import."""
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    clashes = sorted(rooms & set(modelopt.__all__))
    assert not clashes, f"subpackages named like public API names: {clashes}"


# Rooms from the bottom up (issue 24): a module imports only from its own room and the rooms below it. Root
# modules are rooms of their own. Imports under TYPE_CHECKING count too: a type a lower room names from a
# higher one is still a dependency on it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "_files", "_registry", "_version", "_name_clash", "confidence"),  # foundations
    ("zoo",),  # bundled models
    ("data",),  # the splits and their file formats
    ("solvers",),  # closed-form layer solvers on input second moments: GPTQ's sweep, least squares
    ("model",),  # the model under compression: layers, loading, the workload
    ("compressors",),  # the plugin contract and the plugins
    ("plan",),  # what a search decides: plans, the space, plan files
    ("evaluation",),  # scoring one plan: the evaluator, its parts, metrics, trials
    ("objective",),  # what a run minimises; feasibility
    ("search",),  # strategies
    ("exporters",),  # writers of a scored plan: packed, ONNX, bitsandbytes
    ("reconstruct",),  # the chosen plans refitted on their own inputs
    ("latency",),  # measured latency of a plan
    ("certify",),  # the promise: what splits certify, confirmation, deployed-equals-certified
    ("knowledge",),  # what earlier runs teach
    ("config",),  # a run's settings, and building a run from them
    ("executors",),  # who scores plans
    ("run",),  # runs on disk: the runner, journal, export from a run folder
    ("reports",),
    ("testing",),  # conformance suites for plugins
    ("api",),  # the public verbs
    ("sweep",),  # grids of runs
    ("cli",),
    ("__init__", "__main__"),
)
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _all_imports(module: str) -> list[tuple[str, int]]:
    """(module, line) of every import of ours in `module`, at top level, in functions and under TYPE_CHECKING."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    is_package = MODULES[module].name == "__init__.py"
    return [(t, node.lineno) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for t in _targets(node, module, is_package) if t.split(".")[0] == "modelopt"]


def test_every_room_has_a_layer() -> None:
    missing = sorted({_room(m) for m in MODULES} - set(RANK))
    assert not missing, f"rooms with no place in LAYERS: {missing}; say which rooms each may import"


def test_no_module_imports_upward() -> None:
    up = []
    for m in MODULES:
        for target, line in _all_imports(m):
            if target == "modelopt":  # the package root is begun by Python before any room: not a dependency
                continue
            if RANK.get(_room(target), -1) > RANK.get(_room(m), -1):
                up.append(f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} ({_room(m)}) imports {target} "
                          f"({_room(target)})")
    assert not up, f"{len(up)} upward imports:\n" + "\n".join(up)


# The plugin boundary (issues 24 and 45): outside compressors/, code reaches compressors through the package
# (`modelopt.compressors`: the registry and the plugins' records) and its public contract
# (`modelopt.compressors.contract`), never through an underscore module (which may move) or a plugin's own module,
# and never spells a registered compressor's name.
CONTRACT = frozenset({"modelopt.compressors", "modelopt.compressors.contract"})
# What the package itself may hand out beyond its contract modules: the registry and the records of the contract.
# The package re-exports the shipped plugins' classes for users (`modelopt.compressors.Quantize`); the public
# facade `modelopt/__init__.py` hands `QuantSpec` and `Granularity` on to them, and nothing else imports those.
CONTRACT_NAMES = frozenset({"COMPRESSORS", "FIRST_COMPRESSOR", "Cell", "Choice", "Compressor", "Options",
                            "ReportColumn", "Setting", "SettingKind", "Storage", "compressor_settings", "option"})
FACADE = "modelopt"
# The names of the compressors modelopt ships, as the registry knows them.
SHIPPED = ("quantize", "prune", "early_exit", "depth")


def _outside_compressors() -> list[str]:
    return [m for m in MODULES if _room(m) != "compressors"]


def test_nothing_outside_compressors_imports_a_plugin_module() -> None:
    bad = sorted({f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {t}" for m in _outside_compressors()
                  for t, line in _all_imports(m) if t.startswith("modelopt.compressors") and t not in CONTRACT})
    assert not bad, f"{len(bad)} imports of compressor plugins from outside compressors/:\n" + "\n".join(bad)


def test_what_is_imported_from_the_compressors_package_is_its_contract() -> None:
    bad = []
    for m in _outside_compressors():
        if m == FACADE:
            continue
        for node in ast.walk(ast.parse(MODULES[m].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "modelopt.compressors":
                bad += [f"{MODULES[m].relative_to(PACKAGE.parent)}:{node.lineno} imports {a.name}"
                        for a in node.names if a.name not in CONTRACT_NAMES]
    assert not bad, "plugin classes imported through the compressors package:\n" + "\n".join(bad)


def _strings(tree: ast.AST) -> list[tuple[str, int]]:
    """String constants of code, not docstrings."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_nothing_outside_compressors_spells_a_compressor_name() -> None:
    from modelopt.compressors import COMPRESSORS

    assert set(SHIPPED) <= set(COMPRESSORS.names())
    bad = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} {value!r}" for m in _outside_compressors()
           for value, line in _strings(ast.parse(MODULES[m].read_text(encoding="utf-8"))) if value in SHIPPED]
    assert not bad, f"{len(bad)} compressor names spelled outside compressors/:\n" + "\n".join(bad)
