"""Update rules: the one family of optimizer formulas (SGD, momentum and
Nesterov, Adam, AdamW), as graph emitters.

Each rule is a small object in the manner of optax's
``GradientTransformation`` (``init``/``update``), emitting ONNX instead of
computing arrays:

- :meth:`UpdateRule.init` gives the initial per-parameter state (zeros of
  the parameter's shape, one array per :attr:`UpdateRule.state_names`);
- :meth:`UpdateRule.update` emits the nodes computing one parameter's new
  value and new state from its gradient, into any emitter with
  ``op(op_type, *inputs, outputs=None, **attributes)`` and
  ``const(value, elem_type)`` (:class:`onnxtrain.graph.GraphBuilder`).

The learning rate is a graph value (``scalars['learning_rate']``) fed at each
step; schedules live on the host. Both optimizer APIs are adapters of these
rules: the estimators' learning-rate objects (:mod:`onnxtrain.optim`, a
schedule plus a rule) and the onnxblock optimizer blocks
(:mod:`onnxtrain.onnxblock.optim`, the artifacts' optimizer model).

Formulas follow scikit-learn's ``sklearn/neural_network/_stochastic_optimizers.py``
(``SGDOptimizer``, ``AdamOptimizer``). AdamW has one formula, PyTorch's
decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", 2019; ``torch.optim.AdamW`` and onnxruntime-training's
``AdamWOptimizer``): the parameter decays by ``lr * weight_decay`` of
itself, then takes the Adam step. HuggingFace's variant (decay of the
updated parameter), which onnxblock's AdamW keeps, is the same formula with
the step size scaled by ``1 - lr * weight_decay``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["UpdateRule", "SGDRule", "MomentumRule", "AdamRule", "AdamWRule",
           "register_update_rule", "get_update_rule", "registered_update_rules"]

_RULES = {}


def register_update_rule(name):
    """Class decorator registering an :class:`UpdateRule` under ``name``.

    Raises
    ------
    ValueError
        ``name`` registered already.
    """
    def decorate(cls):
        if name in _RULES:
            raise ValueError(f"Update rule {name!r} is registered already "
                             f"({_RULES[name].__name__}).")
        _RULES[name] = cls
        cls.rule_name = name
        return cls
    return decorate


def registered_update_rules():
    """Sorted names of the registered update rules."""
    return sorted(_RULES)


def get_update_rule(name, **params):
    """A new rule ``name`` (in any case: 'Adam' is 'adam') with ``params``.

    Raises
    ------
    ValueError
        Unknown name (the message lists the registered ones).
    """
    if name not in _RULES:
        folded = {k.lower(): k for k in _RULES}
        if not isinstance(name, str) or name.lower() not in folded:
            raise ValueError(f"Unknown update rule {name!r}; registered (in "
                             f"any case): {registered_update_rules()}.")
        name = folded[name.lower()]
    return _RULES[name](**params)


def _out(outputs, index):
    """``outputs=[name]`` for the node computing output ``index``, or no
    keyword (the emitter names it)."""
    return {"outputs": [outputs[index]]} if outputs else {}


class UpdateRule:
    """Base of the update rules.

    Attributes
    ----------
    state_names : tuple of str
        The per-parameter state tensors, each of the parameter's shape.
    reads_step : bool
        Whether :meth:`update` reads ``scalars['step']``.
    """

    state_names = ()
    reads_step = False

    def init(self, shape, dtype):
        """Initial state of one parameter: list of ndarray of shape
        ``shape`` and dtype ``dtype`` (zeros), one per state name."""
        return [np.zeros(shape, dtype=dtype) for _ in self.state_names]

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        """Emit the update of one parameter.

        Parameters
        ----------
        g : emitter
            ``op(op_type, *inputs, outputs=None, **attributes)`` and
            ``const(value, elem_type)``.
        elem_type : int
            ONNX element type of the parameter (constants take it).
        param, grad : str
            Values of the parameter and of its gradient.
        states : sequence of str
            Values of its state, in :attr:`state_names` order.
        scalars : dict
            Rank-0 values of ``elem_type``: ``learning_rate``; ``step`` (the
            1-based step number) for rules that read it; optionally
            ``decay`` (``learning_rate * weight_decay``) and ``step_size``
            (Adam's bias-corrected rate). Rules store what they compute from
            the scalars in it, so that parameters sharing the dict share
            those nodes.
        outputs : list of str, default=None
            Names of the new parameter then the new states (None: the
            emitter names them).

        Returns
        -------
        new_param : str
        new_states : tuple of str
        """
        raise NotImplementedError

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None


@register_update_rule("sgd")
class SGDRule(UpdateRule):
    """``param <- param - learning_rate * grad``."""

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        step = g.op("Mul", grad, scalars["learning_rate"])
        return g.op("Sub", param, step, **_out(outputs, 0)), ()


@register_update_rule("momentum")
class MomentumRule(UpdateRule):
    """SGD with momentum, classical or Nesterov's (scikit-learn's
    ``SGDOptimizer``).

    Parameters
    ----------
    momentum : float, default=0.9
    nesterov : bool, default=False

    Notes
    -----
    ``velocity <- momentum * velocity - lr * grad``; then
    ``param <- param + velocity`` (classical) or
    ``param <- param + momentum * velocity - lr * grad`` (Nesterov).
    """

    state_names = ("velocity",)

    def __init__(self, momentum=0.9, nesterov=False):
        self.momentum = momentum
        self.nesterov = nesterov

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        mu = g.const(self.momentum, elem_type)
        step = g.op("Mul", grad, scalars["learning_rate"])
        velocity = g.op("Sub", g.op("Mul", states[0], mu), step,
                        **_out(outputs, 1))
        if self.nesterov:
            new = g.op("Sub", g.op("Add", param, g.op("Mul", velocity, mu)), step,
                       **_out(outputs, 0))
        else:
            new = g.op("Add", param, velocity, **_out(outputs, 0))
        return new, (velocity,)


@register_update_rule("adam")
class AdamRule(UpdateRule):
    """Adam (Kingma & Ba, 2015) with decoupled weight decay (AdamW when
    ``weight_decay > 0``).

    Parameters
    ----------
    beta_1, beta_2 : float, default=0.9, 0.999
    epsilon : float, default=1e-8
    weight_decay : float, default=0.0
    bias_correction : bool, default=True

    Notes
    -----
    At step t (1-based)::

        m <- beta_1 m + (1 - beta_1) g
        v <- beta_2 v + (1 - beta_2) g^2
        step_size = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)   (else lr)
        param <- param - lr weight_decay param - step_size m / (sqrt(v) + epsilon)

    scikit-learn's ``AdamOptimizer`` without decay; PyTorch's AdamW
    ordering (decay of the parameter before the step) with it.
    """

    state_names = ("m", "v")

    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.0,
                 bias_correction=True):
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.bias_correction = bias_correction

    @property
    def reads_step(self):
        return bool(self.bias_correction)

    def step_size(self, g, elem_type, scalars):
        """The bias-corrected rate (once per ``scalars``)."""
        if "step_size" not in scalars:
            lr = scalars["learning_rate"]
            if self.bias_correction:
                one = g.const(1.0, elem_type)
                b1, b2 = (g.const(b, elem_type) for b in (self.beta_1, self.beta_2))
                root = g.op("Sqrt", g.op("Sub", one, g.op("Pow", b2, scalars["step"])))
                ratio = g.op("Div", root,
                             g.op("Sub", one, g.op("Pow", b1, scalars["step"])))
                lr = g.op("Mul", lr, ratio)
            scalars["step_size"] = lr
        return scalars["step_size"]

    def decay(self, g, elem_type, scalars):
        """``learning_rate * weight_decay`` (once per ``scalars``), None
        without decay."""
        if "decay" not in scalars:
            if not self.weight_decay:
                return None
            scalars["decay"] = g.op("Mul", scalars["learning_rate"],
                                    g.const(self.weight_decay, elem_type))
        return scalars["decay"]

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        b1, b2 = (g.const(b, elem_type) for b in (self.beta_1, self.beta_2))
        one_b1 = g.const(1 - self.beta_1, elem_type)
        one_b2 = g.const(1 - self.beta_2, elem_type)
        m = g.op("Add", g.op("Mul", states[0], b1), g.op("Mul", grad, one_b1),
                 **_out(outputs, 1))
        v = g.op("Add", g.op("Mul", states[1], b2),
                 g.op("Mul", g.op("Mul", grad, grad), one_b2), **_out(outputs, 2))
        denominator = g.op("Add", g.op("Sqrt", v), g.const(self.epsilon, elem_type))
        step = g.op("Mul", g.op("Div", m, denominator),
                    self.step_size(g, elem_type, scalars))
        decay = self.decay(g, elem_type, scalars)
        if decay is not None:
            param = g.op("Sub", param, g.op("Mul", param, decay))
        return g.op("Sub", param, step, **_out(outputs, 0)), (m, v)


@register_update_rule("adamw")
class AdamWRule(AdamRule):
    """:class:`AdamRule` with ``weight_decay=0.01`` by default."""

    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.01,
                 bias_correction=True):
        super().__init__(beta_1, beta_2, epsilon, weight_decay, bias_correction)
