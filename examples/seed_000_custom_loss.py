"""A custom loss with onnxblock, training artifacts and a training loop (seed 000).
================================================================================

onnxruntime-training's documentation ("Vorbereitung für das Training",
custom loss) builds a loss ``0.4 * mse(output1, target1) + 0.6 *
mse(output2, target2)`` with an ``onnxblock.Block`` and passes it to
``generate_artifacts`` with AdamW. That code runs here with only its import
lines changed (``onnxruntime.training`` -> ``onnxtrain``), on the plain
onnxruntime package.

The seed loads a ``model.onnx`` it does not show: a model with two outputs,
trainable heads ``weight1/bias1`` and ``weight2/bias2`` and a frozen
``weight3/bias3``. This example builds one with ``onnx.helper``: a frozen
trunk ``relu(input @ weight3 + bias3)`` feeding two linear heads. It then
trains the heads with :class:`onnxtrain.api.Module` and
:class:`onnxtrain.api.Optimizer` on synthetic data whose targets a hidden
"teacher" pair of heads produces from the same trunk (plus noise), and
draws the training model and the loss curve.

Run: ``python examples/seed_000_custom_loss.py [OUTPUT_DIR]``.
"""
import contextlib
import os
import sys

import matplotlib
import numpy
import onnx
from onnx import helper, numpy_helper

from onnxtrain import api
from onnxtrain.plotting import plot_loss_curves, plot_onnxs

N_FEATURES, N_HIDDEN, N_OUT1, N_OUT2 = 4, 8, 3, 2


# ---------------------------------------------------------------------------
# The seed's code. Only the imports differ from the documentation:
#   import onnxruntime.training.onnxblock as onnxblock
#   from onnxruntime.training import artifacts
# (and ``import onnx``, which the documentation uses without importing).
def run_seed_000():
    """The seed, verbatim below its import lines; it reads ``model.onnx``
    and writes the four artifacts in the current directory."""
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
# ---------------------------------------------------------------------------


def two_head_model(seed=0):
    """input (batch, 4) -> frozen trunk relu(input @ weight3 + bias3) (batch, 8)
    -> output1 = trunk @ weight1 + bias1 (batch, 3) and
    output2 = trunk @ weight2 + bias2 (batch, 2); float32, opset 17."""
    rng = numpy.random.default_rng(seed)
    shapes = [("weight3", (N_FEATURES, N_HIDDEN)), ("bias3", (N_HIDDEN,)),
              ("weight1", (N_HIDDEN, N_OUT1)), ("bias1", (N_OUT1,)),
              ("weight2", (N_HIDDEN, N_OUT2)), ("bias2", (N_OUT2,))]
    inits = [numpy_helper.from_array(
        (0.5 * rng.standard_normal(shape)).astype(numpy.float32), name)
        for name, shape in shapes]
    nodes = [helper.make_node("MatMul", ["input", "weight3"], ["trunk_mm"]),
             helper.make_node("Add", ["trunk_mm", "bias3"], ["trunk_pre"]),
             helper.make_node("Relu", ["trunk_pre"], ["trunk"]),
             helper.make_node("MatMul", ["trunk", "weight1"], ["head1_mm"]),
             helper.make_node("Add", ["head1_mm", "bias1"], ["output1"]),
             helper.make_node("MatMul", ["trunk", "weight2"], ["head2_mm"]),
             helper.make_node("Add", ["head2_mm", "bias2"], ["output2"])]
    float32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "two_heads",
        [helper.make_tensor_value_info("input", float32, ["batch", N_FEATURES])],
        [helper.make_tensor_value_info("output1", float32, ["batch", N_OUT1]),
         helper.make_tensor_value_info("output2", float32, ["batch", N_OUT2])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def synthetic_data(model, n=256, noise=0.05, seed=1):
    """Inputs and the targets of a teacher: the model's own frozen trunk
    followed by other heads (so the student's heads can fit them)."""
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((n, N_FEATURES)).astype(numpy.float32)
    trunk = numpy.maximum(x @ weights["weight3"] + weights["bias3"], 0)
    t1 = trunk @ rng.standard_normal((N_HIDDEN, N_OUT1)) + rng.standard_normal(N_OUT1)
    t2 = trunk @ rng.standard_normal((N_HIDDEN, N_OUT2)) + rng.standard_normal(N_OUT2)
    t1 += noise * rng.standard_normal(t1.shape)
    t2 += noise * rng.standard_normal(t2.shape)
    return x, t1.astype(numpy.float32), t2.astype(numpy.float32)


@contextlib.contextmanager
def working_directory(path):
    """The seed reads and writes the current directory: run it in ``path``."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def main(output_dir=".", epochs=30, batch_size=32, learning_rate=0.05):
    """Write the seed's artifacts in ``output_dir``, train, draw.

    Returns a dict: ``losses`` (mean training loss per epoch),
    ``initial_loss``/``final_loss`` (eval-mode loss on the whole data before
    and after training), ``frozen_unchanged``, ``steps``,
    ``training_model_nodes`` and ``drawn_nodes`` (nodes of the training model
    and node boxes in its drawing), ``artifacts`` and ``pictures`` (paths).
    """
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)

    model = two_head_model()
    onnx.save(model, os.path.join(output_dir, "model.onnx"))
    with working_directory(output_dir):
        run_seed_000()
    paths = {name: os.path.join(output_dir, name)
             for name in ["training_model.onnx", "eval_model.onnx",
                          "optimizer_model.onnx", "checkpoint"]}

    # The training loop of onnxruntime-training's on-device training API.
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model.onnx"], state,
                        paths["eval_model.onnx"])
    optimizer = api.Optimizer(paths["optimizer_model.onnx"], module)
    optimizer.set_learning_rate(learning_rate)
    print("training inputs:", module.input_names())

    frozen = {name: state.parameters[name].data.copy()
              for name in ("weight3", "bias3")}
    x, t1, t2 = synthetic_data(model)
    initial_loss = float(module.eval()(x, t1, t2)[0])
    module.train()
    rng = numpy.random.default_rng(0)
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        batch_losses, sizes = [], []
        for start in range(0, len(x), batch_size):
            rows = order[start:start + batch_size]
            loss = module(x[rows], t1[rows], t2[rows])
            optimizer.step()
            module.lazy_reset_grad()
            batch_losses.append(float(numpy.asarray(loss).ravel()[0]))
            sizes.append(len(rows))
        losses.append(float(numpy.average(batch_losses, weights=sizes)))
        if epoch % 10 == 0 or epoch == epochs - 1:
            print(f"epoch {epoch + 1:3d}  loss {losses[-1]:.5f}")
    final_loss = float(module.eval()(x, t1, t2)[0])
    print(f"eval loss: {initial_loss:.4f} before, {final_loss:.4f} after "
          f"{optimizer.step_count} AdamW steps")
    frozen_unchanged = all(numpy.array_equal(state.parameters[name].data, value)
                           for name, value in frozen.items())

    pictures = {}

    def save(ax, name, **kwargs):
        figure = numpy.atleast_1d(ax)[0].figure
        pictures[name] = os.path.join(output_dir, name)
        figure.savefig(pictures[name], bbox_inches="tight", **kwargs)
        plt.close(figure)

    training_model = onnx.load(paths["training_model.onnx"])
    ax = plot_onnxs(training_model, title="training_model.onnx (seed 000)",
                    weights=["weight1", "bias1", "weight2", "bias2"])
    drawn_nodes = ax.onnx_node_count
    save(ax, "training_model.png", dpi=100)  # a large graph: small text
    save(plot_loss_curves(losses, labels=["0.4 mse(output1) + 0.6 mse(output2)"],
                          log_scale=True,
                          title="api.Module + api.Optimizer (AdamW)"),
         "loss_curve.png", dpi=80)
    return {"losses": losses, "initial_loss": initial_loss,
            "final_loss": final_loss, "frozen_unchanged": frozen_unchanged,
            "steps": optimizer.step_count,
            "training_model_nodes": len(training_model.graph.node),
            "drawn_nodes": drawn_nodes,
            "artifacts": paths, "pictures": pictures}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "seed_000_output")
