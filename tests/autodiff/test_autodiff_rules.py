"""VJP rules checked against finite differences, one table row per op.

Each row is a small graph (one or a few nodes). The test builds the split
gradient models, runs them with onnxruntime in float64 and compares every
weight gradient with central finite differences of ``sum(Y * dY)`` computed
on the inference model (relative error <= 1e-6). Rows marked float32 also
build the float32 graph and compare its gradients with the float64 finite
differences at 1e-3 (the Cast row's float64 twin is a float64 -> float64
Cast). Rows marked fused also compare the fused form with the split form.
Every generated model passes ``onnx.checker.check_model(full_check=True)``.
"""
import re
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import (check_model, fused_gradients, numeric_gradient,
                       relative_error, run, session, split_gradients)
from onnxtrain.autodiff import (build_fused_model, build_gradient_models,
                                registered_vjp_ops, trainable_initializers)
from onnxtrain.exceptions import MissingVJPRuleError
from onnxtrain.graph import infer_value_types, make_model

F64, F32 = np.float64, np.float32
STRICT, LOOSE = 1e-6, 1e-3


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

@dataclass
class Case:
    """One row: a small graph and the weights it is differentiated against.

    ``nodes`` are ``(op_type, inputs, outputs, attributes)``; the last
    node's first output is the graph output ``Y``. ``weights`` become float
    initializers (all differentiated), ``inputs`` graph inputs (symbolic
    dims such as "N" are fed with ``dims``), ``wrt_inputs`` the graph inputs
    also differentiated. ``consts``: initializers not differentiated (float
    ones take the row's dtype, integer ones keep theirs). ``kinds``: value
    ranges by name ("positive", "nonzero", default "any").
    """

    id: str
    nodes: list
    inputs: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    opset: int = 13
    consts: dict = field(default_factory=dict)
    wrt_inputs: tuple = ()
    float32: bool = False
    fused: bool = False
    kinds: dict = field(default_factory=dict)
    types: dict = field(default_factory=dict)  # name -> numpy dtype override
    dims: dict = field(default_factory=lambda: {"N": 3})

    @property
    def wrt(self):
        return list(self.weights) + list(self.wrt_inputs)

    def dtype_of(self, name, dtype):
        return np.dtype(self.types.get(name, dtype))

    def model(self, dtype, values):
        """ModelProto in ``dtype`` whose weights hold ``values``."""
        nodes = [helper.make_node(op, ins, outs, name=f"{outs[0]}_node", **att)
                 for op, ins, outs, att in self.nodes]
        inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(self.dtype_of(n, dtype)), s)
            for n, s in self.inputs.items()]
        inits = [numpy_helper.from_array(
            values[n].astype(self.dtype_of(n, dtype)), n) for n in self.weights]
        for name, value in self.consts.items():
            value = np.asarray(value)
            if value.dtype.kind == "f":
                value = value.astype(self.dtype_of(name, dtype))
            inits.append(numpy_helper.from_array(value, name))
        out_elem = helper.np_dtype_to_tensor_dtype(self.dtype_of("Y", dtype))
        outputs = [helper.make_tensor_value_info("Y", out_elem, None)]
        graph = helper.make_graph(nodes, self.id, inputs, outputs, inits)
        model = make_model(graph, [helper.make_opsetid("", self.opset)])
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        model.graph.output[0].CopyFrom(inferred.graph.output[0])
        check_model(model)
        return model

    def values(self):
        """Random float64 values of weights and inputs (seeded by the id)."""
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        out = {}
        for name, shape in {**self.weights, **self.inputs}.items():
            shape = tuple(self.dims[d] if isinstance(d, str) else d
                          for d in shape)
            kind = self.kinds.get(name, "any")
            if kind == "int":
                out[name] = rng.integers(1, 4, size=shape).astype(np.int64)
                continue
            value = rng.uniform(-1, 1, size=shape)
            if kind == "positive":
                value = rng.uniform(0.5, 1.5, size=shape)
            elif kind == "nonzero":
                value = np.sign(value) * (0.3 + np.abs(value))
            out[name] = np.asarray(value, dtype=F64)
        return out

    def op_types(self):
        return {op for op, *_ in self.nodes}


def unary(op, shape=(3, 4), kind="any", opset=13, **kw):
    """Row ``Y = op(W)`` with W a weight."""
    return Case(f"{op}-{'x'.join(map(str, shape))}", [(op, ["W"], ["Y"], {})],
                weights={"W": shape}, kinds={"W": kind}, opset=opset, **kw)


def binary(op, name, a, b, wrt="AB", opset=13, kinds=None, **kw):
    """Row ``Y = op(A, B)``; the letters of ``wrt`` are weights, the others
    graph inputs."""
    shapes = {"A": a, "B": b}
    weights = {k: v for k, v in shapes.items() if k in wrt}
    inputs = {k: v for k, v in shapes.items() if k not in wrt}
    return Case(f"{op}-{name}", [(op, ["A", "B"], ["Y"], {})], inputs=inputs,
                weights=weights, opset=opset, kinds=kinds or {}, **kw)


def gemm(name, ta=0, tb=0, c=(4,), opset=13, alpha=None, beta=None, **kw):
    """Row ``Y = Gemm(A, B[, C])`` with M=2, K=3, N=4; all weights."""
    a = (3, 2) if ta else (2, 3)
    b = (4, 3) if tb else (3, 4)
    attrs = {"transA": ta, "transB": tb}
    if alpha is not None:
        attrs["alpha"] = alpha
    if beta is not None:
        attrs["beta"] = beta
    weights = {"A": a, "B": b}
    ins = ["A", "B"]
    if c is not None:
        weights["C"] = c
        ins.append("C")
    return Case(f"Gemm-{name}-op{opset}", [("Gemm", ins, ["Y"], attrs)],
                weights=weights, opset=opset, **kw)


def reduce(op, axes, keepdims, opset, as_input, shape=(2, 3, 2), **kw):
    """Row ``Y = op(W, axes, keepdims)``, axes as attribute or input."""
    attrs = {"keepdims": keepdims}
    ins, consts = ["W"], {}
    if axes is not None and as_input:
        ins.append("axes")
        consts["axes"] = np.array(axes, dtype=np.int64)
    elif axes is not None:
        attrs["axes"] = axes
    form = "input" if as_input else "attr"
    text = "all" if axes is None else ",".join(map(str, axes))
    return Case(f"{op}-{form}-axes({text})-keep{keepdims}-op{opset}",
                [(op, ins, ["Y"], attrs)], weights={"W": shape}, consts=consts,
                opset=opset, **kw)


def softmax(op, opset, axis=None, shape=(2, 3, 2), **kw):
    attrs = {} if axis is None else {"axis": axis}
    return Case(f"{op}-axis{axis}-rank{len(shape)}-op{opset}",
                [(op, ["W"], ["Y"], attrs)], weights={"W": shape},
                opset=opset, **kw)


def axes_op(op, axes, opset, shape, **kw):
    """Squeeze/Unsqueeze with axes as attribute (< 13) or input (>= 13)."""
    if axes is None:
        return Case(f"{op}-noaxes-op{opset}", [(op, ["W"], ["Y"], {})],
                    weights={"W": shape}, opset=opset, **kw)
    text = ",".join(map(str, axes))
    if opset >= 13:
        return Case(f"{op}-input({text})-op{opset}", [(op, ["W", "axes"], ["Y"], {})],
                    weights={"W": shape}, opset=opset,
                    consts={"axes": np.array(axes, dtype=np.int64)}, **kw)
    return Case(f"{op}-attr({text})-op{opset}", [(op, ["W"], ["Y"], {"axes": axes})],
                weights={"W": shape}, opset=opset, **kw)


CASES = [
    # elementwise, broadcasting ------------------------------------------------
    binary("Add", "(3,1)+(1,4)", (3, 1), (1, 4), fused=True),
    binary("Add", "(2,3,4)+(4,)", (2, 3, 4), (4,), wrt="B", float32=True),
    binary("Add", "(2,3)+scalar", (2, 3), (), wrt="B"),
    binary("Add", "scalar+(2,3)-both", (), (2, 3)),
    binary("Add", "dyn(N,3)+(3,)", ("N", 3), (3,), wrt="B", fused=True),
    binary("Sub", "(3,1)-(1,4)", (3, 1), (1, 4), float32=True),
    binary("Sub", "scalar-(2,3)", (), (2, 3), wrt="A"),
    binary("Sub", "(2,3,4)-(3,1)", (2, 3, 4), (3, 1), wrt="B"),
    binary("Sub", "dyn(N,3)-(1,3)", ("N", 3), (1, 3), wrt="B"),
    binary("Mul", "(3,1)*(1,4)", (3, 1), (1, 4), fused=True),
    binary("Mul", "(2,3,4)*(4,)", (2, 3, 4), (4,), wrt="B", float32=True),
    binary("Mul", "(2,3)*scalar", (2, 3), ()),
    binary("Mul", "dyn(N,4)*(1,4)", ("N", 4), (1, 4), wrt="B"),
    Case("Mul-inputs(N,1)*(1,M)", [("Mul", ["A", "B"], ["Y"], {})],
         inputs={"A": ("N", 1), "B": (1, "M")}, wrt_inputs=("A", "B"),
         dims={"N": 3, "M": 2}),
    binary("Div", "(3,1)/(1,4)", (3, 1), (1, 4), kinds={"B": "positive"},
           float32=True),
    binary("Div", "(2,3,4)/(4,)", (2, 3, 4), (4,), wrt="B",
           kinds={"B": "positive"}),
    binary("Div", "(2,3)/scalar", (2, 3), (), kinds={"B": "positive"}),
    binary("Div", "scalar/(2,3)", (), (2, 3), kinds={"B": "positive"}),
    binary("Div", "dyn(N,3)/(3,)", ("N", 3), (3,), wrt="B",
           kinds={"B": "positive"}, fused=True),
    binary("Pow", "(3,1)^(1,4)", (3, 1), (1, 4), kinds={"A": "positive"},
           float32=True),
    binary("Pow", "(2,3,4)^(4,)", (2, 3, 4), (4,), wrt="B",
           kinds={"A": "positive"}),
    binary("Pow", "(2,3)^scalar", (2, 3), (), kinds={"A": "positive"}),
    binary("Pow", "dyn(N,3)^(3,)", ("N", 3), (3,), wrt="B",
           kinds={"A": "positive"}),
    binary("Pow", "(2,3)^scalar-op11", (2, 3), (), opset=11,
           kinds={"A": "positive"}),
    Case("Pow-int-exponent-const", [("Pow", ["W", "E"], ["Y"], {})],
         weights={"W": (2, 3)}, consts={"E": np.array([3, 2, 1], np.int64)}),
    Case("Pow-int-exponent-input", [("Pow", ["W", "E"], ["Y"], {})],
         weights={"W": (2, 3)}, inputs={"E": ("N", 3)}, dims={"N": 2},
         types={"E": np.int64}, kinds={"E": "int"}, float32=True),
    # elementwise, unary -----------------------------------------------------
    unary("Neg"),
    unary("Abs", kind="nonzero", float32=True),
    unary("Exp"),
    unary("Log", kind="positive"),
    unary("Sqrt", kind="positive", float32=True),
    unary("Reciprocal", kind="positive"),
    unary("Identity", shape=(2, 3)),
    unary("Relu", kind="nonzero"),
    unary("Sigmoid", float32=True),
    unary("Tanh"),
    # onnxruntime's CPU LeakyRelu kernel is float32 only; from opset 16 the
    # float64 op runs through its ONNX function body
    Case("LeakyRelu-alpha0.2-op16", [("LeakyRelu", ["W"], ["Y"], {"alpha": 0.2})],
         weights={"W": (3, 4)}, kinds={"W": "nonzero"}, float32=True,
         opset=16),
    Case("LeakyRelu-default-alpha-op16", [("LeakyRelu", ["W"], ["Y"], {})],
         weights={"W": (3, 4)}, kinds={"W": "nonzero"}, opset=16),
    Case("Relu-dyn(N,3)+(3,)", [("Add", ["X", "W"], ["H"], {}),
                                ("Relu", ["H"], ["Y"], {})],
         inputs={"X": ("N", 3)}, weights={"W": (3,)}, kinds={"X": "nonzero"},
         dims={"N": 4}),
    Case("Cast-float32-to-float64", [("Cast", ["W"], ["V"],
                                      {"to": TensorProto.DOUBLE}),
                                     ("Mul", ["V", "X"], ["Y"], {})],
         weights={"W": (2, 3)}, inputs={"X": (2, 3)},
         types={"X": F64, "Y": F64}, float32=True, fused=True),
    # MatMul -----------------------------------------------------------------
    binary("MatMul", "(2,3,4)@(4,5)", (2, 3, 4), (4, 5), wrt="B",
           float32=True),
    binary("MatMul", "(2,2,3)@(3,2)", (2, 2, 3), (3, 2), fused=True),
    binary("MatMul", "(2,1,2,3)@(3,3,2)", (2, 1, 2, 3), (3, 3, 2)),
    binary("MatMul", "(3,2)@(2,1,2,3)", (3, 2), (2, 1, 2, 3)),
    binary("MatMul", "(3,)@(3,2)", (3,), (3, 2)),
    binary("MatMul", "(3,)@(2,3,2)", (3,), (2, 3, 2)),
    binary("MatMul", "(2,3)@(3,)", (2, 3), (3,)),
    binary("MatMul", "(2,2,3)@(3,)", (2, 2, 3), (3,), fused=True),
    binary("MatMul", "(4,)@(4,)", (4,), (4,)),
    binary("MatMul", "dyn(N,3)@(3,2)", ("N", 3), (3, 2), wrt="B", fused=True),
    binary("MatMul", "dyn(N,2,3)@(3,2)", ("N", 2, 3), (3, 2), wrt="B"),
    Case("MatMul-inputs(N,2,3)@(K,3,2)-K=1", [("MatMul", ["A", "B"], ["Y"], {})],
         inputs={"A": ("N", 2, 3), "B": ("K", 3, 2)}, wrt_inputs=("A", "B"),
         dims={"N": 2, "K": 1}, fused=True),
    Case("MatMul-inputs(N,2,3)@(3,)", [("MatMul", ["A", "B"], ["Y"], {})],
         inputs={"A": ("N", 2, 3), "B": (3,)}, wrt_inputs=("A", "B")),
    # Gemm -------------------------------------------------------------------
    gemm("nn", 0, 0),
    gemm("tn", 1, 0),
    gemm("nt", 0, 1, float32=True),
    gemm("tt", 1, 1, fused=True),
    gemm("alpha-beta", 0, 1, alpha=0.5, beta=2.0),
    gemm("tt-alpha-beta", 1, 1, c=(2, 4), alpha=-1.5, beta=0.25),
    gemm("C(1,N)", c=(1, 4)),
    gemm("C(M,N)", c=(2, 4)),
    gemm("C(M,1)", c=(2, 1)),
    gemm("C-scalar", c=(), beta=3.0),
    gemm("noC", c=None, alpha=2.0),
    gemm("noC-tt", 1, 1, c=None, opset=11),
    gemm("C(N,)", c=(4,), opset=11, beta=0.5),
    gemm("tn-C(M,N)", 1, 0, c=(2, 4), opset=9, alpha=0.5, beta=2.0,
         fused=True),
    gemm("nt-C(N,)", 0, 1, c=(4,), opset=9),
    gemm("tt-C-scalar", 1, 1, c=(), opset=9),
    gemm("nn-C(1,N)", c=(1, 4), opset=9, float32=True),
    Case("Gemm-dyn(N,3)-transB-op13", [("Gemm", ["X", "W", "b"], ["Y"],
                                        {"transB": 1})],
         inputs={"X": ("N", 3)}, weights={"W": (4, 3), "b": (4,)}, fused=True),
    Case("Gemm-dyn(N,3)-transB-op9", [("Gemm", ["X", "W", "b"], ["Y"],
                                       {"transB": 1, "beta": 2.0})],
         inputs={"X": ("N", 3)}, weights={"W": (4, 3), "b": (4,)}, opset=9),
    # reductions -------------------------------------------------------------
    reduce("ReduceSum", [1], 1, 11, False),
    reduce("ReduceSum", [1], 0, 11, False, float32=True),
    reduce("ReduceSum", [-1, 0], 0, 11, False),
    reduce("ReduceSum", None, 0, 11, False),
    reduce("ReduceSum", None, 1, 11, False),
    reduce("ReduceSum", [1], 0, 13, True, fused=True),
    reduce("ReduceSum", [-2], 1, 13, True),
    reduce("ReduceSum", [0, -1], 0, 13, True),
    reduce("ReduceSum", None, 0, 13, True),
    reduce("ReduceSum", None, 1, 13, True),
    Case("ReduceSum-noop-empty-axes-op13",
         [("ReduceSum", ["W"], ["Y"], {"noop_with_empty_axes": 1})],
         weights={"W": (2, 3)}),
    reduce("ReduceMean", [1], 1, 13, False),
    reduce("ReduceMean", [-1], 0, 13, False, float32=True),
    reduce("ReduceMean", None, 0, 13, False),
    reduce("ReduceMean", [0, 2], 1, 11, False),
    reduce("ReduceMean", [0], 0, 18, True, fused=True),
    reduce("ReduceMean", [-2, -1], 1, 18, True),
    reduce("ReduceMean", None, 1, 18, True),
    reduce("ReduceMean", None, 0, 18, True),
    Case("ReduceMean-dyn(N,3)-axes0-op18",
         [("Mul", ["X", "W"], ["H"], {}),
          ("ReduceMean", ["H", "axes"], ["Y"], {"keepdims": 0})],
         inputs={"X": ("N", 3)}, weights={"W": (3,)}, opset=18,
         consts={"axes": np.array([0], np.int64)}, dims={"N": 5}),
    # softmax family ---------------------------------------------------------
    softmax("Softmax", 11, axis=1, fused=True),
    softmax("Softmax", 11, axis=-2),
    softmax("Softmax", 11, shape=(3, 4), float32=True),
    softmax("Softmax", 13, axis=1),
    softmax("Softmax", 13),
    softmax("LogSoftmax", 11, axis=1, float32=True),
    softmax("LogSoftmax", 11, axis=0),
    softmax("LogSoftmax", 13, axis=1),
    softmax("LogSoftmax", 13, shape=(3, 4), fused=True),
    # shape ------------------------------------------------------------------
    Case("Concat-3-inputs-axis1", [("Concat", ["W1", "X", "W2"], ["Y"],
                                    {"axis": 1})],
         weights={"W1": (2, 2), "W2": (2, 3)}, inputs={"X": (2, 1)},
         fused=True),
    Case("Concat-3-inputs-axis-2", [("Concat", ["X", "W1", "W2"], ["Y"],
                                     {"axis": -2})],
         weights={"W1": (1, 3), "W2": (2, 3)}, inputs={"X": (2, 3)},
         float32=True),
    Case("Concat-3-inputs-op9", [("Concat", ["W1", "X", "W2"], ["Y"],
                                  {"axis": 0})],
         weights={"W1": (1, 3), "W2": (2, 3)}, inputs={"X": (2, 3)}, opset=9),
    Case("Concat-dyn(N,3)-axis0", [("Concat", ["X", "W1", "W2"], ["Y"],
                                    {"axis": 0})],
         weights={"W1": (2, 3), "W2": (1, 3)}, inputs={"X": ("N", 3)}),
    Case("Transpose-perm", [("Transpose", ["W"], ["Y"], {"perm": [1, 2, 0]})],
         weights={"W": (2, 3, 2)}, float32=True),
    Case("Transpose-noperm", [("Transpose", ["W"], ["Y"], {})],
         weights={"W": (2, 3, 2)}),
    Case("Reshape-(3,4)->(2,-1,3)", [("Reshape", ["W", "shape"], ["Y"], {})],
         weights={"W": (3, 4)},
         consts={"shape": np.array([2, -1, 3], np.int64)}),
    Case("Reshape-dyn(N,3)->(-1,)", [("Mul", ["X", "W"], ["H"], {}),
                                     ("Reshape", ["H", "shape"], ["Y"], {})],
         inputs={"X": ("N", 3)}, weights={"W": (3,)},
         consts={"shape": np.array([-1], np.int64)}),
    Case("Flatten-axis1", [("Flatten", ["W"], ["Y"], {"axis": 1})],
         weights={"W": (2, 3, 2)}),
    Case("Flatten-axis0-op11", [("Flatten", ["W"], ["Y"], {"axis": 0})],
         weights={"W": (2, 3, 2)}, opset=11),
    axes_op("Squeeze", [1], 11, (3, 1, 2)),
    axes_op("Squeeze", [-1, 0], 13, (1, 3, 1)),
    axes_op("Squeeze", None, 13, (1, 3, 1)),
    axes_op("Unsqueeze", [0, -1], 11, (3, 2)),
    axes_op("Unsqueeze", [1], 13, (3, 2), float32=True),
    # a small network ----------------------------------------------------------
    Case("MLP-dyn(N,3)", [("MatMul", ["X", "W1"], ["H1"], {}),
                          ("Add", ["H1", "b1"], ["H2"], {}),
                          ("Tanh", ["H2"], ["H3"], {}),
                          ("Gemm", ["H3", "W2", "b2"], ["H4"], {}),
                          ("Softmax", ["H4"], ["Y"], {})],
         inputs={"X": ("N", 3)},
         weights={"W1": (3, 4), "b1": (4,), "W2": (4, 2), "b2": (2,)},
         fused=True, float32=True),
]


def _feeds(case, values, dtype):
    """Inference-model feeds (inputs and weights) in ``dtype``."""
    return {n: v if v.dtype.kind == "i" else v.astype(case.dtype_of(n, dtype))
            for n, v in values.items()}


def _gradients(case, dtype, values, grad_y, fused=False):
    """Build the models of ``case`` in ``dtype`` and check them (checker,
    model left unmodified, forward output equal to inference output).

    Returns the GradientModels, the split-form gradients, the fused-form
    gradients (None unless ``fused``), the feeds and the grad_outputs."""
    model = case.model(dtype, values)
    before = model.SerializeToString()
    gm = build_gradient_models(model, case.wrt)
    assert model.SerializeToString() == before, "the model was modified"
    check_model(gm.forward_model)
    check_model(gm.backward_model)
    feeds = _feeds(case, values, dtype)
    y = run(session(gm.inference_model), feeds)["Y"]
    grad_outputs = {"Y": grad_y(y.shape).astype(y.dtype)}
    forward, grads = split_gradients(gm, feeds, grad_outputs)
    np.testing.assert_array_equal(forward["Y"], y)
    assert set(grads) == set(case.wrt)
    fused_grads = None
    if fused:
        fused_model, bg = build_fused_model(model, case.wrt)
        check_model(fused_model)
        fused_grads = fused_gradients(fused_model, bg, feeds, grad_outputs)
    return gm, grads, fused_grads, feeds, grad_outputs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_vjp_rule_matches_finite_differences(case):
    values = case.values()
    if case.float32:  # both graphs are evaluated at the same float32 point
        values = {n: v.astype(F32).astype(F64) if v.dtype.kind == "f" else v
                  for n, v in values.items()}
    rng = np.random.default_rng(0)
    gy = {}

    def grad_y(shape):
        if shape not in gy:
            gy[shape] = rng.uniform(-1, 1, size=shape)
        return gy[shape]

    gm, grads, fused, feeds, gouts = _gradients(case, F64, values, grad_y,
                                                case.fused)
    inference = session(gm.inference_model)
    expected = {w: numeric_gradient(inference, feeds, w, gouts)
                for w in case.wrt}
    for w in case.wrt:
        assert grads[w].dtype == F64
        err = relative_error(expected[w], grads[w])
        assert err <= STRICT, f"{w}: relative error {err:.2e}"
    if fused is not None:
        for w in case.wrt:
            np.testing.assert_allclose(fused[w], grads[w], rtol=1e-12,
                                       atol=1e-14, err_msg=w)
    if case.float32:
        _, grads32, _, _, _ = _gradients(case, F32, values, grad_y)
        for w in case.wrt:
            assert grads32[w].dtype == case.dtype_of(w, F32)
            err = relative_error(expected[w], grads32[w])
            assert err <= LOOSE, f"{w} (float32): relative error {err:.2e}"


def test_every_registered_op_has_a_row():
    # every row is built in the default domain; the rows of most ops are
    # onnx's own node tests (tests/op_corpus.py, checked in
    # tests/autodiff/test_op_coverage.py)
    from op_corpus import corpus_op_types
    covered = {("", op) for case in CASES for op in case.op_types()}
    covered |= {("", op) for op in corpus_op_types()}
    covered.add(("ai.onnx.ml", "ArrayFeatureExtractor"))  # its own test below
    missing = sorted(set(registered_vjp_ops()) - covered)
    assert not missing, f"registered VJP rules without a test row: {missing}"


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


# ---------------------------------------------------------------------------
# graphs outside the table
# ---------------------------------------------------------------------------

def _model(nodes, inputs, outputs, inits, opset=13, domains=()):
    """ModelProto from ``(op, inputs, outputs, attrs[, domain])`` nodes;
    ``inputs``/``outputs``: name -> (elem_type, shape); ``inits``: arrays."""
    protos = [helper.make_node(op, ins, outs, name=f"{outs[0]}_node",
                               domain=rest[1] if len(rest) > 1 else "",
                               **rest[0] if rest else {})
              for op, ins, outs, *rest in nodes]
    vi = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    vo = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()]
    tensors = [numpy_helper.from_array(v, n) for n, v in inits.items()]
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, 1) for d in domains]
    return make_model(helper.make_graph(protos, "g", vi, vo, tensors), opsets)


D = TensorProto.DOUBLE
RNG = np.random.default_rng(1234)


def _check_split(model, wrt, feeds, outputs=None, grad_outputs=None):
    """Split-form gradients checked against finite differences; returns
    them and the grad_outputs used."""
    gm = build_gradient_models(model, wrt, outputs)
    check_model(gm.forward_model)
    check_model(gm.backward_model)
    inference = session(gm.inference_model)
    ys = run(inference, feeds)
    grad_outputs = grad_outputs or {
        o: RNG.uniform(-1, 1, ys[o].shape) for o in gm.outputs}
    _, grads = split_gradients(gm, feeds, grad_outputs)
    for w in wrt:
        expected = numeric_gradient(inference, feeds, w, grad_outputs)
        assert relative_error(expected, grads[w]) <= STRICT, w
    return grads, grad_outputs


@pytest.mark.parametrize("op, domain", [("Unique", ""),
                                        ("Custom", "my.ops")])
def test_missing_rule_names_op_domain_node_and_weights(op, domain):
    model = _model(
        [("Mul", ["X", "W"], ["H"]), (op, ["H"], ["Z"], {}, domain),
         ("Add", ["Z", "b"], ["Y"])],
        {"X": (D, ("N", 3))}, {"Y": (D, ("N", 3))},
        {"W": np.ones(3), "b": np.zeros(3)},
        domains=[domain] if domain else ())
    with pytest.raises(MissingVJPRuleError) as info:
        build_gradient_models(model, ["W", "b"])
    message = str(info.value)
    assert f"op_type={op!r}" in message
    assert repr(domain or "ai.onnx") in message
    assert "Z_node" in message
    assert "['W']" in message  # b is not upstream of the node
    # the same graph differentiated w.r.t. b only never meets the node
    gm = build_gradient_models(model, ["b"])
    assert gm.grad_names == ["b_grad"]


def test_unknown_wrt_lists_candidates():
    model = _model([("Mul", ["X", "W"], ["Y"])], {"X": (D, (2, 3))},
                   {"Y": (D, (2, 3))}, {"W": np.ones(3)})
    with pytest.raises(ValueError, match="wrong") as info:
        build_gradient_models(model, ["wrong"])
    assert "'W'" in str(info.value) and "'X'" in str(info.value)


def test_nondifferentiable_side_branch_and_zero_gradient():
    # Y = X * W + Cast(ArgMax(W)) + Cast(ArgMax(V)); S = Shape(W)
    nodes = [("Mul", ["X", "W"], ["XW"]),
             ("ArgMax", ["W"], ["AW"], {"axis": 1}),
             ("ArgMax", ["V"], ["AV"], {"axis": 1}),
             ("Add", ["AW", "AV"], ["A"]),
             ("Cast", ["A"], ["AF"], {"to": D}),
             ("Add", ["XW", "AF"], ["Y"]),
             ("Shape", ["W"], ["S"])]
    model = _model(nodes, {"X": (D, ("N", 3))},
                   {"Y": (D, ("N", 3)), "S": (TensorProto.INT64, (2,))},
                   {"W": RNG.uniform(-1, 1, (2, 3)),
                    "V": RNG.uniform(-1, 1, (2, 3))})
    feeds = {"X": RNG.uniform(-1, 1, (2, 3)),
             "W": numpy_helper.to_array(model.graph.initializer[0]),
             "V": numpy_helper.to_array(model.graph.initializer[1])}
    grads, gouts = _check_split(model, ["W", "V"], feeds)
    np.testing.assert_allclose(grads["W"], feeds["X"] * gouts["Y"])
    np.testing.assert_array_equal(grads["V"], np.zeros((2, 3)))
    assert trainable_initializers(model) == ["W"]


def test_weight_only_behind_nondifferentiable_op_is_refused():
    model = _model([("ArgMax", ["V"], ["A"], {"axis": 1}),
                    ("Cast", ["A"], ["Y"], {"to": D})],
                   {}, {"Y": (D, (2, 1))}, {"V": np.ones((2, 3))})
    with pytest.raises(ValueError, match="No output"):
        build_gradient_models(model, ["V"])


@pytest.mark.parametrize("inputs", [("W", "X", "W"), ("W", "W")],
                         ids=["W*X+W", "W*W"])
def test_gradients_reaching_one_weight_are_summed(inputs):
    if len(inputs) == 3:
        nodes = [("Mul", ["W", "X"], ["H"]), ("Add", ["H", "W"], ["Y"])]
    else:
        nodes = [("Mul", ["W", "W"], ["Y"])]
    w = RNG.uniform(-1, 1, (2, 3))
    model = _model(nodes, {"X": (D, ("N", 3))}, {"Y": (D, ("N", 3))},
                   {"W": w})
    feeds = {"X": RNG.uniform(-1, 1, (2, 3)), "W": w}
    grads, gouts = _check_split(model, ["W"], feeds)
    g = gouts["Y"]
    expected = g * feeds["X"] + g if len(inputs) == 3 else 2 * w * g
    np.testing.assert_allclose(grads["W"], expected, rtol=1e-13)
    fused, bg = build_fused_model(model, ["W"])
    check_model(fused)
    np.testing.assert_allclose(
        fused_gradients(fused, bg, feeds, gouts)["W"], expected, rtol=1e-13)


@pytest.mark.parametrize("b_shape, b_rows", [
    ((1, "M"), 1), (("K", "M"), 1), (("K", "M"), 3), (("M",), None)],
    ids=["B(1,M)", "B(K,M)-K=1", "B(K,M)-K=N", "B(M,)"])
def test_sum_to_with_symbolic_dims(b_shape, b_rows):
    model = _model([("Add", ["A", "B"], ["Y"])],
                   {"A": (D, ("N", "M")), "B": (D, b_shape)},
                   {"Y": (D, None)}, {}, opset=13)
    model.graph.output[0].CopyFrom(
        onnx.shape_inference.infer_shapes(model).graph.output[0])
    a = RNG.uniform(-1, 1, (3, 2))
    b = RNG.uniform(-1, 1, (2,) if b_rows is None else (b_rows, 2))
    grads, gouts = _check_split(model, ["A", "B"], {"A": a, "B": b})
    g = gouts["Y"]
    np.testing.assert_allclose(grads["A"], g, rtol=1e-13)
    expected = g.sum(axis=0) if b_rows is None else g.sum(axis=0, keepdims=True)
    if b_rows == 3:
        expected = g
    np.testing.assert_allclose(grads["B"], expected, rtol=1e-13)


def test_sum_to_with_runtime_broadcast_needs_opset_13():
    model = _model([("Add", ["A", "B"], ["Y"])],
                   {"A": (D, ("N", "M")), "B": (D, ("K", "M"))},
                   {"Y": (D, None)}, {}, opset=12)
    with pytest.raises(ValueError, match="opset >= 13"):
        build_gradient_models(model, ["B"])


def _mlp_onnx(estimator, n_outputs, **options):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 3))
    y = rng.integers(0, n_outputs, 20) if n_outputs > 1 else X[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from skl2onnx import to_onnx
        estimator.fit(X, y)
        return to_onnx(estimator, X[:1], **options), X  # a float64 graph


def test_trainable_initializers_of_skl2onnx_mlp():
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    expected = ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    clf, X = _mlp_onnx(MLPClassifier(hidden_layer_sizes=(4,), max_iter=5), 2,
                       options={"zipmap": False})
    names = {i.name for i in clf.graph.initializer}
    assert {"unity", "classes", "shape_tensor"} <= names
    assert trainable_initializers(clf) == expected
    assert trainable_initializers(clf, ["coefficient1", "unity"]) == [
        "coefficient1"]
    reg, _ = _mlp_onnx(MLPRegressor(hidden_layer_sizes=(4,), max_iter=5), 1)
    assert "shape_tensor" in {i.name for i in reg.graph.initializer}
    assert trainable_initializers(reg) == expected
    # the classifier's probabilities are differentiable w.r.t. all four
    feeds = {"X": X[:4]}
    feeds.update({i.name: numpy_helper.to_array(i)
                  for i in clf.graph.initializer if i.name in expected})
    _check_split(clf, expected, feeds, ["probabilities"])


@pytest.mark.parametrize("opset", [12, 13, 15, 16])
def test_gather_with_a_scalar_index(opset):
    """A rank-0 index (a row taken by its number, as a Loop body does) keeps
    the one-hot contraction valid below opset 16 and scatters above."""
    import onnxruntime

    W = np.random.RandomState(0).randn(4, 3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "i"], ["r"], axis=0),
         helper.make_node("Mul", ["r", "X"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [3])],
        [numpy_helper.from_array(W, "W"),
         numpy_helper.from_array(np.array(-2, np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    gm = build_gradient_models(model, ["W"])
    onnx.checker.check_model(gm.backward_model, full_check=True)
    run = lambda m, feeds: onnxruntime.InferenceSession(  # noqa: E731
        m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    X = np.array([1.0, 2.0, 3.0])
    forward = dict(zip([o.name for o in gm.forward_model.graph.output],
                       run(gm.forward_model, {"X": X, "W": W})))
    feeds = {gm.grad_output_names[0]: np.ones(3)}
    for name in gm.backward_inputs:
        feeds[name] = {"X": X, "W": W}.get(name, forward.get(name))
    expected = np.zeros((4, 3))
    expected[2] = X  # index -2 of 4 rows
    np.testing.assert_allclose(run(gm.backward_model, feeds)[0], expected)


def test_embedding_gradient_is_one_row_scatter():
    """Gather on axis 0 (an embedding lookup) with repeated and negative
    indices of rank 2: the rows of dY summed into the rows of W by one
    ScatterND add, against central differences."""
    from gradcheck import check_gradients
    W = np.random.RandomState(0).randn(5, 3)
    idx = np.array([[0, -1, 2], [4, 0, 0]], np.int64)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "i"], ["r"], axis=0),
         helper.make_node("Mul", ["r", "X"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [2, 3, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [2, 3, 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(idx, "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ops = [n.op_type for n in build_gradient_models(model, ["W"]).backward_model.graph.node]
    assert "ScatterND" in ops and "ScatterElements" not in ops
    X = np.random.RandomState(1).randn(2, 3, 3)
    _, grads = check_gradients(model, ["W"], {"X": X, "W": W}, seed=2)
    assert grads["W"].shape == W.shape


@pytest.mark.parametrize("shape,indices", [
    ((4, 5), [3, 1, 3]),           # repeated columns of a table
    ((2, 3, 4), [0]),              # the last axis of a 3-D tensor
    ((4, 2), np.int64(1)),         # a rank-0 index (a binary score column)
    ((5,), [4, 0, 4])])            # a 1-D X: onnxruntime returns one row
def test_array_feature_extractor_gradient(shape, indices):
    """ai.onnx.ml ArrayFeatureExtractor (columns of the last axis, repeated
    or not) against central differences: its gradient sums dY back into the
    selected columns."""
    from gradcheck import check_gradients
    W = np.random.RandomState(0).randn(*shape)
    indices = np.asarray(indices, np.int64)
    selected = np.take(W, indices.reshape(-1), axis=-1)
    if W.ndim == 1:
        selected = selected.reshape(1, -1)
    graph = helper.make_graph(
        [helper.make_node("ArrayFeatureExtractor", ["W", "i"], ["r"],
                          domain="ai.onnx.ml"),
         helper.make_node("Mul", ["r", "X"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, selected.shape)],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, selected.shape)],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(indices, "i")])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    X = np.random.RandomState(1).randn(*selected.shape)
    _, grads = check_gradients(model, ["W"], {"X": X, "W": W}, seed=2)
    unselected = np.setdiff1d(np.arange(W.shape[-1]), indices.reshape(-1))
    assert grads["W"].shape == W.shape
    assert (grads["W"][..., unselected] == 0).all()
    assert (grads["W"][..., indices.reshape(-1)] != 0).all()


@pytest.mark.parametrize("opset, message", [
    (7, "differentiates opset 8 and newer"),
    # Softmax's gradient zeroes the NaNs of a row of -inf with IsNaN, born
    # at opset 9 (scores with something added: a mask may be)
    (8, "The gradient of Softmax node 'Y_node': IsNaN does not exist at opset 8 "
        "(it needs opset >= 9); upgrade the model with "
        "onnx.version_converter.convert_version(model, 9)")])
def test_old_opsets_are_refused_with_what_to_upgrade(opset, message):
    model = _model([("MatMul", ["X", "W"], ["Z"], {}), ("Add", ["Z", "B"], ["S"], {}),
                    ("Softmax", ["S"], ["Y"], {})],
                   {"X": (TensorProto.FLOAT, ["N", 3])},
                   {"Y": (TensorProto.FLOAT, ["N", 2])},
                   {"W": np.ones((3, 2), np.float32), "B": np.zeros(2, np.float32)},
                   opset=opset)
    with pytest.raises(ValueError, match=re.escape(message)):
        build_gradient_models(model, ["W"])


def test_opset_8_dense_layer_and_max_pool_gradients():
    """At opset 8 a bias gradient is a ReduceSum (ConstantOfShape, used at
    9+, does not exist) and MaxPool's is a Scatter (ScatterElements is 11+)."""
    weights = {"W": RNG.normal(size=(3, 2)), "B": RNG.normal(size=(1, 2))}
    dense = _model([("MatMul", ["X", "W"], ["Z"], {}), ("Add", ["Z", "B"], ["Y"], {})],
                   {"X": (D, ["N", 3])}, {"Y": (D, ["N", 2])}, weights, opset=8)
    # (below IR 4 the initializers are graph inputs too: fed their values)
    _check_split(dense, ["W", "B", "X"], {"X": RNG.normal(size=(4, 3)), **weights})
    assert "ReduceSum" in {n.op_type for n in
                           build_gradient_models(dense, ["B"]).backward_model.graph.node}
    pool = _model([("MaxPool", ["X"], ["Y"], {"kernel_shape": [2, 2], "strides": [2, 2]})],
                  {"X": (D, [1, 1, 4, 4])}, {"Y": (D, [1, 1, 2, 2])}, {}, opset=10)
    _check_split(pool, ["X"], {"X": RNG.permutation(16).reshape(1, 1, 4, 4) * 0.5})
    gm = build_gradient_models(pool, ["X"])
    assert "Scatter" in {n.op_type for n in gm.backward_model.graph.node}


def test_a_weight_that_is_also_a_shapeless_output_keeps_its_shape():
    """Exporters declare extra outputs without shapes; onnx's inference
    then types an initializer that is one of them from that declaration,
    and the values computed from it lost their shapes (broadcasting
    gradients need ranks). The initializer's own dimensions win."""
    w = RNG.normal(size=3)
    model = _model([("Mul", ["W", "X"], ["Z"], {})], {"X": (D, [3])},
                   {"Z": (D, None), "W": (D, None)}, {"W": w}, opset=17)
    assert infer_value_types(model)["Z"] == (D, (3,))
    gm = build_gradient_models(model, ["W"], outputs=["Z"])
    feeds, grad_z = {"X": RNG.normal(size=3), "W": w}, {"Z": RNG.normal(size=3)}
    _, grads = split_gradients(gm, feeds, grad_z)
    expected = numeric_gradient(session(gm.inference_model), feeds, "W", grad_z)
    assert relative_error(expected, grads["W"]) <= STRICT


@pytest.mark.parametrize("opset", [12, 16])
def test_dilated_max_pool_windows_that_overlap_are_summed_or_refused(opset):
    """Kernel 2, dilation 2, stride 2: each window spans 3 elements and
    neighbours share one. At opset 16 the gradient sums them
    (ScatterElements with reduction='add', finite differences); before,
    a plain scatter would keep one window's share: refused, as for a
    kernel wider than its stride."""
    attrs = {"kernel_shape": [1, 2], "strides": [1, 2], "dilations": [1, 2]}
    model = _model([("MaxPool", ["X"], ["Y"], attrs)], {"X": (D, [1, 1, 2, 7])},
                   {"Y": (D, [1, 1, 2, 3])}, {}, opset=opset)
    # the shared middle elements are each window's maximum
    x = np.array([[0.0, 1.0, 5.0, 2.0, 4.0, 3.0, 0.5],
                  [1.0, 0.0, 6.0, 0.0, 7.0, 0.0, 2.0]]).reshape(1, 1, 2, 7)
    if opset < 16:
        with pytest.raises(NotImplementedError, match="overlapping windows"):
            build_gradient_models(model, ["X"])
        return
    _check_split(model, ["X"], {"X": x})


@pytest.mark.parametrize("op, inputs, attrs", [
    ("Clip", ["x", "zero"], {}),                 # torch.clamp(d2, min=0)
    ("Max", ["x", "zero"], {}),
    ("Where", ["positive", "x", "zero"], {}),
], ids=["Clip-min", "Max", "Where"])
def test_sanitizing_ops_send_no_gradient_to_the_value_they_dropped(op, inputs, attrs):
    """sqrt(clamp(d2, min=0)) at a d2 rounded slightly below 0: Sqrt's
    gradient at 0 is inf, and the op that chose 0 sends the input none
    (0, as PyTorch), not inf * 0 = NaN (these rules keep Where; only
    activations take the masked product, see VJPContext.masked)."""
    F = TensorProto.FLOAT
    x = np.array([-1e-7, 0.25, 4.0, -2.0], np.float32)
    nodes = [(op, inputs, ["c"], attrs), ("Sqrt", ["c"], ["y"])]
    if op == "Where":
        nodes.insert(0, ("Greater", ["x", "zero"], ["positive"]))
    model = _model(nodes, {"x": (F, [4])}, {"y": (F, [4])},
                   {"zero": np.array(0, np.float32)}, opset=17)
    gm = build_gradient_models(model, ["x"])
    _, grads = split_gradients(gm, {"x": x}, {"y": np.ones(4, np.float32)})
    np.testing.assert_array_equal(grads["x"], [0, 1, 0.25, 0])


def test_celu_gradient_does_not_overflow_at_large_inputs():
    F = TensorProto.FLOAT
    x = np.array([-0.1, 0.5, 8.0, 9.0, 100.0], np.float32)  # x / alpha up to 1000
    model = _model([("Celu", ["x"], ["y"], {"alpha": 0.1})], {"x": (F, [5])},
                   {"y": (F, [5])}, {}, opset=17)
    gm = build_gradient_models(model, ["x"])
    _, grads = split_gradients(gm, {"x": x}, {"y": np.ones(5, np.float32)})
    np.testing.assert_allclose(grads["x"], [np.exp(-1), 1, 1, 1, 1], rtol=1e-6)


@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {"alpha": 0.1}), ("Elu", {}),
                                       ("Selu", {}), ("Celu", {})])
def test_slope_activations_keep_an_inf_gradient_where_where_did(op, attrs):
    """The slope is selected by masks, then multiplies the gradient once:
    an inf gradient stays inf (times a finite nonzero slope), never NaN."""
    F = TensorProto.FLOAT
    x = np.array([-1.0, 2.0], np.float32)
    model = _model([(op, ["x"], ["y"], attrs)], {"x": (F, [2])}, {"y": (F, [2])}, {},
                   opset=17)
    gm = build_gradient_models(model, ["x"])
    _, grads = split_gradients(gm, {"x": x}, {"y": np.full(2, np.inf, np.float32)})
    assert np.isinf(grads["x"]).all(), grads["x"]


@pytest.mark.parametrize("k, shape, dtype, tiled", [
    (2, (2, 3, 8, 6), TensorProto.FLOAT, True),
    (3, (1, 2, 6, 9), TensorProto.DOUBLE, True),
    (1, (1, 2, 3, 3), TensorProto.FLOAT, True),
    (2, (1, 2, 5, 4), TensorProto.FLOAT, False),   # H not a multiple of k
], ids=["k2-float", "k3-double", "k1", "untiled"])
def test_max_pool_gradient_on_tiling_windows_matches_torch_with_ties(k, shape, dtype, tiled):
    """Windows tiling X take the path without MaxPool's Indices (see
    rules/pooling._tiled_max_pool): the gradient goes to the first maximum
    of each window in row-major order, as PyTorch's, ReLU's zeros and
    repeated values (ties) included."""
    torch = pytest.importorskip("torch")
    np_type = np.float32 if dtype == TensorProto.FLOAT else np.float64
    x = np.maximum(RNG.normal(size=shape), 0).round(1).astype(np_type)
    x[0, 0, :k, :k] = 0.5  # a window of equal values
    out = [shape[0], shape[1], shape[2] // k, shape[3] // k]
    model = _model([("MaxPool", ["X"], ["Y"], {"kernel_shape": [k, k], "strides": [k, k]})],
                   {"X": (dtype, ["N", shape[1], shape[2], shape[3]])},
                   {"Y": (dtype, ["N", shape[1], *out[2:]])}, {}, opset=17)
    gm = build_gradient_models(model, ["X"])
    ops = [n.op_type for n in gm.backward_model.graph.node]
    assert ("SpaceToDepth" in ops) == tiled
    gy = RNG.uniform(-1, 1, out).astype(np_type)
    _, grads = split_gradients(gm, {"X": x}, {"Y": gy})
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(xt, k).backward(torch.tensor(gy))
    np.testing.assert_array_equal(grads["X"], xt.grad.numpy())


@pytest.mark.parametrize("k, shape, dtype, tiled", [
    (2, (2, 3, 4, 6), TensorProto.FLOAT, True),
    (3, (1, 2, 6, 9), TensorProto.FLOAT, True),  # onnxruntime pools float only
    (2, (2, 2, 5, 4), TensorProto.FLOAT, False),  # 5 rows: the last window is cut
], ids=["k2", "k3", "untiled"])
def test_average_pool_gradient_on_tiling_windows_matches_torch(k, shape, dtype, tiled):
    """Windows tiling X take the Expand path (rules/pooling._tiled_average_pool):
    each element gets its window's dY / (k k), as PyTorch's avg_pool2d."""
    torch = pytest.importorskip("torch")
    np_type = np.float32 if dtype == TensorProto.FLOAT else np.float64
    x = RNG.normal(size=shape).astype(np_type)
    out = [shape[0], shape[1], shape[2] // k, shape[3] // k]
    model = _model([("AveragePool", ["X"], ["Y"], {"kernel_shape": [k, k],
                                                    "strides": [k, k]})],
                   {"X": (dtype, ["N", shape[1], shape[2], shape[3]])},
                   {"Y": (dtype, ["N", shape[1], *out[2:]])}, {}, opset=17)
    gm = build_gradient_models(model, ["X"])
    ops = [n.op_type for n in gm.backward_model.graph.node]
    assert ("ConvTranspose" not in ops) == tiled
    gy = RNG.uniform(-1, 1, out).astype(np_type)
    _, grads = split_gradients(gm, {"X": x}, {"Y": gy})
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.avg_pool2d(xt, k).backward(torch.tensor(gy))
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=1e-6, atol=1e-7)
