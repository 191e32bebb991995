"""onnxblock: base context, blocks, loss blocks against numpy references,
loss gradients against finite differences."""
import contextvars

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.onnxblock import blocks, loss


def _session(model):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def identity_model(shape, elem=TensorProto.DOUBLE, opset=17):
    """x -> Identity -> y, both of ``shape``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "ident",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


class _Forward(onnxblock.ForwardBlock):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def build(self, name):
        return self.block(name)


def run_loss(block, shape, feeds, elem=TensorProto.DOUBLE, opset=17):
    forward = _Forward(block)
    with onnxblock.base(identity_model(shape, elem, opset)):
        forward("y")
    model = forward.to_model_proto()
    sess = _session(model)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})[0]


# numpy references (PyTorch definitions) --------------------------------------
def _reduce(values, reduction, denominator=None):
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    return values.sum() / (values.size if denominator is None else denominator)


def ref_mse(x, t, reduction, **_):
    return _reduce((x - t) ** 2, reduction)


def ref_l1(x, t, reduction, **_):
    return _reduce(np.abs(x - t), reduction)


def ref_bce(x, t, reduction, weight=None, pos_weight=None):
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    pw = 1.0 if pos_weight is None else pos_weight
    values = -(pw * t * log_sig + (1 - t) * log_one_minus)
    if weight is not None:
        values = values * weight
    return _reduce(values, reduction)


def ref_ce(x, labels, reduction, weight=None, ignore_index=None):
    log_p = x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - x.max(1, keepdims=True)
    keep = np.ones(labels.shape) if ignore_index is None else \
        (labels != ignore_index).astype(float)
    safe = np.where(keep > 0, labels, 0)
    picked = np.take_along_axis(log_p, np.expand_dims(safe, 1), 1).squeeze(1)
    w = keep if weight is None else weight[safe] * keep
    values = -picked * w
    if reduction == "mean":
        return values.sum() / w.sum()
    return _reduce(values, reduction)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 3))
T = RNG.standard_normal((6, 3))
LOGITS = RNG.standard_normal((6, 4)) * 3
LOGITS3 = RNG.standard_normal((5, 4, 2))
LABELS = np.array([0, 3, 1, 2, 3, -1], dtype=np.int64)
LABELS3 = np.array([[0, 1], [3, 3], [2, -1], [1, 0], [-1, 2]], dtype=np.int64)
PROBS = RNG.uniform(0, 1, (6, 3))
CLASS_W = np.array([0.5, 1.0, 2.0, 1.5])

# (id, block factory(reduction), reference, shape, feeds, reference kwargs)
LOSS_ROWS = [
    ("MSELoss", lambda r: loss.MSELoss(r), ref_mse, (6, 3),
     {"x": X, "target": T}, {}),
    ("L1Loss", lambda r: loss.L1Loss(r), ref_l1, (6, 3),
     {"x": X, "target": T}, {}),
    ("BCEWithLogitsLoss", lambda r: loss.BCEWithLogitsLoss(reduction=r), ref_bce,
     (6, 3), {"x": X * 4, "target": PROBS}, {}),
    ("BCEWithLogitsLoss-weights",
     lambda r: loss.BCEWithLogitsLoss(weight=[1.0, 0.5, 2.0], reduction=r,
                                      pos_weight=[3.0, 1.0, 0.25]),
     ref_bce, (6, 3), {"x": X * 4, "target": PROBS},
     {"weight": np.array([1.0, 0.5, 2.0]), "pos_weight": np.array([3.0, 1.0, 0.25])}),
    ("CrossEntropyLoss", lambda r: loss.CrossEntropyLoss(reduction=r), ref_ce,
     (6, 4), {"x": LOGITS, "labels": np.abs(LABELS)}, {}),
    ("CrossEntropyLoss-weight-ignore",
     lambda r: loss.CrossEntropyLoss(weight=CLASS_W, reduction=r, ignore_index=-1),
     ref_ce, (6, 4), {"x": LOGITS, "labels": LABELS},
     {"weight": CLASS_W, "ignore_index": -1}),
    ("CrossEntropyLoss-rank3", lambda r: loss.CrossEntropyLoss(
        weight=CLASS_W, reduction=r, ignore_index=-1), ref_ce, (5, 4, 2),
     {"x": LOGITS3, "labels": LABELS3}, {"weight": CLASS_W, "ignore_index": -1}),
]


def test_every_loss_block_has_a_row():
    covered = {row[0].split("-")[0] for row in LOSS_ROWS}
    assert covered == set(loss.__all__)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("row", LOSS_ROWS, ids=[r[0] for r in LOSS_ROWS])
def test_loss_block_matches_numpy(row, reduction):
    _, factory, reference, shape, feeds, kwargs = row
    got = run_loss(factory(reduction), shape, feeds)
    target = feeds.get("target", feeds.get("labels"))
    expected = reference(feeds["x"], target, reduction, **kwargs)
    assert got.shape == np.shape(expected)
    if reduction != "none":
        assert got.ndim == 0
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weight", [None, CLASS_W])
def test_cross_entropy_refuses_labels_out_of_range(weight):
    """A label outside [-C, C) fails the run, as in onnxruntime's
    SoftmaxCrossEntropyLoss (torch refuses any label outside [0, C)),
    instead of adding a loss of 0 for its row; a negative label counts
    from the end, as in onnxruntime."""
    block = loss.CrossEntropyLoss(weight=weight)
    labels = np.abs(LABELS)
    for bad in (4, -5):
        with pytest.raises(Exception, match="(?i)out of|invalid|bounds"):
            run_loss(block, (6, 4), {"x": LOGITS, "labels": np.where(
                np.arange(6) == 2, bad, labels)})
    wrapped = np.where(np.arange(6) == 2, -1, labels)
    kwargs = {} if weight is None else {"weight": weight}
    np.testing.assert_allclose(
        run_loss(block, (6, 4), {"x": LOGITS, "labels": wrapped}),
        ref_ce(LOGITS, np.where(wrapped < 0, wrapped + 4, wrapped), "mean", **kwargs),
        rtol=1e-12)


def test_bce_is_stable_for_large_logits_in_float32():
    x = np.array([[-1000.0, -80.0, 0.0, 80.0, 1000.0]], dtype=np.float32)
    t = np.array([[1.0, 0.0, 1.0, 1.0, 0.0]], dtype=np.float32)
    got = run_loss(loss.BCEWithLogitsLoss(reduction="none"), (1, 5),
                   {"x": x, "target": t}, elem=TensorProto.FLOAT)
    expected = ref_bce(x.astype(np.float64), t.astype(np.float64), "none")
    assert np.all(np.isfinite(got))
    # log(1 + exp(-80)) rounds to 0 in float32: absolute error 2e-35
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-30)
    assert got[0, 0] == pytest.approx(1000.0)


def test_reduced_losses_on_outputs_of_different_ranks_are_rank0():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["oa"]),
         helper.make_node("Identity", ["b"], ["ob"])], "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3, 2])],
        [helper.make_tensor_value_info("oa", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("ob", TensorProto.FLOAT, [2, 3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    class Sum(onnxblock.ForwardBlock):
        def build(self, a, b):
            return blocks.Add()(loss.MSELoss()(a, target_name="ta"),
                                loss.L1Loss(reduction="sum")(b, target_name="tb"))

    block = Sum()
    with onnxblock.base(model):
        block("oa", "ob")
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal(4).astype(np.float32),
             "ta": rng.standard_normal(4).astype(np.float32),
             "b": rng.standard_normal((2, 3, 2)).astype(np.float32),
             "tb": rng.standard_normal((2, 3, 2)).astype(np.float32)}
    got = _session(block.to_model_proto()).run(None, feeds)[0]
    expected = ((feeds["a"] - feeds["ta"]) ** 2).mean() + \
        np.abs(feeds["b"] - feeds["tb"]).sum()
    assert got.shape == ()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# blocks ----------------------------------------------------------------------
@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.FLOAT,
                                  TensorProto.DOUBLE])
def test_constant_takes_the_element_type_it_meets(elem):
    class Scaled(onnxblock.ForwardBlock):
        def build(self, name):
            return blocks.Mul()(blocks.Constant(0.4)(), name)

    block = Scaled()
    with onnxblock.base(identity_model([3], elem)):
        block("y")
    model = block.to_model_proto()
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    x = np.array([1.0, 2.0, -3.0], dtype=dtype)
    got = _session(model).run(None, {"x": x})[0]
    assert got.dtype == dtype and got.shape == (3,)
    np.testing.assert_allclose(got, x * dtype.type(0.4), rtol=1e-3)


def _chain(state_input):
    """A tour of the elementwise blocks on x (positive entries)."""
    x = state_input
    y = blocks.Add()(x, blocks.Constant(1.0)())
    y = blocks.Sub()(y, blocks.Constant(0.5)())
    y = blocks.Div()(blocks.Mul()(y, y), blocks.Constant(2.0)())
    y = blocks.Pow(1.5)(blocks.Abs()(blocks.Neg()(y)))
    y = blocks.Log()(blocks.Sigmoid()(y))
    y = blocks.Clip(-0.5, -0.01)(y)
    y = blocks.Relu()(blocks.PassThrough()(y))
    return blocks.ReduceSum(axes=[1], keepdims=True)(blocks.Softmax()(x)), \
        blocks.ReduceMean()(blocks.LogSoftmax()(x)), y


def test_elementwise_blocks_match_numpy():
    class Tour(onnxblock.ForwardBlock):
        def build(self, name):
            return _chain(name)

    block = Tour()
    with onnxblock.base(identity_model([2, 3])):
        block("y")
    x = np.abs(np.random.default_rng(2).standard_normal((2, 3))) + 0.1
    softmax_sum, log_softmax_mean, y = _session(block.to_model_proto()).run(
        None, {"x": x})
    v = ((x + 1 - 0.5) ** 2 / 2) ** 1.5
    v = np.clip(np.log(1 / (1 + np.exp(-v))), -0.5, -0.01)
    np.testing.assert_allclose(y, np.maximum(v, 0), atol=1e-12)
    np.testing.assert_allclose(softmax_sum, np.ones((2, 1)), rtol=1e-12)
    lsm = x - np.log(np.exp(x).sum(1, keepdims=True))
    np.testing.assert_allclose(log_softmax_mean, lsm.mean(), rtol=1e-12)
    assert log_softmax_mean.shape == ()


def test_linear_gemm_matmul_and_inputlike():
    class Head(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.linear = blocks.Linear(3, 2, seed=1)

        def build(self, name):
            product = blocks.MatMul()(name, blocks.InputLike("y")("z"))
            out = blocks.Gemm(alpha=2.0, trans_b=True)(
                product, blocks.InputLike("y")("w"))
            pred = self.linear(blocks.Relu()(name))
            return loss.MSELoss()(pred), out, pred

    block = Head()
    block.requires_grad("linear.weight")
    block.requires_grad("linear.bias", False)
    with onnxblock.base(identity_model([3, 3])):
        block("y")
    assert (block.linear.weight_name, block.linear.bias_name) == \
        ("linear.weight", "linear.bias")
    (weight,), (bias,) = block.parameters()
    weight, bias = numpy_helper.to_array(weight), numpy_helper.to_array(bias)
    assert weight.shape == (2, 3) and np.all(np.abs(weight) <= 1 / np.sqrt(3))
    _, evaluation = block.to_model_proto()
    rng = np.random.default_rng(4)
    x, z, w = (rng.standard_normal((3, 3)) for _ in range(3))
    target = rng.standard_normal((3, 2))
    loss_value, out, pred = _session(evaluation).run(None, {
        "x": x, "z": z, "w": w, "target": target,
        "linear.weight": weight, "linear.bias": bias})
    np.testing.assert_allclose(out, 2 * (x @ z) @ w.T, rtol=1e-12)
    np.testing.assert_allclose(pred, np.maximum(x, 0) @ weight.T + bias, rtol=1e-12)
    np.testing.assert_allclose(loss_value, ((pred - target) ** 2).mean(), rtol=1e-12)
    with pytest.raises(RuntimeError, match="not built"):
        Head().parameters()


def test_base_is_a_context_variable_and_copies_the_model():
    model = identity_model([2])
    before = model.SerializeToString()
    with onnxblock.base(model) as copy:
        assert onnxblock.current_base().model is copy.model
        blocks.Neg()("y")
        with onnxblock.empty_base(opset_version=15) as empty:
            assert onnxblock.current_base().model is empty.model
            assert empty.opset_import[0].version == 15
        assert onnxblock.current_base().model is copy.model
        # another context (e.g. a thread) has no base
        with pytest.raises(RuntimeError, match="No base model"):
            contextvars.Context().run(onnxblock.current_base)
    assert model.SerializeToString() == before
    with pytest.raises(RuntimeError, match="No base model"):
        blocks.Neg()("y")


def test_names_are_per_base_not_a_process_counter():
    def names_after_two_negs():
        with onnxblock.base(identity_model([2])) as model:
            blocks.Neg()(blocks.Neg()("y"))
            return [n.name for n in model.graph.node], \
                [o for n in model.graph.node for o in n.output]

    assert names_after_two_negs() == names_after_two_negs()


def test_direct_edits_of_the_base_keep_names_unique():
    class Raw(onnxblock.Block):
        def build(self, name):
            self.base.graph.node.append(
                helper.make_node("Neg", [name], ["neg"], name="Neg_node"))
            return blocks.Neg()("neg")

    with onnxblock.base(identity_model([2])) as model:
        out = Raw()("y")
        outputs = [o for n in model.graph.node for o in n.output]
        names = [n.name for n in model.graph.node]
    assert out != "neg" and len(outputs) == len(set(outputs))
    assert len(names) == len(set(names))


# gradients of the loss blocks through TrainingBlock ---------------------------
def linear_model(n_in, n_out, seed=0):
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((n_in, n_out)), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", n_out])],
        [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class _LossTraining(onnxblock.TrainingBlock):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def build(self, name):
        return self.block(name)


@pytest.mark.parametrize("row", [r for r in LOSS_ROWS if r[3] == (6, 3) or
                                 r[0] == "CrossEntropyLoss-weight-ignore"],
                         ids=lambda r: r[0])
def test_loss_gradients_match_finite_differences(row):
    _, factory, _, shape, feeds, _ = row
    n_out = shape[1]
    block = _LossTraining(factory("mean"))
    block.requires_grad("W")
    with onnxblock.base(linear_model(3, n_out)):
        block("y")
    training, evaluation = block.to_model_proto()
    train, ev = _session(training), _session(evaluation)
    x = np.random.default_rng(3).standard_normal((6, 3))
    w = numpy_helper.to_array(block.parameters()[0][0])
    target = {k: v for k, v in feeds.items() if k != "x"}
    base_feeds = dict(x=x, **target)
    buffer = np.zeros_like(w)
    outs = train.run(None, dict(base_feeds, W=w, lazy_reset_grad=np.array(True),
                                **{"W_grad.accumulation.buffer": buffer}))
    grad = outs[-1]
    numeric = np.zeros_like(w)
    eps = 1e-6
    for idx in np.ndindex(w.shape):
        plus, minus = w.copy(), w.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (ev.run(None, dict(base_feeds, W=plus))[0]
                        - ev.run(None, dict(base_feeds, W=minus))[0]) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_eval_model_puts_dropout_and_batchnorm_in_inference_mode():
    from onnxtrain.onnxblock._training import _inference_mode
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d", "mask"]),
             helper.make_node("BatchNormalization", ["d", "s", "b", "m", "v"],
                              ["y", "running_mean", "running_var"],
                              training_mode=1)]
    dropout, batchnorm = _inference_mode(nodes)
    assert list(dropout.input) == ["x", "ratio", ""]
    assert list(batchnorm.output) == ["y"]
    assert helper.get_attribute_value(batchnorm.attribute[0]) == 0
    assert list(nodes[0].input) == ["x", "ratio", "train"]  # originals kept


def test_forward_block_on_inputs_never_added_names_them():
    """A ForwardBlock built in an empty base on names that are not inputs
    of it: the error names those inputs, not only the block's output."""
    class Sum(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.add = blocks.Add()

        def build(self, a, b):
            return self.add(a, b)

    with onnxblock.empty_base():
        with pytest.raises(ValueError, match=r"read \['a', 'b'\], which no graph input"):
            Sum()("a", "b")
