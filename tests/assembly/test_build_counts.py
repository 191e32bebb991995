"""The graph-building work of a fit, pinned (benchmarks/count_build_work.py
prints it): one reverse pass, built for the path chosen only, no session
that never runs, the loss graph built once, shape inference of the model
once."""
import importlib.util
import os
import pickle

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                     "count_build_work.py")
_SPEC = importlib.util.spec_from_file_location("count_build_work", _PATH)
counts = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(counts)

EXPECTED = {
    # path: reverse passes, shape inferences, rewrites of the running
    # statistics (one preparation per fit, shared by every graph of the
    # fit), loss-graph builds, sessions (forward, backward, loss and update
    # graphs for the split path; the one fused graph otherwise), all of
    # them run
    "split": (1, 1, 1, 1, 4),
    "fused": (1, 1, 1, 1, 1),
    "loop": (1, 1, 1, 1, 1),
    # a classifier's graph trained (its probabilities) comes from a rewrite
    # of the model (one more shape inference); the fused graphs write the
    # loss on the logits into their own builder (no loss graph of its own;
    # the one on probabilities is loss_grad_onnx_, which the seed reads)
    "classifier-split": (1, 2, 1, 1, 4),
    "classifier-loop": (1, 2, 1, 1, 1),
    # BatchNormalization in training mode: the model with the running
    # statistics' updates is typed once more (it has new values), the
    # graph after the reverse pass once more (slow broadcasts: the step
    # graph, or the split path's backward model); the updates' builds and
    # the engine's check of the weights reuse the types they are given
    "batchnorm-split": (1, 3, 1, 1, 4),
    "batchnorm-fused": (1, 3, 1, 1, 1),
    "batchnorm-loop": (1, 3, 1, 1, 1),
}


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_one_reverse_pass_per_fit_for_the_path_chosen(path):
    got = counts.count_build_work(path)
    passes, inferences, rewrites, losses, sessions = EXPECTED[path]
    assert got["reverse passes"] == passes
    assert got["shape inferences"] == inferences
    assert got["statistics rewrites"] == rewrites
    assert got["loss-graph builds"] == losses
    assert got["sessions"] == sessions
    assert got["sessions run"] == got["sessions"]


def test_generate_artifacts_runs_one_reverse_pass():
    got = counts.count_build_work("artifacts")
    assert got["reverse passes"] == 1
    assert got["loss-graph builds"] == 1
    assert got["shape inferences"] == 1  # shared by the outputs and the reverse pass
    assert got["sessions"] == 0


def test_generate_artifacts_with_batchnorm_infers_three_times():
    # the base model, the model with the statistics' updates, and that
    # model with its 4x4-output Conv lowered to a product (4 before: the
    # updates' build inferred its input's types again)
    got = counts.count_build_work("batchnorm-artifacts")
    assert got["reverse passes"] == 1
    assert got["shape inferences"] == 3
    assert got["sessions"] == 0


def test_sample_weights_build_the_weighted_loss_graph_only_then():
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    X, y = counts._data()
    est = OrtGradientForwardBackwardOptimizer(
        counts._mlp_model(X, y), max_iter=2, learning_rate=0.01,
        training_path="split", random_state=0)
    with counts.counting() as got:
        est.fit(X, y, sample_weight=(y > 0) + 1.0)
    # the unweighted graph is loss_grad_onnx_ (the seed reads it), the
    # weighted one trains
    assert got["loss-graph builds"] == 2
    assert got["reverse passes"] == 1
    assert est.learning_loss.loss_grad_onnx_.graph.input[-1].name == "X2"


def test_predict_after_unpickling_builds_no_gradient_graph():
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    X, y = counts._data()
    est = OrtGradientForwardBackwardOptimizer(
        counts._mlp_model(X, y), max_iter=2, learning_rate=0.01,
        random_state=0).fit(X, y)
    expected = est.predict(X)
    copy = pickle.loads(pickle.dumps(est))
    with counts.counting() as got:
        predicted = copy.predict(X)
    assert got["reverse passes"] == 0
    assert got["sessions"] == 1  # the inference graph's
    assert (predicted == expected).all()


@pytest.mark.parametrize("path", ["split", "fused", "loop", "auto"])
def test_graphs_of_the_path_fail_before_any_step(path):
    """The split graphs are built lazily, yet a fit builds those of its path
    before the first step: a missing VJP rule raises with the estimator
    left unfitted."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnxtrain import MissingVJPRuleError, OrtGradientForwardBackwardOptimizer
    W = numpy_helper.from_array(np.ones((3, 1), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["h"]),
         helper.make_node("MyOp", ["h"], ["Y"], domain="com.example")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], [W])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    X, y = counts._data()
    X = X[:, :3]
    est = OrtGradientForwardBackwardOptimizer(model, training_path=path)
    with pytest.raises(MissingVJPRuleError, match="'MyOp'"):
        est.fit(X, y)
    assert not hasattr(est, "weights_to_train_")
