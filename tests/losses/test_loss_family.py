"""One loss family: the estimators' losses (onnxtrain.losses) and the
onnxblock loss blocks emit their per-element losses with the same emitters
(onnxtrain.loss_emitters); on the same data they give the same values up to
their documented reductions, and each one scikit-learn's or PyTorch's."""
import numpy as np
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto

from onnxtrain import loss_emitters
from onnxtrain.losses import (AbsoluteLearningLoss, CrossEntropyLearningLoss,
                              NegLogLearningLoss, SquareLearningLoss)
from onnxtrain.onnxblock import loss as block_loss
from test_onnxblock import run_loss


def _learning_loss_value(loss, expected, predicted):
    model = loss.build_onnx(TensorProto.DOUBLE, 17, rank=predicted.ndim)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    return sess.run(None, {"X1": expected, "X2": predicted})[0]


rng = np.random.RandomState(0)
PRED = rng.randn(6, 3) * 3
TARGET = rng.randn(6, 3)
PROBS = rng.rand(6, 1)
LABELS = rng.randint(0, 3, size=6)


def _torch_bce(x, y):
    return np.mean(np.logaddexp(0, x) - y * x)


ROWS = [
    # (block, learning loss, feeds of the block, (X1, X2), block / learning)
    ("mse", block_loss.MSELoss(), SquareLearningLoss(),
     {"x": PRED, "target": TARGET}, (TARGET, PRED), 2.0),
    ("l1", block_loss.L1Loss(), AbsoluteLearningLoss(),
     {"x": PRED, "target": TARGET}, (TARGET, PRED), 1.0),
    ("bce-logits", block_loss.BCEWithLogitsLoss(), NegLogLearningLoss(),
     {"x": PRED[:, :1], "target": PROBS}, (PROBS, PRED[:, :1]), 1.0),
    ("cross-entropy-logits", block_loss.CrossEntropyLoss(),
     CrossEntropyLearningLoss(from_logits=True),
     {"x": PRED, "labels": LABELS.astype(np.int64)},
     (np.eye(3)[LABELS], PRED), 1.0),
]


@pytest.mark.parametrize("name,block,learning,feeds,pair,ratio", ROWS,
                         ids=[r[0] for r in ROWS])
def test_both_families_agree(name, block, learning, feeds, pair, ratio):
    shape = list(feeds["x"].shape)
    got_block = run_loss(block, shape, feeds)
    got_learning = _learning_loss_value(learning, *pair)
    assert_allclose(got_block, ratio * got_learning, rtol=1e-12)
    # and the mean of the numpy oracle's per-row losses (scikit-learn's)
    assert_allclose(got_learning, learning.loss_per_row(*pair).mean(),
                    rtol=1e-12)


def test_logistic_emitter_is_torch_bce_with_logits():
    from onnxtrain.graph import GraphBuilder, make_model
    from onnx import helper
    g = GraphBuilder(17, {"s", "y"})
    out = loss_emitters.logistic_loss_on_logits(g, "s", "y", TensorProto.DOUBLE)
    vi = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, [None])
          for n in ("s", "y")]
    model = make_model(g.make_graph("bce", vi, [helper.make_tensor_value_info(
        out, TensorProto.DOUBLE, [None])]), [helper.make_opsetid("", 17)])
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    s = np.array([-800.0, -3.0, 0.0, 2.5, 900.0])
    y = np.array([0.0, 1.0, 0.3, 0.0, 1.0])
    got = sess.run(None, {"s": s, "y": y})[0]
    assert_allclose(got.mean(), _torch_bce(s, y), rtol=1e-12)
    assert np.isfinite(got).all()
