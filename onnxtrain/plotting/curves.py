"""Draw training loss curves (:func:`plot_loss_curves`)."""
import numbers

from ._pyplot import require_pyplot


def plot_loss_curves(*curves, labels=None, ax=None, log_scale=False, title=None):
    """Draw the loss per epoch of one or several trainings on one Axes.

    Parameters
    ----------
    *curves : estimator or sequence of float
        Each one is a fitted estimator with ``train_losses_`` (and
        optionally ``validation_losses_``, drawn dashed in the same colour),
        a scikit-learn MLP with ``loss_curve_`` (and optionally
        ``validation_scores_``, drawn dotted on a second y axis since it is
        a score, not a loss), or a plain sequence of losses.
    labels : list of str, default=None
        One label per curve; by default the class name of an estimator and
        ``"curve i"`` for a sequence.
    ax : matplotlib.axes.Axes, default=None
        Where to draw; a new figure when None.
    log_scale : bool, default=False
        Logarithmic y axis for the losses.
    title : str, default=None
        Title of the Axes.

    Returns
    -------
    matplotlib.axes.Axes
        The Axes holding the losses: one line per curve in ``ax.lines``,
        plus one per validation loss curve.

    Raises
    ------
    ImportError
        If matplotlib is not installed.
    TypeError
        If a curve is neither an estimator with a loss curve nor a sequence
        of numbers.
    ValueError
        If no curve is given or ``labels`` does not have one label per curve.
    """
    plt = require_pyplot()
    if not curves:
        raise ValueError("plot_loss_curves needs at least one curve")
    if labels is not None and len(labels) != len(curves):
        raise ValueError(f"labels has {len(labels)} entries for {len(curves)} curves")
    if ax is None:
        _, ax = plt.subplots(1, 1)
    score_ax = None
    for i, curve in enumerate(curves):
        train, validation, scores = _curve_values(curve, i)
        label = labels[i] if labels is not None else _default_label(curve, i)
        line, = ax.plot(range(1, len(train) + 1), train, label=label)
        if validation is not None:
            ax.plot(range(1, len(validation) + 1), validation, linestyle="--",
                    color=line.get_color(), label=f"{label} (validation)")
        if scores is not None:
            score_ax = score_ax or ax.twinx()
            score_ax.plot(range(1, len(scores) + 1), scores, linestyle=":",
                          color=line.get_color(), label=f"{label} (validation score)")
            score_ax.set_ylabel("validation score")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    if log_scale:
        ax.set_yscale("log")
    if title is not None:
        ax.set_title(title)
    ax.legend()
    return ax


def _curve_values(curve, index):
    """(train losses, validation losses or None, validation scores or None)."""
    for attribute in ("train_losses_", "loss_curve_"):
        train = getattr(curve, attribute, None)
        if train is not None:
            validation = getattr(curve, "validation_losses_", None)
            scores = getattr(curve, "validation_scores_", None)
            return list(train), _non_empty(validation), _non_empty(scores)
    if isinstance(curve, (str, bytes)) or not hasattr(curve, "__len__"):
        raise TypeError(f"curve {index} is a {type(curve).__name__}: expected an estimator "
                        "with train_losses_ or loss_curve_, or a sequence of floats")
    values = list(curve)
    if not all(isinstance(v, numbers.Real) for v in values):
        raise TypeError(f"curve {index} is not a sequence of floats")
    return values, None, None


def _non_empty(values):
    return list(values) if values is not None and len(values) > 0 else None


def _default_label(curve, index):
    if hasattr(curve, "train_losses_") or hasattr(curve, "loss_curve_"):
        # matplotlib hides labels starting with "_" from legends
        return type(curve).__name__.lstrip("_") or f"curve {index}"
    return f"curve {index}"
