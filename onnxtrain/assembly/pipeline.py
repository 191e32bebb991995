"""The one pipeline every training graph goes through: prepare, reverse
pass, finish.

- :func:`prepare`: the running statistics' updates
  (:mod:`onnxtrain.graph.training_mode`), small-output Convs of trained
  weights lowered to one product (:mod:`onnxtrain.graph.conv_gemm`),
  LSTMs and GRUs of trained weights as Scans emitting their gates
  (:mod:`onnxtrain.graph.recurrent_lowering`), Dropouts that copy their input removed, Reshape targets known at build
  time written as constants (:mod:`onnxtrain.graph.static_shapes`), and
  the model's types inferred once per rewrite that adds values;
- :func:`reverse`: the one reverse pass (:func:`onnxtrain.autodiff.backward`)
  on the prepared model and its types;
- :func:`finish`: one node per value (CSE), the graph and its model at the
  prepared model's opsets, slow broadcasts avoided, and the checker.

The split path's models, the fused step, its loops (:mod:`.training_graphs`)
and the artifacts' training model (:mod:`onnxtrain.onnxblock._training`)
are thin builders over these three functions: each chooses the interface
(inputs, outputs) and writes its own nodes (loss, update, accumulation)
between them. A trainer prepares its model once per fit and builds every
graph of the fit from that one :class:`Prepared`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper

from ..autodiff import backward
from ..graph import infer_value_types, make_model, opset_of
from ..graph.broadcasts import avoid_slow_broadcasts
from ..graph.conv_gemm import convs_on_columns, lower_small_convs
from ..graph.cse import eliminate_common_subexpressions
from ..graph.identities import remove_identity_dropouts
from ..graph.recurrent_lowering import lower_recurrent
from ..graph.static_shapes import fold_reshape_targets
from ..graph.training_mode import with_running_statistics_updates

__all__ = ["Prepared", "prepare", "reverse", "forward_nodes", "finish"]


@dataclass
class Prepared:
    """A model ready for the reverse pass.

    Attributes
    ----------
    model : onnx.ModelProto
        The rewritten model; the caller's own copy when ``owned``.
    types : dict
        Its :func:`~onnxtrain.graph.infer_value_types`.
    buffers : list of str
        Running statistics every step updates without gradient (the model
        outputs their new values after its own outputs).
    owned : bool
        Whether ``model`` is a copy no one else holds (the reverse pass may
        then name optional outputs on its nodes).
    """

    model: object
    types: dict
    buffers: list = field(default_factory=list)
    owned: bool = False


def prepare(model, wrt, types=None, statistics=None, drop_identity_dropouts=False):
    """Rewrite ``model`` for training ``wrt``, its types inferred once per
    rewrite that adds values.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    wrt : list of str
        The trained weights (their small-output Convs, LSTMs and GRUs are
        lowered).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.
    statistics : dict, default=None
        Keyword arguments of
        :func:`~onnxtrain.graph.training_mode.with_running_statistics_updates`
        (``as_inputs``, ``node_statistics``); None: no rewrite (the caller
        did it, or the graph has none).
    drop_identity_dropouts : bool, default=False
        Whether the Dropouts copying their input leave the graph (no node,
        no gradient rule).

    Returns
    -------
    Prepared
    """
    types = infer_value_types(model) if types is None else types
    buffers, owned = [], False
    if statistics is not None:
        model, buffers, _ = with_running_statistics_updates(model, types=types,
                                                            **statistics)
        owned = True
        if buffers:  # values the model lacked
            types = infer_value_types(model)
    for lower in (lower_small_convs, lower_recurrent):
        lowered = lower(model, wrt, types)
        if lowered is not model:  # values of its own
            model, types, owned = lowered, infer_value_types(lowered), True
    if drop_identity_dropouts:
        # the types stay those of every value left
        model = remove_identity_dropouts(model, opset_of(model) or 1, in_place=owned)
        owned = True
    folded, types = fold_reshape_targets(model, types, in_place=owned)
    owned = owned or folded is not model
    return Prepared(folded, types, list(buffers), owned)


def reverse(prepared, wrt, outputs):
    """The reverse pass of ``outputs`` w.r.t. ``wrt`` on the prepared model
    with its types (no shape inference).

    Returns
    -------
    BackwardGraph
        Its ``model`` (or the prepared one when None) holds the forward
        nodes the gradient nodes read.
    """
    return backward(prepared.model, wrt, outputs=outputs, types=prepared.types,
                    in_place=prepared.owned)


def forward_nodes(prepared, bg):
    """The forward nodes of the reverse pass ``bg`` (with the optional
    outputs its rules read named), the Convs of small maps computed on
    their weight gradients' columns
    (:func:`~onnxtrain.graph.conv_gemm.convs_on_columns`: their constants
    join ``bg.builder``'s)."""
    return list(convs_on_columns(list((bg.model or prepared.model).graph.node),
                                 bg.builder, prepared.types, bg.wrt))


def finish(nodes, initializers, inputs, outputs, name, like, ir_version=None,
           keep=(), forward_types=None, check=False):
    """The training model of ``nodes``: one node per value, at the opsets
    of ``like``, with the slow broadcasts avoided.

    Parameters
    ----------
    nodes : list of NodeProto
        Forward, loss, backward and update nodes, in a topological order.
    initializers : list of TensorProto
    inputs, outputs : list of ValueInfoProto
        The interface (CSE never removes a name of it).
    name : str
        Graph name.
    like : onnx.ModelProto
        Gives the opset imports and the local functions.
    ir_version : int, default=None
        Default: ``like``'s.
    keep : list of str, default=()
        Names :func:`~onnxtrain.graph.broadcasts.avoid_slow_broadcasts`
        must leave read as they are.
    forward_types : dict, default=None
        Types of the forward values, known already.
    check : bool, default=False
        Whether to run :func:`onnx.checker.check_model`.

    Returns
    -------
    onnx.ModelProto
    """
    interface = [v.name for v in list(inputs) + list(outputs)]
    nodes, constants = eliminate_common_subexpressions(
        list(nodes), keep=interface, initializers=list(initializers))
    graph = helper.make_graph(nodes, name, list(inputs), list(outputs), constants)
    model = make_model(graph, list(like.opset_import),
                       ir_version=like.ir_version if ir_version is None else ir_version)
    model.functions.extend(like.functions)
    model = avoid_slow_broadcasts(model, keep=keep, forward_types=forward_types)
    if check:
        onnx.checker.check_model(model)
    return model
