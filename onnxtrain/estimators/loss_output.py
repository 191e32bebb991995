"""``OrtGradientOptimizer``: train a graph whose loss is already an output."""
from __future__ import annotations

from ..rewrite import prediction_graph
from ._base import BaseOrtGradientEstimator
from ._inputs import check_features
from ._validation import check_targets

__all__ = ["OrtGradientOptimizer"]


class OrtGradientOptimizer(BaseOrtGradientEstimator):
    """Train the initializers of a graph that computes its own loss.

    The graph takes the features, the expected values and, optionally, the
    sample weights as inputs (in this order) and outputs the loss of a batch
    (``loss_output_name``); onnxtrain differentiates that output w.r.t. the
    weights and applies the same learning-rate objects as the other
    estimators. :func:`onnxtrain.models.add_loss_output` builds such a graph
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
    verbose : int, default=0
    validation_every : int or float, default=0.1
    saved_gradient : str, default=None
        Path where the gradient graph is saved after the first fit.
    sample_weight_name : str, default='weight'
        Name of the graph's sample-weight input, if it has one.
    random_state : int, RandomState instance or None, default=None
    shuffle : bool, default=False

    Attributes
    ----------
    weights_to_train_, train_losses_, validation_losses_, n_iter_, t_
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

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss",
                 max_iter=100, training_optimizer_name="SGDOptimizer",
                 batch_size=10, learning_rate="SGD", device="cpu",
                 warm_start=False, verbose=0, validation_every=0.1,
                 saved_gradient=None, sample_weight_name="weight",
                 random_state=None, shuffle=False):
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

    def _make_training_model(self, model):
        names = [o.name for o in model.graph.output]
        if self.loss_output_name not in names:
            raise ValueError(f"loss_output_name={self.loss_output_name!r} is "
                             f"not an output of the model: {names}.")
        return model, prediction_graph(model, self.loss_output_name)

    def _build_loss_models(self, loss, elem_type):
        return None  # the graph computes its own loss

    def _feature_inputs(self, model):
        return super()._feature_inputs(model)[:1]  # then targets, weights

    def _start(self, model):
        super()._start(model)
        if self.saved_gradient:
            import onnx
            onnx.save(self._trainer.engine.gradient_model, self.saved_gradient)

    def _weight_input(self):
        return self.sample_weight_name

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
        return y

    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None):
        """Train the weights; arguments and errors as
        :meth:`OrtGradientForwardBackwardOptimizer.fit`."""
        return self._fit(X, y, sample_weight, X_val, y_val)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch, continuing from the current weights."""
        return self._fit(X, y, sample_weight, incremental=True)

    def losses(self, X, y):
        """Value of the loss output on all of (X, y), in one pass (float)."""
        trainer = self._ensure_trainer()
        model = self._training_model()
        X = check_features(model, X, "X", self._training_types(),
                           self._feature_inputs(model))
        y = self._encode_targets(y, X.shape[0], None, False)
        return trainer.dataset_loss(X, y)


