"""Helpers shared by the small graphs (losses, update rules, penalties)."""
from onnx import TensorProto, helper

from .graph import GraphBuilder, make_model

DEFAULT_OPSET = 17


def new_builder(opset=None):
    """A builder for a small graph at ``opset`` (default 17)."""
    return GraphBuilder(opset or DEFAULT_OPSET)


def tensor_input(name, elem_type, shape=None):
    """A graph input/output declaration."""
    return helper.make_tensor_value_info(name, elem_type, shape)


def finish(g, name, inputs, outputs):
    """A ModelProto from builder ``g``."""
    graph = g.make_graph(name, inputs, outputs)
    return make_model(graph, [helper.make_opsetid("", g.opset)])


def check_float_type(elem_type):
    """Raise ValueError unless ``elem_type`` is float16/32/64."""
    if elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        raise ValueError(f"Small graphs need a float element type, got "
                         f"{helper.tensor_dtype_to_string(elem_type)}.")
    return elem_type


def resolve_named(value, registry, base, what):
    """A new object from a registry name or an object of class ``base``.

    One resolver for the extension points (losses, learning rates,
    penalties): an object is cloned (the caller's is never modified), a name
    is looked up in ``registry`` (name -> class), in any case ('adam' is
    'Adam', as scikit-learn spells its solvers).

    Raises
    ------
    ValueError
        Unknown name: the message lists the accepted ones.
    TypeError
        Neither a str nor a ``base``.
    """
    from sklearn.base import clone

    if isinstance(value, base):
        return clone(value)
    if isinstance(value, str):
        if value not in registry:
            # scikit-learn spells its solvers in lower case ('adam', 'sgd')
            folded = {k.lower(): k for k in registry}
            if value.lower() not in folded:
                raise ValueError(f"Unknown {what} {value!r}; accepted (in any "
                                 f"case): {sorted(k for k in registry if k)}.")
            value = folded[value.lower()]
        return registry[value]()
    raise TypeError(f"{what} must be a str or a {base.__name__}, not "
                    f"{type(value).__name__}.")


def full_repr(obj, params=None):
    """``Class(p1=v1, p2=v2, ...)`` with every parameter (``params``, default
    ``obj.get_params(deep=False)``) in the constructor's order, defaults
    included, and so for the parameters that are scikit-learn objects
    (learning rates, losses...): onnxcustom's estimator repr, which its
    users' logs and tests read (scikit-learn's shows only the parameters
    changed from their default)."""
    import inspect

    from sklearn.base import BaseEstimator

    params = obj.get_params(deep=False) if params is None else params
    order = [p for p in inspect.signature(type(obj).__init__).parameters
             if p in params]
    def show(value):
        return full_repr(value) if isinstance(value, BaseEstimator) else repr(value)

    shown = ", ".join(f"{k}={show(params[k])}" for k in order)
    return f"{type(obj).__name__}({shown})"
