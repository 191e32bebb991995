"""Public docstrings (numpydoc) hold the sections and facts users looked
for: one row per object, the fragments its docstring must contain."""
import inspect
import re

import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts, get_train_initializer


def _section(name):
    return re.compile(rf"^{name}\n-{{{len(name)}}}$", re.MULTILINE)


ROWS = [
    (get_train_initializer, [_section("Parameters"), "model : onnx.ModelProto",
                             _section("Returns"), _section("Raises")]),
    (api.CheckpointState.load_checkpoint, [_section("Raises"), "FileNotFoundError",
                                           "ValueError"]),
    (api.Module.__call__, [_section("Raises"), "ValueError", "TypeError",
                           "RuntimeError", "static dimension"]),
    (api.Optimizer.set_learning_rate, [_section("Raises"), "ValueError", ">= 0"]),
    (api.LinearLRScheduler, [_section("Raises"), "initial_lr"]),
    (onnxblock.Block.__call__, [_section("Parameters"), _section("Returns"),
                                ":meth:`build`", "base model"]),
    (onnxblock.loss.MSELoss, ['target_name="target"', '"target"']),
    (onnxblock.loss.L1Loss, ['target_name="target"']),
    (onnxblock.loss.BCEWithLogitsLoss, ['target_name="target"']),
    (onnxblock.loss.CrossEntropyLoss, ['labels_name="labels"', "int64"]),
    (artifacts.generate_artifacts, ["requires_grad : str or list of str",
                                    "frozen_params : str or list of str"]),
]


@pytest.mark.parametrize("obj, fragments", ROWS,
                         ids=[r[0].__qualname__ for r in ROWS])
def test_docstring_has(obj, fragments):
    doc = inspect.cleandoc(obj.__doc__ or "")
    for fragment in fragments:
        if isinstance(fragment, str):
            assert fragment in doc, fragment
        else:
            assert fragment.search(doc), fragment.pattern
