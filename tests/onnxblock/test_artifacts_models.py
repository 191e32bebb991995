"""Models and the seed-000 code shared by the artifacts and api tests
(no tests here)."""
import contextlib
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: The code of seed 000 (onnxruntime's onnxblock documentation) with only the
#: import lines changed (the original used ``onnx`` without importing it).
SEED_000 = '''
import onnx
import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts

# Define a custom loss block that takes in two inputs
# and performs a weighted average of the losses from these
# two inputs.
class WeightedAverageLoss(onnxblock.Block):
    def __init__(self):
        self._loss1 = onnxblock.loss.MSELoss()
        self._loss2 = onnxblock.loss.MSELoss()
        self._w1 = onnxblock.blocks.Constant(0.4)
        self._w2 = onnxblock.blocks.Constant(0.6)
        self._add = onnxblock.blocks.Add()
        self._mul = onnxblock.blocks.Mul()

    def build(self, loss_input_name1, loss_input_name2):
        # The build method defines how the block should be stacked on top of
        # loss_input_name1 and loss_input_name2

        # Returns weighted average of the two losses
        return self._add(
            self._mul(self._w1(), self._loss1(loss_input_name1, target_name="target1")),
            self._mul(self._w2(), self._loss2(loss_input_name2, target_name="target2"))
        )

my_custom_loss = WeightedAverageLoss()

# Load the onnx model
model_path = "model.onnx"
base_model = onnx.load(model_path)

# Define the parameters that need their gradient computed
requires_grad = ["weight1", "bias1", "weight2", "bias2"]
frozen_params = ["weight3", "bias3"]

# Now, we can invoke generate_artifacts with this custom loss function
artifacts.generate_artifacts(base_model, requires_grad = requires_grad, frozen_params = frozen_params,
                            loss = my_custom_loss, optimizer = artifacts.OptimType.AdamW)

# Successful completion of the above call will generate 4 files in the current working directory,
# one for each of the artifacts mentioned above (training_model.onnx, eval_model.onnx, checkpoint, optimizer_model.onnx)
'''

ARTIFACT_FILES = ["training_model.onnx", "eval_model.onnx",
                  "optimizer_model.onnx", "checkpoint"]
PARAM_SHAPES = [("weight3", (4, 5)), ("bias3", (5,)), ("weight1", (5, 3)),
                ("bias1", (3,)), ("weight2", (5, 2)), ("bias2", (2,))]


def two_head_model(dtype=np.float32, seed=0):
    """input (batch, 4) -> frozen trunk relu(x @ weight3 + bias3) -> two
    heads output1 = h @ weight1 + bias1 (batch, 3), output2 = h @ weight2 +
    bias2 (batch, 2)."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(
        (0.5 * rng.standard_normal(shape)).astype(dtype), name)
        for name, shape in PARAM_SHAPES]
    nodes = [helper.make_node("MatMul", ["input", "weight3"], ["trunk_mm"]),
             helper.make_node("Add", ["trunk_mm", "bias3"], ["trunk_pre"]),
             helper.make_node("Relu", ["trunk_pre"], ["trunk"]),
             helper.make_node("MatMul", ["trunk", "weight1"], ["head1_mm"]),
             helper.make_node("Add", ["head1_mm", "bias1"], ["output1"]),
             helper.make_node("MatMul", ["trunk", "weight2"], ["head2_mm"]),
             helper.make_node("Add", ["head2_mm", "bias2"], ["output2"])]
    graph = helper.make_graph(
        nodes, "two_heads",
        [helper.make_tensor_value_info("input", elem, ["batch", 4])],
        [helper.make_tensor_value_info("output1", elem, ["batch", 3]),
         helper.make_tensor_value_info("output2", elem, ["batch", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@contextlib.contextmanager
def chdir(path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def run_seed(directory, dtype=np.float32):
    """Save the two-head model as model.onnx in ``directory`` and run the
    seed code there (it writes to the current directory)."""
    onnx.save(two_head_model(dtype), str(directory / "model.onnx"))
    with chdir(directory):
        exec(compile(SEED_000, "seed_000", "exec"), {"__name__": "seed_000"})


def batch(n=16, dtype=np.float32, seed=1):
    """(input, target1, target2) for the two-head model."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 4)).astype(dtype),
            rng.standard_normal((n, 3)).astype(dtype),
            rng.standard_normal((n, 2)).astype(dtype))
