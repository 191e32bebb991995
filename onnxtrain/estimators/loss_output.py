"""``OrtGradientOptimizer``: train a graph whose loss is already an output."""
from __future__ import annotations

import os

from ..assembly.rewrite import prediction_graph
from ._base import BaseOrtGradientEstimator
from ._inputs import check_features
from ._validation import check_sample_weight, check_targets, check_use_numpy

__all__ = ["OrtGradientOptimizer"]


class OrtGradientOptimizer(BaseOrtGradientEstimator):
    """Train the initializers of a graph that computes its own loss.

    The graph takes the features, the expected values and, optionally, the
    sample weights as inputs (in this order) and outputs the loss of a batch
    (``loss_output_name``); onnxtrain differentiates that output w.r.t. the
    weights and applies the same learning-rate objects as the other
    estimators. :func:`onnxtrain.assembly.models.add_loss_output` builds such a graph
    from a prediction graph.

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes or str
        Never modified.
    weights_to_train : list of str, default=None
        As in :class:`OrtGradientForwardBackwardOptimizer`.
    loss_output_name : str, default='loss'
        The output to minimize; its value is the batch loss as the graph
        defines it (sum or mean: the gradient is taken as is).
    max_iter : int, default=100
    training_optimizer_name : {'SGDOptimizer'}, default='SGDOptimizer'
    batch_size : int, default=10
    learning_rate : float, str or learning-rate object, default='SGD'
    device : {'cpu', 'cuda', 'cuda:N'}, default='cpu'
    warm_start : bool, default=False
        As in :class:`OrtGradientForwardBackwardOptimizer`.
    verbose : int, default=0
    validation_every : int or float, default=0.1
    saved_gradient : str, default=None
        Path where the gradient graph is saved after the first fit.
    sample_weight_name : str, default='weight'
        Name of the graph's sample-weight input, if it has one.
    random_state : int, RandomState instance or None, default=None
    shuffle : bool, default=False
    callbacks : list of Callback, default=None
        As in :class:`OrtGradientForwardBackwardOptimizer`.
    n_threads : int, default=None
        As in :class:`OrtGradientForwardBackwardOptimizer`.
    init : {'model', 'random'}, default='model'
        The initial weights: the graph's own, or drawn (a cold start), as
        in :class:`OrtGradientForwardBackwardOptimizer`.

    Attributes
    ----------
    weights_to_train_, frozen_weights_, train_losses_, validation_losses_, n_iter_, t_, history_
        As in :class:`OrtGradientForwardBackwardOptimizer`.
    """

    early_stopping = False
    validation_fraction = 0.1
    n_iter_no_change = 10
    tol = None
    learning_loss = None
    learning_penalty = None
    weight_name = None
    enable_logging = False
    exc = True

    _parameter_constraints: dict = {
        **BaseOrtGradientEstimator._parameter_constraints,
        "saved_gradient": [str, os.PathLike, None],
        "sample_weight_name": [str],
    }

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss",
                 max_iter=100, training_optimizer_name="SGDOptimizer",
                 batch_size=10, learning_rate="SGD", device="cpu",
                 warm_start=False, verbose=0, validation_every=0.1,
                 saved_gradient=None, sample_weight_name="weight",
                 random_state=None, shuffle=False, callbacks=None, n_threads=None,
                 init="model"):
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.training_optimizer_name = training_optimizer_name
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.validation_every = validation_every
        self.saved_gradient = saved_gradient
        self.sample_weight_name = sample_weight_name
        self.random_state = random_state
        self.shuffle = shuffle
        self.callbacks = callbacks
        self.n_threads = n_threads
        self.init = init

    def _make_training_model(self, model):
        names = [o.name for o in model.graph.output]
        if self.loss_output_name not in names:
            raise ValueError(f"loss_output_name={self.loss_output_name!r} is "
                             f"not an output of the model: {names}.")
        return model, prediction_graph(model, self.loss_output_name)

    _loss_in_graph = True  # no loss graph: the graph's output is the loss

    def _feature_inputs(self, model):
        return super()._feature_inputs(model)[:1]  # then targets, weights

    def _new_run(self, model, rng, previous=None, keep_optimizer=False):
        run = super()._new_run(model, rng, previous, keep_optimizer)
        if self.saved_gradient:
            import onnx
            onnx.save(run.runner.engine.gradient_model, self.saved_gradient)
        return run

    def _encode_targets(self, y, n_samples, classes, first, name="y"):
        model = self._training_model()
        label = [i for i in model.graph.input][1] if len(model.graph.input) > 1 \
            else None
        if label is None:
            raise ValueError("The graph must take the expected values as its "
                             "second input.")
        from ..graph import elem_type_to_numpy
        dtype = elem_type_to_numpy(label.type.tensor_type.elem_type)
        y = check_targets(y, n_samples, name, dtype)
        rank = len(label.type.tensor_type.shape.dim)
        if rank == 2 and y.ndim == 1:
            y = y.reshape(-1, 1)
        self._check_label_width(label.name, y, name)
        return y

    #: Ops comparing the expected values with the prediction elementwise.
    _BROADCASTING = {"Sub", "Add", "Mul", "Div", "Pow", "Max", "Min", "Sum",
                     "Mean", "Less", "Greater", "Equal", "Where"}

    def _check_label_width(self, label, y, name):
        """Refuse a y whose columns differ from the value the graph compares
        it with (a fixed width in the label's declared shape, or in the
        inferred shape of the other operand of an elementwise op reading
        the label): onnxruntime would broadcast (N, 1) against (N, 2) and
        train on a loss over N x 2 differences."""
        model = self._training_model()
        types = self._training_types()
        shapes = [("the label input", types.get(label, (None, None))[1])]
        for node in model.graph.node:
            if node.op_type in self._BROADCASTING and label in node.input:
                shapes += [(f"{other!r} (input of {node.op_type} node "
                            f"{node.name or node.output[0]!r})",
                            types.get(other, (None, None))[1])
                           for other in node.input if other and other != label]
        for what, shape in shapes:
            if shape is None or len(shape) != y.ndim or y.ndim < 2:
                continue
            width = shape[-1]
            if isinstance(width, int) and width != y.shape[-1]:
                raise ValueError(
                    f"{name} has {y.shape[-1]} columns but {what} has {width}: "
                    f"the graph compares {label!r} with it elementwise and "
                    "would broadcast one against the other.")

    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
            use_numpy=None):
        """Train the weights.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Cast to the type of the graph's second input (int64 labels for
            a log loss built by :func:`onnxtrain.assembly.models.add_loss_output`).
        sample_weight : array-like of shape (n_samples,) or (n_samples, 1), \
                default=None
            Fed to the graph's input ``sample_weight_name`` (ones when the
            graph has one and no weights are given).
        X_val, y_val, use_numpy
            As in :meth:`OrtGradientForwardBackwardOptimizer.fit`.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Bad parameter or data, or ``sample_weight`` for a graph without
            a sample-weight input (onnxcustom raised RuntimeError).
        TypeError
            Non-numeric data, or ``use_numpy`` not a bool.
        ConvergenceError
            A non-finite loss.
        """
        check_use_numpy(use_numpy)
        self._check_weight_input(sample_weight)
        return self._fit(X, y, sample_weight, X_val, y_val)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch, continuing from the current weights."""
        self._check_weight_input(sample_weight)
        return self._fit(X, y, sample_weight, incremental=True)

    def _check_weight_input(self, sample_weight):
        """Refuse sample weights the graph cannot take (they would be
        ignored)."""
        if sample_weight is None:
            return
        inputs = [i.name for i in self._training_model().graph.input]
        if len(inputs) < 3:
            raise ValueError(
                f"sample_weight is given but the graph's inputs {inputs} have no "
                f"sample-weight input (add_loss_output(..., weight_name="
                f"{self.sample_weight_name!r}) adds one).")

    def losses(self, X, y, sample_weight=None):
        """Value of the loss output on all of (X, y), in one pass.

        Parameters
        ----------
        X, y, sample_weight
            As :meth:`fit`.

        Returns
        -------
        float
            The graph's loss output, as the graph defines it.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before fit.
        ValueError
            Bad data, or weights for a graph without a sample-weight input.
        """
        trainer = self._ensure_trainer()
        self._check_weight_input(sample_weight)
        model = self._training_model()
        X = check_features(model, X, "X", self._training_types(),
                           self._feature_inputs(model))
        y = self._encode_targets(y, X.shape[0], None, False)
        if sample_weight is not None:
            sample_weight = check_sample_weight(sample_weight, X.shape[0],
                                                trainer._weight_dtype)
        loss, _ = trainer.loss_and_gradient(X, y, sample_weight, training=False)
        return float(loss.numpy())

    def score(self, X, y, sample_weight=None):
        """The negated loss output on (X, y): greater is better, as
        scikit-learn's scorers (``neg_mean_squared_error``...) expect, so
        ``GridSearchCV`` and ``cross_val_score`` need no ``scoring``.

        Parameters
        ----------
        X, y, sample_weight
            As :meth:`fit`.

        Returns
        -------
        float
            ``-losses(X, y, sample_weight)``: the graph's loss as it defines
            it (a sum grows with the rows: compare scores of equal sizes).

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before fit.
        ValueError
            As :meth:`losses`.
        """
        return -self.losses(X, y, sample_weight)


