"""The owner of one fit: what a fit resolved, its step runner, its history
and stopping state, and the epoch loop as its methods.

An estimator validates its parameters and data, resolves the update rule,
the loss and the penalty, builds the
:class:`~onnxtrain.training.step_runner.StepRunner` and hands them to a
:class:`TrainingRun`, which then owns the fit: the counters and history
the estimator publishes as its fitted attributes (``train_losses_``,
``n_iter_``, ``t_``, ``history_``...), the stopping and divergence state,
the best weights of early stopping, the generator and the row order. A
``warm_start`` fit and every ``partial_fit`` go on with the same run.

The epochs run as skorch's ``NeuralNet`` splits them:

- :meth:`TrainingRun.fit_loop`: every epoch of a fit or one of a partial_fit;
- :meth:`TrainingRun.run_epochs`: one epoch, or several in one run of the
  in-graph loop (the 'loop' path) when nothing happens between them;
- :meth:`TrainingRun.run_single_epoch`: the batches of one epoch;
- :meth:`TrainingRun.train_step`: one batch, one step of the runner.

A run never holds its estimator: each call receives the estimator's
current parameters (:class:`FitSettings`) and, for the duration of
:meth:`~TrainingRun.fit_loop` only, the hooks that reach back to it
(:class:`FitHooks`), so that no reference cycle keeps the sessions alive.
A subclass changes one convention by overriding one method (see
:class:`onnxtrain.neural_network._loop.MLPEpochLoop`, scikit-learn MLP's).
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from sklearn.utils import gen_batches
from tqdm.auto import tqdm

from ..exceptions import ConvergenceError, ConvergenceWarning
from ..assembly.models import replace_initializers
from ..graph.training_mode import inference_mode
from .callbacks import Callback

__all__ = ["FitHooks", "FitSettings", "FitState", "TrainingRun"]

logger = logging.getLogger("onnxtrain")

_PATHS = ("auto", "split", "fused", "loop")


@dataclass
class FitSettings:
    """The estimator's parameters one call of a run reads (read again at
    every fit and partial_fit, so that ``set_params`` takes effect).

    Parameters
    ----------
    batch_size : int
        Rows per step (clipped to the number of rows).
    training_path : {'auto', 'split', 'fused', 'loop'}, default='auto'
    shuffle, early_stopping : bool, default=False
    validation_period : int, default=1
        Epochs between two validation losses.
    n_iter_no_change : int or float, default=10
    tol : float or None, default=None
        The stopping rules' threshold; None: no stopping on the loss.
    exc : bool, default=True
        Raise (True) or warn on a non-finite loss.
    verbose : int, default=0
        > 0: a progress bar; > 1: with the loss and the learning rate.
    print_progress : bool, default=False
        Print scikit-learn MLP's lines ("Iteration %d, loss = %.8f").
    enable_logging : bool, default=False
    callbacks : list of Callback, default=[]
    name : str, default='fit'
        The progress bar's label.
    loop_max_bytes : int, default=8 MiB
        'auto' leaves the in-graph loop for the fused step above this many
        bytes of weights and optimizer state.
    """

    batch_size: int
    training_path: str = "auto"
    shuffle: bool = False
    early_stopping: bool = False
    validation_period: int = 1
    n_iter_no_change: float = 10
    tol: float | None = None
    exc: bool = True
    verbose: int = 0
    print_progress: bool = False
    enable_logging: bool = False
    callbacks: list = field(default_factory=list)
    name: str = "fit"
    loop_max_bytes: int = 8 * 2 ** 20


@dataclass
class FitHooks:
    """What reaches back to the estimator during :meth:`TrainingRun.fit_loop`
    (dropped when it returns).

    Parameters
    ----------
    target : object
        What the callbacks receive (the estimator).
    score : callable, default=None
        ``score(X_val, y_val) -> float``: the early-stopping score.
    dtype : numpy dtype, default=numpy.float32
        Type of the step's scalars (learning rate, sample weights).
    before_callbacks : callable, default=None
        Called before each callback (an MLP drops the weight lists a
        callback may have read: the network holds the weights).
    """

    target: object
    score: object = None
    dtype: object = np.float32
    before_callbacks: object = None


def resolve_training_path(path):
    """The ``training_path`` parameter, checked.

    Raises
    ------
    ValueError
        Not one of 'auto', 'split', 'fused', 'loop'.
    """
    if not isinstance(path, str) or path not in _PATHS:
        raise ValueError(f"training_path must be one of {_PATHS}, got {path!r}.")
    return path


def has_batch_hooks(callbacks):
    """Whether a callback acts between batches."""
    return any(type(cb).on_batch_begin is not Callback.on_batch_begin
               or type(cb).on_batch_end is not Callback.on_batch_end
               for cb in callbacks)


class FitState:
    """What a fit holds between calls: the resolved objects, the step
    runner, the counters and history, the stopping and divergence state,
    the generator and the row order; its state and pickling.

    Parameters
    ----------
    update_rule : BaseLearningRate
        The resolved ``learning_rate`` (its update graph built).
    loss, penalty : objects, default=None
        The loss trained and the penalty.
    rng : numpy.random.RandomState, default=None
        Shuffles the rows and splits off the early-stopping rows.
    resolved_loss : object, default=None
        The loss resolved from the parameter, before its adaptation to
        the graph (``loss``); default ``loss``.
    loss_models, fused_spec : objects, default=None
        The loss graphs and what the fused paths need, kept to rebuild the
        runner after unpickling.
    early_stopping : bool, default=False
        Whether the fit keeps validation scores (from -inf).
    """

    def __init__(self, update_rule, loss=None, penalty=None, rng=None,
                 resolved_loss=None, loss_models=None, fused_spec=None,
                 early_stopping=False):
        self.update_rule, self.loss, self.penalty = update_rule, loss, penalty
        self.resolved_loss = loss if resolved_loss is None else resolved_loss
        self.loss_models, self.fused_spec = loss_models, fused_spec
        self.rng, self.order = rng, None
        self.runner, self.pickled = None, None
        self.t = self.n_iter = 0
        self.train_losses, self.history = [], []
        self.validation_losses = None
        self.validation_scores = [] if early_stopping else None
        self.best_validation_score = -np.inf if early_stopping else None
        self.best_loss = np.inf
        self.no_improvement = 0
        self.best_weights = self.best_buffers = self.finite_weights = None
        self.diverged = self.diverged_to_start = None
        self.path, self.stopped = None, False
        self.settings, self.hooks, self.incremental = None, None, False

    def go_on_with(self, previous, keep_optimizer=False):
        """Take over ``previous``'s weights, counters, history and generator
        (``set_params`` replaced the objects of a fitted run: a warm start
        or a partial_fit); with ``keep_optimizer``, its optimizer state and
        step too when this update rule keeps the same state. ``previous``
        is left as it was. Returns self."""
        runner = previous.runner
        for key, value in vars(previous).items():
            if key not in ("update_rule", "loss", "penalty", "resolved_loss",
                           "loss_models", "fused_spec", "runner", "pickled"):
                setattr(self, key, list(value) if isinstance(value, list) else value)
        self.runner.set_weights(runner.engine.get_weights())
        self.runner.set_buffers(runner.get_buffers())
        if keep_optimizer and tuple(self.update_rule.state_names) == tuple(
                previous.update_rule.state_names):
            self.runner.set_state(runner.get_state(), runner.step_count)
        self.update_rule.init_learning_rate()
        return self

    def attach(self, runner):
        """Give the run its runner; after unpickling, with the weights,
        optimizer state and running statistics pickled."""
        if self.pickled is not None:
            runner.set_weights(self.pickled["weights"])
            runner.set_state(self.pickled["state"], self.pickled["steps"])
            runner.set_buffers(self.pickled.get("buffers"))
        self.runner = runner
        return runner

    def get_state(self, include_optimizer=False):
        """The weights, or with ``include_optimizer`` the dict of
        :meth:`onnxtrain.OrtGradientForwardBackwardOptimizer.get_state`."""
        weights = self.runner.engine.get_weights()
        if not include_optimizer:
            return weights
        return {"weights": weights, "optimizer": self.runner.get_state(),
                "step": int(self.runner.step_count),
                "learning_rate": float(self.update_rule.value),
                "n_iter": int(self.n_iter), "t": int(self.t),
                "buffers": self.runner.get_buffers(),
                "rng": None if self.rng is None else self.rng.get_state(),
                "order": None if self.order is None else self.order.copy()}

    def set_state(self, state):
        """Replace the weights, or restore a :meth:`get_state` dict; on an
        error nothing is changed. Returns self.

        Raises
        ------
        ValueError
            Wrong number of tensors, unknown names or shapes, an optimizer
            state of another update rule, a missing or negative number.
        """
        if not (isinstance(state, dict) and "optimizer" in state):
            self.runner.set_weights(state)  # checks everything before it writes
            return self
        backup = self.get_state(include_optimizer=True)
        try:
            return self._set_full_state(state)
        except Exception:
            self._set_full_state(backup)
            raise

    def _set_full_state(self, state):
        runner, rule = self.runner, self.update_rule
        expected = [[tuple(w.shape()) for _ in rule.state_names]
                    for w in runner.engine.weights]
        given = [[np.shape(s) for s in states] for states in state["optimizer"]]
        if given != expected:
            raise ValueError(
                f"The optimizer state has shapes {given}; this estimator's update "
                f"rule {type(rule).__name__} keeps {list(rule.state_names)} per "
                f"weight: {expected}.")
        step, n_iter, t = (_state_number(state, key, int) for key in ("step", "n_iter", "t"))
        rate = _state_number(state, "learning_rate", float)
        runner.set_weights(state["weights"])  # checks (first)
        runner.set_state(state["optimizer"], step)
        runner.set_buffers(state.get("buffers"))
        rule.value = rate
        self.n_iter, self.t = n_iter, t
        if state.get("rng") is not None:
            self.rng = np.random.RandomState()
            self.rng.set_state(state["rng"])
        order = state.get("order")
        self.order = None if order is None else np.array(order, copy=True)
        return self

    def trained_model(self, model):
        """``model`` (not modified) with the trained weights and running
        statistics as initializers, in inference mode."""
        engine = self.runner.engine
        values = dict(zip(engine.weights_to_train, engine.get_weights()))
        values.update(self.runner.get_buffers())
        return inference_mode(replace_initializers(model, values))

    def __getstate__(self):
        state = self.__dict__.copy()
        runner = state.pop("runner", None)
        # the roll-back copy belongs to the runner (its file is never
        # pickled); a copy pickled during a fit goes on from its weights
        state["hooks"] = state["finite_weights"] = None
        if runner is not None:
            state["pickled"] = {"weights": runner.engine.get_weights(),
                                "state": runner.get_state(),
                                "steps": runner.step_count,
                                "buffers": runner.get_buffers()}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.runner = None


class TrainingRun(FitState):
    """:class:`FitState` with the epoch loop: batches, validation, stopping
    rules, learning-rate schedules, reporting and callbacks (see the
    module's notes)."""

    def configure(self, settings, incremental=False):
        """The parameters of the next call (a fit when not ``incremental``,
        else a partial_fit): read by :meth:`choose_path` and :meth:`fit_loop`.

        A partial_fit runs one epoch continuing the schedule, whose learning
        rate is the schedule's at the number of samples seen before each
        batch (``t``, as scikit-learn's MLP counts time), so that the weights
        do not depend on how the data is cut into partial_fit calls."""
        self.settings, self.incremental = settings, incremental
        self.diverged = self.diverged_to_start = None
        return self

    # ---------------------------------------------------------- schedule
    def schedule_time(self, epochs_ahead=0, n_samples=0):
        """Time step of the learning-rate schedule ``epochs_ahead`` epochs
        from now: epochs completed in a fit (onnxcustom's convention),
        samples seen in a partial_fit (scikit-learn MLP's ``t_``)."""
        if self.incremental:
            return self.t + epochs_ahead * n_samples
        return self.n_iter + epochs_ahead

    def schedule_varies(self):
        """Whether the schedule's rate changes with time (a partial_fit then
        changes it at every batch)."""
        rate = self.update_rule
        if getattr(rate, "learning_rate", None) == "adaptive":
            return False
        return rate.schedule(0) != rate.schedule(10 ** 6)

    def per_batch_host_work(self):
        """Why the host must act between the batches of an epoch (the
        in-graph loop cannot run it), or None."""
        if has_batch_hooks(self.settings.callbacks):
            return "a callback acts between batches"
        if self.incremental and self.schedule_varies():
            return ("partial_fit changes the schedule's learning rate at every "
                    "batch (samples seen)")
        return None

    def choose_path(self, sample_weight, batch_size):
        """'split' (the seed's: four graphs per step), 'fused' (one graph
        per step) or 'loop' (an ONNX Loop over the batches): the requested
        one, or with 'auto' the fastest available: the loop, unless the
        parameters exceed ``settings.loop_max_bytes`` (its extra copies of
        them), a batch has zero weight or the host acts between batches
        (:meth:`per_batch_host_work`); the split path when the model cannot
        be fused.

        Raises
        ------
        ValueError
            The path requested cannot run, saying why.
        """
        path = resolve_training_path(self.settings.training_path)
        if path == "split":
            return path
        weighted = sample_weight is not None
        zero_batch = weighted and any(
            not sample_weight[b].sum() > 0
            for b in gen_batches(sample_weight.shape[0], batch_size))
        host = self.per_batch_host_work()
        reason = self.runner.fused_graph("flat step", weighted)
        if isinstance(reason, str) or (path == "loop" and (zero_batch or host)):
            if path == "auto":
                return "split"
            why = reason if isinstance(reason, str) else (
                "a batch has zero weight" if zero_batch else host)
            raise ValueError(f"training_path={path!r} is not available: {why}.")
        if path == "auto":
            heavy = self.runner.parameter_bytes() > self.settings.loop_max_bytes
            return "fused" if (zero_batch or heavy or host) else "loop"
        return path

    # ------------------------------------------------------------- epochs
    def fit_loop(self, X, y, sample_weight, X_val, y_val, n_epochs, hooks):
        """Run ``n_epochs`` epochs (fewer when a stopping rule, a callback
        or a non-finite loss ends training); keep the best weights of early
        stopping. ``hooks`` (:class:`FitHooks`) are dropped on return."""
        self.hooks = hooks
        try:
            self._epochs(X, y, sample_weight, X_val, y_val, n_epochs)
        finally:
            self.hooks = None

    def _epochs(self, X, y, sample_weight, X_val, y_val, n_epochs):
        settings = self.settings
        n_samples = X.shape[0]
        batch_size = int(np.clip(settings.batch_size, 1, n_samples))
        period = 1 if settings.early_stopping else settings.validation_period
        if not self.incremental or self.history is None:
            self.history = []
        if not self.incremental:
            self.train_losses, self.n_iter = [], 0
            self.update_rule.update_learning_rate(self.schedule_time())
        # the epoch count of the weights this call starts from (see rolled_back)
        self.start_epoch = self.n_iter
        if X_val is not None and self.validation_losses is None:
            self.validation_losses = []
        self.path = path = self.choose_path(sample_weight, batch_size)
        chunk = n_epochs if path == "loop" and self.one_run_allowed(X_val) else 1
        bar = tqdm(total=n_epochs, disable=not settings.verbose, desc=settings.name)
        try:
            self.notify("on_train_begin", X, y)
            self._run_epochs_loop(path, X, y, sample_weight, X_val, y_val, period,
                                  n_samples, batch_size, n_epochs, chunk, bar)
            # the copy is kept only during the epochs (its arrays stay with
            # the runner for the next fit's copy)
            self.finite_weights = None
            if settings.early_stopping and self.best_weights is not None:
                self.runner.set_weights(self.best_weights)
                self.runner.set_buffers(self.best_buffers)
            self.notify("on_train_end", X, y)
        except BaseException as error:
            self._train_error(error)
            raise
        finally:
            bar.close()

    def _run_epochs_loop(self, path, X, y, sample_weight, X_val, y_val, period,
                         n_samples, batch_size, n_epochs, chunk, bar):
        """The epochs, ``chunk`` per run, until ``n_epochs`` or a stop."""
        done = 0
        while done < n_epochs:
            count = min(chunk, n_epochs - done)
            self.notify("on_epoch_begin", self.n_iter + 1)
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

    def _train_error(self, error):
        """Tell every callback that training raised ``error`` (those holding
        resources, an MLflow run, release them); a callback failing there
        does not hide ``error`` nor keep the others from hearing it."""
        for callback in self.settings.callbacks:
            hook = getattr(callback, "on_train_error", None)
            if hook is None:
                continue
            try:
                hook(self.hooks.target, error)
            except Exception as other:  # noqa: BLE001 - the first error wins
                warnings.warn(f"{type(callback).__name__}.on_train_error raised "
                              f"{type(other).__name__}: {other}", RuntimeWarning)

    def notify(self, hook, *args):
        """Call ``hook`` on every callback; True when one asks to stop."""
        stop = False
        for callback in self.settings.callbacks:
            if self.hooks.before_callbacks is not None:
                self.hooks.before_callbacks()
            stop = bool(getattr(callback, hook)(self.hooks.target, *args)) or stop
        return stop

    def record_epoch(self, loss, X_val, y_val, period, n_samples, bar, duration):
        """Record an epoch (losses, history, callbacks); True to stop."""
        self.train_losses.append(loss)
        self.n_iter += 1
        self.t += n_samples
        record = {"epoch": self.n_iter, "train_loss": float(loss),
                  "learning_rate": float(self.update_rule.value),
                  "dur": float(duration)}
        if X_val is not None and self.n_iter % period == 0:
            self.validation_losses.append(self.runner.dataset_loss(X_val, y_val))
            record["valid_loss"] = float(self.validation_losses[-1])
        self.history.append(record)
        bar.update(1)
        self.report(bar, loss)
        stop = self.update_no_improvement(loss, X_val, y_val)
        if self.settings.early_stopping and self.validation_scores:
            record["valid_score"] = float(self.validation_scores[-1])
        stop = self.notify("on_epoch_end", record) or stop
        self.update_rule.update_learning_rate(self.schedule_time())
        return stop

    def one_run_allowed(self, X_val):
        """Whether every epoch can run in one session run: nothing the host
        must do between epochs (validation, stopping rules, adaptive rate,
        shuffling, progress, logging, callbacks)."""
        s = self.settings
        adaptive = getattr(self.update_rule, "learning_rate", None) == "adaptive"
        return not (X_val is not None or s.early_stopping or adaptive
                    or s.tol is not None or s.shuffle or s.verbose or s.print_progress
                    or s.enable_logging or self.incremental or s.callbacks)

    def run_epochs(self, path, X, y, sample_weight, batch_size, count):
        """``count`` epochs; returns their losses, shorter (or None) when a
        non-finite loss stopped training (``exc=False``)."""
        if path != "loop":
            loss = self.run_single_epoch(X, y, sample_weight, batch_size, path)
            return None if loss is None else [loss]
        if self.settings.shuffle:
            order = self.shuffled_order(X.shape[0])
            X, y = X[order], y[order]
            sample_weight = None if sample_weight is None else sample_weight[order]
        rates = [self.scalars_ahead(j, X.shape[0]) for j in range(count)]
        losses = self.runner.loop_epochs(X, y, sample_weight, batch_size, rates)
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
        rate = self.update_rule
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
        in ``n_iter`` (a replay of the in-graph loop)."""
        self.keep_finite_weights(self.n_iter + ahead)
        order = self.shuffled_order(X.shape[0]) \
            if self.settings.shuffle and reshuffle else None
        dtype = self.hooks.dtype
        per_batch = self.incremental and self.schedule_varies()
        total = weight_total = 0.0
        for index_batch, batch in enumerate(gen_batches(X.shape[0], batch_size)):
            index = batch if order is None else order[batch]
            wb = None if sample_weight is None else sample_weight[index]
            if wb is not None and not wb.sum() > 0:
                continue  # a batch of zero weights carries no gradient
            if per_batch:
                self.update_rule.update_learning_rate(self.t + batch.start)
            self.notify("on_batch_begin", index_batch)
            loss = self.train_step(path, X[index], y[index], wb, dtype)
            if not np.isfinite(loss):
                self.non_finite(loss, self.n_iter + ahead + 1)
                return None
            self.notify("on_batch_end", index_batch, loss)
            rows = self.batch_rows(batch, wb)
            total += loss * rows
            weight_total += rows
        return total / weight_total

    def train_step(self, path, X, y, sample_weight, dtype):
        """One step of the runner on a batch ('fused': one graph run,
        'split': four); returns the batch loss (float)."""
        runner = self.runner
        step = runner.fused_step if path == "fused" else runner.step
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
        order = self.order
        if order is None or order.shape[0] != n_samples:
            order = np.arange(n_samples)
        self.order = order[self.rng.permutation(n_samples)]
        return self.order

    # ----------------------------------------------------------- stopping
    def update_no_improvement(self, loss, X_val, y_val):
        """scikit-learn's ``_update_no_improvement_count``; True means stop."""
        tol = self.settings.tol
        if self.settings.early_stopping:
            score = self.hooks.score(X_val, y_val)
            self.validation_scores.append(score)
            improved = self.at_least(score, self.best_validation_score + tol)
            if score > self.best_validation_score:
                self.best_validation_score = score
                self.best_weights = self.runner.engine.get_weights(out=self.best_weights)
                self.best_buffers = self.runner.get_buffers()
        else:
            improved = tol is None or self.at_least(self.best_loss - tol, loss)
            self.best_loss = min(self.best_loss, loss)
        self.no_improvement = 0 if improved else self.no_improvement + 1
        if self.no_improvement > self.settings.n_iter_no_change:
            if self.update_rule.trigger_stopping():
                return True
            self.no_improvement = 0
        return False

    #: Whether an epoch whose score or loss is NaN counts as an improvement
    #: (scikit-learn's MLP compares "not worse", which a NaN always is).
    nan_improves = False

    def at_least(self, value, threshold):
        """``value >= threshold``, the NaN cases as :attr:`nan_improves`."""
        return not value < threshold if self.nan_improves else value >= threshold

    def report(self, bar, loss):
        """Progress bar and log line of an epoch."""
        if self.settings.verbose > 1:
            bar.set_postfix(loss=f"{loss:.6g}", lr=f"{self.update_rule.value:.3g}")
        if self.settings.enable_logging:
            logger.info("epoch %d loss=%r lr=%r", self.n_iter, loss,
                        self.update_rule.value)

    # --------------------------------------------------------- divergence
    def keep_finite_weights(self, epochs):
        """Copy the weights an epoch starts from, the weights after
        ``epochs`` epochs, when every value is finite: a divergence goes back
        to them (see :meth:`non_finite`; the runner's
        ``finite_weights_copy`` makes the copy, in memory or in a temporary
        file: :mod:`onnxtrain.training.rollback`)."""
        arrays = self.runner.finite_weights_copy()
        if arrays is not None:
            self.finite_weights = (arrays, epochs)

    def rolled_back(self, kept):
        """Record whether the weights put back after a divergence, ``kept``
        (arrays, epochs) or None, are those this call started from (then
        the call changed no weight: nothing of its own to check)."""
        self.diverged_to_start = (
            kept is not None and kept[1] == getattr(self, "start_epoch", None))

    def non_finite(self, loss, epoch):
        """A non-finite loss at ``epoch``: put back the best validation
        weights (early stopping) or the weights at the end of the last epoch
        whose loss was finite (the epoch before ``epoch``; the weights this
        fit started from when it is the first), never the exploding ones
        the last finite steps left, then raise or warn saying which."""
        self.diverged = float(loss)
        kept = self.finite_weights
        if self.settings.early_stopping and self.best_weights is not None:
            self.runner.set_weights(self.best_weights)
            which = ("the weights of the best validation score "
                     f"({self.best_validation_score:.6g}) are kept")
        elif kept is not None:
            kept[0].restore(self.runner.engine.weights)
            self.rolled_back(kept)
            which = ("the last finite weights are kept: " + (
                f"those at the end of epoch {kept[1]}, the last whose loss "
                "was finite" if kept[1] else "those this fit started from"))
        else:
            which = "the last finite weights are kept"
        self.finite_weights = None
        message = (f"The loss became {loss} at epoch {epoch}; {which}. Lower "
                   "the learning rate.")
        if self.settings.exc:
            raise ConvergenceError(message)
        warnings.warn(message, ConvergenceWarning)


def _state_number(state, key, kind):
    """``kind(state[key])`` for :meth:`FitState.set_state`, or a ValueError
    naming the key (a finite number >= 0 is expected)."""
    if key not in state:
        raise ValueError(f"The state has no {key!r} (a get_state("
                         "include_optimizer=True) dict has one).")
    try:
        value = kind(state[key])
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or not np.isfinite(value) or value < 0:
        raise ValueError(f"The state's {key!r} must be a finite number >= 0, got "
                         f"{state[key]!r}.")
    return value
