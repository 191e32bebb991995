"""matplotlib is optional: import it only when a plot is asked for."""


def require_pyplot():
    """Return ``matplotlib.pyplot``; an ImportError naming the extra without it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib: pip install onnxtrain[plot]") from exc
    return plt
