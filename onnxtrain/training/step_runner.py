"""The execution state of a training run: sessions, weights and optimizer
state on the device, and one training step. Not picklable: estimators keep
numpy copies and rebuild a StepRunner lazily. The graphs come from
:mod:`onnxtrain.assembly.training_graphs`, built for the path a fit runs only; the
StepRunner only runs them."""
from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
from onnx import TensorProto, numpy_helper

from ..assembly.pipeline import prepare
from ..assembly.training_graphs import (LossGraphs, TrainingGraphs, final_activation,
                                        small_graph_opset)
from .._utils.files import ExternalTensor
from ..graph import elem_type_to_numpy, without_initializer_values
from ..graph.builder import split_weight_values, with_initializer_values
from ..optim.initializers import bias_weights
from ..runtime import (ForwardBackwardEngine, FusedRunner, SessionRunner,
                       is_ortvalue, to_ortvalue)
from ..runtime.devices import parse_device
from ..runtime.sessions import ortvalue_dtype
from ..runtime.segmented_update import (SegmentedUpdate, deferred_weights,
                                        segment_update_model)
from ..runtime.threads import session_threads
from .rollback import WeightsCopy

__all__ = ["StepRunner", "final_activation", "step_graphs", "feature_arrays"]

#: Opset of the small graphs (update rule, loss) unless the model's is lower.
_OPSET = 17

_ITEMSIZE = {"tensor(float16)": 2, "tensor(bfloat16)": 2, "tensor(float)": 4,
             "tensor(double)": 8}


def _without_initializer_inputs(model):
    """``model`` without the graph inputs that initializers define (an
    export with ``keep_initializers_as_inputs=True``): the engine feeds
    only the data, the weights and the running statistics. IR < 4 requires
    them: such a model is returned as it is."""
    inits = {i.name for i in model.graph.initializer}
    if model.ir_version < 4 or not any(i.name in inits for i in model.graph.input):
        return model
    import onnx
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inputs = [i for i in new.graph.input if i.name not in inits]
    del new.graph.input[:]
    new.graph.input.extend(inputs)
    return new


def _without_trained_values(model, weights, values=None):
    """``model`` without the values of the trained ``weights`` (of more
    than :data:`~onnxtrain.graph.builder.LIGHT_MIN_ELEMENTS` elements), and
    ``name -> TensorProto`` of those values: the rewrites of the build copy
    the model without them, the engine reads them once. ``values``: those
    ``model`` lacks already; the initializers not trained get theirs back
    (the rewrites and the sessions read them)."""
    model, held = split_weight_values(model)
    values = {**held, **(values or {})}
    trained = set(weights)
    # external data still in its file is read for the constants only
    constants = {n: t.to_tensor_proto() if isinstance(t, ExternalTensor) else t
                 for n, t in values.items() if n not in trained}
    if constants:
        model = with_initializer_values(model, constants)
    return model, {n: t for n, t in values.items() if n in trained}


def step_graphs(model, weights, types, loss, update_rule, penalty,
                weight_input="weight"):
    """Build the update rule's graph and the loss graphs of a fit.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph trained; its first output is the prediction (or the loss
        when ``loss`` is None).
    weights : list of str
        The weights trained.
    types : dict
        ``model``'s :func:`~onnxtrain.graph.infer_value_types`.
    loss : loss object or None
        None: the graph computes its own loss (no loss graph).
    update_rule, penalty : objects
        The resolved learning rate (its ``axpy_onnx_`` built here) and
        penalty (applied to the weights but the biases, unless
        ``exclude_bias=False``).
    weight_input : str, default='weight'
        Name of the weighted loss graph's sample-weight input.

    Returns
    -------
    loss_models : LossGraphs or None
        The (unweighted, weighted) loss graphs, each built at its first
        use; the unweighted one now, as ``loss.loss_grad_onnx_``, which the
        seed reads after fit.
    fused_spec : dict or None
        What :class:`StepRunner`'s fused paths need.
    """
    out_type, out_shape = types[model.graph.output[0].name]
    rank = 2 if out_shape is None else len(out_shape)
    opset = small_graph_opset(model, _OPSET)
    penalized = set(weights)
    if getattr(penalty, "exclude_bias", True):
        penalized -= set(bias_weights(model, weights))
    update_rule.build_onnx([(w, types[w][1]) for w in weights], out_type, opset,
                           penalty, penalized)
    if loss is None:
        return None, None
    loss_models = LossGraphs(loss, out_type, opset, rank, weight_input)
    loss_models[False]  # noqa: B018 - builds it
    return loss_models, {
        "loss": loss, "penalty": penalty, "penalized": penalized,
        "shapes": {w: types[w][1] for w in weights},
        "elem_type": out_type, "rank": rank}


def _initializer_values(model, names):
    """``name -> numpy.ndarray``: the values of the initializers ``names``."""
    inits = {i.name: i for i in model.graph.initializer}
    return {name: numpy_helper.to_array(inits[name]) for name in names}


def _sample_weight_dtype(model, input_names, buffer_names, loss_models):
    """numpy dtype of the sample-weight input of a graph computing its
    own loss (its third input), as the graph declares it: a float type,
    whatever the type of the labels; None without such an input."""
    names = [n for n in input_names if n not in buffer_names]
    if loss_models or len(names) < 3:
        return None
    declared = {i.name: i for i in model.graph.input}[names[2]]
    return elem_type_to_numpy(declared.type.tensor_type.elem_type)


def _scalar(cache, value, dtype, device):
    """A scalar OrtValue of ``value``, kept in ``cache`` for the next steps
    (at most a few hundred: schedules change the rate at every epoch)."""
    key = (float(value), dtype)
    if key not in cache:
        if len(cache) > 256:
            cache.clear()
        cache[key] = to_ortvalue(np.array(value, dtype=dtype), device)
    return cache[key]


def feature_arrays(X):
    """The arrays to feed, in graph input order: ``[X]`` for one array, the
    values of its ``arrays`` for one array per input (a
    :class:`~onnxtrain.estimators.GraphInputs`, whose class the estimators
    own)."""
    arrays = getattr(X, "arrays", None)
    return [X] if arrays is None else list(arrays.values())


def _data_feeds(graph, X, y, sample_weight):
    """The data inputs of a fused graph: the features, y, the weights."""
    values = feature_arrays(X) + [y]
    if sample_weight is not None:
        values.append(sample_weight)
    return dict(zip(graph.data_inputs, values))


def _parameter_names(runner):
    """The step graphs' names of the StepRunner ``runner``'s
    :meth:`~StepRunner._flat_parameters`: every weight, its states
    (``<weight>_<state>``), then the buffers."""
    states = runner.learning_rate.state_names
    return [n for w in runner.engine.weights_to_train
            for n in [w] + [f"{w}_{s}" for s in states]] + list(runner.buffer_names)


class StepRunner:
    """Runs training steps: forward, loss and dE/dY, backward, update, one
    step per batch (or the steps of whole epochs in one fused-loop run), on
    the weights and optimizer state it keeps on the device. It only runs
    graphs: :mod:`onnxtrain.assembly.training_graphs` builds them, the epoch
    loop of a :class:`~onnxtrain.training.run.TrainingRun` calls it.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph (or, with ``loss_models=None``, a graph whose first
        output is the loss).
    weights : list of str
    device : str
    loss_models : sequence (unweighted, weighted) of onnx.ModelProto, or None
        Loss graphs (inputs X1, X2[, weight]; outputs Y, Y_grad), read when
        a step needs them (a :class:`~onnxtrain.assembly.training_graphs.LossGraphs`
        builds each at its first access).
    update_model : onnx.ModelProto
        The learning-rate object's ``axpy_onnx_``.
    learning_rate : BaseLearningRate
        Gives the per-step scalars and the state names.
    weight_input : str
        Name of the weighted loss graph's sample-weight input.
    fused_spec : dict, default=None
        What the fused paths need to rebuild the small graphs at the model's
        opset: ``loss`` (loss object), ``penalty``, ``penalized``,
        ``shapes`` (weight name -> shape), ``elem_type``, ``rank``. None
        disables the fused paths.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types`, passed down
        to the graph builders (no shape inference of the model again).
    values : dict, default=None
        ``name -> onnx.TensorProto`` (or
        :class:`~onnxtrain._utils.files.ExternalTensor`, data still in its
        file): the values of initializers ``model`` holds without them
        (:func:`onnxtrain.graph.builder.split_weight_values` of the
        caller's model); read once, never copied into a model but
        for the initializers not trained.

    Notes
    -----
    The weights (``engine.weights``), the optimizer state and the buffers
    are OrtValues no one else holds: the fused step writes them in place
    (:func:`onnxtrain.assembly.training_graphs.update_in_place`). Set them through
    :meth:`set_weights`, :meth:`set_state` and :meth:`set_buffers`, which
    copy.

    Attributes
    ----------
    buffer_names : list of str
        Running statistics of BatchNormalization nodes in training mode
        (:mod:`onnxtrain.graph.training_mode`): every training step updates
        ``buffers`` (OrtValues, in this order); predictions run the
        inference graph on them.
    finite_copy : WeightsCopy
        The weights a divergence rolls back to
        (:meth:`finite_weights_copy`), kept from one fit to the next (its
        arrays or its file are reused).
    """

    def __init__(self, model, weights, device, loss_models, update_model,
                 learning_rate, weight_input="weight", fused_spec=None,
                 types=None, values=None):
        model, values = _without_trained_values(model, weights, values)
        model = _without_initializer_inputs(model)
        device = parse_device(device)
        # the one preparation of the fit's graphs (running statistics'
        # updates, small Convs lowered), shared by the engine, the split and
        # the fused graphs; on the CPU the updates read the batch statistics
        # from the nodes (onnxruntime's CUDA kernel outputs another variance)
        cpu = device.type == "cpu"
        prepared = prepare(model, weights, types,
                           statistics={"node_statistics": cpu})
        self.buffer_names = prepared.buffers
        initial = _initializer_values(model, self.buffer_names)
        outputs = None if loss_models and not self.buffer_names else [
            model.graph.output[0].name]
        # the split graphs are built when a split step first runs; the
        # callable holds the graphs, not ``self`` nor the engine: no
        # reference cycle keeps the sessions alive after the runner is gone
        graphs_box = []
        self.engine = ForwardBackwardEngine(
            prepared.model, weights, device, outputs, types=prepared.types,
            gradient_models=lambda engine_model: graphs_box[0].split(engine_model,
                                                                     outputs),
            checked=True, values=values)
        del values
        # the models kept build graphs where the trained weights are inputs:
        # their values (now in engine.weights) left out
        model = without_initializer_values(prepared.model, self.engine.weights_to_train)
        self.engine.model = model
        # big weights' updates run over segments after the fused step, on
        # the CPU, where their addresses are bound (segmented_update)
        self._segment_model = None
        deferred = []
        if cpu and fused_spec is not None:
            deferred = deferred_weights(learning_rate, fused_spec["shapes"],
                                        fused_spec["penalty"], fused_spec["penalized"])
            if deferred:
                self._segment_model = segment_update_model(
                    learning_rate, fused_spec["elem_type"], small_graph_opset(model))
                if self._segment_model is None:
                    deferred = []
        # onnxruntime runs float16 on the CPU as float32 behind inserted
        # Casts; the in-place form's If takes the update's gradient-only
        # values (g*g*(1-b2)...) from outside it, rounded to float16 at its
        # boundary (a second moment of 0 sent an Adam step to -15), where the
        # flat step keeps the float32 chain, as the split path's update does
        half = fused_spec is not None and fused_spec["elem_type"] == TensorProto.FLOAT16
        self.graphs = TrainingGraphs(model, weights, learning_rate, fused_spec,
                                     buffer_names=self.buffer_names,
                                     types=prepared.types, in_place=cpu and not half,
                                     deferred=deferred)
        graphs_box.append(self.graphs)
        self.buffers = [to_ortvalue(initial[b], self.engine.device, owned=True)
                        for b in self.buffer_names]
        self._new_buffers = None
        self.device = self.engine.device
        self.loss_models = loss_models
        self._loss_runners = {}
        self.update_model = update_model
        self._update = None
        self.learning_rate = learning_rate
        self.weight_input = weight_input
        self.step_count = 0
        self._scalars = {}
        self.model = model
        self.fused_spec = fused_spec
        self._fused = {}
        self._orders = {}  # runner key -> its parameters' places (_runner)
        self._parameter_bytes = None
        self.finite_copy = WeightsCopy(device.type == "cpu")
        self._weight_dtype = _sample_weight_dtype(
            model, self.engine.input_names, self.buffer_names, loss_models)
        self.reset_state()

    # ------------------------------------------------------------- state
    def finite_weights_copy(self):
        """Keep a copy of the weights when every value is finite.

        The divergence rollback of :class:`~onnxtrain.training.run.TrainingRun`
        keeps one at every epoch, in :attr:`finite_copy` (a
        :class:`~onnxtrain.training.rollback.WeightsCopy`: in memory, or in
        a temporary file from
        :data:`~onnxtrain.training.rollback.ROLLBACK_FILE_MIN_BYTES` on),
        whose ``restore`` puts it back into the weights.

        Returns
        -------
        WeightsCopy or None
            None when a value is not finite; the previous copy is then left
            as it was.
        """
        return self.finite_copy if self.finite_copy.keep(self.engine.weights) else None

    def set_weights(self, weights):
        """Replace the weights: :meth:`ForwardBackwardEngine.set_weights
        <onnxtrain.runtime.ForwardBackwardEngine.set_weights>` on
        copies, OrtValues included, which the engine would keep as they are
        (a fused step writes the trainer's weights in place)."""
        def host(value):
            return value.numpy() if is_ortvalue(value) else value
        if isinstance(weights, Mapping):
            weights = {name: host(value) for name, value in weights.items()}
        else:
            weights = [host(value) for value in weights]
        self.engine.set_weights(weights)
        self._release_runners()

    def _release_runners(self, keep=None):
        """The runners (but ``keep``) drop the values the trainer replaced or
        hands to another runner (they bind the new ones at their next
        step): a replaced set of weights is freed now, not kept by a runner
        for the estimator's life."""
        for runner in self._fused.values():
            if runner is not keep:
                runner.release()

    def reset_state(self):
        """Zero optimizer state (velocities, moments) and step counter."""
        self.step_count = 0
        self.state = [
            [to_ortvalue(s, self.device) for s in
             self.learning_rate.init_state(tuple(w.shape()), w.numpy().dtype)]
            for w in self.engine.weights]
        self._release_runners()

    def get_state(self):
        """Optimizer state as numpy copies: one list per weight."""
        return [[s.numpy().copy() for s in states] for states in self.state]

    def set_state(self, state, step_count=0):
        """Restore :meth:`get_state` output (arrays are copied, in their
        weight's dtype, which the update graphs read)."""
        dtypes = [ortvalue_dtype(w) for w in self.engine.weights]
        self.state = [[to_ortvalue(np.array(s, dtype=dtype, copy=True), self.device,
                                   dtype=dtype)
                       for s in states] for states, dtype in zip(state, dtypes)]
        self.step_count = step_count
        self._release_runners()

    def get_buffers(self):
        """``buffer name -> numpy copy`` of the running statistics."""
        return {n: b.numpy().copy() for n, b in zip(self.buffer_names, self.buffers)}

    def set_buffers(self, buffers):
        """Replace the running statistics (``name -> array``; copied)."""
        if buffers:
            self.buffers = [to_ortvalue(np.array(buffers[n], copy=True), self.device)
                            for n in self.buffer_names]
            self._release_runners()

    def _forward(self, X, training, extra=()):
        """The engine's outputs for the features ``X`` (one array or
        GraphInputs), ``extra`` inputs and the running statistics; in
        training mode the updated statistics wait in ``_new_buffers`` until
        the step commits them."""
        inputs = feature_arrays(X) + list(extra) + list(self.buffers)
        outputs = self.engine.forward(inputs, training=training)
        if training and self.buffer_names:
            self._new_buffers = outputs[1:1 + len(self.buffer_names)]
        return outputs

    @property
    def update(self):
        """The update graph's runner (split path), made at its first step."""
        if self._update is None:
            with session_threads(self.engine._threads):
                self._update = SessionRunner(self.update_model, self.device)
        return self._update

    def _loss_runner(self, weighted):
        if weighted not in self._loss_runners:
            with session_threads(self.engine._threads):
                self._loss_runners[weighted] = SessionRunner(
                    self.loss_models[int(weighted)], self.device)
        return self._loss_runners[weighted]

    # --------------------------------------------------------------- steps
    def loss_and_gradient(self, X, y, sample_weight, training=True):
        """Loss value (OrtValue) and dE/dY for a batch."""
        if self.loss_models is None:  # the graph's first output is the loss
            inputs = [y]
            if self._weight_dtype is not None:  # a sample-weight input
                inputs.append(np.ones(X.shape[0], dtype=self._weight_dtype)
                              if sample_weight is None else sample_weight)
            prediction = self._forward(X, training, inputs)[0]
            ones = np.ones(tuple(prediction.shape()), dtype=prediction.numpy().dtype)
            return prediction, to_ortvalue(ones, self.device)
        prediction = self._forward(X, training)[0]
        feeds = {"X1": y, "X2": prediction}
        if sample_weight is not None:
            feeds[self.weight_input] = sample_weight
        return self._loss_runner(sample_weight is not None)(feeds)

    def step(self, X, y, sample_weight, dtype):
        """One training step on a batch; returns the batch loss (float).

        The weights and optimizer state change only when the loss is finite,
        so a non-finite loss leaves the last finite weights in place.
        """
        loss, grad = self.loss_and_gradient(X, y, sample_weight)
        grads = self.engine.backward([grad])
        rows = X.shape[0] if sample_weight is None else float(np.sum(sample_weight))
        step = self.step_count + 1
        feeds = {name: _scalar(self._scalars, value, dtype, self.device)
                 for name, value in self.learning_rate.step_scalars(step).items()}
        feeds["loss"] = loss
        feeds["penalty_scale"] = _scalar(self._scalars, 1.0 / rows, dtype, self.device)
        names = self.engine.weights_to_train
        states = self.learning_rate.state_names
        for name, weight, grad_w, state in zip(names, self.engine.weights, grads, self.state):
            feeds[name] = weight
            feeds[f"{name}_grad"] = grad_w
            feeds.update((f"{name}_{s}", v) for s, v in zip(states, state))
        outputs = self.update(feeds)
        total = float(outputs[-1].numpy())
        if np.isfinite(total):
            width = 1 + len(states)
            self.engine.weights = outputs[:-1:width]
            self.state = [outputs[i * width + 1:(i + 1) * width]
                          for i in range(len(names))]
            self.step_count = step
            if self._new_buffers is not None:
                self.buffers = list(self._new_buffers)
        self._new_buffers = None
        return total

    def dataset_loss(self, X, y):
        """Loss over every row of (X, y), in one pass, in order (no penalty)."""
        loss, _ = self.loss_and_gradient(X, y, None, training=False)
        return float(loss.numpy())

    def predict(self, X):
        """The graph's first output for X, as numpy."""
        return self._forward(X, False)[0].numpy()

    # ----------------------------------------------------------- fused paths
    def prepare(self, path, weighted):
        """Build the graphs training ``path`` ('split', 'fused' or 'loop')
        runs, so that a graph that cannot be built raises before any step
        (the split graphs are otherwise built at the first step)."""
        if path == "split":
            self.engine.models  # noqa: B018 - builds them
        else:
            self.fused_graph("epochs" if path == "loop" else "step", weighted)

    def fused_graph(self, kind, weighted):
        """The fused graph ``kind`` ('step', 'flat step', 'loop' or
        'epochs') as a TrainingStep, or a str saying why it is unavailable
        (:meth:`onnxtrain.assembly.training_graphs.TrainingGraphs.get`)."""
        return self.graphs.get(kind, weighted)

    def parameter_bytes(self):
        """Bytes taken by the weights and the optimizer state (their shapes
        and types do not change: counted once)."""
        if self._parameter_bytes is None:
            values = [v for w, state in zip(self.engine.weights, self.state)
                      for v in [w, *state]]
            self._parameter_bytes = sum(
                int(np.prod(v.shape())) * _ITEMSIZE.get(v.data_type(), 8)
                for v in values)
        return self._parameter_bytes

    def flops_per_step(self, rows):
        """Estimated work of a step on ``rows`` rows: forward and backward
        cost about 6 floating-point operations per weight and row."""
        return 6.0 * rows * sum(int(np.prod(w.shape())) for w in self.engine.weights)

    def _runner(self, kind, weighted, rows):
        key = ("runner", kind, weighted)
        if key not in self._fused:
            graph = self.fused_graph(kind, weighted)
            # called once by the runner, which then holds no reference to self
            segments = functools.partial(
                SegmentedUpdate, self._segment_model, self.device,
                state_names=self.learning_rate.state_names) \
                if getattr(graph, "deferred", None) else None
            with session_threads(self.engine._threads):
                self._fused[key] = FusedRunner(
                    graph, self.device, self.flops_per_step(rows), kind != "step",
                    n_threads=self.engine._requested_threads,
                    segmented_update=segments)
        runner = self._fused[key]
        if key not in self._orders:
            # where the runner's parameters, then its deferred weights and
            # states, sit in _flat_parameters (named once, not every step)
            index = {n: i for i, n in enumerate(_parameter_names(self))}
            states = self.learning_rate.state_names
            self._orders[key] = (
                [index[n] for n in runner.parameter_names],
                [[index[w]] + [index[f"{w}_{s}"] for s in states]
                 for w in runner.deferred])
        order, deferred_order = self._orders[key]
        current = self._flat_parameters()
        flat = [current[i] for i in order]
        deferred = [(current[w], [current[i] for i in states])
                    for w, *states in deferred_order]
        held = [v for w, states in runner.deferred_values or () for v in [w, *states]]
        wanted = [current[i] for group in deferred_order for i in group]
        if runner.parameters is None or any(
                a is not b for a, b in zip(runner.parameters + held, flat + wanted)):
            self._release_runners(keep=runner)  # one runner holds them
            runner.set_parameters(flat, writable=True, deferred=deferred)
            self._take_parameters(runner)
        return runner

    def _flat_parameters(self):
        """Every weight, its states, then the buffers (OrtValues)."""
        return [v for w, state in zip(self.engine.weights, self.state)
                for v in [w] + list(state)] + list(self.buffers)

    def _take_parameters(self, runner):
        """Take the runner's current parameters (its deferred weights and
        states are the same OrtValues, updated in place)."""
        named = dict(zip(_parameter_names(self), self._flat_parameters()))
        named.update(zip(runner.parameter_names, runner.parameters))
        names = self.engine.weights_to_train
        self.engine.weights = [named[w] for w in names]
        self.state = [[named[f"{w}_{s}"] for s in self.learning_rate.state_names]
                      for w in names]
        self.buffers = [named[b] for b in self.buffer_names]

    def fused_step(self, X, y, sample_weight, dtype):
        """:meth:`step` as one graph run (forward, loss, backward, update)."""
        weighted = sample_weight is not None
        runner = self._runner("step", weighted, X.shape[0])
        step = self.step_count + 1
        scalars = self.learning_rate.step_scalars(step)
        rows = X.shape[0] if not weighted else float(np.sum(sample_weight))
        scalars["penalty_scale"] = 1.0 / rows
        loss = float(runner.run(_data_feeds(runner.step, X, y, sample_weight),
                                scalars))
        if np.isfinite(loss):
            self._take_parameters(runner)
            self.step_count = step
        return loss

    def loop_epochs(self, X, y, sample_weight, batch_size, rates):
        """``len(rates)`` epochs in one run of the in-graph loop.

        Parameters
        ----------
        rates : list of dict
            The learning-rate object's ``step_scalars`` of each epoch (only
            the values that do not depend on the step are used).

        Returns
        -------
        ndarray of shape (n_epochs, n_batches)
            The batch losses; the parameters advance only if all are finite.
        """
        weighted = sample_weight is not None
        runner = self._runner("epochs", weighted, min(batch_size, X.shape[0]))
        n_batches = -(-X.shape[0] // batch_size)
        scalars = {"n_epochs": len(rates), "step__first": self.step_count + 1,
                   "batch_size": batch_size}
        for name in rates[0]:
            if name != "step":
                scalars[f"{name}__per_epoch"] = [r[name] for r in rates]
        losses = runner.run(_data_feeds(runner.step, X, y, sample_weight), scalars)
        if np.isfinite(losses).all():
            self._take_parameters(runner)
            self.step_count += n_batches * len(rates)
        return losses.reshape(len(rates), n_batches)

