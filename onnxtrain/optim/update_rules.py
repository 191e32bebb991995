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
  ``const(value, elem_type)`` (:class:`onnxtrain.graph.GraphBuilder`);
- :meth:`UpdateRule.update_all` emits the update of every parameter at once,
  which a :class:`ChainedRule` needs: links (:mod:`onnxtrain.optim.links`:
  clipping, penalty, weight decay) then a rule, as optax's ``chain``.

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

import copy

import numpy as np

from .links import DecoupledWeightDecay, GradientLink

__all__ = ["UpdateRule", "SGDRule", "MomentumRule", "AdamRule", "AdamWRule",
           "ChainedRule", "register_update_rule", "get_update_rule",
           "registered_update_rules"]

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

    def update_all(self, g, elem_type, params, grads, states, scalars,
                   outputs=None, keys=None):
        """Emit the update of every parameter of one step.

        Parameters
        ----------
        g, elem_type, scalars
            As :meth:`update`; ``scalars`` is shared by every parameter.
        params, grads : list of str
            Every parameter and its gradient.
        states : list of sequence of str
            The state of each parameter.
        outputs : list of list of str, default=None
            Per parameter, the names of its new value then new states (None:
            the emitter names them).
        keys : list of str, default=None
            The parameters' names in the model (None: ``params``); links
            choose the parameters they change by them.

        Returns
        -------
        new_params : list of str
        new_states : list of tuple of str
        loss_terms : list of str
            Rank-0 values to add to the reported loss (a penalty's value),
            in parameter order; empty for a rule alone.
        """
        new_params, new_states = [], []
        for param, grad, state, names in zip(params, grads, states,
                                             outputs or [None] * len(params)):
            named = {"outputs": names} if names else {}
            new_param, new_state = self.update(g, elem_type, param, grad, state,
                                               scalars, **named)
            new_params.append(new_param)
            new_states.append(tuple(new_state))
        return new_params, new_states, []

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
    ordering (decay of the parameter before the step) with it. With decay,
    the rule is the chain :meth:`as_chain`: the link
    :class:`~onnxtrain.optim.links.DecoupledWeightDecay` then Adam.
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
        """``learning_rate * weight_decay`` (once per ``scalars``, as
        ``scalars['decay']``), None without decay."""
        if "decay" in scalars:
            return scalars["decay"]
        return _adam_decay(self.weight_decay).decay(g, elem_type, scalars)

    def as_chain(self):
        """This rule as :class:`ChainedRule`: the decoupled weight decay
        link (:class:`~onnxtrain.optim.links.DecoupledWeightDecay`, reading
        ``scalars['decay']``) then Adam without decay; the rule itself
        without decay."""
        if not self.weight_decay:
            return self
        core = copy.copy(self)
        core.weight_decay = 0.0
        return ChainedRule([_adam_decay(self.weight_decay)], core)

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        if self.weight_decay:
            return self.as_chain().update(g, elem_type, param, grad, states,
                                          scalars, outputs)
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
        return g.op("Sub", param, step, **_out(outputs, 0)), (m, v)


@register_update_rule("adamw")
class AdamWRule(AdamRule):
    """:class:`AdamRule` with ``weight_decay=0.01`` by default."""

    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.01,
                 bias_correction=True):
        super().__init__(beta_1, beta_2, epsilon, weight_decay, bias_correction)


def _adam_decay(weight_decay):
    """The decay link of ``AdamRule(weight_decay=...)``: ``learning_rate *
    weight_decay`` is ``scalars['decay']``, which learning-rate objects feed
    (computed on the host) and onnxblock's AdamW computes first."""
    link = DecoupledWeightDecay(weight_decay)
    link.scalar_key = "decay"
    return link


class ChainedRule(UpdateRule):
    """Links then a rule: one update rule (optax's ``chain``).

    Parameters
    ----------
    links : sequence of GradientLink
        Applied in order to every parameter's gradient
        (:mod:`onnxtrain.optim.links`).
    rule : UpdateRule
        The last link: its per-parameter :meth:`~UpdateRule.update` takes
        the gradients the links made. A ``ChainedRule`` given here is
        flattened (its links follow ``links``).

    Raises
    ------
    TypeError
        A link that is not a :class:`~onnxtrain.optim.links.GradientLink`, or
        ``rule`` not an :class:`UpdateRule`.

    Notes
    -----
    The chain has the state of its rule (:attr:`state_names`, :meth:`init`):
    links hold none. A link whose ``needs_all`` is True (global-norm
    clipping) sees every gradient as the links before it left them; the
    other links and the rule are emitted parameter after parameter, so
    that each intermediate value is read soon after it is computed.
    """

    def __init__(self, links, rule):
        links = list(links)
        if isinstance(rule, ChainedRule):
            links, rule = links + list(rule.links), rule.rule
        for link in links:
            if not isinstance(link, GradientLink):
                raise TypeError(f"A chain's links must be GradientLink objects "
                                f"(onnxtrain.optim.links), not {link!r}.")
        if not isinstance(rule, UpdateRule):
            raise TypeError(f"A chain must end with an UpdateRule, not {rule!r}.")
        self.links = tuple(links)
        self.rule = rule

    @property
    def state_names(self):
        return self.rule.state_names

    @property
    def reads_step(self):
        return self.rule.reads_step

    @property
    def needs_all(self):
        """Whether a link reads every gradient: :meth:`update` (one
        parameter) then refuses to run."""
        return any(link.needs_all for link in self.links)

    def init(self, shape, dtype):
        return self.rule.init(shape, dtype)

    def update(self, g, elem_type, param, grad, states, scalars, outputs=None):
        """:meth:`update_all` of one parameter (a chain whose links need
        every gradient raises ValueError: call :meth:`update_all`)."""
        if self.needs_all:
            raise ValueError(
                f"{self!r} reads every gradient (global-norm clipping); emit it "
                "with update_all, over every parameter at once.")
        new_params, new_states, terms = self.update_all(
            g, elem_type, [param], [grad], [states], scalars,
            None if outputs is None else [outputs])
        if terms:
            raise ValueError(f"{self!r} adds terms to the loss (a penalty); "
                             "emit it with update_all, which returns them.")
        return new_params[0], new_states[0]

    def update_all(self, g, elem_type, params, grads, states, scalars,
                   outputs=None, keys=None):
        """See :meth:`UpdateRule.update_all`.

        Raises
        ------
        ValueError
            A link's parameter out of its range (``GradientLink.check``),
            before any node is emitted.
        """
        for link in self.links:
            link.check()
        n = len(params)
        keys = list(params) if keys is None else list(keys)
        current = [[p, gr] for p, gr in zip(params, grads)]
        terms = [[] for _ in range(n)]
        stage = []  # (link, context) not applied yet

        def apply(i):
            for link, context in stage:
                param, grad, term = link.transform(
                    g, elem_type, current[i][0], current[i][1], scalars,
                    context=context, key=keys[i])
                current[i] = [param, grad]
                if term is not None:
                    terms[i].append(term)

        for link in self.links:
            context = None
            if link.needs_all:
                for i in range(n):
                    apply(i)
                stage = []
                context = link.prepare(g, elem_type, [c[0] for c in current],
                                       [c[1] for c in current], scalars)
            stage.append((link, context))
        new_params, new_states = [], []
        for i in range(n):
            apply(i)
            named = {"outputs": outputs[i]} if outputs and outputs[i] else {}
            new_param, new_state = self.rule.update(
                g, elem_type, current[i][0], current[i][1], states[i], scalars,
                **named)
            new_params.append(new_param)
            new_states.append(tuple(new_state))
        return new_params, new_states, [t for group in terms for t in group]
