"""Module: run the training and eval models of ``generate_artifacts``."""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import elem_type_to_numpy, infer_value_types
from ..onnxblock._training import EVAL_METADATA, TRAINING_METADATA
from ..runtime import (SessionRunner, is_ortvalue, ortvalue_dtype, parse_device,
                       to_numpy, to_ortvalue)

__all__ = ["Module"]


def load_model(uri):
    """A ModelProto from a path (str, pathlib.Path) or a ModelProto (copied)."""
    if isinstance(uri, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(uri)
        return copy
    return onnx.load(str(uri))


def read_layout(model, key, what):
    """The JSON layout onnxtrain wrote in ``model``'s metadata under ``key``.

    Raises
    ------
    ValueError
        If the model has none (it was not written by onnxtrain.artifacts).
    """
    for prop in model.metadata_props:
        if prop.key == key:
            return json.loads(prop.value)
    raise ValueError(f"The {what} has no {key!r} metadata: it was not written "
                     "by onnxtrain.artifacts.generate_artifacts.")


def input_specs(model, names):
    """``name -> (numpy dtype, shape, onnxruntime type)`` of the tensor
    inputs ``names`` of ``model``: shape is None when undeclared, else a
    tuple of int (static dims), str (symbolic dims) or None (unknown dims);
    the onnxruntime type is the string ``OrtValue.data_type()`` returns
    ("tensor(float)"...)."""
    infos = {vi.name: vi.type for vi in model.graph.input}
    specs = {}
    for name in names:
        if name not in infos or not infos[name].HasField("tensor_type"):
            continue
        tensor = infos[name].tensor_type
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(d.dim_value if d.dim_value > 0 else (d.dim_param or None)
                          for d in tensor.shape.dim)
        ort_type = f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"
        specs[name] = (elem_type_to_numpy(tensor.elem_type), shape, ort_type)
    return specs


def check_inputs(specs, names, values, what):
    """Check ``values`` against the declared types of the inputs ``names``
    (see :func:`input_specs`); returns them, arrays as numpy arrays.

    An array may differ from the input's dtype only by a cast within its
    kind or to a wider kind (``np.can_cast(..., 'same_kind')``: float64 to
    float32, int to float, not float to int); an OrtValue is fed as it is,
    so its dtype must be the input's. ``what`` names the model in messages.

    Raises
    ------
    TypeError
        A dtype that does not cast to the input's.
    ValueError
        A rank or a static dimension other than the declared one, or a
        symbolic dimension of different sizes in two inputs.
    """
    checked, sizes = [], {}
    for name, value in zip(names, values):
        if is_ortvalue(value):
            shape = tuple(value.shape())
            if name in specs and value.data_type() != specs[name][2]:
                raise TypeError(f"Input {name!r} of the {what} is "
                                f"{specs[name][0]}; got an OrtValue of "
                                f"{ortvalue_dtype(value)} (OrtValues are not cast).")
        else:
            value = np.asarray(value)
            dtype, shape = value.dtype, value.shape
            if name in specs and dtype != specs[name][0] \
                    and not np.can_cast(dtype, specs[name][0], "same_kind"):
                raise TypeError(f"Input {name!r} of the {what} is "
                                f"{specs[name][0]}; got {dtype}, which is not "
                                "cast to it (arrays are cast between floats, "
                                "between ints, and from bool or int to float).")
        checked.append(value)
        expected = specs[name][1] if name in specs else None
        if expected is None:
            continue
        if len(shape) != len(expected) or any(
                isinstance(e, int) and e != g for e, g in zip(expected, shape)):
            raise ValueError(f"Input {name!r} of the {what} has shape "
                             f"{expected}; got shape {tuple(shape)}.")
        for dim, size in zip(expected, shape):
            if isinstance(dim, str):
                first, seen = sizes.setdefault(dim, (name, size))
                if seen != size:
                    raise ValueError(
                        f"Inputs {first!r} and {name!r} of the {what} share "
                        f"dimension {dim!r}; got sizes {seen} and {size}.")
    return checked


class Module:
    """Train and evaluate the model of a set of training artifacts.

    Parameters
    ----------
    train_model_uri : str, pathlib.Path or onnx.ModelProto
        ``training_model.onnx`` written by
        :func:`onnxtrain.artifacts.generate_artifacts`.
    state : CheckpointState
        Holds the parameters; the module reads and updates them in place.
    eval_model_uri : str, pathlib.Path or onnx.ModelProto, default=None
        ``eval_model.onnx``; needed by :meth:`eval` mode calls and
        :meth:`export_model_for_inferencing`.
    device : str, default="cpu"
        "cpu", "cuda" or "cuda:N" (needs onnxruntime-gpu). Parameters,
        gradients and optimizer states stay on the device between calls.

    Raises
    ------
    ValueError
        If the state lacks a parameter of the model or holds one of another
        shape or dtype.
    DeviceError
        For an unknown or unavailable device.
    """

    def __init__(self, train_model_uri, state, eval_model_uri=None, device="cpu"):
        self._device = parse_device(device)
        self._models = {"train": load_model(train_model_uri)}
        self._layouts = {"train": read_layout(self._models["train"],
                                              TRAINING_METADATA, "training model")}
        if eval_model_uri is not None:
            self._models["eval"] = load_model(eval_model_uri)
            self._layouts["eval"] = read_layout(self._models["eval"],
                                                EVAL_METADATA, "eval model")
        self._state = state
        for mode in self._models:
            self._check_parameters(mode)
        self._input_specs = {
            mode: input_specs(model, self._layouts[mode]["user_inputs"])
            for mode, model in self._models.items()}
        self._training = True
        self._reset_grad = True
        self._runners = {}

    def _check_parameters(self, mode):
        model, layout = self._models[mode], self._layouts[mode]
        types = {vi.name: vi.type.tensor_type for vi in model.graph.input}
        for name in layout["parameters"]:
            if name not in self._state.parameters:
                raise ValueError(f"The checkpoint state has no parameter {name!r} "
                                 f"needed by the {mode} model.")
            param = self._state.parameters[name]
            dtype = elem_type_to_numpy(types[name].elem_type)
            shape = tuple(d.dim_value for d in types[name].shape.dim)
            if param.dtype != dtype or param.shape != shape:
                raise ValueError(
                    f"Parameter {name!r} of the state is {param.dtype} of shape "
                    f"{param.shape}; the {mode} model expects {dtype} of shape "
                    f"{shape}.")

    # modes -----------------------------------------------------------------
    def train(self, mode=True):
        """Set training mode (calls run the training model); returns self."""
        self._training = bool(mode)
        return self

    def eval(self):
        """Set eval mode (calls run the eval model); returns self."""
        return self.train(False)

    @property
    def training(self):
        """bool: whether the module is in training mode."""
        return self._training

    def _mode(self):
        if self._training:
            return "train"
        if "eval" not in self._models:
            raise RuntimeError("Eval mode needs the eval model: pass "
                               "eval_model_uri to Module.")
        return "eval"

    def _runner(self, mode):
        if mode not in self._runners:
            self._runners[mode] = SessionRunner(self._models[mode], self._device)
        return self._runners[mode]

    def input_names(self):
        """Names of the user inputs of the current mode's model (model inputs
        and loss targets, in call order)."""
        return list(self._layouts[self._mode()]["user_inputs"])

    def output_names(self):
        """Names of the outputs a call returns (the loss first)."""
        return list(self._layouts[self._mode()]["user_outputs"])

    # parameters --------------------------------------------------------------
    def _device_value(self, param):
        """The parameter's value as an OrtValue on the module's device."""
        value = param._value
        if isinstance(value, np.ndarray):
            value = to_ortvalue(value, self._device)
            param._value = value
        return value

    def _parameters(self, trainable_only):
        layout = self._layouts["train"]
        names = layout["trainable"] if trainable_only else layout["parameters"]
        return [self._state.parameters[n] for n in names]

    def get_parameters_size(self, trainable_only=True):
        """Number of parameter elements (int)."""
        return int(sum(int(np.prod(p.shape)) for p in self._parameters(trainable_only)))

    def get_contiguous_parameters(self, trainable_only=False):
        """All parameters flattened and concatenated in model order.

        Returns
        -------
        ndarray of shape (get_parameters_size(trainable_only),)

        Raises
        ------
        TypeError
            If the parameters have different dtypes.
        """
        params = self._parameters(trainable_only)
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise TypeError(f"Parameters have several dtypes {sorted(map(str, dtypes))}; "
                            "they cannot share one buffer.")
        return np.concatenate([p.data.reshape(-1) for p in params])

    def copy_buffer_to_parameters(self, buffer, trainable_only=True):
        """Copy a flat buffer (as from :meth:`get_contiguous_parameters`)
        into the parameters, in model order.

        Raises
        ------
        ValueError
            If the buffer size differs from :meth:`get_parameters_size`.
        """
        flat = np.asarray(to_numpy(buffer)).reshape(-1)
        expected = self.get_parameters_size(trainable_only)
        if flat.size != expected:
            raise ValueError(f"The buffer has {flat.size} elements; the "
                             f"parameters have {expected}.")
        start = 0
        for param in self._parameters(trainable_only):
            size = int(np.prod(param.shape))
            param.data = flat[start:start + size].reshape(param.shape)
            start += size

    # running ---------------------------------------------------------------
    def lazy_reset_grad(self):
        """Make the next training call overwrite the gradients instead of
        adding to them (they are reset lazily, inside that call)."""
        self._reset_grad = True

    def __call__(self, *user_inputs):
        """Run the training model (train mode) or the eval model.

        Parameters
        ----------
        *user_inputs : ndarray or OrtValue
            One per :meth:`input_names`, in that order. Arrays are cast to
            the input's dtype within their kind or to a wider one (float64
            to float32, int to float, not float to int); OrtValues are fed
            as they are and must have the input's dtype.

        Returns
        -------
        ndarray or tuple of ndarray
            The outputs of :meth:`output_names` (the loss first): an array
            when there is one, a tuple otherwise. In train mode, each
            trainable parameter's ``grad`` receives the gradient (added to the
            previous one unless :meth:`lazy_reset_grad` was called).

        Raises
        ------
        ValueError
            If the number of inputs differs from :meth:`input_names`, or an
            input's rank or a static dimension differs from the model's
            declared shape, or two inputs sharing a symbolic dimension
            (the batch) have different sizes along it (the message names
            the input, the expected and the received shape).
        TypeError
            If an array's dtype does not cast to the input's within its kind
            (float64 to float32 and int to float do; float to int, strings
            and objects do not) or an OrtValue has another dtype.
        RuntimeError
            In eval mode without an eval model.

        Every check runs before the model runs; parameters and gradients
        are left as they were when one fails.
        """
        mode = self._mode()
        layout = self._layouts[mode]
        names = layout["user_inputs"]
        if len(user_inputs) != len(names):
            raise ValueError(f"The {mode} model takes {len(names)} inputs "
                             f"{names}; got {len(user_inputs)}.")
        user_inputs = check_inputs(
            self._input_specs[mode], names, user_inputs,
            "training model" if mode == "train" else "eval model")
        feeds = dict(zip(names, user_inputs))
        for name in layout["parameters"]:
            feeds[name] = self._device_value(self._state.parameters[name])
        if mode == "train":
            self._feed_gradients(feeds, layout)
        outputs = self._runner(mode)(feeds)
        n_user = len(layout["user_outputs"])
        if mode == "train":
            for name, grad in zip(layout["trainable"], outputs[n_user:]):
                self._state.parameters[name]._grad = grad
            self._reset_grad = False
            _write_running_statistics(self._state, layout,
                                      outputs[n_user + len(layout["trainable"]):])
        results = tuple(to_numpy(o) for o in outputs[:n_user])
        return results[0] if len(results) == 1 else results

    def _feed_gradients(self, feeds, layout):
        reset = self._reset_grad
        for name, buffer in zip(layout["trainable"], layout["buffers"]):
            param = self._state.parameters[name]
            if param._grad is None:
                reset = True
                feeds[buffer] = to_ortvalue(np.zeros(param.shape, param.dtype),
                                            self._device)
            else:
                feeds[buffer] = param._grad
        feeds[layout["lazy_reset_grad"]] = np.array(reset, dtype=np.bool_)

    # export ------------------------------------------------------------------
    def export_model_for_inferencing(self, inference_model_uri, graph_output_names):
        """Write an inference model: the eval model's graph cut at
        ``graph_output_names``, with the current parameters as initializers.

        Parameters
        ----------
        inference_model_uri : str or pathlib.Path
        graph_output_names : list of str
            Values of the eval model (typically the original model outputs).

        Returns
        -------
        onnx.ModelProto
            The model written.

        Raises
        ------
        RuntimeError
            Without an eval model.
        ValueError
            If a name is not a value of the eval model.
        """
        if "eval" not in self._models:
            raise RuntimeError("Exporting needs the eval model: pass "
                               "eval_model_uri to Module.")
        model = _inference_model(self._models["eval"], self._layouts["eval"],
                                 list(graph_output_names), self._state.parameters)
        onnx.save(model, str(inference_model_uri))
        return model


def _write_running_statistics(state, layout, values):
    """Store the running statistics a training call updated (BatchNorm in
    training mode: see :mod:`onnxtrain.training_mode`) into the state."""
    for name, value in zip(layout.get("running_statistics", {}), values):
        state.parameters[name]._value = value


def _node_reads(node):
    """Inputs of a node, including names its subgraphs read from outside."""
    names = {i for i in node.input if i}
    for att in node.attribute:
        for graph in list(att.graphs) + ([att.g] if att.HasField("g") else []):
            inner = {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for sub in graph.node:
                names |= _node_reads(sub) - inner
                inner |= set(sub.output)
    return names


def _inference_model(eval_model, layout, output_names, parameters):
    graph = eval_model.graph
    produced = {o for n in graph.node for o in n.output}
    available = produced | {i.name for i in graph.input} | \
        {i.name for i in graph.initializer}
    unknown = [n for n in output_names if n not in available]
    if unknown:
        raise ValueError(f"graph_output_names {unknown} are not values of the "
                         "eval model.")
    needed, nodes = set(output_names), []
    for node in reversed(graph.node):
        if needed & set(node.output):
            nodes.append(node)
            needed |= _node_reads(node)
    nodes.reverse()
    params = set(layout["parameters"])
    types = infer_value_types(eval_model)
    inputs = [i for i in graph.input if i.name in needed and i.name not in params]
    inits = [i for i in graph.initializer if i.name in needed]
    inits += [numpy_helper.from_array(parameters[p].data, p)
              for p in layout["parameters"] if p in needed]
    outputs = []
    for name in output_names:
        elem, shape = types[name]
        shape = None if shape is None else [
            None if isinstance(d, str) and d.startswith("unk__") else d
            for d in shape]
        outputs.append(helper.make_tensor_value_info(name, elem, shape))
    new_graph = helper.make_graph(nodes, graph.name.replace("_eval", "") or "inference",
                                  inputs, outputs, inits)
    model = helper.make_model(new_graph, opset_imports=list(eval_model.opset_import),
                              producer_name="onnxtrain")
    model.ir_version = eval_model.ir_version
    model.functions.extend(eval_model.functions)
    onnx.checker.check_model(model)
    return model
