"""The execution state of a training run: sessions, weights and optimizer
state on the device, and one training step. Not picklable: estimators keep
numpy copies and rebuild a Trainer lazily."""
from __future__ import annotations

import numpy as np

from ..runtime import OrtGradientForwardBackward, SessionRunner, to_ortvalue

__all__ = ["Trainer"]


class Trainer:
    """Forward, loss and dE/dY, backward, update: one step per batch.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph (or, with ``loss_models=None``, a graph whose first
        output is the loss).
    weights : list of str
    device : str
    loss_models : tuple (unweighted, weighted) of onnx.ModelProto, or None
        Loss graphs (inputs X1, X2[, weight]; outputs Y, Y_grad).
    update_model : onnx.ModelProto
        The learning-rate object's ``axpy_onnx_``.
    learning_rate : BaseLearningRate
        Gives the per-step scalars and the state names.
    weight_input : str
        Name of the weighted loss graph's sample-weight input.
    """

    def __init__(self, model, weights, device, loss_models, update_model,
                 learning_rate, weight_input="weight"):
        outputs = None if loss_models else [model.graph.output[0].name]
        self.engine = OrtGradientForwardBackward(model, weights, device, outputs)
        self.device = self.engine.device
        self.loss_models = loss_models
        self._loss_runners = {}
        self.update = SessionRunner(update_model, self.device)
        self.learning_rate = learning_rate
        self.weight_input = weight_input
        self.step_count = 0
        self._scalars = {}
        self.reset_state()

    # ------------------------------------------------------------- state
    @property
    def weights(self):
        return self.engine.weights

    def reset_state(self):
        """Zero optimizer state (velocities, moments) and step counter."""
        self.step_count = 0
        self.state = [
            [to_ortvalue(s, self.device) for s in
             self.learning_rate.init_state(tuple(w.shape()), w.numpy().dtype)]
            for w in self.engine.weights]

    def get_state(self):
        """Optimizer state as numpy copies: one list per weight."""
        return [[s.numpy().copy() for s in states] for states in self.state]

    def set_state(self, state, step_count=0):
        """Restore :meth:`get_state` output (arrays are copied)."""
        self.state = [[to_ortvalue(np.array(s, copy=True), self.device)
                       for s in states] for states in state]
        self.step_count = step_count

    def _scalar(self, value, dtype):
        key = (float(value), dtype)
        if key not in self._scalars:
            if len(self._scalars) > 256:
                self._scalars.clear()
            self._scalars[key] = to_ortvalue(np.array(value, dtype=dtype),
                                             self.device)
        return self._scalars[key]

    def _loss_runner(self, weighted):
        if weighted not in self._loss_runners:
            self._loss_runners[weighted] = SessionRunner(
                self.loss_models[int(weighted)], self.device)
        return self._loss_runners[weighted]

    # --------------------------------------------------------------- steps
    def loss_and_gradient(self, X, y, sample_weight, training=True):
        """Loss value (OrtValue) and dE/dY for a batch."""
        if self.loss_models is None:  # the graph's first output is the loss
            inputs = [X, y]
            if len(self.engine.input_names) > 2:  # a sample-weight input
                inputs.append(np.ones(X.shape[0], dtype=y.dtype)
                              if sample_weight is None else sample_weight)
            prediction = self.engine.forward(inputs, training=training)[0]
            ones = np.ones(tuple(prediction.shape()), dtype=prediction.numpy().dtype)
            return prediction, to_ortvalue(ones, self.device)
        prediction = self.engine.forward([X], training=training)[0]
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
        feeds = {name: self._scalar(value, dtype) for name, value in
                 self.learning_rate.step_scalars(step).items()}
        feeds["loss"] = loss
        feeds["penalty_scale"] = self._scalar(1.0 / rows, dtype)
        names = self.engine.weights_to_train
        states = self.learning_rate.state_names
        for name, weight, grad_w, state in zip(names, self.weights, grads, self.state):
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
        return total

    def dataset_loss(self, X, y):
        """Loss over every row of (X, y), in one pass, in order (no penalty)."""
        loss, _ = self.loss_and_gradient(X, y, None, training=False)
        return float(loss.numpy())

    def predict(self, X):
        """The graph's first output for X, as numpy."""
        return self.engine.forward([X], training=False)[0].numpy()
