"""The fit of :class:`~onnxtrain.neural_network.MLPRegressor` and
:class:`~onnxtrain.neural_network.MLPClassifier`: a
:class:`~onnxtrain.training.run.TrainingRun` under scikit-learn MLP's
conventions.

The MLP estimators own one :class:`MLPEpochLoop` (built at the first fit
from the layer sizes and the data, :func:`new_mlp_run`) and train with the
run's loop: epochs, batches, shuffling, early stopping, the stopping rule,
the 'adaptive' schedule, partial_fit and pickling. This class only states
where scikit-learn's MLP differs from the run's defaults
(``sklearn/neural_network/_multilayer_perceptron.py``, ``_fit_stochastic``):

- the schedule's time step is the number of samples seen, ``t``
  (``self._optimizer.iteration_ends(self.t_)``), and every fit starts at
  the initial rate (a fit builds a new optimizer);
- the epoch loss averages the batch losses weighted by their numbers of
  rows, even with sample weights;
- early stopping stratifies only single-output classification, refuses a
  validation set of fewer than 2 rows, and scores the validation rows with
  their sample weights: R² for regression, accuracy for classification;
- a warm-start fit zeroes the optimizer state and reseeds the generator,
  a partial_fit reseeds it (scikit-learn calls ``check_random_state`` at
  each call);
- a non-finite loss raises nothing here: the epoch where it happens ends
  training and is recorded as scikit-learn records it (its loss in the
  loss curve, a NaN validation score); the estimator then restores the best
  validation weights (early stopping) or raises scikit-learn's ValueError.
  onnxruntime's steps never commit non-finite weights, so training stops
  there rather than running on with NaN weights as scikit-learn does.
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split

from .._utils.gc import gc_frozen
from ..training.step_runner import StepRunner, step_graphs
from ..losses.learning_losses import resolve_learning_loss
from ..losses.penalties import resolve_learning_penalty
from ..optim.learning_rates import resolve_learning_rate
from ..training.run import TrainingRun, has_batch_hooks
from ._graph import OUTPUT_FUNCTIONS

__all__ = ["MLPEpochLoop", "decode_outputs", "new_mlp_run", "mlp_runner",
           "early_stopping_split", "validation_scorer"]


def decode_outputs(values, out_activation):
    """Class indices from probabilities or one-hot targets, as
    ``LabelBinarizer.inverse_transform`` reads them: argmax for 'softmax',
    ``values > 0.5`` otherwise ((n,) for one column, (n, k) indicators for
    multilabel)."""
    if out_activation == "softmax":
        return values.argmax(axis=1)
    indicator = (values > 0.5).astype(np.int64)
    return indicator.ravel() if indicator.shape[1] == 1 else indicator


def same_objects(objects, others):
    """Whether two lists of learning-rate / penalty objects (or None) have
    the same types and parameters."""
    return all(type(a) is type(b) and (a is None or a.get_params() == b.get_params())
               for a, b in zip(objects, others))


@gc_frozen
def mlp_runner(model, weights, run, device, types):
    """The step runner of ``run`` on the MLP's training graph ``model``
    (whose initializers hold the initial weights; ``types``: its
    :func:`~onnxtrain.graph.infer_value_types`)."""
    return StepRunner(model, weights, device, run.loss_models,
                      run.update_rule.axpy_onnx_, run.update_rule, "weight",
                      run.fused_spec, types=types)


def new_mlp_run(model, types, weights, loss, update_rule, penalty, device, rng,
                early_stopping=False, previous=None, keep_optimizer=False):
    """An :class:`MLPEpochLoop` training ``model``'s ``weights`` with the
    given objects, its runner on the graph's weights or, with ``previous``,
    going on with that run's weights, counters and generator (the objects
    are checked and copied as the estimators' parameters are)."""
    loss = resolve_learning_loss(loss)
    update_rule = resolve_learning_rate(update_rule)
    penalty = resolve_learning_penalty(penalty)
    loss_models, spec = step_graphs(model, weights, types, loss, update_rule,
                                    penalty)
    run = MLPEpochLoop(update_rule, loss, penalty, rng, loss_models=loss_models,
                       fused_spec=spec, early_stopping=early_stopping)
    run.attach(mlp_runner(model, weights, run, device, types))
    if previous is not None:
        run.go_on_with(previous, keep_optimizer)
    update_rule.init_learning_rate()
    return run


def early_stopping_split(X, y, sample_weight, rng, validation_fraction,
                         stratify):
    """scikit-learn's split: ``train_test_split`` on the same generator,
    stratified on ``stratify`` (or None); returns (X, X_val, y, y_val,
    sample_weight, validation sample weight).

    Raises
    ------
    ValueError
        Fewer than 2 validation rows.
    """
    arrays = [X, y] + ([] if sample_weight is None else [sample_weight])
    parts = train_test_split(*arrays, random_state=rng,
                             test_size=validation_fraction, stratify=stratify)
    if parts[1].shape[0] < 2:
        raise ValueError("The validation set is too small. Increase "
                         "'validation_fraction' or the size of your dataset.")
    weighted = sample_weight is not None
    return (parts[0], parts[1], parts[2], parts[3],
            parts[4] if weighted else None, parts[5] if weighted else None)


def validation_scorer(run, task, out_activation, weight):
    """``score(X_val, y_val)``: R² or accuracy of the validation rows with
    their sample weights ``weight`` (NaN when the predictions are not
    finite), as scikit-learn's ``_score``."""
    def score(X_val, y_val):
        output = run.runner.predict(X_val)
        if not np.isfinite(output).all():
            return np.nan
        if task == "regression":
            return r2_score(y_val, output, sample_weight=weight)
        proba = OUTPUT_FUNCTIONS[out_activation](output)
        return accuracy_score(decode_outputs(y_val, out_activation),
                              decode_outputs(proba, out_activation),
                              sample_weight=weight)
    return score


class MLPEpochLoop(TrainingRun):
    """:class:`~onnxtrain.training.run.TrainingRun` under scikit-learn MLP's
    conventions (see the module's notes)."""

    def fit_loop(self, X, y, sample_weight, X_val, y_val, n_epochs, hooks):
        """The run's epochs; scikit-learn's best weights start as the
        initial ones, and an epoch whose loss became non-finite is recorded
        as scikit-learn records it (the last epoch)."""
        if self.settings.early_stopping and self.best_weights is None:
            self.best_weights = self.runner.engine.get_weights()
        super().fit_loop(X, y, sample_weight, X_val, y_val, n_epochs, hooks)
        if self.diverged is not None:
            self.train_losses.append(self.diverged)
            self.n_iter += 1
            self.t += X.shape[0]
            if self.settings.early_stopping:
                self.validation_scores.append(np.nan)

    def per_batch_host_work(self):
        """scikit-learn's partial_fit changes the rate only at the end of a
        call (``iteration_ends(t_)``): only batch callbacks act between
        batches."""
        if has_batch_hooks(self.settings.callbacks):
            return "a callback acts between batches"
        return None

    def schedule_varies(self):
        return False  # the rate changes between epochs only, as scikit-learn's

    def schedule_time(self, epochs_ahead=0, n_samples=0):
        """Samples seen, ``t`` (scikit-learn's ``iteration_ends(t_)``); 0 at
        the start of a fit, which scikit-learn begins at
        ``learning_rate_init`` with a new optimizer."""
        if self.n_iter == 0 and epochs_ahead == 0:
            return 0
        return self.t + epochs_ahead * n_samples

    def batch_rows(self, batch, sample_weight):
        """scikit-learn weighs a batch loss by its rows, even with weights
        (``accumulated_loss += batch_loss * (batch_slice.stop -
        batch_slice.start)``)."""
        return float(batch.stop - batch.start)

    # scikit-learn's count compares "not worse", so a NaN resets it
    nan_improves = True

    def update_no_improvement(self, loss, X_val, y_val):
        self.stopped = super().update_no_improvement(loss, X_val, y_val)
        if self.settings.print_progress and self.settings.early_stopping:
            print(f"Validation score: {self.validation_scores[-1]:f}")
        return self.stopped

    def non_finite(self, loss, epoch):
        """Record the loss that ended training at ``epoch`` (see the
        module's notes) and put back the weights at the start of that epoch
        when they were finite (the last steps may have left exploding ones);
        the estimator raises scikit-learn's error after training, or early
        stopping restores its best weights."""
        kept = self.finite_weights
        if kept is not None:
            kept[0].restore(self.runner.engine.weights)
        self.rolled_back(kept)
        self.finite_weights = None
        self.diverged = float(loss)

    def report(self, bar, loss):
        if self.settings.print_progress:
            print(f"Iteration {self.n_iter}, loss = {loss:.8f}")
