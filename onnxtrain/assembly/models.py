"""Utilities on prediction models: loading, choosing the weights to train,
replacing initializers, converting scikit-learn models."""
from __future__ import annotations

import numbers
from collections import OrderedDict

import numpy as np
import onnx
from onnx import numpy_helper

from .._utils.files import read_onnx_model
from ..autodiff import is_nondifferentiable, trainable_initializers
from ..autodiff.backward import _dependents, _is_float, _node_inputs
from ..graph import FLOAT_TYPES, infer_value_types
from ..graph.scopes import rename_graph_values
from ..graph.training_mode import batchnorm_buffers, running_statistics

__all__ = ["load_model", "select_weights", "check_weights_reach_outputs",
           "get_train_initializer", "replace_initializers", "to_onnx",
           "add_loss_output", "onnx_rename_weights"]


def load_model(model):
    """A ModelProto from a ModelProto (returned as is), bytes or a path
    (:func:`onnxtrain._utils.files.read_onnx_model`; the entry points that build
    sessions from it check it with
    :func:`onnxtrain.runtime.checks.load_checked_model`).

    Raises
    ------
    TypeError
        For any other type.
    onnxtrain.exceptions.InvalidModelError
        A ValueError: bytes or a file that are not an ONNX model, external
        data that cannot be read (the message names the file or tensor).
    """
    return read_onnx_model(model, "model")


def select_weights(model, weights_to_train=None, types=None):
    """Validate ``weights_to_train`` against ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
    weights_to_train : list of str, default=None
        None selects :func:`onnxtrain.autodiff.trainable_initializers`
        except the running statistics of BatchNormalization nodes
        (:func:`onnxtrain.graph.training_mode.running_statistics`), which are
        never trained by gradient.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known
        (shape inference runs otherwise).

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        A name that is not a float initializer of the model (the message
        lists the candidates), a duplicate, nothing to train, the running
        statistic of a BatchNormalization in training mode (updated by each
        step, not trained), or weights
        none of which reaches a float output through differentiable ops
        (the message names the non-differentiable ops that stop their
        gradient).
    """
    statistics = set(running_statistics(model))
    candidates = [n for n in trainable_initializers(model, types=types)
                  if n not in statistics]
    if weights_to_train is None:
        if not candidates:
            _nothing_to_train(model, types)
        return candidates
    names = [weights_to_train] if isinstance(weights_to_train, str) else list(
        weights_to_train)
    floats = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    unknown = [n for n in names if n not in floats]
    if unknown:
        raise ValueError(f"weights_to_train {unknown} are not float initializers "
                         f"of the model; candidates: {candidates}.")
    if len(set(names)) != len(names):
        raise ValueError(f"weights_to_train has duplicates: {names}.")
    buffers = [n for n in batchnorm_buffers(model) if n in set(names)]
    if buffers:
        raise ValueError(
            f"weights_to_train {buffers} are running statistics of "
            "BatchNormalization nodes in training mode: each training step "
            "updates them with the momentum rule, they are not trained by "
            f"gradient. Leave them out; candidates: {candidates}.")
    if not names:
        raise ValueError("weights_to_train is empty: nothing to train.")
    if not set(names) & set(candidates):  # else one reaches: nothing to check
        check_weights_reach_outputs(model, names, types=types)
    return names


def _nothing_to_train(model, types):
    """Raise the ValueError of a model without weights to train, naming the
    ops that hold its parameters in attributes (ai.onnx.ml trees, SVMs...)
    or those where the gradient of its float initializers stops."""
    floats = [i.name for i in model.graph.initializer
              if i.data_type in FLOAT_TYPES and len(i.dims) > 0]
    if floats:
        check_weights_reach_outputs(model, floats, what="the float initializers",
                                    types=types)
    held = list(dict.fromkeys(
        f"{n.op_type} node {n.name!r}" if n.name else n.op_type
        for n in model.graph.node if n.domain == "ai.onnx.ml"
        and n.op_type not in ("ZipMap", "Scaler", "Normalizer", "Imputer",
                              "ArrayFeatureExtractor", "FeatureVectorizer",
                              "OneHotEncoder", "Binarizer", "LabelEncoder",
                              "CastMap", "DictVectorizer")))
    where = (f": its parameters are attributes of {', '.join(held)} "
             "(ai.onnx.ml), which onnxtrain does not train (it rewrites only "
             "LinearRegressor and LinearClassifier into trainable ops)"
             if held else "")
    raise ValueError("The model has no float initializer reaching its outputs "
                     f"through differentiable ops: nothing to train{where}.")


def check_weights_reach_outputs(model, names, outputs=None,
                                what="weights_to_train", target="the outputs",
                                types=None):
    """Raise ValueError when no weight of ``names`` reaches ``outputs``
    through differentiable ops, the case where
    :func:`onnxtrain.autodiff.backward` finds nothing to differentiate.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    names : list of str
        The weights.
    outputs : list of str, default=None
        Default: the graph outputs (only float ones have gradients).
    what, target : str
        How the message calls ``names`` and ``outputs``.
    types : dict, default=None
        The model's :func:`~onnxtrain.graph.infer_value_types` (computed
        when None).

    Raises
    ------
    ValueError
        Naming the weights and the ops where their gradient stops: ops
        declared non-differentiable (Floor, ArgMax, Shape...) or producing
        no float value (a Cast to an integer type; TopK, whose values are
        float, is not one).
    """
    types = infer_value_types(model) if types is None else types
    ends = set(outputs or [o.name for o in model.graph.output])
    differentiable = _dependents(model.graph.node, names, types)
    if any(o in differentiable for o in ends if _is_float(types, o)):
        return
    # the message: where the gradient stops, whether the weights reach at all
    reached, stops = set(names), []
    for node in model.graph.node:
        inputs = _node_inputs(node)
        produced = [o for o in node.output if o]
        if reached & set(inputs):
            reached.update(produced)
        if any(i in differentiable for i in inputs) and (
                is_nondifferentiable(node.op_type, node.domain)
                or not any(_is_float(types, o) for o in produced)):
            stops.append(node)  # not TopK: its values are float
    if not reached & ends or not stops:
        raise ValueError(f"{what} {names} do not reach {target}: nothing to "
                         "train.")
    ops = list(dict.fromkeys(
        f"{n.op_type} node {n.name!r}" if n.name else n.op_type for n in stops))
    raise ValueError(
        f"{what} {names} reach {target} only through non-differentiable ops "
        f"({', '.join(ops)}): their gradient is zero, nothing to train.")


def get_train_initializer(model):
    """Float initializers of ``model`` that training can change.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        The model, its serialized bytes or a path to an ONNX file (see
        :func:`load_model`); not modified.

    Returns
    -------
    OrderedDict
        ``name -> (numpy.ndarray, onnx.TensorProto)`` for every float
        initializer reaching an output through differentiable ops, in graph
        order (the layout onnxcustom's function of the same name returned).
        The TensorProtos are the model's own (not copies). Integer and
        rank-0 initializers are left out (see
        :func:`onnxtrain.autodiff.trainable_initializers`).

    Raises
    ------
    TypeError
        If ``model`` is not a ModelProto, bytes or a path.
    FileNotFoundError
        If the path does not exist.
    """
    model = load_model(model)
    keep = set(trainable_initializers(model))
    return OrderedDict((i.name, (numpy_helper.to_array(i), i))
                       for i in model.graph.initializer if i.name in keep)


def replace_initializers(model, values):
    """A copy of ``model`` whose initializers ``values`` (name -> array) are
    replaced, each cast to the initializer's element type.

    Raises
    ------
    ValueError
        A name that is not an initializer, or a shape change.
    """
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inits = {i.name: i for i in new.graph.initializer}
    for name, value in values.items():
        if name not in inits:
            raise ValueError(f"{name!r} is not an initializer of the model.")
        old = inits[name]
        array = np.asarray(value).astype(
            onnx.helper.tensor_dtype_to_np_dtype(old.data_type), copy=False)
        if tuple(array.shape) != tuple(old.dims):
            raise ValueError(f"Initializer {name!r} has shape {tuple(old.dims)}, "
                             f"the new value {array.shape}.")
        old.CopyFrom(numpy_helper.from_array(array, name))
    return new


def to_onnx(model, X=None, name=None, initial_types=None, target_opset=None,
            options=None, rewrite_ops=False, white_op=None, black_op=None,
            final_types=None, verbose=0):
    """Convert a fitted scikit-learn model with skl2onnx.

    Takes mlprodict's ``to_onnx`` parameters, in its order, so that code
    written for it runs with its import changed; every one but
    ``rewrite_ops`` goes to :func:`skl2onnx.to_onnx`.

    Parameters
    ----------
    model : fitted scikit-learn estimator
    X : numpy.ndarray, default=None
        A sample of the input (gives the input type and number of
        features); needed when ``initial_types`` is None.
    name : str, default=None
        Name of the graph.
    initial_types : list of (str, skl2onnx type), default=None
        The inputs, instead of ``X``.
    target_opset : int or dict, default=None
        Default-domain opset, or domain -> opset (skl2onnx's latest tested
        one when None).
    options : dict, default=None
        skl2onnx converter options (``{'zipmap': False}``...).
    rewrite_ops : bool, default=False
        mlprodict replaced some of skl2onnx's converters by its own with
        True; onnxtrain has no other converters, so skl2onnx's are used
        either way.
    white_op, black_op : set of str, default=None
        Op types the converters may use / must avoid: with
        ``black_op={'LinearRegressor'}`` a linear model becomes MatMul and
        Add over trainable initializers.
    final_types : list of (str, skl2onnx type), default=None
        The outputs' names and types.
    verbose : int, default=0

    Returns
    -------
    onnx.ModelProto
        skl2onnx's graph of ``model``.

    Raises
    ------
    RuntimeError
        skl2onnx's error when no converter avoids the ops of ``black_op``.
    ValueError
        If the converted graph still contains an op of ``black_op``.
    """
    from skl2onnx import to_onnx as skl2onnx_to_onnx

    onx = skl2onnx_to_onnx(model, X, name=name, initial_types=initial_types,
                           target_opset=target_opset, options=options,
                           white_op=white_op, black_op=black_op,
                           final_types=final_types, verbose=verbose)
    banned = sorted({n.op_type for n in onx.graph.node} & set(black_op or ()))
    if banned:
        raise ValueError(f"The converted graph contains the forbidden ops "
                         f"{banned} (black_op={sorted(black_op)}).")
    return onx


def onnx_rename_weights(model):
    """A copy of ``model`` whose initializers are renamed ``I{i}_{name}`` in
    graph order (``i`` zero-padded to the number of digits of their count),
    so that alphabetical order is graph order: onnxcustom's function of the
    same name (the names its tests and examples use, e.g. 'I0_coef').

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Not modified.

    Returns
    -------
    onnx.ModelProto
        Node inputs of the main graph and of its subgraphs are renamed with
        the initializers.
    """
    new = onnx.ModelProto()
    new.CopyFrom(load_model(model))
    names = [i.name for i in new.graph.initializer]
    width = len(str(max(len(names) - 1, 0)))
    rename = {n: f"I{i:0{width}d}_{n}" for i, n in enumerate(names)}
    for init in new.graph.initializer:
        init.name = rename[init.name]
    rename_graph_values(new.graph, rename)
    return new


#: add_loss_output's score names (onnxcustom's) -> onnxtrain loss names.
_SCORE_NAMES = {"squared_error": "square_error", "l2": "square_error",
                "absolute_error": "absolute_error", "l1": "absolute_error",
                "elastic": "elastic_error"}


def add_loss_output(model, score_name="squared_error", loss_name="loss",
                    label_name="label", weight_name=None, penalty=None,
                    output_index=None, **kwargs):
    """A training graph computing the loss of a prediction graph
    (onnxcustom's ``add_loss_output``, same parameters).

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Prediction graph; not modified.
    score_name : str or loss object, default='squared_error'
        'squared_error' / 'l2', 'absolute_error' / 'l1', 'elastic'
        (``kwargs`` ``l1_weight``, ``l2_weight``, default 0.5 each), 'log'
        (binary log loss of a probability output of shape (N, 2) or (N, 1)
        against int64 labels of shape (N, 1); ``kwargs`` ``eps``, default
        1e-6), any name of :func:`onnxtrain.losses.resolve_learning_loss`
        or a loss object. Every loss is a (weighted) mean over the rows.
    loss_name : str, default='loss'
        The new output: the rank-0 batch loss.
    label_name : str, default='label'
        New input receiving the expected values (the prediction's shape;
        int64 (N, 1) for 'log'). A tensor of the model computed under that
        name (skl2onnx's classifiers output 'label') is renamed first.
    weight_name : str, default=None
        New input receiving sample weights of shape (N,), if given.
    penalty : dict, default=None
        ``{name: {'l1': a, 'l2': b}}`` or ``{name: b}`` (l2 only): adds
        ``a * sum(|w|) + b * sum(w ** 2)`` of the initializer or input
        ``name`` to the loss.
    output_index : int or str, default=None
        The output holding the prediction (position or name); None when the
        model has a single output.
    **kwargs
        Parameters of the loss named by ``score_name``.

    Returns
    -------
    onnx.ModelProto
        Inputs: the model's inputs, ``label_name`` (and ``weight_name``);
        outputs: ``loss_name``, then the prediction.

    Raises
    ------
    ValueError
        ``output_index`` missing with several outputs or naming no output,
        an unknown score name, 'log' on more than two columns, names
        colliding with inputs or initializers of the model, penalties on
        unknown names.
    TypeError
        ``kwargs`` with a loss object, or ``output_index`` of another type.
    """
    from ..graph import infer_value_types, opset_of

    base = load_model(model)
    index = _prediction_index(base, output_index)
    learning_loss, binary = _score_loss(score_name, kwargs)
    names = [n for n in (label_name, weight_name, loss_name) if n]
    if len(set(names)) != len(names):
        raise ValueError(f"add_loss_output: label_name, weight_name and "
                         f"loss_name must differ, got {names}.")
    base = _free_names(base, names)
    prediction = base.graph.output[index].name
    elem_type, shape = infer_value_types(base)[prediction]
    rank = 2 if shape is None else len(shape)
    opset = max(opset_of(base) or 9, 9)
    nodes, inits, inputs = [], [], []
    if binary:
        prediction, label_type = _binary_column(base, prediction, shape, nodes,
                                                inits, label_name, elem_type)
        rank = 2
    loss_model = onnx.compose.add_prefix(
        learning_loss.build_onnx(elem_type, opset, weight_name=weight_name,
                                 rank=rank), "loss__")
    unpenalized = "loss__Y" if penalty else loss_name
    rename = {"loss__X1": f"{label_name}__cast" if binary else label_name,
              "loss__X2": prediction, "loss__Y": unpenalized}
    if weight_name:
        rename[f"loss__{weight_name}"] = weight_name
    for node in loss_model.graph.node:
        nodes.append(onnx.helper.make_node(
            node.op_type, [rename.get(i, i) for i in node.input],
            [rename.get(o, o) for o in node.output], name=node.name,
            domain=node.domain, **{a.name: onnx.helper.get_attribute_value(a)
                                   for a in node.attribute}))
    for vi in loss_model.graph.input:
        if vi.name == "loss__X1" and binary:
            inputs.append(onnx.helper.make_tensor_value_info(
                label_name, onnx.TensorProto.INT64, label_type))
        elif rename.get(vi.name) != prediction:
            inputs.append(onnx.helper.make_value_info(rename[vi.name], vi.type))
    if penalty:
        _add_penalty(base, penalty, unpenalized, loss_name, elem_type, nodes, inits)
    graph = onnx.helper.make_graph(
        list(base.graph.node) + nodes, base.graph.name,
        list(base.graph.input) + inputs,
        [onnx.helper.make_tensor_value_info(loss_name, elem_type, []),
         base.graph.output[index]],
        list(base.graph.initializer) + list(loss_model.graph.initializer) + inits)
    new = onnx.helper.make_model(graph, opset_imports=list(base.opset_import))
    new.ir_version = base.ir_version
    for key in ("producer_name", "producer_version", "domain", "model_version",
                "doc_string"):
        setattr(new, key, getattr(base, key))
    new.metadata_props.extend(base.metadata_props)
    return new


def _prediction_index(model, output_index):
    outputs = [o.name for o in model.graph.output]
    if output_index is None:
        if len(outputs) != 1:
            raise ValueError(f"add_loss_output: the model has outputs {outputs}; "
                             "output_index must say which one is the prediction.")
        return 0
    if isinstance(output_index, str):
        if output_index not in outputs:
            raise ValueError(f"add_loss_output: output_index={output_index!r} is "
                             f"not an output of the model: {outputs}.")
        return outputs.index(output_index)
    if isinstance(output_index, numbers.Integral) and not isinstance(output_index, bool):
        if not -len(outputs) <= output_index < len(outputs):
            raise ValueError(f"add_loss_output: output_index={output_index} but "
                             f"the model has {len(outputs)} outputs {outputs}.")
        return int(output_index) % len(outputs)
    raise TypeError(f"output_index must be None, an int or a str, got "
                    f"{type(output_index).__name__}.")


def _score_loss(score_name, kwargs):
    """(loss object, whether it is the binary log loss on probabilities)."""
    from ..losses.learning_losses import (BaseLearningLoss, NegLogLearningLoss,
                                          resolve_learning_loss)

    if isinstance(score_name, BaseLearningLoss):
        if kwargs:
            raise TypeError(f"add_loss_output: {sorted(kwargs)} cannot be given "
                            "with a loss object.")
        return resolve_learning_loss(score_name), False
    if score_name == "log":
        return NegLogLearningLoss(probability_function=None,
                                  **{"eps": 1e-6, **kwargs}), True
    loss = resolve_learning_loss(_SCORE_NAMES.get(score_name, score_name))
    return loss.set_params(**kwargs), False


def _free_names(model, names):
    """A copy of ``model`` where tensors computed by nodes under one of
    ``names`` are renamed (``{name}__model``), so the new inputs and output
    can take those names.

    Raises
    ------
    ValueError
        A name that is an input or an initializer of the model.
    """
    fixed = {i.name for i in model.graph.input} | {
        i.name for i in model.graph.initializer}
    clash = [n for n in names if n in fixed]
    if clash:
        raise ValueError(f"add_loss_output: names {clash} are inputs or "
                         "initializers of the model.")
    produced = {o for n in model.graph.node for o in n.output}
    taken = produced | fixed | {o.name for o in model.graph.output}
    rename = {}
    for name in names:
        if name in produced:
            new = f"{name}__model"
            while new in taken:
                new += "_"
            taken.add(new)
            rename[name] = new
    if not rename:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rename_graph_values(copy.graph, rename)
    return copy


def _binary_column(model, prediction, shape, nodes, inits, label_name, elem_type):
    """Nodes taking the positive-class probability (N, 1) of a probability
    output (N, 2) or (N, 1) and casting the int64 label; returns its name and
    the label's shape."""
    width = None if shape is None or len(shape) != 2 else shape[1]
    if shape is not None and (len(shape) != 2 or width not in (1, 2, None)):
        raise ValueError(f"add_loss_output: score_name='log' needs binary "
                         f"probabilities of shape (N, 2) or (N, 1), the output "
                         f"{prediction!r} has shape {shape}.")
    column = f"{prediction}__positive"
    starts, ends, axes = (f"{column}__{k}" for k in ("starts", "ends", "axes"))
    inits.extend([numpy_helper.from_array(np.array([-1], dtype=np.int64), starts),
                  numpy_helper.from_array(np.array([2 ** 62], dtype=np.int64), ends),
                  numpy_helper.from_array(np.array([1], dtype=np.int64), axes)])
    nodes.append(onnx.helper.make_node("Slice", [prediction, starts, ends, axes],
                                       [column]))
    nodes.append(onnx.helper.make_node("Cast", [label_name], [f"{label_name}__cast"],
                                       to=elem_type))
    return column, [None if shape is None else shape[0], 1]


def _add_penalty(model, penalty, loss, output, elem_type, nodes, inits):
    """Nodes adding ``l1 * sum|w| + l2 * sum(w^2)`` per weight of ``penalty``
    to ``loss`` under the name ``output``."""
    known = {i.name for i in model.graph.initializer} | {
        i.name for i in model.graph.input}
    unknown = sorted(set(penalty) - known)
    if unknown:
        raise ValueError(f"add_loss_output: penalty on {unknown}, which are not "
                         "initializers or inputs of the model.")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    total = loss
    for i, (name, value) in enumerate(penalty.items()):
        coefs = {"l2": value} if isinstance(value, numbers.Real) else dict(value)
        for kind, coef in coefs.items():
            if kind not in ("l1", "l2"):
                raise ValueError(f"add_loss_output: penalty[{name!r}] keys must "
                                 f"be 'l1' or 'l2', got {kind!r}.")
            prefix = f"penalty__{i}_{kind}"
            inits.append(numpy_helper.from_array(np.array(coef, dtype=dtype),
                                                 f"{prefix}__coef"))
            op = "Abs" if kind == "l1" else "Mul"
            nodes.extend([
                onnx.helper.make_node(op, [name] * (1 if kind == "l1" else 2),
                                      [f"{prefix}__term"]),
                onnx.helper.make_node("ReduceSum", [f"{prefix}__term"],
                                      [f"{prefix}__sum"], keepdims=0),
                onnx.helper.make_node("Mul", [f"{prefix}__sum", f"{prefix}__coef"],
                                      [f"{prefix}__value"]),
                onnx.helper.make_node("Add", [total, f"{prefix}__value"],
                                      [f"{prefix}__total"])])
            total = f"{prefix}__total"
    nodes.append(onnx.helper.make_node("Identity", [total], [output]))
