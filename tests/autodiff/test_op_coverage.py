"""The gradient corpus of onnx's node tests (see tests/op_corpus.py).

The whole corpus runs here with at most :data:`MAX_COORDS` perturbed
elements per weight (the committed table, docs/op_coverage.md, comes from
``python tests/op_corpus.py``, which perturbs up to 2000). The tests fail
on any wrong gradient, on a registered VJP rule without a passing case, on
a pass rate below the floor, and when docs/op_coverage.md no longer
matches the rules (regenerate it).
"""
import pathlib
import re
import warnings

import pytest

import op_corpus
from onnxtrain.autodiff import registered_vjp_ops

MAX_COORDS = 24
#: Regression floors: lower them only with a reason in the commit.
MIN_PASS_RATE = 0.99
MIN_FULL_OPS = 129
DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "op_coverage.md"


@pytest.fixture(scope="module")
def results():
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = op_corpus.load_corpus() + op_corpus.extra_cases()
        return [op_corpus.check_case(c, max_coords=MAX_COORDS) for c in cases]


def test_no_wrong_gradient(results):
    wrong = [f"{r.case}: {r.reason}" for r in results if r.status == "wrong"]
    assert not wrong, "\n".join(wrong)


def test_every_registered_op_has_a_passing_case(results):
    passed = {r.op_type for r in results if r.status == "passed"}
    missing = sorted(op for domain, op in registered_vjp_ops()
                     if domain == "" and op not in passed
                     and op not in _ROWS_IN_RULE_TABLE)
    assert not missing, f"registered VJP rules without a passing case: {missing}"


#: Ops whose only checks are rows of tests/autodiff/test_autodiff_rules.py (the
#: corpus's Cast cases hold non-finite values: no finite differences).
_ROWS_IN_RULE_TABLE = {"Cast"}


def test_pass_rate_and_ops_fully_passing(results):
    per_op = op_corpus.summarize(results)
    counted = [r for r in results if r.status in op_corpus.COUNTED]
    rate = sum(r.status == "passed" for r in counted) / len(counted)
    full = [op for op, c in per_op.items()
            if c["passed"] and c["passed"] == sum(c[s] for s in op_corpus.COUNTED)]
    assert rate >= MIN_PASS_RATE, rate
    assert len(full) >= MIN_FULL_OPS, sorted(full)


def test_unsupported_cases_say_why(results):
    vague = [r.case for r in results
             if r.status == "unsupported" and len(r.reason) < 20]
    assert not vague


def test_doc_table_matches_the_rules(results):
    """docs/op_coverage.md was generated from the current rules."""
    row = r"^\| (\w+) " + r"\| (\d+) " * 6 + r"\|$"
    rows = re.findall(row, DOC.read_text(encoding="utf-8"), flags=re.M)
    expected = {}
    for op, c in op_corpus.summarize(results).items():
        other = c["nondifferentiable"] + c["no_reference"]
        expected[op] = (sum(c.values()), c["passed"], c["wrong"],
                        c["unsupported"], c["error"], other)
    documented = {op: tuple(int(v) for v in rest) for op, *rest in rows}
    stale = {op: (documented.get(op), expected[op]) for op in expected
             if documented.get(op) != expected[op]}
    assert not stale, ("docs/op_coverage.md is stale, run "
                       f"`python tests/op_corpus.py`: {stale}")
