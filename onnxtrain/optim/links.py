"""Links of an update chain: gradient transformations written as ONNX nodes
before an update rule, as optax's ``chain`` composes its
``GradientTransformation``\\ s (``clip_by_global_norm``,
``add_decayed_weights``...).

A link sees every trained parameter of one update. It has two halves:

- :meth:`GradientLink.prepare`, for a link that needs every gradient at once
  (:attr:`GradientLink.needs_all`: global-norm clipping), emits what the
  parameters share (the clipping factor) and returns it as the link's
  *context*;
- :meth:`GradientLink.transform` emits the change of one parameter: a new
  gradient (clipping, penalty, coupled decay), a new starting value
  (decoupled decay), and optionally a term added to the reported loss (the
  penalty's value).

:class:`onnxtrain.optim.update_rules.ChainedRule` runs the links in order
and ends with an update rule; :func:`onnxtrain.optim.chain` builds one.
Links hold no optimizer state (the rule at the end of a chain holds it), so
a chain keeps the per-parameter state layout of its rule.

Links are scikit-learn objects (``get_params``/``set_params``/``clone``):
an estimator's ``learning_rate`` holding a chain clones and grid-searches
them as any parameter. Their parameters are checked by :meth:`check`,
called before anything is emitted.
"""
from __future__ import annotations

import numbers

import numpy as np
from onnx import TensorProto
from sklearn.base import BaseEstimator

__all__ = ["GradientLink", "ClipByGlobalNorm", "ClipByValue",
           "AddDecayedWeights", "DecoupledWeightDecay", "AddPenalty",
           "clip_factor"]

_HALF_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _finite(value):
    """Whether ``value`` is a real number (not a bool), finite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and bool(np.isfinite(value))


_POSITIVE = (lambda v: _finite(v) and v > 0, "a finite float > 0")
_NON_NEGATIVE = (lambda v: _finite(v) and v >= 0, "a finite float >= 0")


def clip_factor(g, total, max_norm):
    """Emit ``min(1, max_norm / (sqrt(total) + 1e-6))`` in double.

    The factor of ``torch.nn.utils.clip_grad_norm_``
    (``torch/nn/utils/clip_grad.py``, ``_clip_grads_with_norm_``:
    ``clip_coef = max_norm / (total_norm + 1e-6)``, clamped at 1), shared by
    :class:`ClipByGlobalNorm` and onnxblock's ``ClipGradNorm``.

    Parameters
    ----------
    g : emitter
        ``op`` and ``const``.
    total : str
        Rank-0 double value, the sum of the squares of every gradient.
    max_norm : float

    Returns
    -------
    str
        Rank-0 double value.
    """
    double = TensorProto.DOUBLE
    norm = g.op("Sqrt", total)
    coef = g.op("Div", g.const(float(max_norm), double),
                g.op("Add", norm, g.const(1e-6, double)))
    return g.op("Min", coef, g.const(1.0, double))


class GradientLink(BaseEstimator):
    """Base of the links of a chain (see the module docstring).

    Attributes
    ----------
    needs_all : bool
        Whether :meth:`prepare` reads every parameter's gradient: the links
        before it then run on every parameter first.
    """

    needs_all = False
    #: parameter -> (test of a valid value, what a valid value is)
    valid_params = {}

    def check(self):
        """Raise ValueError naming a parameter out of its range
        (:attr:`valid_params`); return self."""
        for name, (test, what) in self.valid_params.items():
            value = getattr(self, name)
            if not test(value):
                raise ValueError(f"{type(self).__name__}: {name} must be {what}, "
                                 f"got {value!r}.")
        return self

    def prepare(self, g, elem_type, params, grads, scalars):
        """Emit what every parameter's :meth:`transform` shares.

        Parameters
        ----------
        g : emitter
            ``op(op_type, *inputs, outputs=None, **attributes)`` and
            ``const(value, elem_type)``
            (:class:`onnxtrain.graph.GraphBuilder`).
        elem_type : int
            ONNX element type of the parameters.
        params, grads : list of str
            Every parameter and its gradient, as the links before this one
            left them.
        scalars : dict
            The rank-0 values of the update
            (:meth:`onnxtrain.optim.update_rules.UpdateRule.update`).

        Returns
        -------
        object
            The context given to :meth:`transform` (None by default).
        """
        return None

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        """Emit this link's change of one parameter.

        Parameters
        ----------
        g, elem_type, scalars
            As :meth:`prepare`.
        param, grad : str
            The value the update starts from and its gradient.
        context : object, default=None
            What :meth:`prepare` returned.
        key : str, default=None
            The parameter's name in the model (``param`` may be a value a
            link before this one computed).

        Returns
        -------
        param : str
        grad : str
        loss_term : str or None
            A rank-0 value added to the reported loss.
        """
        raise NotImplementedError

    def __eq__(self, other):
        return type(self) is type(other) and \
            self.get_params(deep=False) == other.get_params(deep=False)

    __hash__ = None


class ClipByGlobalNorm(GradientLink):
    """Scale every gradient so that their joint 2-norm is at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` does.

    Parameters
    ----------
    max_norm : float, default=1.0
        A finite float > 0.

    Raises
    ------
    ValueError
        From :meth:`check`: ``max_norm`` not a finite float > 0 (a negative
        one would turn every gradient around).

    Notes
    -----
    With ``n`` the 2-norm of all the gradients together (the square root of
    the sum of their squares, summed in double), every gradient is
    multiplied by ``min(1, max_norm / (n + 1e-6))``: PyTorch's formula
    (``torch/nn/utils/clip_grad.py``, ``_clip_grads_with_norm_``), which
    scales the gradients as soon as ``n > max_norm - 1e-6`` and multiplies
    them by 1 below. The squares of a float16 or bfloat16 gradient are
    summed in float32 (a square over 65504 would be infinite in float16).
    """

    needs_all = True
    valid_params = {"max_norm": _POSITIVE}

    def __init__(self, max_norm=1.0):
        self.max_norm = max_norm

    def prepare(self, g, elem_type, params, grads, scalars):
        double = TensorProto.DOUBLE
        total = None
        for grad in grads:
            if elem_type in _HALF_TYPES:
                grad = g.op("Cast", grad, to=TensorProto.FLOAT)
            square = g.op("ReduceSumSquare", grad, keepdims=0)
            if elem_type != double:
                square = g.op("Cast", square, to=double)
            total = square if total is None else g.op("Add", total, square)
        factor = clip_factor(g, total, self.max_norm)
        return factor if elem_type == double else g.op("Cast", factor, to=int(elem_type))

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        return param, g.op("Mul", grad, context), None


class ClipByValue(GradientLink):
    """Clip every gradient element into ``[-clip_value, clip_value]``, as
    ``torch.nn.utils.clip_grad_value_`` does.

    Parameters
    ----------
    clip_value : float, default=1.0
        A finite float > 0.

    Raises
    ------
    ValueError
        From :meth:`check`: ``clip_value`` not a finite float > 0.
    """

    valid_params = {"clip_value": _POSITIVE}

    def __init__(self, clip_value=1.0):
        self.clip_value = clip_value

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        low = g.const(-float(self.clip_value), elem_type)
        high = g.const(float(self.clip_value), elem_type)
        if getattr(g, "opset", 11) >= 11:  # Clip takes its bounds as inputs
            return param, g.op("Clip", grad, low, high), None
        return param, g.op("Max", g.op("Min", grad, high), low), None


class AddDecayedWeights(GradientLink):
    """Coupled weight decay: ``grad <- grad + weight_decay * param``, the
    ``weight_decay`` of ``torch.optim.SGD`` and ``torch.optim.Adam`` (an L2
    penalty ``weight_decay / 2 * sum(param ** 2)`` of the loss, not scaled
    by the batch).

    Parameters
    ----------
    weight_decay : float, default=0.0001
        A finite float >= 0; 0 emits nothing.

    Raises
    ------
    ValueError
        From :meth:`check`: ``weight_decay`` not a finite float >= 0.

    Notes
    -----
    Every parameter decays, biases included, as in PyTorch;
    ``onnxtrain.penalties.ElasticLearningPenalty`` (``learning_penalty``)
    leaves the biases out and scales by the batch as scikit-learn's MLP
    ``alpha`` does.
    """

    valid_params = {"weight_decay": _NON_NEGATIVE}

    def __init__(self, weight_decay=0.0001):
        self.weight_decay = weight_decay

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        if not self.weight_decay:
            return param, grad, None
        decayed = g.op("Mul", param, g.const(float(self.weight_decay), elem_type))
        return param, g.op("Add", grad, decayed), None


class DecoupledWeightDecay(GradientLink):
    """Decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
    Regularization", 2019): the parameter decays by ``learning_rate *
    weight_decay`` of itself before the rule's step, which its gradient
    never sees (``torch.optim.AdamW``).

    Parameters
    ----------
    weight_decay : float, default=0.01
        A finite float >= 0; 0 emits nothing.

    Raises
    ------
    ValueError
        From :meth:`check`: ``weight_decay`` not a finite float >= 0.

    Notes
    -----
    ``param <- param * (1 - learning_rate * weight_decay)``, then the
    rule's step from that value: ``AdamRule(weight_decay=d)`` is this link
    followed by Adam. The product ``learning_rate * weight_decay`` is
    computed once per update, in the graph.
    """

    #: Key of ``scalars`` holding ``learning_rate * weight_decay`` (None: one
    #: of this link's own); :class:`~onnxtrain.optim.update_rules.AdamRule`'s
    #: link reads ``'decay'``, which its learning-rate object feeds.
    scalar_key = None
    valid_params = {"weight_decay": _NON_NEGATIVE}

    def __init__(self, weight_decay=0.01):
        self.weight_decay = weight_decay

    def _key(self):
        return self.scalar_key or f"decay({self.weight_decay!r})"

    def decay(self, g, elem_type, scalars):
        """``learning_rate * weight_decay`` (once per ``scalars``), None
        without decay."""
        if not self.weight_decay:
            return None
        key = self._key()
        if key not in scalars:
            scalars[key] = g.op("Mul", scalars["learning_rate"],
                                g.const(self.weight_decay, elem_type))
        return scalars[key]

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        decay = self.decay(g, elem_type, scalars)
        if decay is None:
            return param, grad, None
        # one product per parameter (as torch.optim.AdamW): the scalar
        # 1 - decay is computed once per update
        kept = f"1 - {self._key()}"
        if kept not in scalars:
            scalars[kept] = g.op("Sub", g.const(1.0, elem_type), decay)
        return g.op("Mul", param, scalars[kept]), grad, None


class AddPenalty(GradientLink):
    """A penalty on the weights as a link: its gradient joins the
    gradient, its value the reported loss.

    The estimators write their ``learning_penalty`` as this link, first in
    the chain (the penalty is part of the loss the gradient comes from, so
    clipping sees the penalized gradient), on the weights it penalizes
    (biases excluded unless the penalty's ``exclude_bias`` is False).

    Parameters
    ----------
    penalty : BaseLearningPenalty, default=None
        ``penalize(g, weight, grad, scale)`` (:mod:`onnxtrain.penalties`);
        None: no penalty.
    penalized : collection of str, default=None
        Names of the parameters penalized (None: all).

    Notes
    -----
    Reads ``scalars['penalty_scale']`` (1 / sum of the batch's sample
    weights), which only the estimators' update graphs have.
    """

    def __init__(self, penalty=None, penalized=None):
        self.penalty = penalty
        self.penalized = penalized

    def check(self):
        if self.penalty is not None and not callable(
                getattr(self.penalty, "penalize", None)):
            raise ValueError(f"AddPenalty: penalty must be a penalty object "
                             f"(onnxtrain.penalties), got {self.penalty!r}.")
        return self

    def transform(self, g, elem_type, param, grad, scalars, context=None,
                  key=None):
        key = param if key is None else key
        if self.penalty is None or (self.penalized is not None
                                    and key not in self.penalized):
            return param, grad, None
        grad, value = self.penalty.penalize(g, param, grad, scalars["penalty_scale"])
        return param, grad, value
