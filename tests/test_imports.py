"""The package's import graph, read statically from the source (``ast``, nothing imported):

- the rooms of ``bertforge`` stand in declared layers (:data:`LAYERS`, lowest first) and every
  ``bertforge`` import -- at module level, inside a function or under ``if TYPE_CHECKING:`` --
  points down that list: never up, never across to a sibling room of the same layer (a module may
  import modules of its own room freely);
- no import cycle among ``bertforge`` modules and none among its rooms (a utility two rooms need
  lives in a room of its own, e.g. ``bertforge.io``);
- no ``bertforge`` import inside a function (such imports exist only to dodge a cycle or to hide
  a dependency; the CLI's lazy loading goes through ``importlib`` in ``bertforge.cli``), except
  inside ``try: ... except ImportError`` around an optional extra such as ``bertforge[serve]``.

Run alone: ``pytest tests/test_imports.py``; on failure the message names each import and the
layers, or prints the cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "bertforge"

# The rooms of ``bertforge`` (a subpackage or a top-level module), lowest layer first. An import
# may only point to a room of a lower layer. "" is the package's front door
# (``bertforge/__init__.py``, which re-exports the library); ``__main__`` runs the CLI.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),  # the project's error types
    ("io",),  # atomic writes, JSON files, manifests
    ("runtime", "lock", "progress", "distributed"),  # device/precision, locks, bars, torchrun
    ("tokenizer",),  # WordPiece training and loading
    ("modeling",),  # config, the model, kernels, checkpoints, pooling declaration
    ("data",),  # corpora -> shards, masking, labelled task files
    ("inference",),  # using a trained model: fill-mask, classify, embed, explain, ONNX
    ("evaluation",),  # scores a model through inference: MLM, task metrics, probes, plots
    ("training",),  # the pretraining and fine-tuning loops
    ("recipes", "serve", "verify"),  # chains of commands (runner passed in), the server, checks
    ("",),  # bertforge/__init__.py: the library's public names
    ("cli",),  # parses options and calls the layers below
    ("__main__",),  # python -m bertforge
]


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, modules: dict) -> list[str]:
    """The ``bertforge`` modules an import statement in ``module`` loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
    if len(out) < len(node.names) and base in modules:  # names taken from the module itself
        out.append(base)
    return out


def _module_level(tree: ast.Module):
    """Import statements that run when the module is imported (``if``/``try`` bodies included,
    ``if TYPE_CHECKING:`` blocks and function/class bodies not)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            stack += [n for h in node.handlers for n in h.body]
        elif isinstance(node, ast.With):
            stack += node.body


def import_graph() -> dict[str, set[str]]:
    """module -> the ``bertforge`` modules its module-level imports load."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = {t for n in _module_level(tree) for t in _targets(n, name, modules)}
        graph[name].discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_the_real_imports():
    graph = import_graph()
    assert "bertforge.io" in graph["bertforge.modeling.checkpoint"]
    assert "bertforge.training.pretrain" in graph["bertforge"]
    assert len(graph) > 40


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# ---- layers: every import points down ---------------------------------------------------------


def room(module: str) -> str:
    """The room of a dotted module name: ``bertforge.data.shards`` -> ``data``, ``bertforge`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of() -> dict[str, int]:
    """room -> its layer's index in :data:`LAYERS` (0 = lowest)."""
    return {name: i for i, rooms in enumerate(LAYERS) for name in rooms}


def all_imports() -> list[tuple[str, int, str]]:
    """Every ``bertforge`` import of the package, wherever it stands (module level, function body,
    ``if TYPE_CHECKING:``), as ``(importer, line, imported module)``."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [
                    (name, node.lineno, t) for t in _targets(node, name, modules) if t != name
                ]
    return found


def layer_violations(imports, layers: dict[str, int]) -> list[str]:
    """The imports that point up or across the layers, one line each."""
    bad = []
    for importer, line, target in imports:
        src, dst = room(importer), room(target)
        if src == dst:
            continue
        if layers[dst] >= layers[src]:
            way = "across" if layers[dst] == layers[src] else "up"
            bad.append(f"{importer}:{line} imports {target} ({way}: {src or PACKAGE} -> {dst})")
    return bad


def test_every_room_has_a_layer():
    rooms = {room(m) for m in _modules()}
    declared = set(layer_of())
    assert rooms == declared, f"undeclared rooms {rooms - declared}, stale {declared - rooms}"


def test_layer_check_sees_up_and_across():
    layers = {"io": 0, "data": 1, "serve": 2, "recipes": 2}
    imports = [
        ("bertforge.data.a", 1, "bertforge.io"),  # down: fine
        ("bertforge.data.a", 2, "bertforge.data.b"),  # same room: fine
        ("bertforge.io", 3, "bertforge.data.a"),  # up
        ("bertforge.serve.x", 4, "bertforge.recipes.y"),  # across
    ]
    assert layer_violations(imports, layers) == [
        "bertforge.io:3 imports bertforge.data.a (up: io -> data)",
        "bertforge.serve.x:4 imports bertforge.recipes.y (across: serve -> recipes)",
    ]


def test_every_import_points_down_the_layers():
    bad = layer_violations(all_imports(), layer_of())
    assert not bad, "imports against the layers (LAYERS, lowest first):\n" + "\n".join(bad)


def test_no_cycle_among_rooms():
    graph: dict[str, set[str]] = {}
    for importer, _, target in all_imports():
        if room(importer) != room(target):
            graph.setdefault(room(importer), set()).add(room(target))
    cycle = find_cycle(graph)
    assert cycle is None, "rooms in a cycle: " + " -> ".join(cycle)


def test_no_module_cycle_even_for_type_checking():
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for importer, _, target in all_imports():
        graph[importer].add(target)
    # function-level imports run late and cannot deadlock an import, but a cycle is a cycle
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _optional(func: ast.AST) -> set[int]:
    """Ids of the import statements inside ``try: ... except ImportError`` blocks of ``func``: an
    optional extra (``bertforge[serve]``) imported where it is used, with a message if missing."""
    guarded = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def test_no_bertforge_import_inside_a_function():
    inside = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            guarded = _optional(func)
            for node in ast.walk(func):
                if id(node) in guarded:
                    continue
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                    inside.append(f"{name}:{node.lineno} ({func.name}) from {node.module}")
                elif isinstance(node, ast.Import) and any(
                    a.name.startswith(PACKAGE) for a in node.names
                ):
                    inside.append(f"{name}:{node.lineno} ({func.name})")
    assert not inside, "move these imports to the top of their module:\n" + "\n".join(inside)


# ---- function lengths: a loop a reader can hold ---------------------------------------------


def longest_functions(n: int = 10) -> list[tuple[int, str]]:
    """The ``n`` longest functions of the package as ``(lines, "module:function")`` (a function's
    lines run from its ``def`` to its last line, nested functions included)."""
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    return sorted(found, reverse=True)[:n]


def test_the_training_loops_fit_on_a_page():
    lengths = {where: lines for lines, where in longest_functions(10_000)}
    assert lengths["bertforge.training.pretrain:pretrain"] <= 130
    assert lengths["bertforge.training.finetune:finetune"] <= 130


if __name__ == "__main__":  # python tests/test_imports.py: the longest functions in src/
    for lines, where in longest_functions():
        print(f"{lines:5d}  {where}")
