"""The update of big weights over segments, after the fused step.

Inside the fused step graph, onnxruntime gives every element-wise
operation of a weight's update a temporary as large as the weight: about
three of them for Adam, more than one for momentum, whatever the
formulation (the update reads outer-scope values it may not overwrite).
For a weight of tens of MiB that is the step's peak. PyTorch's optimizers
update in place with no such temporaries.

So on the CPU, the fused step leaves the update of each weight of at least
:data:`DEFERRED_MIN_ELEMENTS` elements out (it outputs the weight's
gradient into a buffer kept from step to step) and
:class:`SegmentedUpdate` applies it afterwards, over consecutive segments
of at most :data:`SEGMENT_SIZE` elements bound by
address: the weight, its gradient and its states in place, the
temporaries one segment large. The update rule must be element-wise and
read no penalty value (:func:`deferred_weights`), so that segments are
independent and the step's loss needs nothing from them.
"""
from __future__ import annotations

import numpy as np

from ..graph import elem_type_to_numpy
from ..graph.aliasing import writes_after_reads
from ..losses.penalties import BaseLearningPenalty
from ..optim.update_rules import AdamRule, AdamWRule, MomentumRule, SGDRule
from .sessions import make_session, ortvalue_dtype, to_ortvalue

__all__ = ["DEFERRED_MIN_ELEMENTS", "SEGMENT_SIZE", "SegmentedUpdate",
           "deferred_weights", "segment_sizes", "segment_update_model"]

#: Most elements of a segment: a size for which one kernel's temporary
#: stays in a server processor's last-level cache.
SEGMENT_SIZE = 1 << 20

#: Weights of at least this many elements (16 MiB in float32) are updated
#: by :class:`SegmentedUpdate`: below, the fused update's temporaries are
#: small and the separate runs cost more than they save.
DEFERRED_MIN_ELEMENTS = 1 << 22

#: Update rules whose nodes are element-wise (the learning-rate objects'
#: own, exactly: a chain's links may read a whole gradient, as norm
#: clipping does, and a subclass may change the update).
_ELEMENTWISE_RULES = frozenset({SGDRule, MomentumRule, AdamRule, AdamWRule})

#: Name of the segment model's parameter (its gradient and states follow
#: the update models' naming: ``param_grad``, ``param_<state>``).
_PARAM = "param"


def segment_sizes(sizes, maximum=None):
    """Sizes of the segments of the flat buffers of parameters of sizes
    ``sizes``: the fewest consecutive ranges of at most ``maximum``
    elements, of equal sizes (to one element), regardless of where a
    parameter ends.

    Parameters
    ----------
    sizes : list of int
        Number of elements of each parameter, in the buffers' order.
    maximum : int, default=None
        None: :data:`SEGMENT_SIZE`.

    Returns
    -------
    list of int
        Elements of each segment; their sum is ``sum(sizes)`` (one segment
        of 0 elements for no element).
    """
    maximum = SEGMENT_SIZE if maximum is None else maximum
    total = int(sum(sizes))
    count = max(1, -(-total // maximum))
    base, extra = divmod(total, count)
    return [base + 1] * extra + [base] * (count - extra)


def _inert(penalty):
    """Whether ``penalty`` adds nothing (None or the base class's no-op)."""
    return penalty is None or type(penalty).penalize is BaseLearningPenalty.penalize


def deferred_weights(learning_rate, shapes, penalty=None, penalized=(),
                     minimum=None):
    """The weights whose update :class:`SegmentedUpdate` may apply.

    Parameters
    ----------
    learning_rate : BaseLearningRate
    shapes : dict
        Weight name -> shape (a dimension None or a str: unknown).
    penalty : BaseLearningPenalty, default=None
    penalized : collection of str, default=()
        The weights ``penalty`` applies to.
    minimum : int, default=None
        Fewest elements of a deferred weight; None:
        :data:`DEFERRED_MIN_ELEMENTS`.

    Returns
    -------
    list of str
        The weights of static shape and at least ``minimum`` elements that
        no active penalty reads, in ``shapes``' order; empty unless
        ``learning_rate``'s rule is one of the element-wise rules (SGD,
        momentum, Adam/AdamW: not a chain of links).
    """
    if type(learning_rate.update_rule()) not in _ELEMENTWISE_RULES:
        return []
    minimum = DEFERRED_MIN_ELEMENTS if minimum is None else minimum
    penalized = frozenset() if _inert(penalty) else frozenset(penalized)
    chosen = []
    for name, shape in shapes.items():
        if shape is None or any(not isinstance(d, (int, np.integer)) or d <= 0
                                for d in shape):
            continue
        if int(np.prod(shape, dtype=np.int64)) >= minimum and name not in penalized:
            chosen.append(name)
    return chosen


def segment_update_model(learning_rate, elem_type, opset=None):
    """The update of one segment: ``learning_rate``'s update model for a 1-D
    parameter of any length, or None when an output could not be written
    over its input (:func:`~onnxtrain.graph.aliasing.writes_after_reads`).

    Parameters
    ----------
    learning_rate : BaseLearningRate
        Its :meth:`~onnxtrain.optim.BaseLearningRate.update_model`, with
        no penalty.
    elem_type : int
        ONNX element type of the weights (float16, float32 or float64).
    opset : int, default=None
        The model's opset (None: the update models' default, 17).

    Returns
    -------
    onnx.ModelProto or None
        Inputs: the rank-0 scalars of the update models (``scalar_names``,
        ``loss``, ``penalty_scale``), ``param``, ``param_grad`` and
        ``param_<state>`` per state; outputs ``param_new``,
        ``param_<state>_new``, ``loss_total``.
    """
    model = learning_rate.update_model([(_PARAM, ["segment"])], elem_type, opset)
    pairs = [(_PARAM, f"{_PARAM}_new")] + [
        (f"{_PARAM}_{s}", f"{_PARAM}_{s}_new") for s in learning_rate.state_names]
    if len(writes_after_reads(model.graph, pairs)) != len(pairs):
        return None
    return model


class SegmentedUpdate:
    """Runs :func:`segment_update_model` over the segments of big weights,
    writing each weight and state in place.

    Parameters
    ----------
    model : onnx.ModelProto
        From :func:`segment_update_model`.
    device : Device
        Where the weights are (their addresses are bound).
    options : onnxruntime.SessionOptions
    state_names : sequence of str
        The learning-rate object's state names.
    maximum : int, default=None
        Most elements of a segment; None:
        :data:`SEGMENT_SIZE`.
    """

    def __init__(self, model, device, options, state_names, maximum=None):
        self.session = make_session(model, device, options)
        self.device = device
        self.state_names = list(state_names)
        self.maximum = SEGMENT_SIZE if maximum is None else maximum
        self.dtypes = {i.name: elem_type_to_numpy(i.type.tensor_type.elem_type)
                       for i in model.graph.input}
        self._bindings = []
        self._held = []
        self._scalars = {}

    def bind(self, weights):
        """Bind ``weights``: a list of (weight, gradient, states) OrtValues,
        each of them contiguous and of one shape; every run updates the
        weight and the states in place from the gradient. The OrtValues are
        held until the next :meth:`bind`.

        Raises
        ------
        ValueError
            A gradient or state of another dtype than the model's or of
            another number of elements than its weight (nothing is bound).
        """
        dtype = np.dtype(self.dtypes[_PARAM])
        itemsize = dtype.itemsize
        for weight, grad, states in weights:
            total = int(np.prod(weight.shape(), dtype=np.int64))
            for value in [weight, grad, *states]:
                # addresses are bound: a value of another type or size would
                # be read as raw memory
                if ortvalue_dtype(value) != dtype or int(np.prod(
                        value.shape(), dtype=np.int64)) != total:
                    raise ValueError(
                        f"SegmentedUpdate.bind: a {value.data_type()} of shape "
                        f"{value.shape()} among the values of a weight of shape "
                        f"{weight.shape()}; all must be {dtype.name} tensors of "
                        f"{total} elements.")
        self._held = [(w, g, list(s)) for w, g, s in weights]
        self._bindings = []
        for weight, grad, states in self._held:
            total = int(np.prod(weight.shape(), dtype=np.int64))
            named = {_PARAM: weight, f"{_PARAM}_grad": grad}
            named.update((f"{_PARAM}_{s}", v) for s, v in zip(self.state_names, states))
            start = 0
            for size in segment_sizes([total], self.maximum):
                binding = self.session.io_binding()
                for name, value in named.items():
                    address = value.data_ptr() + start * itemsize
                    binding.bind_input(name, self.device.type, self.device.index,
                                       dtype, [size], address)
                    if name != f"{_PARAM}_grad":
                        binding.bind_output(f"{name}_new", self.device.type,
                                            self.device.index, dtype, [size], address)
                binding.bind_output("loss_total", self.device.type, self.device.index)
                self._bindings.append(binding)
                start += size

    def run(self, scalars):
        """Update every bound weight; ``scalars``: name -> float, the rank-0
        inputs of the update (those the model does not read are ignored;
        ``loss`` and ``penalty_scale`` default to 0 and 1)."""
        values = {"loss": 0.0, "penalty_scale": 1.0}
        values.update(scalars)
        feeds = {name: self._scalar(name, values[name]) for name in self.dtypes
                 if name in values}
        for binding in self._bindings:
            for name, value in feeds.items():
                binding.bind_ortvalue_input(name, value)
            self.session.run_with_iobinding(binding)

    def _scalar(self, name, value):
        array = np.asarray(value, dtype=self.dtypes[name])
        cached = self._scalars.get(name)
        if cached is None:
            cached = self._scalars[name] = to_ortvalue(array, self.device, owned=True)
        elif self.device.type == "cpu":
            cached.numpy()[...] = array
        else:
            cached.update_inplace(array)
        return cached
