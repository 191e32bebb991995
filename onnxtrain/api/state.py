"""CheckpointState: parameters, optimizer state and properties of a training."""
from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np

from ..checkpoint.format import encode_property, read_checkpoint, write_checkpoint
from ..runtime import to_numpy

__all__ = ["Parameter", "CheckpointState", "OptimizerState"]


class Parameter:
    """One model parameter.

    Parameters
    ----------
    name : str
    data : ndarray
        Copied.
    requires_grad : bool, default=True

    Attributes
    ----------
    name : str
    requires_grad : bool
    data : ndarray
        A host copy of the current value; assigning an array copies it in
        (cast to the parameter's dtype; the shape must match).
    grad : ndarray or None
        The accumulated gradient (a host copy). Zeros once a
        :class:`~onnxtrain.api.Module` trains the parameter and before its
        first training call (as onnxruntime-training); None for a
        parameter no module trains.

    Raises
    ------
    RuntimeError
        Reading ``data`` of a parameter of a nominal checkpoint before its
        value was loaded.
    """

    def __init__(self, name, data, requires_grad=True):
        array = np.array(data, copy=True)
        self._name = str(name)
        self._dtype, self._shape = array.dtype, array.shape
        self._value = array
        self._grad = None
        # where the first gradient is written (an Optimizer's flat buffer view)
        self._grad_buffer = None
        self._zero_grad = False  # set by a Module training this parameter
        self._requires_grad = bool(requires_grad)

    @classmethod
    def _owning(cls, name, array, requires_grad=True):
        """A parameter holding ``array`` itself (no copy): an array no one
        else holds, as the checkpoint reader returns them."""
        param = cls(name, np.zeros(0, dtype=array.dtype), requires_grad)
        param._shape, param._value = array.shape, array
        return param

    @classmethod
    def nominal(cls, name, dtype, shape, requires_grad=True):
        """A parameter without a value (from a nominal checkpoint): name,
        dtype and shape only, until ``data`` is assigned."""
        param = cls(name, np.zeros(0, dtype=dtype), requires_grad)
        param._shape = tuple(int(d) for d in shape)
        param._value = None
        return param

    @property
    def loaded(self):
        """bool: whether the parameter holds a value (False for a parameter
        of a nominal checkpoint until one is assigned)."""
        return self._value is not None

    # read-only, as onnxruntime-training's
    name = property(lambda self: self._name, doc="str: name of the parameter.")
    requires_grad = property(lambda self: self._requires_grad,
                             doc="bool: whether a Module trains the parameter.")
    dtype = property(lambda self: self._dtype, doc="numpy dtype of the parameter.")
    shape = property(lambda self: self._shape,
                     doc="Shape of the parameter (tuple of int).")

    @property
    def data(self):
        if self._value is None:
            raise RuntimeError(f"Parameter {self._name!r} comes from a nominal "
                               "checkpoint: Please load the parameter states "
                               "first.")
        return np.array(to_numpy(self._value), copy=True)

    @data.setter
    def data(self, value):
        array = np.array(value, dtype=self._dtype, copy=True)
        if array.shape != self._shape:
            raise ValueError(f"Parameter {self._name!r} has shape {self._shape}; "
                             f"the new value has shape {array.shape}.")
        self._value = array

    @property
    def grad(self):
        if self._grad is None:
            return np.zeros(self._shape, self._dtype) if self._zero_grad else None
        return np.array(to_numpy(self._grad), copy=True)

    def __repr__(self):
        return (f"Parameter(name={self._name!r}, shape={self._shape}, "
                f"dtype={self._dtype}, requires_grad={self._requires_grad})")


class _Parameters:
    """The parameters of a :class:`CheckpointState`, in checkpoint order.

    As onnxruntime-training's: ``parameters[name]`` is a :class:`Parameter`,
    assigning an array to ``parameters[name]`` copies it into that
    parameter, ``name in parameters`` and ``len(parameters)`` work, and
    iterating yields ``(name, Parameter)`` pairs. ``keys()``, ``values()``
    and ``items()`` are there too.

    A state loaded from a nominal checkpoint has no values:
    ``parameters[name]`` raises RuntimeError ("Please load the parameter
    states first") and so does an assignment ("Please load all the
    parameter states first") until
    ``Module.copy_buffer_to_parameters(buffer, trainable_only=False)``
    loads them.
    """

    def __init__(self, parameters):
        self._items = {p.name: p for p in parameters}

    def raw(self, name):
        """The Parameter ``name``, loaded or not (KeyError naming the known
        parameters when absent)."""
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"No parameter {name!r}; parameters: "
                           f"{list(self._items)}.") from None

    def not_loaded(self):
        """Names of the parameters without a value (nominal checkpoint)."""
        return [n for n, p in self._items.items() if not p.loaded]

    def __getitem__(self, name):
        param = self.raw(name)
        if not param.loaded:
            raise RuntimeError(
                f"Parameter {name!r} comes from a nominal checkpoint. Please "
                "load the parameter states first (Module.copy_buffer_to_"
                "parameters(buffer, trainable_only=False)).")
        return param

    def __setitem__(self, name, value):
        missing = self.not_loaded()
        if missing:
            raise RuntimeError(
                f"Parameters {missing[:5]} come from a nominal checkpoint. "
                "Please load all the parameter states first "
                "(Module.copy_buffer_to_parameters(buffer, "
                "trainable_only=False)).")
        self[name].data = value.data if isinstance(value, Parameter) else value

    def __contains__(self, name):
        return name in self._items

    def __iter__(self):
        return iter(self._items.items())

    def __len__(self):
        return len(self._items)

    def keys(self):
        """Parameter names, in checkpoint order."""
        return self._items.keys()

    def values(self):
        """Parameters, in checkpoint order."""
        return self._items.values()

    def items(self):
        """``(name, Parameter)`` pairs, in checkpoint order."""
        return self._items.items()

    def __repr__(self):
        items = ", ".join(f"{n!r}: {p!r}" for n, p in self._items.items())
        return f"{{{items}}}"


class _Properties(MutableMapping):
    """str -> int, float or str; other types raise TypeError."""

    def __init__(self, values=None):
        self._values = {}
        for key, value in (values or {}).items():
            self[key] = value

    def __getitem__(self, key):
        return self._values[key]

    def __setitem__(self, key, value):
        encode_property(key, value)  # validates
        self._values[key] = value

    def __delitem__(self, key):
        del self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return repr(self._values)


class OptimizerState:
    """State of an :class:`~onnxtrain.api.Optimizer`.

    Attributes
    ----------
    step : int
        Number of optimizer steps taken.
    learning_rate : float
    states : dict
        ``parameter name -> {state name -> value}`` (e.g. AdamW's
        ``exp_avg`` and ``exp_avg_sq``), values of the parameter's shape.
    """

    def __init__(self, step=0, learning_rate=0.001, states=None):
        self.step = int(step)
        self.learning_rate = float(learning_rate)
        self.states = {p: dict(s) for p, s in (states or {}).items()}

    def as_arrays(self):
        """The state with every value copied to the host (ndarray)."""
        return {"step": self.step, "learning_rate": self.learning_rate,
                "states": {p: {k: np.array(to_numpy(v)) for k, v in s.items()}
                           for p, s in self.states.items()}}


class CheckpointState:
    """Parameters, optimizer state and user properties of a training.

    Parameters
    ----------
    parameters : list of Parameter
    properties : dict, default=None
        str -> int, float or str.
    optimizer_state : OptimizerState, default=None
    nominal : bool, default=False
        True when loaded from a nominal checkpoint: the parameters have no
        values until ``Module.copy_buffer_to_parameters(buffer,
        trainable_only=False)`` loads them (reading or assigning one, or
        running a Module or an Optimizer, raises RuntimeError before).

    Attributes
    ----------
    parameters : name -> Parameter
        Iterating yields ``(name, Parameter)`` pairs (as onnxruntime);
        ``keys()``, ``values()``, ``items()`` as a dict.
    properties : MutableMapping of str to int, float or str
    optimizer_state : OptimizerState or None
    """

    def __init__(self, parameters, properties=None, optimizer_state=None,
                 nominal=False):
        self.parameters = _Parameters(parameters)
        self.properties = _Properties(properties)
        self.optimizer_state = optimizer_state
        self.nominal = bool(nominal)

    @staticmethod
    def load_checkpoint(checkpoint_uri):
        """Load a checkpoint written by ``generate_artifacts`` or
        :meth:`save_checkpoint` (format: :mod:`onnxtrain.checkpoint`).

        Parameters
        ----------
        checkpoint_uri : str or pathlib.Path

        Returns
        -------
        CheckpointState
            For a nominal checkpoint, parameters have the recorded names,
            shapes and dtypes but no values (load them with
            ``Module.copy_buffer_to_parameters(buffer, trainable_only=False)``
            before training).

        Raises
        ------
        FileNotFoundError
            If ``checkpoint_uri`` does not exist.
        ValueError
            If the file is not an onnxtrain checkpoint or breaks a rule of
            ``docs/checkpoint_format.md`` ("What reading validates": exact
            JSON types, unique names, a finite non-negative learning rate
            and step, numeric dtypes, entries stored uncompressed with the
            size their shape gives...), checked before any array is read;
            the message names the file and the field.
        """
        content = read_checkpoint(checkpoint_uri)
        params = []
        for name, value, requires_grad in content["parameters"]:
            if content["nominal"]:
                params.append(Parameter.nominal(name, value[0], value[1],
                                                requires_grad))
            else:  # the reader's arrays, held by no one else
                params.append(Parameter._owning(name, value, requires_grad))
        optimizer = content["optimizer"]
        if optimizer is not None:
            optimizer = OptimizerState(**optimizer)
        return CheckpointState(params, content["properties"], optimizer,
                               content["nominal"])

    @staticmethod
    def save_checkpoint(state, checkpoint_uri, include_optimizer_state=False):
        """Write ``state`` to ``checkpoint_uri``.

        Parameters
        ----------
        state : CheckpointState
        checkpoint_uri : str or pathlib.Path
        include_optimizer_state : bool, default=False
            Also write the optimizer state (step, learning rate, moments).

        Raises
        ------
        ValueError
            If ``include_optimizer_state`` and the state has no optimizer
            state (no :class:`~onnxtrain.api.Optimizer` was created on it).
        RuntimeError
            If the state comes from a nominal checkpoint and its parameters
            have no values yet.
        """
        missing = state.parameters.not_loaded()
        if missing:
            raise RuntimeError(f"Parameters {missing[:5]} come from a nominal "
                               "checkpoint: Please load the parameter states "
                               "first.")
        optimizer = None
        if include_optimizer_state:
            if state.optimizer_state is None:
                raise ValueError("The state has no optimizer state: create an "
                                 "Optimizer for a Module of this state first.")
            optimizer = state.optimizer_state.as_arrays()
        params = [(p.name, p.data, p.requires_grad)
                  for p in state.parameters.values()]
        write_checkpoint(checkpoint_uri, params, dict(state.properties),
                         optimizer)
