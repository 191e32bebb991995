"""Run scikit-learn's own MLP test suite against onnxtrain.neural_network.

The installed ``sklearn/neural_network/tests/test_mlp.py`` is copied into a
temporary folder at run time (never into this repository), its import of
``MLPClassifier`` / ``MLPRegressor`` is changed to onnxtrain's, pytest runs
it, and the script prints the passed / failed counts. The tests that read
or write scikit-learn's private attributes (``_backprop``,
``_optimizer``, ``_no_improvement_count``...) are listed and counted apart:
they pin scikit-learn's internals, not its behaviour.

Usage::

    python benchmarks/compat_suites.py [-v] [-k EXPR]

onnxruntime-training's and onnxcustom's suites are not in any installed
package, so this script cannot fetch them (see README.md for how they were
counted).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import sklearn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: scikit-learn's import line and what replaces it.
IMPORT = "from sklearn.neural_network import MLPClassifier, MLPRegressor"
REPLACEMENT = "from onnxtrain.neural_network import MLPClassifier, MLPRegressor"

#: scikit-learn's own conftest gives ``global_random_seed`` (42 unless
#: SKLEARN_TESTS_GLOBAL_RANDOM_SEED says otherwise); the copy gets its default.
CONFTEST = """import pytest


@pytest.fixture
def global_random_seed():
    return 42
"""

#: Tests of scikit-learn's private attributes: the reason for each.
PRIVATE = {
    "test_fit": "calls _backprop, sets _coef_grads / _coef_velocity",
    "test_gradient": "calls _loss_grad_lbfgs",
    "test_learning_rate_warmstart": "reads _optimizer.learning_rate",
    "test_adaptive_learning_rate": "reads _optimizer.learning_rate",
    "test_n_iter_no_change": "reads _no_improvement_count",
    "test_n_iter_no_change_inf": "reads _no_improvement_count",
}


def sklearn_test_mlp():
    """Path of the installed scikit-learn's test_mlp.py."""
    path = os.path.join(os.path.dirname(sklearn.__file__), "neural_network",
                        "tests", "test_mlp.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not installed (scikit-learn "
                                f"{sklearn.__version__} without its tests).")
    return path


def run_test_mlp(extra_args=()):
    """Copy, rewrite and run scikit-learn's test_mlp.py.

    Returns
    -------
    dict
        test id -> 'PASSED' | 'FAILED' | 'ERROR' | 'SKIPPED'.
    """
    with open(sklearn_test_mlp(), encoding="utf-8") as f:
        source = f.read()
    if IMPORT not in source:
        raise RuntimeError(f"scikit-learn {sklearn.__version__}'s test_mlp.py has "
                           f"no line {IMPORT!r}: update this script.")
    source = source.replace(IMPORT, REPLACEMENT)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_mlp.py"), "w", encoding="utf-8") as f:
            f.write(source)
        with open(os.path.join(tmp, "conftest.py"), "w", encoding="utf-8") as f:
            f.write(CONFTEST)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider",
             "-W", "ignore", "test_mlp.py", *extra_args],
            cwd=tmp, env=env, capture_output=True, text=True)
    results = {}
    for line in proc.stdout.splitlines():
        # -rA summary lines: "PASSED test_mlp.py::test_x[...]"
        m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", line)
        if m:
            results[m.group(2).split("::", 1)[-1].split(" ")[0]] = m.group(1)
    if not results:
        raise RuntimeError("pytest reported nothing:\n" + proc.stdout[-3000:]
                           + proc.stderr[-3000:])
    return results, proc.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every failing test and pytest's failures")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    args = parser.parse_args(argv)
    results, out = run_test_mlp(["-k", args.k] if args.k else [])
    base = {t: t.split("[")[0] for t in results}
    private = [t for t in results if base[t] in PRIVATE]
    public = [t for t in results if base[t] not in PRIVATE]
    passed = [t for t in public if results[t] == "PASSED"]
    print(f"scikit-learn {sklearn.__version__} test_mlp.py against "
          "onnxtrain.neural_network")
    print(f"  all tests:   {sum(r == 'PASSED' for r in results.values())} "
          f"passed of {len(results)}")
    print(f"  excepting {len(private)} tests of private attributes: "
          f"{len(passed)} passed of {len(public)}")
    for name in sorted(set(base[t] for t in private)):
        print(f"    excepted {name}: {PRIVATE[name]}")
    failed = sorted(t for t in public if results[t] != "PASSED")
    for t in failed:
        print(f"  {results[t]} {t}")
    if args.verbose:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
