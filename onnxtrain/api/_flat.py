"""One optimizer update over all parameters at once, on the CPU.

The optimizer model of ``generate_artifacts`` repeats the update's ops for
every parameter: the AdamW model of a 2-layer encoder runs about 560 small
kernels per step, each costing a few microseconds whatever its size. When
the given model's graph is still the one
:func:`~onnxtrain.onnxblock.optim.build_optimizer_model` wrote for a
standard optimizer (its digest, constants included, recorded in the
model's metadata: a clipped, edited or foreign model is run as it is),
:class:`~onnxtrain.api.Optimizer` runs the same update built for one
parameter holding them all. Every parameter, gradient and
optimizer state is then a view of one flat buffer per kind, so that no
copy joins or splits them: the module writes each gradient into its view,
the update writes the parameters and states in place (PyTorch's
``foreach`` optimizers group their kernels in the same spirit).

The update runs over *segments* of those buffers, consecutive ranges of
at most :data:`SEGMENT_SIZE` elements, as few as that allows and of equal
sizes, whatever the parameters' bounds (the update is element-wise: small
parameters share a segment, a large one spans several), rather than over
each buffer whole: the temporaries of one segment's ops then stay in the
processor's caches for the next op to read, where the whole buffer's went
to memory and came back; one kernel per op and parameter would cost more
than it saves. The arena of the optimizer's session keeps blocks for one
segment's temporaries: their size is bounded whatever the model's largest
parameter (a parameter of its own segment made them as large as it).
"""
from __future__ import annotations

import numpy as np
import onnx

from ..graph import elem_type_to_numpy, opset_of
from ..onnxblock import optim
from ..runtime import to_numpy, to_ortvalue
from ..runtime.segmented_update import SEGMENT_SIZE, segment_sizes

__all__ = ["flat_optimizer_model", "FlatBuffers", "segment_sizes",
           "segment_name", "FLAT_NAME", "SEGMENT_SIZE"]

#: Prefix of the names of the parameters of the flat optimizer model.
FLAT_NAME = "parameters"


def segment_name(index):
    """Name of the ``index``-th parameter of the flat optimizer model."""
    return f"{FLAT_NAME}_{index}"


def _block(layout):
    """The optimizer block the metadata describes, or None."""
    hyper = layout.get("hyperparameters") or {}
    if layout.get("optimizer") == "SGD" and not hyper:
        return optim.SGD()
    if layout.get("optimizer") == "AdamW":
        try:
            return optim.AdamW(betas=tuple(hyper["betas"]), eps=hyper["eps"],
                               weight_decay=hyper["weight_decay"],
                               bias_correction=hyper["bias_correction"])
        except (KeyError, TypeError, ValueError):
            return None
    return None


def _unedited(model, layout, specs):
    """Whether ``model``'s graph is the one ``build_optimizer_model`` wrote
    (its digest in the metadata) for the parameters ``specs``."""
    if layout.get("graph_digest") != optim.graph_digest(model):
        return False
    declared = {i.name: i.type.tensor_type for i in model.graph.input}
    for name, elem, shape in specs:
        tensor = declared.get(name)
        if tensor is None or tensor.elem_type != elem or \
                [d.dim_value for d in tensor.shape.dim] != list(shape):
            return False
    return True


def flat_optimizer_model(model, layout, specs):
    """The optimizer model of ``model``'s update for one parameter per
    segment of ``specs``' elements (:func:`segment_sizes`), or None.

    Parameters
    ----------
    model : onnx.ModelProto
        The optimizer model given to :class:`~onnxtrain.api.Optimizer`.
    layout : dict
        Its :data:`~onnxtrain.onnxblock.optim.OPTIMIZER_METADATA`.
    specs : list of (str, int, tuple)
        Name, ONNX element type and shape of each parameter, in the model's
        order.

    Returns
    -------
    onnx.ModelProto or None
        Inputs ``learning_rate``, ``step`` and for each segment ``k``
        :func:`segment_name` ``(k)``, its ``_grad`` and one ``.<state>`` per
        state (1-D, of the segment's size); None unless every parameter has the
        same element type and ``model``'s graph is, by the digest its
        metadata records, what
        :func:`~onnxtrain.onnxblock.optim.build_optimizer_model` built for
        the metadata's optimizer and ``specs``.
    """
    if not isinstance(model, onnx.ModelProto) or not specs or \
            len({elem for _, elem, _ in specs}) != 1:
        return None
    block = _block(layout)
    if block is None or list(block.state_names) != list(layout.get("states", ())):
        return None
    if not _unedited(model, layout, specs):
        return None
    opset = opset_of(model)
    sizes = segment_sizes([int(np.prod(shape, dtype=np.int64)) for _, _, shape in specs],
                          SEGMENT_SIZE)
    return optim.build_optimizer_model(
        block, [(segment_name(k), specs[0][1], [n]) for k, n in enumerate(sizes)], opset)


class FlatBuffers:
    """One flat host buffer per kind (parameters, gradients, each state),
    each parameter's value, gradient and states being OrtValues over views
    of them, and the flat model's feeds: OrtValues over each segment
    (:func:`segment_sizes`) of the buffers.

    Parameters
    ----------
    names : list of str
    shapes : list of tuple
    elem_type : int
        ONNX element type of them all.
    state_names : list of str
    """

    def __init__(self, names, shapes, elem_type, state_names):
        dtype = elem_type_to_numpy(elem_type)
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        total, offsets = sum(sizes), np.cumsum([0] + sizes)
        self.names, self.state_names = list(names), list(state_names)
        kinds = ["value", "grad"] + self.state_names
        self.flat = {k: np.zeros(total, dtype=dtype) for k in kinds}
        # kind -> name -> OrtValue over the parameter's slice of the buffer
        self.views = {k: {n: to_ortvalue(self.flat[k][a:b].reshape(shape))
                          for n, a, b, shape in zip(names, offsets[:-1], offsets[1:], shapes)}
                      for k in kinds}
        # the flat model's inputs, views of each segment, and the outputs
        # written over them
        self.feeds, self.into = {}, {}
        ends = np.cumsum([0] + segment_sizes(sizes, SEGMENT_SIZE))
        for k, (a, b) in enumerate(zip(ends[:-1], ends[1:])):
            name = segment_name(k)
            inputs = {name: "value", f"{name}_grad": "grad"}
            inputs.update((f"{name}.{key}", key) for key in self.state_names)
            for input_name, kind in inputs.items():
                view = to_ortvalue(self.flat[kind][a:b])
                self.feeds[input_name] = view
                if kind != "grad":
                    self.into[f"{input_name}.updated"] = view

    def attach(self, params, states):
        """:meth:`sync` now (the parameters' and states' own arrays are then
        freed) and give every parameter its gradient view as the buffer the
        module's first training call writes into (``Parameter._grad_buffer``):
        no gradient is allocated twice."""
        for name in self.names:
            params.raw(name)._grad_buffer = self.views["grad"][name]
        self.sync(params, states)

    def sync(self, params, states):
        """Make every parameter's value and gradient and every state the
        view of its buffer, copying in the values held elsewhere (a
        parameter assigned by the user, a first gradient the module
        allocated, states from a checkpoint). Views already in place are
        left as they are: after the first step, nothing is copied."""
        for name in self.names:
            param = params.raw(name)
            param._value = self._install("value", name, param._value)
            if param._grad is not None:
                param._grad = self._install("grad", name, param._grad)
            for key in self.state_names:
                states[name][key] = self._install(key, name, states[name][key])

    def _install(self, kind, name, value):
        """The view of ``kind`` for ``name`` holding ``value`` (None, a
        parameter of a nominal checkpoint not loaded yet, stays None)."""
        view = self.views[kind][name]
        if value is None:
            return None
        if value is not view:
            np.copyto(view.numpy(), to_numpy(value))
        return view
