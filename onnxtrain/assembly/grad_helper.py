"""The gradient graph of an ONNX model as one ONNX model (onnxcustom's
``onnxcustom.training.grad_helper``), built by :mod:`onnxtrain.autodiff`
with standard ONNX ops only, so that stock onnxruntime runs it."""
from __future__ import annotations

from enum import IntFlag

import onnx
from onnx import TensorProto, helper

from ..autodiff import build_fused_model
from .models import get_train_initializer, load_model

__all__ = ["DerivativeOptions", "onnx_derivative"]

_FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT,
           TensorProto.DOUBLE)


class DerivativeOptions(IntFlag):
    """How :func:`onnx_derivative` lays out the gradient graph (the values
    of onnxcustom's flags).

    * ``Zero``: inputs are the model's inputs, the weights, then one
      ``<output>_grad`` per output; outputs are the gradients only.
    * ``KeepYieldOp``: onnxruntime-training's graph with its ``YieldOp``
      nodes; not supported (``YieldOp`` is a com.microsoft training kernel
      stock onnxruntime lacks).
    * ``KeepOutputs``: the model's outputs are outputs too.
    * ``FillGrad``: no ``<output>_grad`` input, the output gradients are
      ones of the output's shape (needs ``KeepOutputs``).
    * ``Loss``: the model computes a loss; its gradient w.r.t. the inputs
      and weights, the loss seeded with one. Its value, 5, is also
      ``KeepYieldOp | FillGrad`` (onnxcustom's numbering): that combination
      means ``Loss``.
    """

    Zero = 0
    KeepYieldOp = 1
    KeepOutputs = 2
    FillGrad = 4
    Loss = 5


def _float_inputs(model, exclude=()):
    return [i.name for i in model.graph.input
            if i.type.HasField("tensor_type")
            and i.type.tensor_type.elem_type in _FLOATS and i.name not in exclude]


def onnx_derivative(onx, weights=None, inputs=None,
                    options=DerivativeOptions.Zero, loss=None, label=None,
                    path_name=None):
    """Build one ONNX model computing the gradients of ``onx``.

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or str
        The model (not modified).
    weights : list of str, default=None
        Initializers to differentiate against; they become inputs of the
        gradient model, after the model's inputs. None: every float
        initializer reaching an output (:func:`onnxtrain.get_train_initializer`);
        ``[]``: none (they stay initializers).
    inputs : list of str, default=None
        Graph inputs to differentiate against; None: every float input
        (``label`` excepted with ``Loss``).
    options : DerivativeOptions, default=DerivativeOptions.Zero
        Layout of the result (see :class:`DerivativeOptions`).
    loss : str, default=None
        With ``options=DerivativeOptions.Loss``: name of the output holding
        the loss (one value).
    label : str or list of str, default=None
        With ``Loss``: the input(s) holding the expected values, never
        differentiated.
    path_name : str, default=None
        With ``Loss``: where the gradient model is saved.

    Returns
    -------
    onnx.ModelProto
        Outputs: ``<name>_grad`` for each input in ``inputs`` then each
        weight, in that order (with ``KeepOutputs`` or ``Loss``, the model's
        outputs first). Its inputs: the model's inputs, the weights, then
        (without ``FillGrad`` or ``Loss``) one ``<output>_grad`` per float
        output depending on them, of that output's type and shape.

    Raises
    ------
    TypeError
        ``options`` is not a :class:`DerivativeOptions` (an int is refused,
        as onnxcustom refused it).
    ValueError
        ``FillGrad`` without ``KeepOutputs``; nothing to differentiate
        against; with ``Loss``: ``weights`` given, or ``loss``, ``label`` or
        ``path_name`` missing or unknown; unknown names (see
        :func:`onnxtrain.autodiff.backward`).
    NotImplementedError
        ``KeepYieldOp``.
    onnxtrain.exceptions.MissingVJPRuleError
        A node on the path has no gradient rule.
    """
    if not isinstance(options, DerivativeOptions):
        raise TypeError("options must be a DerivativeOptions, not "
                        f"{type(options).__name__} {options!r}.")
    model = load_model(onx)
    if options == DerivativeOptions.Loss:
        return _loss_derivative(model, weights, inputs, loss, label, path_name)
    if options & DerivativeOptions.KeepYieldOp:
        raise NotImplementedError(
            "DerivativeOptions.KeepYieldOp: YieldOp is an onnxruntime-training "
            "kernel (com.microsoft domain) that stock onnxruntime does not "
            "have; onnxtrain's gradient graphs take the output gradients as "
            "inputs named '<output>_grad' instead.")
    fill = bool(options & DerivativeOptions.FillGrad)
    keep = bool(options & DerivativeOptions.KeepOutputs)
    if fill and not keep:
        raise ValueError("DerivativeOptions.FillGrad needs "
                         "DerivativeOptions.KeepOutputs as well.")
    wrt = _wrt(model, weights, inputs)
    fused, bg = build_fused_model(model, wrt)
    if fill:
        _fill_output_grads(fused, bg.outputs, bg.grad_output_names)
    if not keep:
        _drop_outputs(fused, {o.name for o in model.graph.output})
    onnx.checker.check_model(fused)
    return fused


def _wrt(model, weights, inputs, exclude=()):
    if weights is None:
        weights = list(get_train_initializer(model))
    if inputs is None:
        inputs = _float_inputs(model, exclude)
    elif isinstance(inputs, str):
        inputs = [inputs]
    wrt = list(inputs) + [w for w in weights if w not in set(inputs)]
    if not wrt:
        raise ValueError("onnx_derivative: no input or weight to differentiate "
                         "against (weights=[] and no float input).")
    return wrt


def _drop_outputs(model, names):
    kept = [o for o in model.graph.output if o.name not in names]
    del model.graph.output[:]
    model.graph.output.extend(kept)


def _fill_output_grads(model, outputs, grad_names):
    """Replace the ``<output>_grad`` inputs by ones of the output's shape."""
    graph = model.graph
    types = {o.name: o.type.tensor_type.elem_type for o in graph.output}
    new_nodes = []
    for out, grad in zip(outputs, grad_names):
        shape = f"{grad}_shape"
        new_nodes.append(helper.make_node("Shape", [out], [shape]))
        new_nodes.append(helper.make_node(
            "ConstantOfShape", [shape], [grad],
            value=helper.make_tensor("value", types[out], [1], [1])))
    _insert_before_first_reader(graph, new_nodes, set(grad_names))
    kept = [i for i in graph.input if i.name not in set(grad_names)]
    del graph.input[:]
    graph.input.extend(kept)


def _insert_before_first_reader(graph, new_nodes, names):
    nodes = list(graph.node)
    first = next((k for k, n in enumerate(nodes) if names & set(n.input)),
                 len(nodes))
    del graph.node[:]
    graph.node.extend(nodes[:first] + new_nodes + nodes[first:])


def _loss_derivative(model, weights, inputs, loss, label, path_name):
    if weights is not None:
        raise ValueError("onnx_derivative: weights must be None with "
                         "DerivativeOptions.Loss (every float initializer is "
                         "differentiated).")
    if path_name is None:
        raise ValueError("onnx_derivative: path_name is required with "
                         "DerivativeOptions.Loss.")
    if label is None:
        raise ValueError("onnx_derivative: label is required with "
                         "DerivativeOptions.Loss.")
    if not isinstance(loss, str):
        raise ValueError("onnx_derivative: loss must be the name (str) of the "
                         f"loss output with DerivativeOptions.Loss, not {loss!r}.")
    outputs = [o.name for o in model.graph.output]
    if loss not in outputs:
        raise ValueError(f"onnx_derivative: loss {loss!r} is not an output of "
                         f"the model {outputs}.")
    labels = {label} if isinstance(label, str) else set(label)
    unknown = labels - {i.name for i in model.graph.input}
    if unknown:
        raise ValueError(f"onnx_derivative: label {sorted(unknown)} is not an "
                         "input of the model.")
    if isinstance(inputs, str):
        inputs = [inputs]
    if inputs is not None:
        inputs = [i for i in inputs if i not in labels]
    wrt = _wrt(model, None, inputs, exclude=labels)
    fused, bg = build_fused_model(model, wrt, outputs=[loss])
    _fill_output_grads(fused, bg.outputs, bg.grad_output_names)
    onnx.checker.check_model(fused)
    onnx.save(fused, path_name)
    return fused
