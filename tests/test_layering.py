"""The layering rules of DESIGN.md, checked on the source tree."""
import ast
import pathlib

import onnxtrain

PACKAGE = pathlib.Path(onnxtrain.__file__).parent


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_only_runtime_imports_onnxruntime():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "runtime":
            continue
        if any(name.split(".")[0] == "onnxruntime" for name in _imports(path)):
            offenders.append(str(relative))
    assert offenders == []


def test_lower_layers_do_not_import_upper_ones():
    lower = {"graph": {"autodiff", "runtime", "estimators", "losses", "optim"},
             "autodiff": {"runtime", "estimators", "losses", "optim"},
             # the artifact API runs without scikit-learn's estimators: what
             # it shares with them lives lower (onnxtrain._casting...)
             "api": {"estimators", "neural_network"}}
    offenders = []
    for layer, forbidden in lower.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            source = path.read_text()
            for name in forbidden:
                if f"from ..{name}" in source or f"from ...{name}" in source \
                        or f"onnxtrain.{name}" in source:
                    offenders.append((str(path.relative_to(PACKAGE)), name))
    assert offenders == []
