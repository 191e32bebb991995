"""Chains: gradient transformations (clipping, weight decay, penalty) then
an update rule or a learning-rate object, as optax's ``chain``.

``chain(ClipByGlobalNorm(1.0), LearningRateAdam(1e-3))`` reads as optax's
``optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))``: the last
argument carries the learning rate (its schedule) and the rule, the links
before it change the gradients first. What :func:`chain` returns has the
kind of its last argument:

- a learning-rate object (:class:`~onnxtrain.optim.BaseLearningRate`)
  gives a :class:`LearningRateChain`, itself a learning-rate object that the
  estimators take as ``learning_rate`` (every training path writes the
  chain into its update);
- an update rule (:class:`~onnxtrain.optim.update_rules.UpdateRule`) gives a
  :class:`~onnxtrain.optim.update_rules.ChainedRule`, which onnxblock's
  optimizer model (``generate_artifacts(optimizer=...)``) and any builder
  take.

A :class:`LearningRateChain` holds its steps as scikit-learn's ``Pipeline``
does: a list of ``(name, object)`` pairs, named by :func:`chain` as
``make_pipeline`` names them (the lower-case class name), so that
``GridSearchCV`` reaches a link's parameter through the estimator, e.g.
``learning_rate__clipbyglobalnorm__max_norm``.
"""
from __future__ import annotations

import collections

from .learning_rates import BaseLearningRate, check_learning_rate
from .links import GradientLink
from .update_rules import ChainedRule, UpdateRule

__all__ = ["LearningRateChain", "chain"]


def _named(steps):
    """``(name, step)`` pairs named as scikit-learn's ``make_pipeline``
    names its steps: the lower-case class name, ``-1``, ``-2``... after a
    name taken twice."""
    names = [type(step).__name__.lower() for step in steps]
    counts = collections.Counter(names)
    seen = collections.Counter()
    named = []
    for name, step in zip(names, steps):
        if counts[name] > 1:
            seen[name] += 1
            name = f"{name}-{seen[name]}"
        named.append((name, step))
    return named


def chain(*steps):
    """Links, then an update rule or a learning-rate object, as one.

    Parameters
    ----------
    *steps : GradientLink, ..., then BaseLearningRate or UpdateRule
        The links (:mod:`onnxtrain.optim.links`) in the order they change
        the gradients, then what updates the parameters.

    Returns
    -------
    LearningRateChain or ChainedRule
        A :class:`LearningRateChain` (steps named as ``make_pipeline``
        names them) when the last step is a learning-rate object, a
        :class:`~onnxtrain.optim.update_rules.ChainedRule` when it is an
        update rule.

    Raises
    ------
    TypeError
        No step, a step other than the last that is not a
        :class:`~onnxtrain.optim.links.GradientLink`, or a last step that is
        neither a learning-rate object nor an update rule.

    Examples
    --------
    >>> from onnxtrain.optim import ClipByGlobalNorm, LearningRateAdam, chain
    >>> rate = chain(ClipByGlobalNorm(1.0), LearningRateAdam(1e-3))
    >>> [name for name, _ in rate.steps]
    ['clipbyglobalnorm', 'learningrateadam']
    """
    if not steps:
        raise TypeError("chain() needs at least one step, the last one a "
                        "learning-rate object or an update rule.")
    *links, last = steps
    if isinstance(last, UpdateRule):
        return ChainedRule(links, last)
    if isinstance(last, BaseLearningRate):
        chained = LearningRateChain(_named(steps))
        chained._check_links()
        return chained
    raise TypeError(f"The last step of a chain must be a learning-rate object "
                    f"(onnxtrain.optim) or an UpdateRule, not {last!r}.")


class LearningRateChain(BaseLearningRate):
    """Links then a learning-rate object: a learning-rate object whose update
    first passes the gradients through the links.

    Parameters
    ----------
    steps : list of (str, object)
        Named steps, as scikit-learn's ``Pipeline`` takes them: links
        (:class:`~onnxtrain.optim.links.GradientLink`) in the order they
        apply, then one learning-rate object (the schedule and the rule).
        Names are unique, without ``__``.

    Raises
    ------
    ValueError
        At ``fit`` (:func:`~onnxtrain.optim.check_learning_rate`), before any
        work: steps not as described, or a parameter of a link or of the
        learning-rate object out of its range.

    Notes
    -----
    The schedule, the current rate (``value``), the state (``state_names``:
    links hold none) and the fed scalars are those of the last step; the
    update rule is :class:`~onnxtrain.optim.update_rules.ChainedRule` of
    the links and of the last step's rule. An estimator's
    ``learning_penalty`` comes before the links (it is part of the loss).
    ``get_params(deep=True)`` and ``set_params`` reach each step by its name
    (``clipbyglobalnorm__max_norm``) and replace a whole step
    (``clipbyglobalnorm=ClipByGlobalNorm(2.0)``), as ``Pipeline`` does.

    Examples
    --------
    >>> from onnxtrain.optim import (ClipByValue, LearningRateChain,
    ...                              LearningRateSGD)
    >>> rate = LearningRateChain([("clip", ClipByValue(0.5)),
    ...                           ("sgd", LearningRateSGD(0.01))])
    >>> rate.set_params(clip__clip_value=0.1).steps[0][1].clip_value
    0.1
    """

    def __init__(self, steps):
        self.steps = steps

    # -------------------------------------------------- scikit-learn params
    def get_params(self, deep=True):
        params = {"steps": self.steps}
        if deep:
            for name, step in self._pairs():
                params[name] = step
                params.update((f"{name}__{key}", value)
                              for key, value in step.get_params(deep=True).items())
        return params

    def set_params(self, **params):
        """Set ``steps``, replace a step by its name, or set a parameter of
        a step (``name__parameter``).

        Raises
        ------
        ValueError
            A name that is neither ``steps`` nor a step's.
        """
        if "steps" in params:
            self.steps = params.pop("steps")
        names = [name for name, _ in self._pairs()]
        nested = collections.defaultdict(dict)
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in names:
                raise ValueError(f"Invalid parameter {name!r} for {self!r}: "
                                 f"valid parameters are ['steps'] and the steps "
                                 f"{names}.")
            if sub:
                nested[name][sub] = value
            else:
                self.steps = [(n, value if n == name else s) for n, s in self.steps]
        for name, values in nested.items():
            dict(self._pairs())[name].set_params(**values)
        return self

    def _pairs(self):
        """The steps as (name, object) pairs (no check)."""
        return [tuple(pair) for pair in self.steps]

    def _check_links(self):
        """ValueError unless ``steps`` are named links then a learning-rate
        object, each within its parameters' ranges."""
        steps = self.steps
        if not isinstance(steps, (list, tuple)) or not steps or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in steps):
            raise ValueError(f"LearningRateChain: steps must be a non-empty list "
                             f"of (name, object) pairs, got {steps!r}.")
        names = [name for name, _ in steps]
        bad = [n for n in names if not isinstance(n, str) or not n or "__" in n
               or n == "steps"]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"LearningRateChain: step names must be unique "
                             f"non-empty strings without '__' (not 'steps'), "
                             f"got {names}.")
        *links, (name, last) = steps
        if not isinstance(last, BaseLearningRate):
            raise ValueError(f"LearningRateChain: the last step {name!r} must be "
                             f"a learning-rate object, got {last!r}.")
        for link_name, link in links:
            if not isinstance(link, GradientLink):
                raise ValueError(f"LearningRateChain: step {link_name!r} must be "
                                 f"a GradientLink (onnxtrain.optim.links), got "
                                 f"{link!r}.")
            link.check()
        check_learning_rate(last)

    # ------------------------------------------------ the last step's schedule
    def _rate(self):
        return self.steps[-1][1]

    @property
    def value(self):
        """The current learning rate (the last step's)."""
        return self._rate().value

    @value.setter
    def value(self, value):
        self._rate().value = value

    @property
    def learning_rate(self):
        """The last step's schedule kind ('adaptive'...); AttributeError
        when it has none (Adam)."""
        return self._rate().learning_rate

    @property
    def state_names(self):
        return self._rate().state_names

    @property
    def scalar_names(self):
        return self._rate().scalar_names

    def init_learning_rate(self):
        self._rate().init_learning_rate()
        return self

    def update_learning_rate(self, t):
        self._rate().update_learning_rate(t)
        return self

    def schedule(self, t):
        return self._rate().schedule(t)

    def trigger_stopping(self):
        return self._rate().trigger_stopping()

    def step_scalars(self, step):
        return self._rate().step_scalars(step)

    def init_state(self, shape, dtype):
        return self._rate().init_state(shape, dtype)

    # ------------------------------------------------------------ the update
    def update_rule(self):
        """:class:`~onnxtrain.optim.update_rules.ChainedRule` of the links
        and of the last step's rule."""
        return ChainedRule([link for _, link in self.steps[:-1]],
                           self._rate().update_rule())

    def _rule_scalars(self):
        return self._rate()._rule_scalars()
