"""The import paths of modules that moved, kept working.

Each former path in :data:`MOVED` imports as the module that now holds the
code (the same module object, so its private names and monkeypatching work
too). The former files are gone so that git follows the moves.
"""
import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "install"]

#: former module path -> the module that holds its code now
MOVED = {
    "onnxtrain.api.checkpoint": "onnxtrain.checkpoint.format",
    "onnxtrain.artifacts": "onnxtrain.onnxblock.artifacts",
    "onnxtrain.autodiff.models": "onnxtrain.autodiff.gradient_graphs",
    "onnxtrain.data_loader": "onnxtrain.runtime.data_loader",
    "onnxtrain.distributed": "onnxtrain.integrations.distributed",
    "onnxtrain.estimators._trainer": "onnxtrain.training.step_runner",
    "onnxtrain.grad_helper": "onnxtrain.assembly.grad_helper",
    "onnxtrain.initializers": "onnxtrain.optim.initializers",
    "onnxtrain.loss_emitters": "onnxtrain.losses.emitters",
    "onnxtrain.mlflow": "onnxtrain.integrations.mlflow",
    "onnxtrain.models": "onnxtrain.assembly.models",
    "onnxtrain.ortgradient": "onnxtrain.runtime.ortgradient",
    "onnxtrain.penalties": "onnxtrain.losses.penalties",
    "onnxtrain.rewrite": "onnxtrain.assembly.rewrite",
    "onnxtrain.training_graphs": "onnxtrain.assembly.training_graphs",
    "onnxtrain.training_mode": "onnxtrain.graph.training_mode",
    "onnxtrain.update_rules": "onnxtrain.optim.update_rules",
    "onnxtrain.weight_roles": "onnxtrain.assembly.weight_roles",
}


class _MovedLoader(importlib.abc.Loader):
    """Loads a former path as the module it moved to."""

    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        """Nothing to run (the target ran when imported); the import system
        set the former path's spec on the module: give it back its own."""
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the former paths of :data:`MOVED`; asked first, so that no
    other installed copy of onnxtrain answers for them (no file exists
    at a former path: ``tests/test_layering.py`` checks it)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname,
                                               _MovedLoader(MOVED[fullname]))


def install():
    """Let the former paths of :data:`MOVED` import (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def moved_attribute(package, name):
    """The moved module ``package.name`` for a package's ``__getattr__``.

    Raises
    ------
    AttributeError
        ``package.name`` never was a module.
    """
    former = f"{package}.{name}"
    if former not in MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(former)
