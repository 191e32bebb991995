"""Which initializers of a prediction graph are the model's weights.

A converted pipeline holds more float initializers than the predictor's
coefficients: a scaler's offsets and scales, PCA's mean and components,
constants of the arithmetic around the prediction (skl2onnx's ``unity``
in ``1 - p``). Training those by default changes what the pipeline does
to its input, or breaks the probabilities it outputs. :func:`default_weights`
tells them apart by the graph's structure, whatever the converter named
them:

- the *preprocessing* is the part of the graph that only reshapes, selects,
  imputes, encodes or applies constant affine maps to the data inputs
  (``ai.onnx.ml`` preprocessing ops, Cast, Concat, Add/Sub/Mul/Div with a
  constant, Gather of constant columns...), including a projection by a
  constant matrix without a bias (PCA, TruncatedSVD) that feeds another
  layer through affine ops only;
- a *layer* is a MatMul, Gemm, Conv or ConvTranspose with an initializer
  operand; its *bias* is Gemm's or Conv's third input, or a constant added
  to its output;
- the preprocessing constants are frozen when a layer reads the
  preprocessing's output (there is a predictor downstream); so are the
  one-element constants of elementwise arithmetic that are no layer's bias;
  a graph without a layer (elementwise weights only) freezes nothing.

Every other float initializer that reaches an output through
differentiable ops is trained.
"""
from __future__ import annotations

import math

from .autodiff import trainable_initializers
from .graph import FLOAT_TYPES
from .training_mode import running_statistics

__all__ = ["choose_weights", "default_weights"]

_LAYERS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
#: Default-domain ops that keep the preprocessing affine or only move,
#: select or convert values.
_PREPROCESSING = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Cast", "CastLike", "Identity",
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Transpose",
    "Gather", "Slice", "Split", "Expand"})
#: Ops of which a one-element initializer is an arithmetic constant.
_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
                         "Sum", "Mean", "Clip"})
_ML_DOMAIN = "ai.onnx.ml"


def _is_default(node):
    return node.domain in ("", "ai.onnx")


def _label(node):
    return f"{node.op_type} node {node.name!r}" if node.name else \
        f"{node.op_type} node"


class _Graph:
    """Consumers, constants and layers of a main graph."""

    def __init__(self, model):
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits = {i.name: i for i in graph.initializer}
        self.constants = set(self.inits) | {
            n.output[0] for n in self.nodes
            if n.op_type == "Constant" and _is_default(n)}
        # values computed from constants only (PCA's Sqrt of the explained
        # variance) are constants too
        self.folded = []
        for node in self.nodes:
            inputs = [i for i in node.input if i]
            if inputs and all(i in self.constants for i in inputs) and \
                    not node.op_type.startswith("Random"):
                self.constants.update(o for o in node.output if o)
                self.folded.append(node)
        self.consumers = {}
        for node in self.nodes:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}

    def data_inputs(self, node):
        return [i for i in node.input if i and i not in self.constants]

    def is_layer(self, node):
        return (_is_default(node) and node.op_type in _LAYERS
                and any(i in self.inits for i in node.input[:2])
                and bool(self.data_inputs(node)))

    def bias(self, layer):
        """The initializer added to the layer's output, or None."""
        if layer.op_type in ("Gemm", "Conv", "ConvTranspose") and \
                len(layer.input) > 2 and layer.input[2] in self.inits:
            return layer.input[2]
        for node in self.consumers.get(layer.output[0], []):
            if node.op_type == "Add" and _is_default(node):
                others = [i for i in node.input if i != layer.output[0]]
                if len(others) == 1 and others[0] in self.inits:
                    return others[0]
        return None

    def affine_step(self, node):
        """Whether ``node`` keeps data affine (an op of the preprocessing
        whose non-data inputs are constants)."""
        if node.domain == _ML_DOMAIN:
            return node.op_type in ("Scaler", "Normalizer", "Imputer",
                                    "ArrayFeatureExtractor", "FeatureVectorizer")
        if not _is_default(node) or node.op_type not in _PREPROCESSING:
            return False
        if node.op_type == "Gather":
            return node.input[0] not in self.constants
        if node.op_type in ("Mul", "Div"):
            return len(self.data_inputs(node)) == 1
        return True

    def is_projection(self, layer):
        """A layer without a bias whose output reaches another layer through
        affine steps only (PCA's components before the predictor)."""
        if self.bias(layer) is not None or layer.op_type != "MatMul":
            return False
        seen, todo, reached = set(), [layer.output[0]], False
        while todo:
            name = todo.pop()
            if name in self.outputs:
                return False
            for node in self.consumers.get(name, []):
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if self.is_layer(node):
                    reached = True
                elif self.affine_step(node):
                    todo.extend(o for o in node.output if o)
                else:
                    return False
        return reached


def _preprocessing(g):
    """``(nodes, fed)``: the ids of the preprocessing nodes (see the
    module) and whether a layer reads the data they or the graph inputs
    give."""
    produced = {o for node in g.nodes for o in node.output if o}
    values = {n for node in g.nodes for n in g.data_inputs(node)
              if n not in produced}  # the graph's data inputs
    prefix, fed = set(), False
    for node in g.nodes:
        inputs = g.data_inputs(node)
        if not inputs or not all(i in values for i in inputs):
            continue
        if g.is_layer(node):
            if not g.is_projection(node):
                fed = True
                continue
        elif not g.affine_step(node) and not (
                node.domain == _ML_DOMAIN and node.op_type not in (
                    "LinearClassifier", "LinearRegressor", "ZipMap")):
            continue
        prefix.add(id(node))
        values.update(o for o in node.output if o)
    # the constant computations only the preprocessing reads belong to it
    for node in reversed(g.folded):
        readers = [r for o in node.output if o for r in g.consumers.get(o, [])]
        if readers and all(id(r) in prefix for r in readers):
            prefix.add(id(node))
    return prefix, fed


def default_weights(model, types=None):
    """The weights a fine-tune trains by default, and why the others are not.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph trained (after the estimators' rewrites); not modified.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.

    Returns
    -------
    names : list of str
        The float initializers of
        :func:`~onnxtrain.autodiff.trainable_initializers` (graph order)
        but the running statistics of BatchNormalization nodes and the
        frozen constants below.
    frozen : dict
        ``name -> reason`` (a short sentence naming the node reading it)
        for every float initializer of the graph left out (integer
        tensors are never weights and are not listed): preprocessing
        constants, one-element arithmetic constants, running statistics,
        and initializers without a differentiable path to an output.
    """
    g = _Graph(model)
    trainable = trainable_initializers(model, types=types)
    statistics = set(running_statistics(model))
    prefix, fed = _preprocessing(g)
    frozen = {}
    layers = [n for n in g.nodes if g.is_layer(n)]
    biases = {g.bias(n) for n in layers} - {None}
    # without a predictor layer (a graph of elementwise weights), its
    # constants are the model: nothing is frozen
    predictor = any(not g.is_projection(n) for n in layers)
    floats = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    for node in g.nodes:
        for name in node.input:
            if name not in floats or name in frozen:
                continue
            if not predictor:
                break
            if fed and id(node) in prefix:
                frozen[name] = (f"preprocessing constant: read by the {_label(node)} "
                                "before the predictor")
            elif (_is_default(node) and node.op_type in _ARITHMETIC
                  and math.prod(g.inits[name].dims) == 1 and name not in biases):
                frozen[name] = (f"arithmetic constant of one element, read by the "
                                f"{_label(node)}, not a layer's bias")
    for name in statistics:
        frozen.setdefault(name, "running statistic of a BatchNormalization: "
                          "updated by the training steps, not by gradient")
    names = [n for n in trainable if n not in frozen]
    kept = set(trainable)
    for init in model.graph.initializer:
        if init.name in floats and init.name not in kept \
                and init.name not in frozen:
            frozen[init.name] = ("a constant of no rank, or no differentiable "
                                 "path to an output" if not init.dims else
                                 "no differentiable path to an output")
    return names, frozen


def choose_weights(model, weights_to_train=None, types=None):
    """``(names, frozen)``: the weights an estimator trains and
    ``name -> reason`` for the float initializers it leaves out.

    ``weights_to_train=None`` gives :func:`default_weights`; a list (or a
    name) is validated by :func:`~onnxtrain.models.select_weights` and wins
    over the default (the others are then frozen "not in
    weights_to_train").

    Raises
    ------
    ValueError
        What :func:`~onnxtrain.models.select_weights` raises: an unknown
        name, nothing to train (the message names the ops that stop the
        gradient).
    """
    from .models import select_weights

    if weights_to_train is None:
        names, frozen = default_weights(model, types)
        if names:
            return names, frozen
        # every candidate frozen: train them all rather than nothing
        # (select_weights raises when there is none, naming why)
        names = select_weights(model, None, types)
        return names, {k: v for k, v in frozen.items() if k not in set(names)}
    names = select_weights(model, weights_to_train, types)
    chosen = set(names)
    frozen = {i.name: "not in weights_to_train" for i in model.graph.initializer
              if i.data_type in FLOAT_TYPES and i.name not in chosen}
    return names, frozen
