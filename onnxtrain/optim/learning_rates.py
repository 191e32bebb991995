"""Learning-rate objects: a learning-rate schedule plus an update rule
(SGD, momentum, Nesterov, Adam, AdamW), the seed's (onnxcustom's) API.

A learning-rate object has two halves:

- a schedule evaluated on the host (``schedule(t) -> float``, updated at the
  end of each epoch) and the scalars fed to the update graph at each step
  (``step_scalars(step)``);
- the update graph (``build_onnx``), one small ONNX graph updating every
  weight and its optimizer state (velocity, first and second moments), kept
  as OrtValues on the device by the trainer. Its formula is an update rule
  of :mod:`onnxtrain.optim.update_rules` (:meth:`BaseLearningRate.update_rule`):
  this module only adapts the rules to the seed's graph layout.

Formulas follow scikit-learn's ``sklearn/neural_network/_stochastic_optimizers.py``
(SGD with momentum/Nesterov, Adam) so that loss curves overlay MLPRegressor's;
AdamW follows Loshchilov & Hutter, "Decoupled Weight Decay Regularization"
(2019), with the decay scaled by the learning rate as PyTorch's AdamW does.
"""
from __future__ import annotations

import numbers

import numpy as np
from onnx import TensorProto
from sklearn.base import BaseEstimator

from ..graph._saving import GraphSaverMixin
from ..graph._small import (check_float_type, finish, new_builder, resolve_named,
                            select_named, tensor_input)
from .links import AddPenalty, _finite
from .update_rules import AdamRule, ChainedRule, MomentumRule, SGDRule

__all__ = ["BaseLearningRate", "LearningRateSGD", "LearningRateSGDNesterov",
           "LearningRateAdam", "LearningRateAdamW", "check_learning_rate",
           "resolve_learning_rate"]

_SCHEDULES = ("constant", "invscaling", "optimal", "adaptive")


class BaseLearningRate(GraphSaverMixin, BaseEstimator):
    """Schedule + update graph.

    Subclasses set :attr:`state_names` (per-weight optimizer state, the
    names of their rule's states in the graph) and define
    :meth:`update_rule` (the :class:`~onnxtrain.optim.update_rules.UpdateRule`
    updating one weight); they may override :meth:`schedule` and
    :meth:`step_scalars`.

    Attributes
    ----------
    value : float
        Current learning rate (:meth:`init_learning_rate`,
        :meth:`update_learning_rate`, :meth:`trigger_stopping`).
    axpy_onnx_ : onnx.ModelProto
        The update graph built by :meth:`build_onnx`.
    """

    #: Names of the per-weight state tensors (zeros at initialization).
    state_names = ()
    #: Names of the rank-0 inputs fed at each step (see step_scalars): the
    #: schedule's learning rate (constant within an epoch) and the 1-based
    #: step number (a float; rules that need it compute from it in-graph).
    scalar_names = ("learning_rate", "step")

    # ------------------------------------------------------------ schedule
    def init_learning_rate(self):
        """Reset the schedule: ``value`` becomes the initial learning rate."""
        self.value = self.schedule(0)
        return self

    def loop(self, n=1000):
        """The first ``n`` values of the schedule, from a reset
        (:meth:`init_learning_rate`), then :meth:`update_learning_rate` with
        t = 1, 2, ... (onnxcustom's ``loop``). Once exhausted, ``value`` is
        the rate at t = n.

        Parameters
        ----------
        n : int, default=1000

        Yields
        ------
        float
        """
        self.init_learning_rate()
        for t in range(n):
            yield self.value
            self.update_learning_rate(t + 1)

    @staticmethod
    def select(class_name, **kwargs):
        """A learning-rate object from a float x (``LearningRateSGD(eta0=x)``),
        a name (see :func:`resolve_learning_rate`) or an object, as
        :meth:`BaseLearningLoss.select <onnxtrain.losses.BaseLearningLoss.select>`
        makes a loss (same arguments and errors)."""
        return select_named(class_name, kwargs, BaseLearningRate,
                            resolve_learning_rate, "a learning-rate object")

    def update_learning_rate(self, t):
        """Set ``value`` for time step ``t`` (called at each epoch's end; the
        caller defines ``t``, see the schedule's documentation)."""
        if self._schedule_kind() != "adaptive":
            self.value = self.schedule(t)
        return self

    def _schedule_kind(self):
        return getattr(self, "learning_rate", "constant")

    def schedule(self, t):
        """Learning rate at time step ``t`` (float); constant by default."""
        return float(self.eta0)

    def trigger_stopping(self):
        """Called when the loss stopped improving; True means stop training.

        The 'adaptive' schedule divides the learning rate by 5 and asks to
        stop once it is at most 1e-6 (scikit-learn's ``SGDOptimizer``);
        every other schedule stops.
        """
        if self._schedule_kind() != "adaptive":
            return True
        if self.value <= 1e-6:
            return True
        self.value /= 5.0
        return False

    def step_scalars(self, step):
        """Rank-0 values fed to the update graph at ``step`` (1-based)."""
        return {"learning_rate": self.value, "step": float(step)}

    # --------------------------------------------------------- update graph
    def init_state(self, shape, dtype):
        """Initial optimizer state of one weight: one array per state name
        (zeros, as every rule of :mod:`onnxtrain.optim.update_rules` starts)."""
        return [np.zeros(shape, dtype=dtype) for _ in self.state_names]

    def update_rule(self):
        """The :class:`~onnxtrain.optim.update_rules.UpdateRule` of this object's
        parameters (a new object)."""
        raise NotImplementedError

    def _check_links(self):
        """Check the links of a chain (:class:`~onnxtrain.optim.LearningRateChain`);
        a learning-rate object alone has none."""

    def build_onnx(self, weights, elem_type=TensorProto.FLOAT, opset=None,
                   penalty=None, penalized=()):
        """Build and return ``axpy_onnx_``, the update of every weight
        (:meth:`update_model`, kept as that attribute)."""
        self.axpy_onnx_ = self.update_model(weights, elem_type, opset, penalty,
                                            penalized)
        return self.axpy_onnx_

    def update_model(self, weights, elem_type=TensorProto.FLOAT, opset=None,
                     penalty=None, penalized=()):
        """The update of every weight as a model of its own.

        Parameters
        ----------
        weights : list of (str, tuple)
            Name and shape of each weight.
        elem_type : int, default=TensorProto.FLOAT
        opset : int, default=None (17)
        penalty : BaseLearningPenalty, default=None
            Its gradient joins the gradient of the weights in ``penalized``
            before the update, and its value joins the loss.
        penalized : collection of str, default=()

        Returns
        -------
        onnx.ModelProto
            Inputs: the rank-0 ``scalar_names`` (``learning_rate``...),
            ``loss`` and ``penalty_scale`` (1 / sum of the batch's sample
            weights), then for each weight ``w``: ``w``, ``w_grad`` and
            ``w_<state>`` for each state name. Outputs: for each weight
            ``w_new`` and ``w_<state>_new``, then ``loss_total`` (the loss
            plus the penalty of the current weights).
        """
        check_float_type(elem_type)
        g = new_builder(opset)
        scalars = list(self.scalar_names) + ["loss", "penalty_scale"]
        for name in scalars + ["loss_total"]:
            g.reserve(name)
        inputs = [tensor_input(n, elem_type, []) for n in scalars]
        outputs = []
        for name, shape in weights:
            states = [f"{name}_{s}" for s in self.state_names]
            feeds = [name, f"{name}_grad"] + states
            news = [f"{name}_new"] + [f"{s}_new" for s in states]
            for n in feeds + news:
                g.reserve(n)
            for n in feeds:
                g.set_type(n, elem_type, shape)
            inputs += [tensor_input(n, elem_type, shape) for n in feeds]
            outputs += [tensor_input(n, elem_type, shape) for n in news]
        self.emit_update(g, [name for name, _ in weights], elem_type, penalty,
                         penalized)
        outputs.append(tensor_input("loss_total", elem_type, []))
        return finish(g, f"{type(self).__name__}_update", inputs, outputs)

    def emit_update(self, g, weights, elem_type, penalty=None, penalized=(),
                    names=None):
        """Write the update of every weight into the builder ``g``.

        Parameters
        ----------
        g : GraphBuilder
            The graph the nodes join (``axpy_onnx_``'s, or a training
            step's); it knows the types of the weights.
        weights : list of str
        elem_type : int
        penalty : BaseLearningPenalty, default=None
        penalized : collection of str, default=()
        names : dict, default=None
            The graph's value for each name of :meth:`build_onnx`'s
            interface (``learning_rate``, ``loss``, ``penalty_scale``,
            ``w_grad``, ``w_new``, ``loss_total``...); a name left out keeps
            its own. The outputs must be reserved in ``g``.
        """
        names = names or {}

        def name(n):
            return names.get(n, n)

        rule = self.update_rule()
        if penalty is not None:
            # the penalty is part of the loss the gradient comes from: the
            # chain's first link
            rule = ChainedRule([AddPenalty(penalty, frozenset(penalized))], rule)
        scalars = {k: name(v) for k, v in self._rule_scalars().items()}
        scalars["penalty_scale"] = name("penalty_scale")
        states = [[f"{w}_{s}" for s in self.state_names] for w in weights]
        _, _, terms = rule.update_all(
            g, elem_type, [name(w) for w in weights],
            [name(f"{w}_grad") for w in weights],
            [[name(s) for s in group] for group in states], scalars,
            [[name(f"{w}_new")] + [name(f"{s}_new") for s in group]
             for w, group in zip(weights, states)], keys=list(weights))
        total = name("loss")
        for value in terms:
            total = g.op("Add", total, value)
        g.op("Identity", total, outputs=[name("loss_total")])

    def _rule_scalars(self):
        """The rule's scalars: graph inputs of the same names."""
        return {"learning_rate": "learning_rate", "step": "step"}


class LearningRateSGD(BaseLearningRate):
    """Stochastic gradient descent: W <- W - eta * G.

    Parameters
    ----------
    eta0 : float, default=0.01
        Initial learning rate.
    alpha : float, default=0.0001
        Regularization constant of the 'optimal' schedule.
    power_t : float, default=0.25
        Exponent of the 'invscaling' schedule.
    learning_rate : {'invscaling', 'constant', 'optimal', 'adaptive'}, \
            default='invscaling'
        Schedule, updated at the end of each epoch with t the time step the
        estimator passes (``OrtGradientForwardBackwardOptimizer``: epochs
        completed, onnxcustom's convention; ``onnxtrain.neural_network``:
        samples seen, scikit-learn MLP's): 'constant': eta0; 'invscaling':
        eta0 / (t + 1) ** power_t; 'optimal': eta0 * t0 / (t0 + t) with
        typw = sqrt(1 / sqrt(alpha)), eta_h = typw / max(1, 2 * (1 + typw)),
        t0 = 1 / (eta_h * alpha) (onnxcustom's definition, after Bottou's
        SGD heuristic); 'adaptive': eta0, divided by 5 each time the loss
        stops improving (scikit-learn's MLP rule, see ``trigger_stopping``).

    Raises
    ------
    ValueError
        At construction, an unknown ``learning_rate`` schedule.

    Notes
    -----
    ``axpy_onnx_`` computes ``w_new = w - learning_rate * w_grad`` (axpy).
    """

    def __init__(self, eta0=0.01, alpha=0.0001, power_t=0.25,
                 learning_rate="invscaling"):
        # a schedule object, not an estimator: onnxcustom refused an unknown
        # schedule here, before any fit
        if learning_rate not in _SCHEDULES:
            raise ValueError(f"Unknown learning_rate schedule {learning_rate!r}; "
                             f"expected one of {_SCHEDULES}.")
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate

    def schedule(self, t):
        kind = self.learning_rate
        if kind in ("constant", "adaptive"):
            return float(self.eta0)
        if kind == "invscaling":
            return float(self.eta0) / (t + 1) ** float(self.power_t)
        if kind == "optimal":
            typw = np.sqrt(1.0 / np.sqrt(self.alpha))
            eta_h = typw / max(1.0, 2 * (1.0 + typw))
            t0 = 1.0 / (eta_h * self.alpha)
            return float(self.eta0 * t0 / (t0 + t))
        raise ValueError(f"Unknown learning_rate schedule {kind!r}; expected one "
                         f"of {_SCHEDULES}.")

    def update_rule(self):
        return SGDRule()


class LearningRateSGDNesterov(LearningRateSGD):
    """SGD with momentum, Nesterov's or classical (scikit-learn's
    ``SGDOptimizer``).

    Parameters
    ----------
    eta0, alpha, power_t, learning_rate
        As :class:`LearningRateSGD`.
    momentum : float, default=0.9
    nesterov : bool, default=True

    Notes
    -----
    Velocity V (zeros at start): V <- momentum * V - eta * G; then
    W <- W + V (classical) or W <- W + momentum * V - eta * G (Nesterov).
    """

    state_names = ("velocity",)

    def __init__(self, eta0=0.01, alpha=0.0001, power_t=0.25,
                 learning_rate="invscaling", momentum=0.9, nesterov=True):
        super().__init__(eta0=eta0, alpha=alpha, power_t=power_t,
                         learning_rate=learning_rate)
        self.momentum = momentum
        self.nesterov = nesterov

    def update_rule(self):
        return MomentumRule(self.momentum, self.nesterov)


class LearningRateAdam(BaseLearningRate):
    """Adam (Kingma & Ba, 2015) as scikit-learn's ``AdamOptimizer`` computes it.

    Parameters
    ----------
    eta0 : float, default=0.001
        Learning rate (scikit-learn's ``learning_rate_init``).
    beta_1, beta_2 : float, default=0.9, 0.999
        Decay rates of the first and second moment estimates.
    epsilon : float, default=1e-8
    weight_decay : float, default=0.0
        Decoupled weight decay (AdamW): W <- W - eta * weight_decay * W at
        each step, before the Adam step.

    Notes
    -----
    At step t (1-based): m <- beta_1 m + (1 - beta_1) G; v <- beta_2 v +
    (1 - beta_2) G**2; W <- W - eta_t m / (sqrt(v) + epsilon) with
    eta_t = eta * sqrt(1 - beta_2**t) / (1 - beta_1**t), computed in the
    graph from the ``step`` input (so an in-graph loop can advance it).
    """

    state_names = ("m", "v")
    scalar_names = ("learning_rate", "step", "decay")

    def __init__(self, eta0=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.0):
        self.eta0 = eta0
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay = weight_decay

    def step_scalars(self, step):
        return {"learning_rate": self.value, "step": float(step),
                "decay": float(self.value * self.weight_decay)}

    def update_rule(self):
        return AdamRule(self.beta_1, self.beta_2, self.epsilon, self.weight_decay)

    def _rule_scalars(self):
        scalars = super()._rule_scalars()
        if self.weight_decay:  # fed as learning_rate * weight_decay
            scalars["decay"] = "decay"
        return scalars


class LearningRateAdamW(LearningRateAdam):
    """:class:`LearningRateAdam` with decoupled weight decay (default 0.01)."""

    def __init__(self, eta0=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.01):
        super().__init__(eta0=eta0, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, weight_decay=weight_decay)


_BY_NAME = {
    "SGD": LearningRateSGD, "LearningRateSGD": LearningRateSGD,
    "SGDNesterov": LearningRateSGDNesterov, "Nesterov": LearningRateSGDNesterov,
    "LearningRateSGDNesterov": LearningRateSGDNesterov,
    "Adam": LearningRateAdam, "LearningRateAdam": LearningRateAdam,
    "AdamW": LearningRateAdamW, "LearningRateAdamW": LearningRateAdamW,
}


#: parameter -> (test of a valid value, what a valid value is)
_VALID = {
    "eta0": (lambda v: _finite(v) and v > 0, "a finite float > 0"),
    "alpha": (lambda v: _finite(v) and v >= 0, "a finite float >= 0"),
    "power_t": (lambda v: _finite(v) and v >= 0, "a finite float >= 0"),
    "learning_rate": (lambda v: v in _SCHEDULES, f"one of {_SCHEDULES}"),
    "momentum": (lambda v: _finite(v) and 0 <= v <= 1, "a float in [0, 1]"),
    "beta_1": (lambda v: _finite(v) and 0 <= v < 1, "a float in [0, 1)"),
    "beta_2": (lambda v: _finite(v) and 0 <= v < 1, "a float in [0, 1)"),
    "epsilon": (lambda v: _finite(v) and v > 0, "a finite float > 0"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a finite float >= 0"),
}


def check_learning_rate(rate):
    """Validate the parameters of a learning-rate object.

    Called by :func:`resolve_learning_rate` and by the estimators' ``fit``
    before anything changes: a negative, NaN or infinite learning rate
    would otherwise train (ascend the loss, or turn every weight into NaN)
    after the weights were drawn.

    Parameters
    ----------
    rate : BaseLearningRate

    Returns
    -------
    rate

    Raises
    ------
    ValueError
        A parameter out of its range (``eta0`` <= 0, NaN or infinite;
        ``momentum`` outside [0, 1]; ``beta_1``/``beta_2`` outside [0, 1);
        ``epsilon`` <= 0; negative ``alpha``, ``power_t`` or
        ``weight_decay``; an unknown schedule), named in the message; for a
        :class:`~onnxtrain.optim.LearningRateChain`, steps that are not
        named links then a learning-rate object, or a link's parameter out
        of its range (``max_norm`` <= 0 or NaN...).
    """
    rate._check_links()
    params = rate.get_params(deep=False)
    for name, value in params.items():
        test, what = _VALID.get(name, (None, None))
        if test is not None and not test(value):
            raise ValueError(f"{type(rate).__name__}: {name} must be {what}, "
                             f"got {value!r}.")
    if params.get("learning_rate") == "optimal" and not params["alpha"] > 0:
        raise ValueError(f"{type(rate).__name__}: the 'optimal' schedule "
                         f"needs alpha > 0, got {params['alpha']!r}.")
    return rate


def resolve_learning_rate(value):
    """A new learning-rate object from a float, a name or an object.

    A float ``x`` means ``LearningRateSGD(eta0=x)``; names: 'SGD',
    'SGDNesterov' (or 'Nesterov'), 'Adam', 'AdamW' and the class names.

    Raises
    ------
    ValueError
        Unknown name, non-positive or non-finite float, or an object whose
        parameters :func:`check_learning_rate` refuses.
    TypeError
        Any other type.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"learning_rate must be > 0, got {value!r}.")
        return LearningRateSGD(eta0=float(value))
    return check_learning_rate(
        resolve_named(value, _BY_NAME, BaseLearningRate, "learning_rate"))
