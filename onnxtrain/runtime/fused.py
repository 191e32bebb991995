"""Run fused training graphs (one step, or a Loop over an epoch) with the
weights and optimizer state bound once through IOBinding. A step graph
writes the outputs its ``in_place`` names into their inputs' memory
(:func:`onnxtrain.assembly.training_graphs.update_in_place`) and the others into a
second buffer, which becomes the input of the next run. Only the loss is
copied to the host."""
from __future__ import annotations

import numpy as np
from onnxruntime import OrtValue

from ..graph import elem_type_to_numpy
from .devices import parse_device
from .sessions import default_session_options, make_session, to_ortvalue
from .threads import check_n_threads

__all__ = ["FusedRunner"]


def _empty_like(value, device):
    return OrtValue.ortvalue_from_shape_and_type(
        list(value.shape()), _dtype_of(value), device.type, device.index)


def _copy(value, device):
    """A copy of ``value`` in memory onnxruntime allocates on ``device``."""
    copy = _empty_like(value, device)
    if device.type == "cpu":
        copy.numpy()[...] = value.numpy()
    else:
        copy.update_inplace(value.numpy())
    return copy


def _dtype_of(value):
    return {"tensor(float)": np.float32, "tensor(double)": np.float64,
            "tensor(float16)": np.float16}[value.data_type()]


#: Steps cheaper than this (in floating-point operations) run on one thread,
#: unless a thread count is given explicitly (``n_threads``).
SMALL_STEP_FLOPS = 4e6


class FusedRunner:
    """Runs a :class:`~onnxtrain.assembly.training_graphs.TrainingStep` graph.

    Parameters
    ----------
    step : TrainingStep
        A step graph (outputs: loss, new parameters) or a loop graph
        (outputs: losses, final parameters).
    device : str or Device
    flops_per_step : float, default=None
        Estimated work of one step; below :data:`SMALL_STEP_FLOPS` the session
        runs on one thread (waking a thread pool for every small kernel
        costs more than it saves) unless ``n_threads`` is given.
    long_runs : bool, default=False
        True for loop graphs, whose one run holds many steps.
    n_threads : int, default=None
        An explicit intra-op thread count (an estimator's ``n_threads``): the
        session uses it whatever ``flops_per_step``. None: one thread for a
        small step, else the count in force
        (:func:`~onnxtrain.runtime.threads.current_session_threads`).
    segmented_update : callable, default=None
        With a step whose ``deferred`` names weights: makes the
        :class:`~onnxtrain.runtime.segmented_update.SegmentedUpdate` that
        applies their update after each run with a finite loss, from the
        session options (called once).

    Attributes
    ----------
    parameters : list of OrtValue
        Current weights and states, flat, in the graph's input order.
    """

    def __init__(self, step, device="cpu", flops_per_step=None, long_runs=False,
                 n_threads=None, segmented_update=None):
        self.step = step
        self.device = parse_device(device)
        n_threads = check_n_threads(n_threads)
        small = n_threads is None and flops_per_step is not None \
            and flops_per_step < SMALL_STEP_FLOPS
        options = default_session_options(1 if small else n_threads, model=step.model)
        self.long_runs = long_runs
        self.session = make_session(step.model, self.device, options)
        self.parameter_names = [n for w, group in zip(step.weights, step.states)
                                for n in [w] + group] + list(step.buffers)
        outputs = [o.name for o in step.model.graph.output]
        self.deferred = list(getattr(step, "deferred", ()))
        if self.deferred and segmented_update is None:
            raise ValueError("FusedRunner: the step defers the update of "
                             f"{self.deferred}; pass segmented_update.")
        n_params = len(outputs) - len(self.deferred)
        self.loss_name, self.parameter_outputs = outputs[0], outputs[1:n_params]
        # the deferred weights' gradients, written into buffers kept
        self.gradient_outputs = outputs[n_params:]
        self._segments = segmented_update(options) if self.deferred else None
        self._deferred_values = None
        self._gradients = None
        self.dtypes = {i.name: elem_type_to_numpy(i.type.tensor_type.elem_type)
                       for i in step.model.graph.input}
        # a step's loss (rank 0) goes into one OrtValue read after each
        # run: binding.get_outputs() would wrap every output at every step;
        # a loop's losses follow the data size
        loss_type = step.model.graph.output[0].type.tensor_type
        scalar = loss_type.HasField("shape") and not loss_type.shape.dim
        self._loss = None if long_runs or not scalar else \
            OrtValue.ortvalue_from_shape_and_type(
                [], elem_type_to_numpy(loss_type.elem_type), self.device.type,
                self.device.index)
        self.parameters = None
        self._bindings = None

    def set_parameters(self, parameters, writable=False, deferred=None):
        """Bind ``parameters`` (flat list of OrtValues) and, for a step
        with deferred weights, ``deferred``: one ``(weight, states)`` pair
        of OrtValues per weight of ``step.deferred``, updated in place
        after each run (held, never copied: ``writable`` or not).

        Step graphs (many short runs) write the outputs of ``step.in_place``
        over their inputs, and the other outputs into a preallocated second
        buffer, swapped at each run (so the first buffer is written too,
        every second run). With ``writable`` False, the runner works on
        copies it makes (take them from :attr:`parameters`); True: the
        caller hands over OrtValues nobody else reads or writes, not views
        of read-only memory, and the runner writes over them (no copy: a
        copy made while the originals are still held leaves their memory to
        the allocator, more resident memory). A loop graph's
        one run already holds copies of the parameters inside its Loop, so
        its outputs are allocated by onnxruntime at the end of the run
        instead (less peak memory) and bound as the next run's inputs."""
        parameters = list(parameters)
        if self.deferred:
            self._bind_deferred(deferred)
        if self.long_runs:
            self.parameters = parameters
            self._buffers = [self.parameters, None]
            self._bindings = [self._bind(self.parameters, None), None]
        else:
            in_place = [name in self.step.in_place for name in self.parameter_outputs]
            # the others alternate: every second run writes them into the
            # first buffer, the given values, so those are written either way
            self.parameters = parameters if writable else [
                _copy(v, self.device) for v in parameters]
            other = [v if over else _empty_like(v, self.device)
                     for v, over in zip(self.parameters, in_place)]
            self._buffers = [self.parameters, other]
            self._bindings = [self._bind(self._buffers[0], self._buffers[1]),
                              self._bind(self._buffers[1], self._buffers[0])]
        self._current = 0

    def release(self):
        """Drop the parameters and their bindings (another runner took
        them over); :meth:`set_parameters` binds new ones."""
        self.parameters = self._buffers = self._bindings = None
        self._deferred_values = self._gradients = None
        if self._segments is not None:
            self._segments.bind([])

    @property
    def deferred_values(self):
        """The ``(weight, states)`` pairs bound by :meth:`set_parameters`
        (None without deferred weights)."""
        return self._deferred_values

    def _bind_deferred(self, deferred):
        deferred = [(w, list(states)) for w, states in (deferred or ())]
        if len(deferred) != len(self.deferred):
            raise ValueError(f"FusedRunner.set_parameters: {len(self.deferred)} "
                             f"deferred weights expected, got {len(deferred)}.")
        if self._gradients is None:
            self._gradients = [_empty_like(w, self.device) for w, _ in deferred]
        self._deferred_values = deferred
        self._segments.bind([(w, g, states) for (w, states), g
                             in zip(deferred, self._gradients)])

    def _bind(self, inputs, outputs):
        binding = self.session.io_binding()
        # bound first: get_outputs() gives the outputs in binding order
        if self._loss is not None:
            binding.bind_ortvalue_output(self.loss_name, self._loss)
        else:
            binding.bind_output(self.loss_name, self.device.type, self.device.index)
        for name, value in zip(self.parameter_names, inputs):
            binding.bind_ortvalue_input(name, value)
        for name, (weight, _) in zip(self.deferred, self._deferred_values or ()):
            binding.bind_ortvalue_input(name, weight)
        for name, grad in zip(self.gradient_outputs, self._gradients or ()):
            binding.bind_ortvalue_output(name, grad)
        for index, name in enumerate(self.parameter_outputs):
            if outputs is None:
                binding.bind_output(name, self.device.type, self.device.index)
            else:
                binding.bind_ortvalue_output(name, outputs[index])
        return binding

    def run(self, data, scalars):
        """One run. ``data``: name -> array/OrtValue; ``scalars``: name -> float.

        Returns
        -------
        numpy.ndarray
            The loss (step graph: rank 0; loop graph: one per batch). The
            parameters advance only when every loss is finite.
        """
        if self._bindings is None:
            raise RuntimeError("FusedRunner.run: no parameters bound; call "
                               "set_parameters first (again after release()).")
        binding = self._bindings[self._current]
        # outputs onnxruntime allocates are allocated afresh at every run
        # (their shapes may change: the loop's losses follow the data size)
        fresh = ([] if self._loss is not None else [self.loss_name]) + (
            self.parameter_outputs if self.long_runs else [])
        for name in fresh:
            binding.bind_output(name, self.device.type, self.device.index)
        for name, value in data.items():
            binding.bind_ortvalue_input(name, to_ortvalue(value, self.device,
                                                          self.dtypes.get(name)))
        for name, value in scalars.items():
            binding.bind_ortvalue_input(name, self._scalar(name, value))
        self.session.run_with_iobinding(binding)
        if self._loss is not None:
            loss = np.array(self._loss.numpy())  # the next run writes it again
        else:
            outputs = binding.get_outputs()
            loss = outputs[0].numpy()
        if not np.isfinite(loss).all():
            return loss
        if self._segments is not None:
            self._segments.run(scalars)
        if self.long_runs:
            self.parameters = list(outputs)[1:]
            for name, value in zip(self.parameter_names, self.parameters):
                binding.bind_ortvalue_input(name, value)
        else:
            self._current = 1 - self._current
            self.parameters = self._buffers[self._current]
        return loss

    def _scalar(self, name, value):
        return to_ortvalue(np.asarray(value, dtype=self.dtypes[name]), self.device)
