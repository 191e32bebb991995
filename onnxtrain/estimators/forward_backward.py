"""Estimators training the initializers of an ONNX graph with gradients from
:class:`~onnxtrain.runtime.ForwardBackwardEngine`: a regressor (the onnxcustom
``OrtGradientForwardBackwardOptimizer``) and a classifier."""
from __future__ import annotations

import warnings

import numpy as np
from scipy.special import expit, softmax
from sklearn.base import ClassifierMixin, RegressorMixin, clone
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils.multiclass import unique_labels

from ..assembly.rewrite import (class_labels, prediction_graph, probability_graph,
                                rewrite_ml_linear_ops)
from ..assembly.training_graphs import final_activation
from ..losses.learning_losses import CrossEntropyLearningLoss, NegLogLearningLoss
from ._base import BaseOrtGradientEstimator, prediction_dtype
from ._validation import check_sample_weight, check_targets, check_use_numpy

__all__ = ["OrtGradientForwardBackwardOptimizer",
           "OrtGradientForwardBackwardClassifier"]

_COMMON_PARAMETERS = """
    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes or str
        The graph (never modified). {model}
    weights_to_train : list of str, default=None
        Initializers to train. None: the model's weights, chosen by the
        graph's structure (:func:`onnxtrain.assembly.weight_roles.default_weights`):
        the predictor's coefficients and intercepts (MatMul, Gemm, Conv
        operands and their biases, and the other float initializers of
        rank >= 1 reaching the output through differentiable ops), not the
        preprocessing constants before the predictor (a scaler's offsets
        and scales, PCA's mean and components), nor one-element constants
        of arithmetic (skl2onnx's ``unity`` in ``1 - p``), nor integer
        tensors. ``frozen_weights_`` says why each float initializer left
        out is. A list wins over that choice; an unknown name raises a
        ValueError listing the candidates.
    loss_output_name : str, default='loss'
        Kept for compatibility with onnxcustom; see ``OrtGradientOptimizer``.
    max_iter : int, default=100
        Number of epochs.
    training_optimizer_name : {{'SGDOptimizer'}}, default='SGDOptimizer'
    batch_size : int, default=10
        Rows per step, clipped to [1, n_samples]; the last batch of an epoch
        may be smaller and its gradient is the mean over its own rows.
    learning_rate : float, str or learning-rate object, default='SGD'
        A float x means ``LearningRateSGD(eta0=x)`` ('invscaling' schedule,
        t = epochs completed); names: 'SGD', 'SGDNesterov', 'Adam', 'AdamW';
        or an object from :mod:`onnxtrain.optim`, a chain of gradient
        clipping or weight decay before one included
        (``chain(ClipByGlobalNorm(1.0), LearningRateAdam())``).
    device : {{'cpu', 'cuda', 'cuda:N'}}, default='cpu'
    warm_start : bool, default=False
        False: every fit starts from the initial weights (``init``). True:
        a fit continues from the weights of the previous fit (the initial
        weights at first), with a new optimizer state.
    verbose : int, default=0
        > 0: a tqdm progress bar over epochs; > 1: with loss and learning rate.
    validation_every : int or float, default=0.1
        With ``X_val``: validation loss every this many epochs (an int), or
        every ``max(1, int(validation_every * max_iter))`` epochs (a float < 1).
    learning_loss : str or loss object, default={loss!r}
        A name from :func:`onnxtrain.losses.resolve_learning_loss` or an object.
    enable_logging : bool, default=False
        Log each epoch's loss at INFO level on logger "onnxtrain".
    weight_name : str, default=None
        Name of the loss graph's sample-weight input (default 'weight').
    learning_penalty : None, str or penalty object, default=None
        'elastic' or an :class:`~onnxtrain.losses.penalties.ElasticLearningPenalty`;
        its gradient is added to the weights' gradient (scaled by the
        learning rate), biases excluded by default.
    exc : bool, default=True
        On a non-finite loss: raise ConvergenceError (True) or warn with a
        ConvergenceWarning and stop (False). Either way the weights kept
        are those at the end of the last epoch whose loss was finite (the
        starting weights if the first epoch diverged), or with early
        stopping the best validation ones; the message says which.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights, the shuffling and the early-stopping split.
    shuffle : bool, default=False
        Shuffle the rows at each epoch (False: batches in row order).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data{stratified}, stop when
        the validation score ({score}) has not improved by ``tol`` for
        ``n_iter_no_change`` epochs, and keep the best weights. ``fit``
        only: ``partial_fit`` raises a ValueError, as scikit-learn's MLP.
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=10
    tol : float or None, default=None
        Improvement threshold of the stopping rules. None: no stopping on the
        training loss; early stopping and the 'adaptive' schedule then use
        1e-4 (scikit-learn's default). With a float and no early stopping,
        training stops (or the 'adaptive' schedule divides the learning rate
        by 5) when the training loss has not decreased by ``tol`` for
        ``n_iter_no_change`` epochs (scikit-learn's MLP rule).
    training_path : {{'auto', 'split', 'fused', 'loop'}}, default='auto'
        How steps run: 'split' as onnxcustom did (forward, loss, backward
        and update graphs, four session runs per batch); 'fused' (one graph
        per batch doing all four); 'loop' (an ONNX Loop over the batches of
        device-resident data: one run per epoch, or one run for every epoch
        when nothing happens between epochs). 'auto' takes 'loop' when the
        model allows it (opset >= 13, a loss graph) and its weights and
        optimizer state take at most 8 MiB, 'fused' above (the Loop holds
        three to four copies of them, the fused step one), else 'split'. All paths compute the same steps (same losses and weights
        up to float rounding).
    callbacks : list of Callback, default=None
        Objects of :mod:`onnxtrain.training.callbacks` whose hooks run at
        the start and end of training, of each epoch and of each batch
        (scoring, checkpoints, per-batch learning rate with warmup, early
        stopping on any metric); they are cloned with the estimator.
    n_threads : int, default=None
        Threads of each onnxruntime session (intra-op), read when the
        sessions are built (first fit, unpickling). None: joblib's thread
        budget inside a joblib worker process (``cpu_count() // n_jobs``,
        e.g. ``GridSearchCV(n_jobs=2)``), onnxruntime's default elsewhere
        (see :mod:`onnxtrain.runtime.threads`).
    init : {{'model', 'random'}}, default='model'
        The initial weights. 'model': the graph's own initializers, so that
        fine-tuning a converted model (skl2onnx, a PyTorch export...) starts
        from what it learned. 'random': a cold start, ``weights_to_train``
        drawn Glorot-uniform as scikit-learn's MLP draws them
        (``random_state``; BatchNormalization running statistics and the
        other initializers keep their values), what onnxcustom did for
        graphs converted from scikit-learn with ``warm_start=False``.
"""

_COMMON_ATTRIBUTES = """
    Attributes
    ----------
    weights_to_train_ : list of str
    frozen_weights_ : dict
        ``name -> reason`` for each float initializer not trained
        (preprocessing constant, arithmetic constant, running statistic,
        not in ``weights_to_train``...).
    train_losses_ : list of float
        One loss per epoch: the mean of the batch losses weighted by their
        rows (or sample weights), comparable to ``MLPRegressor.loss_curve_``.
    validation_losses_ : list of float or None
        Loss on every row of the validation data, in order.
    validation_scores_ : list of float or None
        With early stopping: the validation score of each epoch.
    best_validation_score_, best_loss_ : float
    n_iter_ : int
        Epochs run by the last fit (partial_fit calls add up).
    t_ : int
        Samples seen since the weights were initialized.
    n_features_in_ : int
    history_ : list of dict
        One record per epoch of the last fit (partial_fit calls add up), as
        skorch's History: ``epoch``, ``train_loss``, ``learning_rate`` (the
        rate of the epoch's last step), ``dur`` (seconds), ``valid_loss`` (when
        computed), ``valid_score`` (early stopping) and what callbacks add.
    learning_rate_, learning_loss_, learning_penalty_
        The resolved objects. After fit the parameters ``learning_rate``,
        ``learning_loss`` and ``learning_penalty`` refer to them too, since
        onnxcustom's API exposed ``learning_rate.axpy_onnx_`` and
        ``learning_loss.loss_grad_onnx_`` (objects you pass are copied, never
        modified). The classifier may train a loss adapted to its graph
        (one column, a final Sigmoid or Softmax: see above): then
        ``learning_loss_`` is that loss, with ``loss_grad_onnx_``, and the
        parameter ``learning_loss`` keeps the loss resolved from what was
        given, which a fit on another graph adapts anew.
    train_session_ : onnxtrain.runtime.ForwardBackwardEngine
        The engine (rebuilt lazily after unpickling).
"""

_COMMON_RAISES = """
    Raises
    ------
    ValueError, TypeError
        Invalid parameters or data{refused}, raised by ``fit`` before any step.
    ConvergenceError
        A non-finite loss while ``exc=True``.
    """


class OrtGradientForwardBackwardOptimizer(RegressorMixin, BaseOrtGradientEstimator):
    __doc__ = ("""Train the initializers of an ONNX regression graph by
    mini-batch gradient descent on onnxruntime.

    The gradient graph is built by onnxtrain's autodiff; the loss and its
    gradient dE/dY, and the weight update, are small ONNX graphs run by
    their own sessions; every tensor of the loop stays an OrtValue on
    ``device`` and only the loss value is copied to the host per batch.
    """ + _COMMON_PARAMETERS.format(
        model="Its first output is the prediction; other outputs are ignored.",
        loss="square_error", stratified="", score="R²") + _COMMON_ATTRIBUTES + \
        _COMMON_RAISES.format(refused=""))

    _default_loss = "square_error"

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss",
                 max_iter=100, training_optimizer_name="SGDOptimizer",
                 batch_size=10, learning_rate="SGD", device="cpu",
                 warm_start=False, verbose=0, validation_every=0.1,
                 learning_loss="square_error", enable_logging=False,
                 weight_name=None, learning_penalty=None, exc=True,
                 random_state=None, shuffle=False, early_stopping=False,
                 validation_fraction=0.1, n_iter_no_change=10, tol=None,
                 training_path="auto", callbacks=None, n_threads=None,
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
        self.learning_loss = learning_loss
        self.enable_logging = enable_logging
        self.weight_name = weight_name
        self.learning_penalty = learning_penalty
        self.exc = exc
        self.random_state = random_state
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.training_path = training_path
        self.callbacks = callbacks
        self.n_threads = n_threads
        self.init = init

    # ------------------------------------------------------------ graph
    def _make_training_model(self, model):
        model = rewrite_ml_linear_ops(model, copy=False)
        return model, prediction_graph(model)

    # ---------------------------------------------------------- targets
    def _encode_targets(self, y, n_samples, classes, first, name="y"):
        y = check_targets(y, n_samples, name, prediction_dtype(
            self._training_model(), self._training_types()))
        if first:
            self._y_ndim = y.ndim
        rank = getattr(self, "_output_rank", None)
        if rank is None:
            model = self._training_model()
            shape = self._training_types()[model.graph.output[0].name][1]
            rank = 2 if shape is None else len(shape)
        if rank == 2 and y.ndim == 1:
            y = y.reshape(-1, 1)
        elif rank == 1 and y.ndim == 2 and y.shape[1] == 1:
            y = y.reshape(-1)
        self._check_width(y, name)
        return y

    def _check_width(self, y, name):
        """The prediction must have as many columns as y."""
        model = self._training_model()
        shape = self._training_types()[model.graph.output[0].name][1]
        width = shape[-1] if shape is not None and len(shape) == 2 else None
        if isinstance(width, int) and y.ndim == 2 and y.shape[1] != width:
            raise ValueError(
                f"The graph's prediction {model.graph.output[0].name!r} has "
                f"{width} columns but {name} has {y.shape[1]}. For a classifier "
                "graph, use OrtGradientForwardBackwardClassifier.")

    def _validation_score(self, X_val, y_val):
        return r2_score(y_val, self._trainer.predict(X_val))

    # ------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
            use_numpy=None):
        """Train the weights.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, ...), or dict
            Numeric; cast to the graph input's element type. An array of the
            input's rank (images (n_samples, channels, height, width),
            sequences...); for a graph of several inputs, a dict (or
            :class:`~onnxtrain.GraphInputs`) ``input name -> array``, each
            sliced along axis 0.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Numeric (integers accepted); cast to the prediction's type.
        sample_weight : array-like of shape (n_samples,) or (n_samples, 1), \
                default=None
            Non-negative; rows are weighted in the loss and its gradient.
        X_val, y_val : array-like, default=None
            Validation data for ``validation_losses_``.
        use_numpy : bool, default=None
            onnxcustom's choice of data path; onnxtrain has one, the value
            changes nothing (TypeError if not a bool).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Bad parameter, data of the wrong shape, NaN/inf, negative weights.
        TypeError
            Non-numeric (e.g. object dtype) data.
        ConvergenceError
            A non-finite loss with ``exc=True``.
        """
        check_use_numpy(use_numpy)
        return self._fit(X, y, sample_weight, X_val, y_val)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over (X, y), continuing from the current weights (the
        first call initializes them as ``fit`` does). Same arguments and
        errors as :meth:`fit`.

        A ``learning_rate``, ``learning_loss`` or ``learning_penalty`` set
        by ``set_params`` since the last call takes effect here; the
        optimizer state (velocities, moments, step) goes on when the update
        rule keeps the same state, and starts anew for another rule. A call
        that raises leaves the estimator as it was."""
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X):
        """Predictions of the trained graph.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...), or dict
            As in :meth:`fit`. The graph runs in inference mode
            (BatchNormalization on its running statistics, no Dropout).

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
            Shaped like the ``y`` seen in fit, in the prediction's dtype.
        """
        prediction = self._raw_predict(X)
        if self._y_ndim == 1 and prediction.ndim == 2 and prediction.shape[1] == 1:
            return prediction.reshape(-1)
        if self._y_ndim == 2 and prediction.ndim == 1:
            return prediction.reshape(-1, 1)
        return prediction

    def losses(self, X, y, sample_weight=None):
        """Loss of every row of (X, y), in order.

        Parameters
        ----------
        X, y
            As :meth:`fit`.
        sample_weight : array-like of shape (n_samples,) or (n_samples, 1), \
                default=None
            Multiplies each row's loss (onnxcustom's weighted losses).

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        prediction = self.predict(X)
        y = check_targets(y, prediction.shape[0], "y", prediction.dtype)
        return _weighted(self.learning_loss_.loss_per_row(y, prediction),
                         sample_weight)

    def scores(self, X, y, sample_weight=None):
        """Deprecated: onnxcustom's first name of :meth:`losses` (same
        values; emits a DeprecationWarning)."""
        return _deprecated_scores(self, X, y, sample_weight)


def _not_probabilities(proba):
    """What makes ``proba`` (n, C) not probabilities, or None: a value
    outside [0, 1], or for C > 1 a row sum other than 1, beyond
    ``max(1e-4, 16 * eps)`` of its dtype."""
    tol = max(1e-4, 16 * float(np.finfo(proba.dtype).eps))
    low, high = float(proba.min()), float(proba.max())
    if not (-tol <= low and high <= 1 + tol):  # NaN fails too
        return f"its values lie in [{low:.4g}, {high:.4g}], not in [0, 1]"
    if proba.shape[1] > 1:
        sums = proba.sum(axis=1)
        if np.abs(sums - 1).max() > tol:
            return (f"its rows sum to values in [{sums.min():.4g}, "
                    f"{sums.max():.4g}], not to 1")
    return None


def _output_kind(loss):
    """How ``loss`` reads a classifier's output: 'probabilities',
    'logits' (it applies a softmax), 'scores' (a sigmoid), or None
    (another loss)."""
    if isinstance(loss, CrossEntropyLearningLoss):
        return "logits" if loss.from_logits else "probabilities"
    if isinstance(loss, NegLogLearningLoss):
        return "scores" if loss.probability_function == "sigmoid" \
            else "probabilities"
    return None


def _activation_problem(activation, width, loss):
    """Why a graph whose output comes from ``activation`` ('Sigmoid',
    'Softmax' or None) over ``width`` columns (None: unknown) cannot be
    trained with ``loss`` (already adapted to it), with what to do instead;
    None when it can."""
    kind = _output_kind(loss)
    name = type(loss).__name__
    if activation == "Softmax" and width == 1:
        return ("a Softmax over one column is 1 for every row: nothing would "
                "train. End the graph with a Sigmoid (one column, "
                "P(classes_[1]), learning_loss='cross_entropy' or 'log') or "
                "give the Softmax n_classes columns")
    if activation == "Softmax" and kind == "scores":
        return (f"{name}(probability_function='sigmoid') would apply a "
                "sigmoid to these probabilities: predict_proba would not be "
                "the graph's output. Pass learning_loss='cross_entropy' (the "
                "loss of a Softmax, trained through its logits)")
    if activation == "Sigmoid" and kind == "logits":
        return (f"{name}(from_logits=True) would apply a softmax to these "
                "sigmoids: predict_proba would not be the graph's output. End "
                "the graph with a Softmax over the n_classes columns and pass "
                "learning_loss='cross_entropy'")
    if activation == "Sigmoid" and kind == "probabilities" and width is not None \
            and width > 1:
        return (f"the rows of {width} sigmoids do not sum to 1, and {name} "
                "reads them as class probabilities (predict_proba would not "
                "be probabilities). End the graph with a Softmax over the "
                "n_classes columns and pass learning_loss='cross_entropy', "
                "or, for one-vs-rest scores, remove the final Sigmoid and "
                "pass learning_loss=NegLogLearningLoss() (predict_proba then "
                "divides each row of sigmoids by its sum)")
    return None


class OrtGradientForwardBackwardClassifier(ClassifierMixin, BaseOrtGradientEstimator):
    __doc__ = ("""Train the initializers of an ONNX classification graph.

    The graph (from skl2onnx: MLPClassifier, LogisticRegression... with or
    without ZipMap) is trained on its float probability tensor, never on the
    label or ZipMap output; ai.onnx.ml LinearClassifier nodes are first
    rewritten into MatMul/Add (+ Sigmoid/Softmax) with trainable
    initializers (:func:`onnxtrain.assembly.rewrite.rewrite_ml_linear_ops`). The
    classes are the graph's own labels when it carries them (skl2onnx's
    ZipMap or label output: ``y`` may hold any of them, no other), else
    the sorted unique labels of ``y`` (or ``classes`` of the first
    ``partial_fit``); their number must equal the probability width.

    What the graph's output means (``predict_proba`` is the output of the
    trained graph, ``get_trained_onnx``, whenever the loss reads it as
    probabilities):

    * (N, n_classes) probabilities, rows summing to 1 (skl2onnx classifiers,
      a final Softmax): trained with ``'cross_entropy'``. When the output
      comes from a Softmax, the fused paths train on its input (the logits)
      with the same clipped loss, which gives the same steps up to rounding
      at any learning rate.
    * (N, 1), two classes: the column is P(``classes_[1]``) and
      ``predict_proba`` returns ``(1 - p, p)``. ``'cross_entropy'`` then
      trains the binary log loss ``-[y log p + (1 - y) log(1 - p)]``
      (``learning_loss_`` is ``NegLogLearningLoss(probability_function=None,
      eps=eps)``, or ``NegLogLearningLoss()`` on a score with
      ``from_logits=True``). A final Sigmoid is trained through its input
      on the fused paths.
    * A final Sigmoid or Softmax is the function a loss on logits would
      apply: with ``'log'`` (``NegLogLearningLoss()``, a sigmoid) on a
      final Sigmoid or ``CrossEntropyLearningLoss(from_logits=True)`` on a
      final Softmax, the loss trained (``learning_loss_``) reads the output
      as probabilities, trained through the logits as above: the activation
      is never applied twice. The other pairs are an error at ``fit``: a
      Softmax over one column (always 1), a Sigmoid over several columns
      read as class probabilities (its rows do not sum to 1), a sigmoid loss
      on a Softmax or a softmax loss on a Sigmoid.
    * Logits or scores, not probabilities (no final Sigmoid or Softmax):
      pass ``learning_loss=CrossEntropyLearningLoss(from_logits=True)``
      (softmax of the output) or ``NegLogLearningLoss()`` (sigmoid of each
      column); ``predict_proba`` applies that function (and divides sigmoid
      rows of several columns by their sum, one-vs-rest as scikit-learn's
      LogisticRegression); ``get_trained_onnx`` keeps the raw output.

    When the loss reads the output as probabilities and the graph does not
    end with a Softmax or a Sigmoid, ``fit`` evaluates the graph on the
    first batch with the starting weights and raises a ValueError if a
    value lies outside [0, 1] or, for several columns, a row does not sum
    to 1 (beyond a tolerance of ``max(1e-4, 16 * finfo(dtype).eps)``): a
    regression graph, or a classifier's raw decision scores (skl2onnx's
    SGDClassifier) is not silently trained as probabilities. Every such
    error is raised before any step and leaves the estimator as it was
    (parameters, fitted state or its absence).
    """ + _COMMON_PARAMETERS.format(
        model="It outputs class probabilities of shape (N, n_classes) or, for "
              "two classes, (N, 1); see above.",
        loss="cross_entropy", stratified=" (stratified)",
        score="accuracy") + _COMMON_ATTRIBUTES + """
    classes_ : ndarray of shape (n_classes,)
        Labels, in the order of the probability columns: the graph's own
        when it carries them (the labels of a ZipMap reading the
        probabilities, or the table its label output looks up, as
        skl2onnx writes them), so that ``predict`` agrees with the label
        output of ``get_trained_onnx``; ``y`` (or ``classes``) may then
        hold any of them, and a label the graph does not know is an error.
        Otherwise the sorted unique labels of ``y`` (or ``classes``).
""" + _COMMON_RAISES.format(
        refused=", or an output that is not probabilities\n        (see above)"))

    _default_loss = "cross_entropy"

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss",
                 max_iter=100, training_optimizer_name="SGDOptimizer",
                 batch_size=10, learning_rate="SGD", device="cpu",
                 warm_start=False, verbose=0, validation_every=0.1,
                 learning_loss="cross_entropy", enable_logging=False,
                 weight_name=None, learning_penalty=None, exc=True,
                 random_state=None, shuffle=False, early_stopping=False,
                 validation_fraction=0.1, n_iter_no_change=10, tol=None,
                 training_path="auto", callbacks=None, n_threads=None,
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
        self.learning_loss = learning_loss
        self.enable_logging = enable_logging
        self.weight_name = weight_name
        self.learning_penalty = learning_penalty
        self.exc = exc
        self.random_state = random_state
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.training_path = training_path
        self.callbacks = callbacks
        self.n_threads = n_threads
        self.init = init

    def _make_training_model(self, model):
        model = rewrite_ml_linear_ops(model, copy=False)
        training, name = probability_graph(model)
        # read here, where the label path still exists: the graph trained
        # keeps only the probabilities
        self._labels_of_graph = class_labels(model, name)
        return model, training

    def _graph_classes(self):
        """The labels the graph gives its probability columns (a ZipMap's,
        or the table its label output looks up), or None."""
        self._training_model()  # builds the graph, reading its labels
        labels = getattr(self, "_labels_of_graph", None)
        width = self._n_columns()
        if labels is None or (width is not None and width != len(labels)
                              and not (width == 1 and len(labels) == 2)):
            return None
        return labels

    def _adapt_loss(self, loss):
        """The loss trained on this graph, from the one resolved from
        ``learning_loss`` (a new object when it differs).

        * One column, p = P(classes_[1]): the cross-entropy is the binary
          log loss of p (of sigmoid(s) with ``from_logits=True``).
        * A final Sigmoid or Softmax is the function the loss would apply
          (``NegLogLearningLoss()``'s sigmoid, the softmax of
          ``from_logits=True``): the loss reads the output as
          probabilities, trained through the logits on the fused paths, so
          that ``predict_proba`` stays the graph's own output.

        Raises
        ------
        ValueError
            The graph's final activation and the loss do not go together
            (see :func:`_activation_problem`), before any graph is built.
        """
        model = self._training_model()
        width = self._n_columns()
        if width == 1 and isinstance(loss, CrossEntropyLearningLoss):
            loss = NegLogLearningLoss(
                eps=loss.eps,
                probability_function="sigmoid" if loss.from_logits else None)
        activation = final_activation(model)[0]
        kind = _output_kind(loss)
        if activation == "Sigmoid" and kind == "scores":
            loss = clone(loss).set_params(probability_function=None)
        elif activation == "Softmax" and kind == "logits":
            loss = clone(loss).set_params(from_logits=False)
        problem = _activation_problem(activation, width, loss)
        if problem is not None:
            raise ValueError(
                f"The graph's output {model.graph.output[0].name!r} comes from "
                f"a {activation} over {width or 'an unknown number of'} "
                f"column{'s' if width != 1 else ''} and learning_loss="
                f"{self.learning_loss or self._default_loss!r}: {problem}.")
        return loss

    def _output_kind(self):
        """How the loss trained reads the output (see :func:`_output_kind`)."""
        return _output_kind(self.learning_loss_)

    def _check_start(self, X):
        """Raise when the loss reads the output as probabilities, the graph
        does not end with a Softmax or a Sigmoid (those were checked by
        :meth:`_adapt_loss`), and its values on ``X`` with the starting
        weights are not probabilities."""
        model = self._training_model()
        if self._output_kind() != "probabilities" or \
                final_activation(model)[0] is not None:
            return
        problem = _not_probabilities(self._trainer.predict(X).reshape(len(X), -1))
        if problem is not None:
            raise ValueError(
                f"The graph's output {model.graph.output[0].name!r} is not a "
                f"probability: on the first batch ({len(X)} rows, starting "
                f"weights) {problem}. The learning loss "
                f"({type(self.learning_loss_).__name__}) reads it as "
                "probabilities: end the graph with a Softmax (n_classes "
                "columns) or a Sigmoid (one column, P(classes_[1])), or, if "
                "it holds logits, pass learning_loss=CrossEntropyLearningLoss"
                "(from_logits=True) (predict_proba then applies the softmax, "
                "the sigmoid for one column).")

    def _n_columns(self):
        model = self._training_model()
        shape = self._training_types()[model.graph.output[0].name][1]
        return None if not shape or not isinstance(shape[-1], int) else shape[-1]

    def _encode_targets(self, y, n_samples, classes, first, name="y"):
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y.ravel()
        if y.ndim != 1 or y.shape[0] != n_samples:
            raise ValueError(f"{name} must have shape ({n_samples},), got {y.shape}.")
        if y.dtype.kind == "f" and not np.isfinite(y).all():
            raise ValueError(f"{name} contains NaN or infinity.")
        if first:
            given = np.asarray(unique_labels(y) if classes is None
                               else unique_labels(classes))
            self.classes_ = self._classes_from_graph(given, name) \
                if self._names_classes(given) else given
            width = self._n_columns()
            if width is not None and width != len(self.classes_) and not (
                    width == 1 and len(self.classes_) == 2):
                raise ValueError(
                    f"The graph outputs {width} probability columns but "
                    f"{len(self.classes_)} classes were given: "
                    f"{self.classes_.tolist()}.")
        unseen = np.setdiff1d(y, self.classes_)
        if unseen.size:
            raise ValueError(f"{name} has labels unseen at fit time: "
                             f"{unseen.tolist()}; known classes: {self.classes_.tolist()}.")
        order = np.argsort(self.classes_, kind="stable")  # classes_ may be unsorted
        index = order[np.searchsorted(self.classes_[order], y)]
        dtype = prediction_dtype(self._training_model(), self._training_types())
        if self._n_columns() == 1:
            return index.astype(dtype).reshape(-1, 1)
        return np.eye(len(self.classes_), dtype=dtype)[index]

    def _names_classes(self, given):
        """Whether the graph's labels name the classes of ``given``: they
        do unless the graph has none, or they are the column indices 0 to
        C - 1 (skl2onnx's ``nocl=True`` leaves the names out) and no label
        of ``given`` is among them (labels partly among them are refused:
        which naming was meant cannot be told)."""
        labels = self._graph_classes()
        if labels is None:
            return False
        if labels.dtype.kind == "U" or not np.array_equal(labels, np.arange(len(labels))):
            return True
        return given.dtype.kind in "biuf" and bool(np.intersect1d(given, labels).size)

    def _classes_from_graph(self, given, name):
        """``classes_`` of a graph that carries its labels: those labels, in
        its column order (cast to the type of ``given``, the labels of
        ``y`` or ``classes``), which must all be among them."""
        labels = self._graph_classes()
        text = given.dtype.kind in "SU" or (
            given.dtype.kind == "O" and all(isinstance(v, (str, bytes)) for v in given))
        if text != (labels.dtype.kind == "U"):
            raise ValueError(
                f"{name} holds {'string' if text else 'numeric'} labels "
                f"{given.tolist()} but the graph's label output gives "
                f"{'string' if labels.dtype.kind == 'U' else 'integer'} labels "
                f"{labels.tolist()} (its probability columns, in order).")
        if not text and np.array_equal(labels.astype(given.dtype), labels):
            labels = labels.astype(given.dtype)
        unknown = np.setdiff1d(given, labels)
        if unknown.size:
            raise ValueError(
                f"{name} has labels {unknown.tolist()} that the graph does not "
                f"know: its label output gives {labels.tolist()} (its probability "
                "columns, in order). Relabel y, or convert the model again with "
                "these classes.")
        return labels

    def _stratify(self, y):
        return y.argmax(axis=1) if y.ndim == 2 and y.shape[1] > 1 else y.ravel()

    def _validation_score(self, X_val, y_val):
        proba = self._probabilities(self._trainer.predict(X_val))
        return accuracy_score(self._stratify(y_val), proba.argmax(axis=1))

    def _probabilities(self, output):
        """(n_samples, n_classes) probabilities from the graph's output."""
        output = output.reshape(output.shape[0], -1)
        kind = self._output_kind()
        if kind == "logits":
            proba = softmax(output, axis=1)
        elif kind == "scores":
            proba = expit(output)
        else:
            proba = output
        if proba.shape[1] == 1:
            return np.hstack([1 - proba, proba])
        if kind == "scores":  # one-vs-rest, as LogisticRegression(ovr)
            proba = proba / proba.sum(axis=1, keepdims=True)
        return proba

    # ------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
            use_numpy=None):
        """Train the weights. Same arguments as the regressor's ``fit``; y
        holds class labels (ints or strings) of shape (n_samples,)."""
        check_use_numpy(use_numpy)
        return self._fit(X, y, sample_weight, X_val, y_val)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch. ``classes`` (every label) is required on the first call
        when ``y`` may not contain them all, as in scikit-learn."""
        return self._fit(X, y, sample_weight, classes=classes, incremental=True)

    def predict_proba(self, X):
        """Probabilities: ndarray of shape (n_samples, n_classes), columns in
        the order of ``classes_``. A one-column graph's p gives
        ``(1 - p, p)``; logits or scores (``learning_loss`` with
        ``from_logits=True`` or a sigmoid) go through softmax or sigmoid."""
        return self._probabilities(self._raw_predict(X))

    def predict(self, X):
        """Labels (of the type seen in fit): ndarray of shape (n_samples,)."""
        proba = self.predict_proba(X)  # raises NotFittedError before fit
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y, sample_weight=None):
        """Accuracy.

        Raises
        ------
        ValueError
            Labels in ``y`` unseen at fit time.
        """
        y = np.asarray(y).ravel()
        unseen = np.setdiff1d(y, self.classes_)
        if unseen.size:
            raise ValueError(f"y has labels unseen at fit time: {unseen.tolist()}; "
                             f"known classes: {self.classes_.tolist()}.")
        return accuracy_score(y, self.predict(X), sample_weight=sample_weight)

    def losses(self, X, y, sample_weight=None):
        """Loss of every row, multiplied by ``sample_weight`` (shape
        (n_samples,) or (n_samples, 1)) when given: ndarray of shape
        (n_samples,)."""
        proba = self._raw_predict(X)
        target = self._encode_targets(y, proba.shape[0], None, False)
        return _weighted(self.learning_loss_.loss_per_row(target, proba),
                         sample_weight)

    def scores(self, X, y, sample_weight=None):
        """Deprecated: onnxcustom's first name of :meth:`losses` (same
        values; emits a DeprecationWarning)."""
        return _deprecated_scores(self, X, y, sample_weight)


def _deprecated_scores(estimator, X, y, sample_weight):
    warnings.warn("scores() is onnxcustom's old name of losses(); call "
                  "losses(X, y, sample_weight).", DeprecationWarning,
                  stacklevel=3)
    return estimator.losses(X, y, sample_weight)


def _weighted(losses, sample_weight):
    """Per-row losses times the sample weights (validated), if any."""
    if sample_weight is None:
        return losses
    return losses * check_sample_weight(sample_weight, losses.shape[0],
                                        losses.dtype)

