"""Optimizer (runs ``optimizer_model.onnx``) and LinearLRScheduler."""
from __future__ import annotations

import numbers

import numpy as np

from ..checkpoint.format import MAX_STEP
from ..graph import numpy_to_elem_type
from ..graph.aliasing import writes_after_reads
from ..onnxblock.optim import OPTIMIZER_METADATA, per_parameter_model
from ..runtime import SessionRunner, is_ortvalue, to_ortvalue
from ._flat import FlatBuffers, flat_optimizer_model
from .module import load_model, read_layout
from .state import OptimizerState

__all__ = ["Optimizer", "LinearLRScheduler"]


def _check_rate(value, name):
    """``value`` as a float; ValueError unless a finite number >= 0 (0 is
    allowed: onnxruntime-training accepted it and a warmup starts there).
    Anything ``float()`` takes is accepted (a 0-d array, a torch scalar
    tensor: onnxruntime-training's binding took them too) except bool and
    text."""
    number = None
    if not isinstance(value, (bool, str, bytes)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
    if number is None or not np.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite float >= 0, got {value!r}.")
    return number


def _check_step_count(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    return int(value)


def _shape(value):
    """Shape of an array or an OrtValue (a state after a step)."""
    return tuple(value.shape()) if is_ortvalue(value) else tuple(np.shape(value))


class Optimizer:
    """Update the trainable parameters of a :class:`Module` from their
    gradients by running the optimizer model.

    Parameters
    ----------
    optimizer_uri : str, pathlib.Path or onnx.ModelProto
        ``optimizer_model.onnx`` written by
        :func:`onnxtrain.onnxblock.artifacts.generate_artifacts` (or its ``.ort``,
        written with ``ort_format=True``), or the model of an optimizer
        block called on ``TrainingBlock.parameters()`` in an
        ``onnxblock.empty_base()`` (onnxruntime-training's manual workflow).
    module : Module

    Notes
    -----
    The optimizer state (step count, learning rate, per-parameter moments)
    lives in ``module``'s :class:`CheckpointState` (``optimizer_state``):
    a state loaded from a checkpoint saved with
    ``include_optimizer_state=True`` resumes where it stopped. A new state
    starts at step 0 with learning rate 0.001 and zero moments.

    Raises
    ------
    ValueError
        If the optimizer model updates a parameter that is not trainable in
        the module, or a saved optimizer state does not fit the model.
    """

    def __init__(self, optimizer_uri, module):
        model = load_model(optimizer_uri)
        self._layout = read_layout(model, OPTIMIZER_METADATA, "optimizer model")
        if self._layout.get("layout") == "sequence":
            # an optimizer block's sequence layout (onnxruntime-training's
            # manual workflow): packed into and out of its sequences
            params = module._state.parameters
            model = per_parameter_model(model, self._layout, [
                (n, numpy_to_elem_type(params.raw(n).dtype), params.raw(n).shape)
                for n in self._layout["parameters"]])
            self._layout = read_layout(model, OPTIMIZER_METADATA, "optimizer model")
        self._module = module
        trainable = set(module._layouts["train"]["trainable"])
        extra = [p for p in self._layout["parameters"] if p not in trainable]
        if extra:
            raise ValueError(f"The optimizer model updates {extra}, which the "
                             f"training model does not train ({sorted(trainable)}).")
        state = module._state
        if state.optimizer_state is None:
            state.optimizer_state = OptimizerState()
        self._init_states(state)
        self._flat = self._flat_runner = self._runner = None
        if module._device.type == "cpu":
            self._init_flat(model, state)
        if self._flat is None:
            self._runner = SessionRunner(model, module._device,
                                         module._session_options(model))
        # outputs written over their inputs' memory, as PyTorch's optimizers
        # update in place: one copy of each parameter and state, not two
        pairs = [(n, f"{n}.updated") for n in self._layout["parameters"]]
        pairs += [(f"{n}.{key}", f"{n}.{key}.updated")
                  for n in self._layout["parameters"] for key in self._layout["states"]]
        self._in_place = {out for _, out in writes_after_reads(model.graph, pairs)}

    def _init_flat(self, model, state):
        """Run the update once over flat buffers when the model allows it
        (:mod:`onnxtrain.api._flat`)."""
        params = [state.parameters.raw(n) for n in self._layout["parameters"]]
        specs = [(p.name, numpy_to_elem_type(p.dtype), p.shape) for p in params]
        flat = flat_optimizer_model(model, self._layout, specs)
        if flat is None:
            return
        names = [o.name for o in flat.graph.output]
        if len(writes_after_reads(flat.graph, [(n[:-len(".updated")], n)
                                               for n in names])) != len(names):
            return
        self._flat = FlatBuffers([p.name for p in params], [p.shape for p in params],
                                 specs[0][1], self._layout["states"])
        self._flat.attach(state.parameters, state.optimizer_state.states)
        self._flat_runner = SessionRunner(flat, self._module._device,
                                          self._module._session_options(flat))

    def _init_states(self, state):
        states = state.optimizer_state.states
        for name in self._layout["parameters"]:
            param = state.parameters.raw(name)
            current = states.setdefault(name, {})
            for key in self._layout["states"]:
                if key not in current:
                    current[key] = np.zeros(param.shape, dtype=param.dtype)
                elif _shape(current[key]) != param.shape:
                    raise ValueError(
                        f"Optimizer state {key!r} of {name!r} has shape "
                        f"{_shape(current[key])}; the parameter has {param.shape}.")

    @property
    def _state(self):
        return self._module._state.optimizer_state

    def step(self):
        """Apply one update to every trainable parameter and increment the
        step counter.

        Raises
        ------
        RuntimeError
            If a parameter has no gradient yet (call the module in training
            mode first), or the state comes from a nominal checkpoint whose
            parameters have no values yet.
        ValueError
            If the step count leaves no next step an int64 holds.

        Notes
        -----
        Thread safe with the module's training calls: both hold the
        module's lock, so a step never reads gradients that a concurrent
        call is writing.
        """
        with self._module._lock:
            self._step()

    def _step(self):
        self._module._check_loaded()
        module, opt = self._module, self._state
        params = module._state.parameters
        if not 0 <= opt.step < MAX_STEP:
            raise ValueError(f"The optimizer's step count {opt.step} leaves no "
                             "next step: the optimizer model takes the next "
                             "step's number as an int64, so the count is 0 to "
                             f"{MAX_STEP - 1}.")
        feeds = {"learning_rate": np.array(opt.learning_rate, dtype=np.float64),
                 "step": np.array(opt.step + 1, dtype=np.int64)}
        missing = [n for n in self._layout["parameters"] if params.raw(n)._grad is None]
        if missing:
            raise RuntimeError(f"Parameter {missing[0]!r} has no gradient: run the "
                               "module in training mode before step().")
        if self._flat is not None:
            self._flat_step(feeds)
            return
        outputs, into = [], {}
        for name in self._layout["parameters"]:
            param = params.raw(name)
            feeds[name] = module._device_value(param)
            feeds[f"{name}_grad"] = param._grad
            outputs.append(f"{name}.updated")
            for key in self._layout["states"]:
                value = opt.states[name][key]
                if isinstance(value, np.ndarray):
                    # a copy: the update writes into it, not into the array
                    # the state was given
                    value = to_ortvalue(np.array(value, copy=True), module._device)
                    opt.states[name][key] = value
                feeds[f"{name}.{key}"] = value
                outputs.append(f"{name}.{key}.updated")
        for output in outputs:
            if output in self._in_place:
                into[output] = feeds[output[:-len(".updated")]]
        results = iter(self._runner(feeds, outputs, into))
        for name in self._layout["parameters"]:
            params.raw(name)._value = next(results)
            for key in self._layout["states"]:
                opt.states[name][key] = next(results)
        opt.step += 1

    def _flat_step(self, feeds):
        """One run of the flat update (the caller holds the module's lock)."""
        params, opt = self._module._state.parameters, self._state
        flat = self._flat
        flat.sync(params, opt.states)
        feeds.update(flat.feeds)
        self._flat_runner(feeds, list(flat.into), flat.into)
        opt.step += 1

    def set_learning_rate(self, learning_rate):
        """Set the learning rate of the next steps.

        Parameters
        ----------
        learning_rate : float
            Finite and >= 0 (0 leaves the parameters unchanged, as a linear
            warmup's first step does).

        Raises
        ------
        ValueError
            A negative, non-finite or non-numeric value (the learning rate
            is left unchanged).
        """
        self._state.learning_rate = _check_rate(learning_rate, "learning_rate")

    def get_learning_rate(self):
        """The current learning rate (float, 0.001 by default)."""
        return self._state.learning_rate

    @property
    def step_count(self):
        """int: number of steps taken."""
        return self._state.step


class LinearLRScheduler:
    """Linear warmup then linear decay of the learning rate.

    At optimizer step ``t`` the learning rate is
    ``initial_lr * t / warmup_step_count`` while ``t < warmup_step_count``,
    then ``initial_lr * max(0, (total_step_count - t) / (total_step_count -
    warmup_step_count))`` (the schedule of HuggingFace transformers'
    ``get_linear_schedule_with_warmup``).

    Parameters
    ----------
    optimizer : Optimizer
    warmup_step_count : int
        Steps of linear warmup (0: none).
    total_step_count : int
        Step at which the learning rate reaches 0.
    initial_lr : float
        Peak learning rate (finite, >= 0).

    Notes
    -----
    The constructor sets the learning rate of the optimizer's current step;
    call :meth:`step` after each ``optimizer.step()``.

    Raises
    ------
    ValueError
        If a step count is not an int >= 0, ``total_step_count <
        warmup_step_count``, or ``initial_lr`` is negative, non-finite or
        not a number.
    """

    def __init__(self, optimizer, warmup_step_count, total_step_count, initial_lr):
        warmup = _check_step_count(warmup_step_count, "warmup_step_count")
        total = _check_step_count(total_step_count, "total_step_count")
        initial_lr = _check_rate(initial_lr, "initial_lr")
        if total < warmup:
            raise ValueError(f"Expected 0 <= warmup_step_count <= total_step_count, "
                             f"got warmup_step_count={warmup}, "
                             f"total_step_count={total}.")
        self._optimizer = optimizer
        self.warmup_step_count, self.total_step_count = warmup, total
        self.initial_lr = initial_lr
        self.step()

    def get_lr(self, step):
        """Learning rate at optimizer step ``step`` (float)."""
        if step < self.warmup_step_count:
            return self.initial_lr * step / self.warmup_step_count
        decay = self.total_step_count - self.warmup_step_count
        if decay <= 0:
            return 0.0
        return self.initial_lr * max(0.0, (self.total_step_count - step) / decay)

    def step(self):
        """Set the optimizer's learning rate for its current step count."""
        self._optimizer.set_learning_rate(self.get_lr(self._optimizer.step_count))
