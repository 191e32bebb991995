"""The layering rules of docs/design.md, checked on the real import graph.

Every module of onnxtrain is parsed (``ast``); its imports, at module level
and inside functions, relative ones resolved, give the edges of the import
graph between onnxtrain's modules. An edge ``a -> b`` names the module ``b``
that the statement reads from (``from .graph import builder`` reads
``onnxtrain.graph.builder``; ``from .graph import GraphBuilder`` reads
``onnxtrain.graph``); the parent packages that Python initializes on the way
are not edges, so a package ``__init__`` re-exporting its modules makes no
cycle. The former module paths kept by :mod:`onnxtrain._utils.moved` are no
files, hence no nodes.
"""
import ast
import pathlib

import onnxtrain
from onnxtrain._utils.moved import MOVED

PACKAGE = pathlib.Path(onnxtrain.__file__).parent

#: The layers, lowest first: a unit (a folder or a top-level module of
#: onnxtrain) imports units of lower layers and itself, never a unit of its
#: own layer or of a higher one.
LAYERS = [
    ("exceptions",),
    ("_utils", "checkpoint"),
    ("graph",),
    ("autodiff",),
    ("losses", "optim"),
    ("assembly",),
    ("runtime",),
    ("training",),
    ("estimators", "onnxblock"),
    ("neural_network", "api"),
    ("demo", "plotting", "integrations"),
    ("cli",),
    ("__main__",),
    ("__init__",),  # the package's facade: the names of every layer
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules():
    """module name -> (path, is a package)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("onnxtrain",) + path.relative_to(PACKAGE).with_suffix("").parts
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _targets(module, package, node):
    """The onnxtrain modules one import statement reads from."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [n for n in names if n.split(".")[0] == "onnxtrain"]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[:None if package else -1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    if base.split(".")[0] != "onnxtrain":
        return []
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names]


def _import_graph():
    """module -> set of onnxtrain modules it imports (anywhere in it)."""
    graph = {}
    for module, (path, package) in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {target for node in ast.walk(tree)
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _targets(module, package, node)}
    return graph


GRAPH = _import_graph()


def _unit(module):
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_import_names_a_module():
    unknown = sorted((m, t) for m, ts in GRAPH.items() for t in ts
                     if t not in MODULES and t not in MOVED)
    assert unknown == []


def test_onnxtrain_imports_no_former_path():
    """Former paths are for users; onnxtrain imports the modules themselves."""
    assert sorted((m, t) for m, ts in GRAPH.items() for t in ts if t in MOVED) == []


def test_former_paths_are_no_files():
    """A file at a former path would be hidden by the alias (or hide it)."""
    assert [name for name in MOVED if name in MODULES] == []
    assert all(target in MODULES for target in MOVED.values())


def test_every_unit_has_a_layer():
    assert sorted({_unit(m) for m in MODULES} - set(RANK)) == []


def test_no_import_runs_up_the_layers():
    offenders = []
    for module, targets in GRAPH.items():
        for target in targets:
            low, high = _unit(target), _unit(module)
            if low != high and RANK[low] >= RANK[high]:
                offenders.append(f"{module} -> {target}")
    assert sorted(offenders) == []


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_import_graph_has_no_cycle():
    assert _cycles(GRAPH) == []


def test_only_runtime_imports_onnxruntime():
    offenders = []
    for module, (path, _) in MODULES.items():
        if _unit(module) == "runtime":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and node.level == 0 else [])
            if any(n.split(".")[0] == "onnxruntime" for n in names):
                offenders.append(module)
    assert offenders == []


def test_no_public_class_is_defined_twice():
    """One name per thing: two public classes of one name are two things
    under one name (an alias ``Old = New`` is no definition)."""
    where = {}
    for module, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(module)
    assert {name: found for name, found in where.items() if len(found) > 1} == {}


def test_no_class_has_more_than_25_methods():
    # issue 33: one responsibility per class; helpers of one op family live
    # with their users, not on the shared builder
    large = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                count = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                            for item in node.body)
                if count > 25:
                    large.append((str(path.relative_to(PACKAGE)), node.name, count))
    assert large == []
