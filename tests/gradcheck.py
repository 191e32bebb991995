"""Finite-difference oracle for the gradient models of onnxtrain.autodiff.

The scalar checked is ``sum_k sum(output_k * grad_output_k)``: its gradient
with respect to a weight is exactly the vector-Jacobian product the backward
model computes for those ``grad_outputs``.
"""
import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.autodiff import build_fused_model, build_gradient_models
from onnxtrain.autodiff.context import VJPContext
from onnxtrain.graph import GraphBuilder, infer_value_types

__all__ = ["session", "run", "check_model", "split_gradients",
           "fused_gradients", "numeric_gradient", "central_differences",
           "relative_error", "expansion_model", "check_gradients"]


def session(model):
    """A CPU InferenceSession of ``model``."""
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def run(sess, feeds):
    """Run ``sess`` on the feeds it takes; return ``{output name: array}``."""
    wanted = {i.name for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(names, values))


def check_model(model):
    """``onnx.checker.check_model(full_check=True)`` (raises on failure)."""
    onnx.checker.check_model(model, full_check=True)


def split_gradients(gm, feeds, grad_outputs, sessions=None):
    """Weight gradients through the split form.

    Parameters
    ----------
    gm : GradientModels
    feeds : dict
        Values of the inference model's inputs (original inputs and wrt).
    grad_outputs : dict
        ``output name -> gradient`` for every name of ``gm.outputs``.
    sessions : tuple of two InferenceSession, default=None
        Sessions of ``gm.forward_model`` and ``gm.backward_model``.

    Returns
    -------
    forward_outputs : dict
    grads : dict
        ``wrt name -> gradient``.
    """
    fwd, bwd = sessions or (session(gm.forward_model),
                            session(gm.backward_model))
    forward_outputs = run(fwd, feeds)
    bfeeds = {g: grad_outputs[o]
              for g, o in zip(gm.grad_output_names, gm.outputs)}
    for name in gm.backward_inputs:
        bfeeds[name] = feeds[name] if name in feeds else forward_outputs[name]
    result = run(bwd, bfeeds)
    return forward_outputs, {w: result[g] for w, g in zip(gm.wrt, gm.grad_names)}


def fused_gradients(fused, bg, feeds, grad_outputs):
    """Weight gradients through the fused model of ``build_fused_model``."""
    all_feeds = dict(feeds)
    all_feeds.update({g: grad_outputs[o]
                      for g, o in zip(bg.grad_output_names, bg.outputs)})
    result = run(session(fused), all_feeds)
    return {w: result[g] for w, g in zip(bg.wrt, bg.grad_names)}


def numeric_gradient(sess, feeds, wrt, grad_outputs, eps=1e-6):
    """Central finite differences of ``sum(output * grad_output)``.

    ``sess`` runs the inference model (weights as inputs); every element of
    ``feeds[wrt]`` is moved by ``+-eps`` in float64, then cast back to the
    feed's dtype.
    """
    def objective(value):
        outs = run(sess, {**feeds, wrt: value.astype(base.dtype)})
        return sum(float(np.sum(outs[o].astype(np.float64) * g))
                   for o, g in grad_outputs.items())

    base = np.asarray(feeds[wrt])
    return central_differences(objective, base.astype(np.float64), eps)


def central_differences(f, p, eps=1e-6):
    """``(f(p + eps e_i) - f(p - eps e_i)) / (2 eps)`` for every element i
    of the array ``p``: the gradient of the scalar function ``f``, in
    ``p``'s dtype."""
    grad = np.zeros_like(p)
    for idx in np.ndindex(p.shape):
        plus, minus = p.copy(), p.copy()
        plus[idx] += eps
        minus[idx] -= eps
        grad[idx] = (f(plus) - f(minus)) / (2 * eps)
    return grad


def relative_error(num, ana):
    """``max|num - ana| / max(max|num|, 1e-12)``."""
    num = np.asarray(num, dtype=np.float64)
    ana = np.asarray(ana, dtype=np.float64)
    assert num.shape == ana.shape, f"shape {ana.shape} != expected {num.shape}"
    return float(np.max(np.abs(num - ana), initial=0.0)
                 / max(float(np.max(np.abs(num), initial=0.0)), 1e-12))


def expansion_model(model, expand):
    """The expansion ``expand(ctx)`` that a VJP rule differentiates, of the
    single node of ``model``, as a model of the same inputs, outputs, opset
    and IR version (``expand`` returns one output name or a list)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    node = model.graph.node[0]
    g = GraphBuilder(opset, {i.name for i in model.graph.input},
                     infer_value_types(model))
    ctx = VJPContext(node, g, [True] * len(node.input), {})
    outputs = expand(ctx)
    for name, out in zip([outputs] if isinstance(outputs, str) else outputs,
                         model.graph.output):
        g.op("Identity", name, outputs=[out.name])
    graph = onnx.helper.make_graph(g.nodes, "expansion", list(model.graph.input),
                                   list(model.graph.output), g.initializers)
    expanded = onnx.helper.make_model(graph, opset_imports=model.opset_import)
    expanded.ir_version = model.ir_version
    check_model(expanded)
    return expanded


def check_gradients(model, wrt, feeds, seed=0, outputs=None, eps=1e-6,
                    tol=1e-6, check_node_models=True):
    """Split and fused gradients of ``model`` (of ``outputs``, None: all)
    against central differences of step ``eps``: relative error below
    ``tol``. ``seed``, a seed or a Generator, draws the output gradients
    (in the outputs' dtypes). ``check_node_models=False`` skips onnx's
    checker on the models holding the model's own nodes (inference,
    forward, fused), for a node the checker refuses in the model given too.
    Returns the inference outputs and the split gradients."""
    rng = np.random.default_rng(seed)
    gm = build_gradient_models(model, wrt, outputs=outputs)
    fused, bg = build_fused_model(model, wrt, outputs=outputs)
    check_model(gm.backward_model)
    if check_node_models:
        for m in (gm.inference_model, gm.forward_model, fused):
            check_model(m)
    inference = session(gm.inference_model)
    y = run(inference, feeds)
    grad_outputs = {o: rng.normal(size=y[o].shape).astype(y[o].dtype)
                    for o in gm.outputs}
    _, split = split_gradients(gm, feeds, grad_outputs)
    fused_grads = fused_gradients(fused, bg, feeds, grad_outputs)
    for w in wrt:
        num = numeric_gradient(inference, feeds, w, grad_outputs, eps)
        assert relative_error(num, split[w]) < tol, (w, split[w], num)
        assert relative_error(num, fused_grads[w]) < tol, w
    return y, split
