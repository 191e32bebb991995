"""The epoch loop of the estimators: batches, validation, stopping rules,
learning-rate schedules, reporting and callbacks, out of the estimators.

An estimator prepares a fit (validates, resolves the update rule and the
loss, builds its :class:`~onnxtrain.estimators._trainer.StepRunner`) and hands
the data to an :class:`EpochLoop`, which runs the epochs as skorch's
``NeuralNet`` splits them:

- :meth:`EpochLoop.fit_loop`: every epoch of a fit or one of a partial_fit;
- :meth:`EpochLoop.run_epochs`: one epoch, or several in one run of the
  in-graph loop (the 'loop' path) when nothing happens between them;
- :meth:`EpochLoop.run_single_epoch`: the batches of one epoch;
- :meth:`EpochLoop.train_step`: one batch, one step of the trainer.

The loop writes the estimator's fitted attributes (``train_losses_``,
``n_iter_``, ``t_``, ``history_``...) and reads its parameters; a subclass
changes one convention by overriding one method (see
:class:`onnxtrain.neural_network._loop.MLPEpochLoop`, scikit-learn MLP's).
"""
from __future__ import annotations

import logging
import numbers
import time
import warnings

import numpy as np
from sklearn.utils import gen_batches
from tqdm.auto import tqdm

from ..exceptions import ConvergenceError, ConvergenceWarning

__all__ = ["EpochLoop"]

logger = logging.getLogger("onnxtrain")


class EpochLoop:
    """Run the epochs of one fit or partial_fit of ``estimator``.

    Parameters
    ----------
    estimator : BaseOrtGradientEstimator
        Prepared for training: ``_trainer``, ``learning_rate_``, ``_rng``
        and the fitted attributes exist.
    callbacks : list of :class:`~onnxtrain.training.callbacks.Callback`, \
            default=()
        Hooks called at the start and end of training, of every epoch and
        of every batch (batch hooks make the epochs run batch by batch: no
        in-graph loop).
    incremental : bool, default=False
        A partial_fit: one epoch continuing the schedule, whose learning
        rate is the schedule's at the number of samples seen before each
        batch (``t_``, as scikit-learn's MLP counts time), so that the
        weights do not depend on how the data is cut into partial_fit calls
        (for chunks made of whole batches).
    """

    def __init__(self, estimator, callbacks=(), incremental=False):
        self.estimator = estimator
        self.callbacks = list(callbacks or ())
        self.incremental = incremental

    # ---------------------------------------------------------- schedule
    def schedule_time(self, epochs_ahead=0, n_samples=0):
        """Time step of the learning-rate schedule ``epochs_ahead`` epochs
        from now: epochs completed in a fit (onnxcustom's convention),
        samples seen in a partial_fit (scikit-learn MLP's ``t_``)."""
        est = self.estimator
        if self.incremental:
            return est.t_ + epochs_ahead * n_samples
        return est.n_iter_ + epochs_ahead

    def schedule_varies(self):
        """Whether the schedule's rate changes with time (a partial_fit then
        changes it at every batch)."""
        rate = self.estimator.learning_rate_
        if getattr(rate, "learning_rate", None) == "adaptive":
            return False
        return rate.schedule(0) != rate.schedule(10 ** 6)

    def has_batch_hooks(self):
        """Whether a callback acts between batches."""
        from .callbacks import Callback
        return any(type(cb).on_batch_begin is not Callback.on_batch_begin
                   or type(cb).on_batch_end is not Callback.on_batch_end
                   for cb in self.callbacks)

    def per_batch_host_work(self):
        """Why the host must act between the batches of an epoch (the
        in-graph loop cannot run it), or None."""
        if self.has_batch_hooks():
            return "a callback acts between batches"
        if self.incremental and self.schedule_varies():
            return ("partial_fit changes the schedule's learning rate at every "
                    "batch (samples seen)")
        return None

    # ------------------------------------------------------------- epochs
    def fit_loop(self, X, y, sample_weight, X_val, y_val, n_epochs):
        """Run ``n_epochs`` epochs (fewer when a stopping rule, a callback
        or a non-finite loss ends training); keep the best weights of early
        stopping."""
        est = self.estimator
        n_samples = X.shape[0]
        batch_size = int(np.clip(est.batch_size, 1, n_samples))
        period = 1 if est.early_stopping else validation_period(
            est.validation_every, est.max_iter)
        if not self.incremental or getattr(est, "history_", None) is None:
            est.history_ = []  # (estimators pickled before history_ had none)
        if not self.incremental:
            est.train_losses_, est.n_iter_ = [], 0
            est.learning_rate_.update_learning_rate(self.schedule_time())
        # the epoch count of the weights this call starts from (see rolled_back)
        self.start_epoch = est.n_iter_
        if X_val is not None and est.validation_losses_ is None:
            est.validation_losses_ = []
        path = est._choose_path(sample_weight, batch_size, self)
        est.training_path_ = path
        chunk = n_epochs if path == "loop" and self.one_run_allowed(X_val) else 1
        bar = tqdm(total=n_epochs, disable=not est.verbose, desc=type(est).__name__)
        self.notify("on_train_begin", X, y)
        done = 0
        while done < n_epochs:
            count = min(chunk, n_epochs - done)
            self.notify("on_epoch_begin", est.n_iter_ + 1)
            start = time.perf_counter()
            losses = self.run_epochs(path, X, y, sample_weight, batch_size, count)
            duration = (time.perf_counter() - start) / count
            stop = losses is None or len(losses) < count
            for loss in losses or ():
                stop = self.record_epoch(loss, X_val, y_val, period, n_samples,
                                         bar, duration) or stop
            done += chunk
            if stop:
                break
        bar.close()
        # the copy is kept only during the epochs (its arrays stay with the
        # trainer for the next fit's copy)
        est._finite_weights = None
        if est.early_stopping and est._best_weights is not None:
            est._trainer.set_weights(est._best_weights)
            est._trainer.set_buffers(getattr(est, "_best_buffers", None))
        self.notify("on_train_end", X, y)

    def notify(self, hook, *args):
        """Call ``hook`` on every callback; True when one asks to stop."""
        stop = False
        for callback in self.callbacks:
            stop = bool(getattr(callback, hook)(self.estimator, *args)) or stop
        return stop

    def record_epoch(self, loss, X_val, y_val, period, n_samples, bar, duration):
        """Record an epoch (losses, history, callbacks); True to stop."""
        est = self.estimator
        est.train_losses_.append(loss)
        est.n_iter_ += 1
        est.t_ += n_samples
        record = {"epoch": est.n_iter_, "train_loss": float(loss),
                  "learning_rate": float(est.learning_rate_.value),
                  "dur": float(duration)}
        if X_val is not None and est.n_iter_ % period == 0:
            est.validation_losses_.append(est._trainer.dataset_loss(X_val, y_val))
            record["valid_loss"] = float(est.validation_losses_[-1])
        est.history_.append(record)
        bar.update(1)
        self.report(bar, loss)
        stop = self.update_no_improvement(loss, X_val, y_val)
        if est.early_stopping and est.validation_scores_:
            record["valid_score"] = float(est.validation_scores_[-1])
        stop = self.notify("on_epoch_end", record) or stop
        est.learning_rate_.update_learning_rate(self.schedule_time())
        return stop

    def one_run_allowed(self, X_val):
        """Whether every epoch can run in one session run: nothing the host
        must do between epochs (validation, stopping rules, adaptive rate,
        shuffling, progress, logging, callbacks)."""
        est = self.estimator
        adaptive = getattr(est.learning_rate_, "learning_rate", None) == "adaptive"
        return not (X_val is not None or est.early_stopping or adaptive
                    or est._stopping_tol() is not None or est.shuffle
                    or est.verbose or est.enable_logging or self.incremental
                    or self.callbacks)

    def run_epochs(self, path, X, y, sample_weight, batch_size, count):
        """``count`` epochs; returns their losses, shorter (or None) when a
        non-finite loss stopped training (``exc=False``)."""
        if path != "loop":
            loss = self.run_single_epoch(X, y, sample_weight, batch_size, path)
            return None if loss is None else [loss]
        est = self.estimator
        if est.shuffle:
            order = self.shuffled_order(X.shape[0])
            X, y = X[order], y[order]
            sample_weight = None if sample_weight is None else sample_weight[order]
        rates = [self.scalars_ahead(j, X.shape[0]) for j in range(count)]
        losses = est._trainer.loop_epochs(X, y, sample_weight, batch_size, rates)
        if not np.isfinite(losses).all():  # replay step by step to stop exactly
            results = []
            for _ in range(count):
                loss = self.run_single_epoch(X, y, sample_weight, batch_size,
                                             "fused", reshuffle=False,
                                             ahead=len(results))
                if loss is None:
                    return results
                results.append(loss)
            return results
        sizes = np.array([
            self.batch_rows(b, None if sample_weight is None else sample_weight[b])
            for b in gen_batches(X.shape[0], batch_size)], dtype=np.float64)
        return (losses.astype(np.float64) @ sizes / sizes.sum()).tolist()

    def scalars_ahead(self, epochs_ahead, n_samples):
        """The update rule's per-epoch scalars ``epochs_ahead`` epochs ahead."""
        rate = self.estimator.learning_rate_
        if epochs_ahead == 0:
            return rate.step_scalars(1)
        saved = rate.value
        rate.value = rate.schedule(self.schedule_time(epochs_ahead, n_samples))
        try:
            return rate.step_scalars(1)
        finally:
            rate.value = saved

    def run_single_epoch(self, X, y, sample_weight, batch_size, path="split",
                         reshuffle=True, ahead=0):
        """One pass over the data, one session run (fused) or four (split) per
        batch; returns the epoch loss, or None when a non-finite loss stopped
        training (``exc=False``). ``ahead``: epochs run but not yet recorded
        in ``n_iter_`` (a replay of the in-graph loop)."""
        est = self.estimator
        self.keep_finite_weights(est.n_iter_ + ahead)
        order = self.shuffled_order(X.shape[0]) if est.shuffle and reshuffle \
            else None
        dtype = est._float_dtype()
        per_batch = self.incremental and self.schedule_varies()
        total = weight_total = 0.0
        for index_batch, batch in enumerate(gen_batches(X.shape[0], batch_size)):
            index = batch if order is None else order[batch]
            wb = None if sample_weight is None else sample_weight[index]
            if wb is not None and not wb.sum() > 0:
                continue  # a batch of zero weights carries no gradient
            if per_batch:
                est.learning_rate_.update_learning_rate(est.t_ + batch.start)
            self.notify("on_batch_begin", index_batch)
            loss = self.train_step(path, X[index], y[index], wb, dtype)
            if not np.isfinite(loss):
                self.non_finite(loss, est.n_iter_ + ahead + 1)
                return None
            self.notify("on_batch_end", index_batch, loss)
            rows = self.batch_rows(batch, wb)
            total += loss * rows
            weight_total += rows
        return total / weight_total

    def train_step(self, path, X, y, sample_weight, dtype):
        """One step of the trainer on a batch ('fused': one graph run,
        'split': four); returns the batch loss (float)."""
        trainer = self.estimator._trainer
        step = trainer.fused_step if path == "fused" else trainer.step
        return step(X, y, sample_weight, dtype)

    def batch_rows(self, batch, sample_weight):
        """Weight of a batch's loss in the epoch loss: the sum of its sample
        weights, or its number of rows without weights."""
        if sample_weight is None:
            return float(batch.stop - batch.start)
        return float(sample_weight.sum())

    def shuffled_order(self, n_samples):
        """Row order of the next epoch: the previous order shuffled again,
        as scikit-learn's MLP does (``sample_idx = shuffle(sample_idx)``)."""
        est = self.estimator
        order = getattr(est, "_order", None)
        if order is None or order.shape[0] != n_samples:
            order = np.arange(n_samples)
        est._order = order[est._rng.permutation(n_samples)]
        return est._order

    # ----------------------------------------------------------- stopping
    def update_no_improvement(self, loss, X_val, y_val):
        """scikit-learn's ``_update_no_improvement_count``; True means stop."""
        est = self.estimator
        tol = est._stopping_tol()
        if est.early_stopping:
            score = est._validation_score(X_val, y_val)
            est.validation_scores_.append(score)
            improved = score >= est.best_validation_score_ + tol
            if score > est.best_validation_score_:
                est.best_validation_score_ = score
                est._best_weights = est._trainer.engine.get_weights(
                    out=est._best_weights)
                est._best_buffers = est._trainer.get_buffers()
        else:
            improved = tol is None or loss <= est.best_loss_ - tol
            est.best_loss_ = min(est.best_loss_, loss)
        est._no_improvement = 0 if improved else est._no_improvement + 1
        if est._no_improvement > est.n_iter_no_change:
            if est.learning_rate_.trigger_stopping():
                return True
            est._no_improvement = 0
        return False

    def report(self, bar, loss):
        """Progress bar and log line of an epoch."""
        est = self.estimator
        if est.verbose > 1:
            bar.set_postfix(loss=f"{loss:.6g}",
                            lr=f"{est.learning_rate_.value:.3g}")
        if est.enable_logging:
            logger.info("epoch %d loss=%r lr=%r", est.n_iter_, loss,
                        est.learning_rate_.value)

    # --------------------------------------------------------- divergence
    def keep_finite_weights(self, epochs):
        """Copy the weights an epoch starts from, the weights after
        ``epochs`` epochs, when every value is finite: a divergence goes back
        to them (see :meth:`non_finite`;
        :meth:`~onnxtrain.estimators._trainer.StepRunner.finite_weights_copy`
        makes the copy, one at a time: a large model's weights are large)."""
        arrays = self.estimator._trainer.finite_weights_copy()
        if arrays is not None:
            self.estimator._finite_weights = (arrays, epochs)

    def rolled_back(self, kept):
        """Record on the estimator whether the weights put back after a
        divergence, ``kept`` (arrays, epochs) or None, are those this call
        started from (then the call changed no weight: nothing of its own
        to check)."""
        self.estimator._diverged_to_start = (
            kept is not None and kept[1] == getattr(self, "start_epoch", None))

    def non_finite(self, loss, epoch):
        """A non-finite loss at ``epoch``: put back the best validation
        weights (early stopping) or the weights at the end of the last epoch
        whose loss was finite (the epoch before ``epoch``; the weights this
        fit started from when it is the first), never the exploding ones
        the last finite steps left, then raise or warn saying which."""
        est = self.estimator
        est._diverged = float(loss)
        kept = getattr(est, "_finite_weights", None)
        if est.early_stopping and est._best_weights is not None:
            est._trainer.set_weights(est._best_weights)
            which = ("the weights of the best validation score "
                     f"({est.best_validation_score_:.6g}) are kept")
        elif kept is not None:
            est._trainer.set_weights(kept[0])
            self.rolled_back(kept)
            which = ("the last finite weights are kept: " + (
                f"those at the end of epoch {kept[1]}, the last whose loss "
                "was finite" if kept[1] else "those this fit started from"))
        else:
            which = "the last finite weights are kept"
        est._finite_weights = None
        message = (f"The loss became {loss} at epoch {epoch}; {which}. Lower "
                   "the learning rate.")
        if est.exc:
            raise ConvergenceError(message)
        warnings.warn(message, ConvergenceWarning)


def validation_period(validation_every, max_iter):
    """Epochs between two validation losses (never 0).

    An int >= 1 is used as is; a float in (0, 1) is a fraction of
    ``max_iter``: ``max(1, int(validation_every * max_iter))``.

    Raises
    ------
    ValueError
        Non-positive values or floats >= 1 that are not integers.
    """
    value = validation_every
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value >= 1:
            return int(value)
    elif isinstance(value, numbers.Real) and 0 < value < 1:
        return max(1, int(value * max_iter))
    raise ValueError(f"validation_every must be an int >= 1 or a float in (0, 1), "
                     f"got {validation_every!r}.")
