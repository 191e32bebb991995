"""Command line: ``python -m onnxtrain demo``, ``python -m onnxtrain train``
and ``python -m onnxtrain --version``."""
from __future__ import annotations

import argparse
import csv
import importlib.metadata
import io
import os
import sys

import numpy as np
import onnx

from .estimators._inputs import imputes_nan
from .runtime.checks import load_checked_model_deferred

__all__ = ["main", "read_csv"]


def read_csv(path, target, features=None, missing_features=False):
    """Read a numeric CSV file with a header row.

    Parameters
    ----------
    path : str
    target : str
        Column holding y.
    features : list of str, default=None
        Columns of X in order (default: every column but ``target``).
    missing_features : bool, default=False
        Read an empty feature cell, or one that is not a number ('NA',
        'nan'...), as NaN (for a graph that imputes missing values) instead
        of refusing it. The target is always a finite number.

    Returns
    -------
    (X, y, feature_names)
        ``X`` float64 of shape (n_samples, n_features), ``y`` of shape
        (n_samples,).

    Raises
    ------
    ValueError
        Missing columns, column names repeated in the header or in
        ``features``, ``target`` among ``features``, no rows, a value
        that is not a number (the message gives the line and column), or
        bytes that are not UTF-8 (the message gives the line).

    Notes
    -----
    The file is read as UTF-8; a byte-order mark (spreadsheet programs
    write one) is dropped, and blank lines are skipped.
    """
    numbered = [(n, row) for n, row in _csv_rows(path)
                if any(cell.strip() for cell in row)]  # blank lines skipped
    if len(numbered) < 2:
        raise ValueError(f"{path}: needs a header row and at least one data row.")
    lines, rows = zip(*numbered)
    header = [h.strip() for h in rows[0]]
    repeated = _repeated(header)
    if repeated:
        raise ValueError(f"{path}: the header repeats the column names "
                         f"{repeated}; each column needs its own name.")
    if target not in header:
        raise ValueError(f"{path}: no column {target!r}; columns: {header}.")
    features = features or [h for h in header if h != target]
    missing = [c for c in features if c not in header]
    if missing:
        raise ValueError(f"{path}: no columns {missing}; columns: {header}.")
    if target in features:
        raise ValueError(f"{path}: the target {target!r} is also a feature.")
    repeated = _repeated(features)
    if repeated:
        raise ValueError(f"{path}: features {repeated} are given more than "
                         "once.")
    values = np.empty((len(rows) - 1, len(header)), dtype=np.float64)
    for i, (line, row) in enumerate(zip(lines[1:], rows[1:])):
        if len(row) != len(header):
            raise ValueError(f"{path}, line {line}: {len(row)} values, "
                             f"{len(header)} columns.")
        for j, cell in enumerate(row):
            try:
                # Python's float reads '1_000' as 1000: not a number in a CSV
                values[i, j] = np.nan if "_" in cell else float(cell)
            except ValueError:
                values[i, j] = np.nan
            missing = np.isnan(values[i, j]) and missing_features \
                and header[j] != target
            if not (missing or np.isfinite(values[i, j])):
                raise ValueError(f"{path}, line {line}, column {header[j]!r}: "
                                 f"{cell!r} is not a finite number.")
    X = values[:, [header.index(c) for c in features]]
    return X, values[:, header.index(target)], features


def _csv_rows(path):
    """``(line number, row)`` of the CSV file ``path``, decoded as UTF-8
    (a byte-order mark, as spreadsheet programs write, is dropped).

    Raises
    ------
    ValueError
        If the file is not UTF-8: the message gives the line and the byte.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 "
            f"({exc.reason}); save the file as UTF-8.") from exc
    reader = csv.reader(io.StringIO(text, newline=""))
    # line_num after a row is the line it ended on (a quoted cell may span
    # several lines)
    return [(reader.line_num, row) for row in reader]


def _repeated(names):
    """Names appearing more than once, in order of first appearance."""
    return [n for i, n in enumerate(names)
            if names.count(n) > 1 and names.index(n) == i]


def _check_output_path(path, overwrite=False):
    """Refuse an output file path before any work is done.

    Parameters
    ----------
    path : str
    overwrite : bool, default=False
        Whether an existing file may be replaced.

    Raises
    ------
    ValueError
        If ``path`` is a directory, its folder does not exist, or it exists
        and ``overwrite`` is False.
    """
    if os.path.isdir(path):
        raise ValueError(f"--output: {path} is a directory, not a file name.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--output: folder {folder} does not exist.")
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"--output: {path} exists; pass --overwrite to "
                         "replace it.")


def _demo(args):
    from .demo import run_demo

    run_demo(args.output_dir, epochs=args.epochs, device=args.device,
             verbose=args.verbose)
    return 0


def _is_classifier(model):
    """Whether ``model`` classifies: an output that is not a float tensor
    (labels, ZipMap's probabilities)."""
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
              onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    return any(o.type.WhichOneof("value") != "tensor_type"
               or o.type.tensor_type.elem_type not in floats
               for o in model.graph.output)


def _update_rule(args):
    """The learning-rate object of ``--optimizer``, ``--learning-rate`` and
    ``--schedule``.

    Raises
    ------
    ValueError
        ``--schedule`` with Adam or AdamW (their rate is constant).
    """
    from .optim import (LearningRateAdam, LearningRateAdamW, LearningRateSGD,
                        LearningRateSGDNesterov)
    sgd = {"sgd": LearningRateSGD, "nesterov": LearningRateSGDNesterov}
    if args.optimizer in sgd:
        return sgd[args.optimizer](eta0=args.learning_rate,
                                   learning_rate=args.schedule or "invscaling")
    if args.schedule is not None:
        raise ValueError(f"--schedule applies to sgd and nesterov, not to "
                         f"--optimizer {args.optimizer}.")
    adam = {"adam": LearningRateAdam, "adamw": LearningRateAdamW}
    return adam[args.optimizer](eta0=args.learning_rate)


def _train(args):
    from .estimators import (OrtGradientForwardBackwardClassifier,
                             OrtGradientForwardBackwardOptimizer)

    _check_output_path(args.output, args.overwrite)
    learning_rate = _update_rule(args)
    # the graph alone decides how the data is read and the task; the
    # estimator gets the path and reads the float weights stored as
    # external data straight into the weights it trains
    graph, _ = load_checked_model_deferred(args.model, "model", lambda tensor: True)
    X, y, _ = read_csv(args.data, args.target, args.features,
                       missing_features=imputes_nan(graph))
    classify = args.task == "classification" or (
        args.task == "auto" and _is_classifier(graph))
    del graph
    estimator = (OrtGradientForwardBackwardClassifier if classify
                 else OrtGradientForwardBackwardOptimizer)
    params = {} if args.loss is None else {"learning_loss": args.loss}
    est = estimator(
        args.model, weights_to_train=args.weights, max_iter=args.epochs,
        batch_size=args.batch_size, device=args.device, verbose=1,
        learning_rate=learning_rate,
        init="random" if args.warm_start is False else args.init,
        random_state=args.random_state, shuffle=args.shuffle,
        early_stopping=args.early_stopping,
        validation_fraction=args.validation_fraction,
        n_iter_no_change=args.n_iter_no_change, tol=args.tol, **params)
    est.fit(X, y)
    onnx.save(est.get_trained_onnx(), args.output)
    print(f"trained weights: {est.weights_to_train_}")
    if est.frozen_weights_:
        print("frozen: " + "; ".join(f"{k} ({v})"
                                     for k, v in est.frozen_weights_.items()))
    score = "accuracy" if classify else "R2"
    print(f"epochs: {est.n_iter_}, last loss: {est.train_losses_[-1]:.6g}, "
          f"{score} on the training data: {est.score(X, y):.4f}")
    print(f"written: {args.output}")
    return 0


def _learning_rate(text):
    """argparse type of ``--learning-rate``: a finite float > 0, refused
    before any file is read (-1 would ascend the loss, nan destroy it)."""
    try:
        value = float(text)
    except ValueError:
        value = np.nan
    if not (np.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0, got {text!r}")
    return value


def _positive_int(text):
    """argparse type of ``--epochs`` and ``--batch-size``: an int >= 1,
    refused under the option's own name before any file is read."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


_TRAIN_EXAMPLES = """examples:
  fine-tune a converted regressor (its own weights, preprocessing frozen):
    python -m onnxtrain train ridge.onnx new.csv --target y --output tuned.onnx
  a classifier (labels in the target column), Adam, shuffled batches:
    python -m onnxtrain train logreg.onnx new.csv --target label \\
        --optimizer adam --learning-rate 0.001 --shuffle --output tuned.onnx
  a cold start with random weights, early stopping:
    python -m onnxtrain train mlp.onnx data.csv --target y --init random \\
        --random-state 0 --early-stopping --output trained.onnx
"""


def _version():
    """The installed distribution's version (setup.cfg reads it from
    ``onnxtrain.__version__``, a layer above this module)."""
    try:
        return importlib.metadata.version("onnxtrain")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser():
    """The argparse parser of ``python -m onnxtrain``."""
    parser = argparse.ArgumentParser(
        prog="python -m onnxtrain",
        description="Train ONNX graphs on onnxruntime.")
    parser.add_argument("--version", action="version",
                        version=f"onnxtrain {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    # every default is written in its help by hand: the options whose
    # default is None say what None means, required ones say nothing
    demo = sub.add_parser("demo", help="train two scikit-learn MLPs converted "
                          "to ONNX and compare with scikit-learn")
    demo.add_argument("--output-dir", default="onnxtrain_demo",
                      help="folder for the trained models and the loss-curve "
                      "PNG (default: %(default)s)")
    demo.add_argument("--epochs", type=_positive_int, default=50,
                      help="epochs of each training (default: %(default)s)")
    demo.add_argument("--device", default="cpu",
                      help="cpu, cuda or cuda:N (default: %(default)s)")
    demo.add_argument("--verbose", type=int, default=0,
                      help="0: quiet, 1: a progress bar per training, 2: with "
                      "the loss (default: %(default)s)")
    demo.set_defaults(func=_demo)

    train = sub.add_parser(
        "train", help="train (fine-tune) the initializers of an ONNX model on "
        "a CSV file", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_TRAIN_EXAMPLES)
    train.add_argument("model", help="ONNX prediction graph: a regressor "
                       "(first float output = prediction) or a classifier "
                       "(probabilities, with or without ZipMap)")
    train.add_argument("data", help="CSV file with a header row, numbers only")
    train.add_argument("--target", required=True, help="column holding y")
    train.add_argument("--features", nargs="+", default=None,
                       help="feature columns in the model's order (default: "
                       "every column but the target)")
    train.add_argument("--weights", nargs="+", default=None,
                       help="initializers to train (default: the model's "
                       "weights, preprocessing and arithmetic constants "
                       "frozen)")
    train.add_argument("--epochs", type=_positive_int, default=100,
                       help="training epochs (default: %(default)s)")
    train.add_argument("--batch-size", type=_positive_int, default=10,
                       help="rows per step (default: %(default)s)")
    train.add_argument("--learning-rate", type=_learning_rate, default=0.01,
                       help="initial learning rate eta0 of the optimizer "
                       "(default: %(default)s)")
    train.add_argument("--task", choices=["auto", "regression", "classification"],
                       default="auto", help="auto: classification when the "
                       "model outputs labels (default: %(default)s)")
    train.add_argument("--loss", default=None,
                       help="learning loss, a name of onnxtrain.losses: "
                       "square_error, absolute_error, elastic, log, "
                       "cross_entropy, poisson... (default: square_error for "
                       "regression, cross_entropy for classification)")
    train.add_argument("--optimizer", default="sgd",
                       choices=["sgd", "nesterov", "adam", "adamw"],
                       help="update rule (default: %(default)s)")
    train.add_argument("--schedule", default=None,
                       choices=["constant", "invscaling", "optimal"],
                       help="learning-rate schedule of sgd and nesterov: "
                       "invscaling decays as lr / (epoch + 1) ** 0.25 "
                       "(default: invscaling)")
    train.add_argument("--shuffle", action="store_true",
                       help="shuffle the rows at each epoch (without it, "
                       "batches in row order)")
    train.add_argument("--early-stopping", action="store_true",
                       help="hold out a fraction of the rows (validation "
                       "fraction) and stop when their score stops improving, "
                       "keeping the best weights")
    train.add_argument("--validation-fraction", type=float, default=0.1,
                       help="held-out rows of the early stopping (default: "
                       "%(default)s)")
    train.add_argument("--n-iter-no-change", type=int, default=10,
                       help="epochs without improvement before stopping "
                       "(default: %(default)s)")
    train.add_argument("--tol", type=float, default=None,
                       help="improvement threshold of the stopping rules "
                       "(default: no stopping on the training loss, 1e-4 "
                       "with early stopping)")
    train.add_argument("--init", choices=["model", "random"], default="model",
                       help="initial weights: the model's own (fine-tune what "
                       "it learned) or random Glorot-uniform draws as "
                       "scikit-learn's MLP (a cold start) (default: "
                       "%(default)s)")
    # the option --init replaced: --no-warm-start means --init random
    train.add_argument("--warm-start", action=argparse.BooleanOptionalAction,
                       default=None, help=argparse.SUPPRESS)
    train.add_argument("--random-state", type=int, default=None,
                       help="seed of the random initial weights (init random) "
                       "(default: a new seed each run)")
    train.add_argument("--device", default="cpu",
                       help="cpu, cuda or cuda:N (default: %(default)s)")
    train.add_argument("--output", required=True, help="trained ONNX model "
                       "(its folder must exist)")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the output file if it exists (without it, an "
                       "existing file is an error, before any training)")
    train.set_defaults(func=_train)
    return parser


def main(argv=None):
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        # RuntimeError covers ConvergenceError and DeviceError
        print(f"error: {exc}", file=sys.stderr)
        return 2
