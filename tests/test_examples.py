"""Run every script of ``examples/`` and check its key numbers.

Each example has ``main(output_dir)`` returning a dict of key numbers; the
row of :data:`CHECKS` named after the file checks them (losses going down,
scores close to scikit-learn's, curves equal to scikit-learn's where the
training is the same, pictures written and not blank). A file of
``examples/`` without a row fails :func:`test_example`.
"""
import importlib.util
import pathlib

import matplotlib
import numpy
import onnxruntime
import pytest
from numpy.testing import assert_allclose

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Stochastic Optimizer:sklearn.exceptions.ConvergenceWarning")

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def run_example(name, output_dir):
    """Import ``examples/<name>.py`` by path and call ``main(output_dir)``."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"onnxtrain_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(str(output_dir))


def assert_png_not_blank(path):
    """The file is a PNG with more than 1 % of its pixels drawn."""
    path = pathlib.Path(path)
    assert path.is_file(), f"{path} was not written"
    image = mpimg.imread(str(path))[..., :3]
    differs = numpy.abs(image - image[0, 0]).max(axis=-1) > 0.05
    assert differs.mean() > 0.01, f"{path.name}: only {differs.mean():.4f} drawn"


def assert_pictures(result, output_dir, names):
    """Exactly ``names`` were drawn, in ``output_dir``, none blank."""
    assert sorted(result["pictures"]) == sorted(names)
    for name, path in result["pictures"].items():
        assert pathlib.Path(path).parent == pathlib.Path(output_dir)
        assert_png_not_blank(path)


def assert_decreasing(losses, factor):
    """Finite losses whose last value is ``factor`` times below the first."""
    losses = numpy.asarray(losses, dtype=float)
    assert numpy.isfinite(losses).all()
    assert losses[-1] * factor < losses[0], (losses[0], losses[-1])


# one check per example -------------------------------------------------------
def check_seed_004_linear_regression(result, output_dir):
    # the regression recovers the generating coefficients (bias 2)
    assert_allclose(result["trained_coef"], result["coef"], rtol=5e-3)
    assert result["trained_intercept"] == pytest.approx(2, abs=0.1)
    assert result["final_loss"] < 0.01
    assert result["final_loss"] == result["losses"][-1]
    assert len(result["losses"]) == 200
    assert_decreasing(result["losses"], 1e5)
    assert result["test_r2"] > 0.9999
    # scikit-learn's constant rate against the seed's invscaling: both learn
    assert_decreasing(result["sklearn_losses"], 1e3)
    assert result["drawn_node_counts"] == result["node_counts"]
    assert len(result["node_counts"]) == 7  # 1 + 2 + 2 + 2 graphs drawn
    assert_pictures(result, output_dir, [
        "regression.png", "loss_curves.png", "regression_and_loss.png",
        "gradient.png", "small_graphs.png"])


def check_seed_000_custom_loss(result, output_dir):
    assert result["final_loss"] * 100 < result["initial_loss"]
    assert result["final_loss"] < 0.1
    assert len(result["losses"]) == 30
    assert_decreasing(result["losses"], 50)
    assert result["steps"] == 30 * 8  # 256 rows, batches of 32
    assert result["frozen_unchanged"]
    for name in ["model.onnx"] + ["training_model.onnx", "eval_model.onnx",
                                  "optimizer_model.onnx", "checkpoint"]:
        assert (pathlib.Path(output_dir) / name).is_file(), name
    assert result["drawn_nodes"] == result["training_model_nodes"] > 20
    assert_pictures(result, output_dir, ["training_model.png", "loss_curve.png"])


def check_diabetes_mlp(result, output_dir):
    for solver in ("sgd", "adam"):
        ours = result[f"{solver}_onnxtrain_losses"]
        theirs = result[f"{solver}_sklearn_losses"]
        assert len(ours) == len(theirs) == 60
        assert_allclose(ours, theirs, rtol=1e-4)  # same weights, same batches
        assert result[f"{solver}_max_rel_diff"] < 1e-4
        assert_decreasing(ours, 2.5)
        assert result[f"{solver}_onnxtrain_r2"] == pytest.approx(
            result[f"{solver}_sklearn_r2"], abs=1e-3)
        assert result[f"{solver}_onnxtrain_r2"] > 0.3
    assert_pictures(result, output_dir, ["loss_curves.png"])


def check_digits_classifier(result, output_dir):
    assert len(result["onnxtrain_losses"]) == 30
    assert_allclose(result["onnxtrain_losses"], result["sklearn_losses"], rtol=1e-4)
    assert result["max_rel_diff"] < 1e-4
    assert_decreasing(result["onnxtrain_losses"], 10)
    assert result["onnxtrain_losses"][-1] < 0.2
    assert result["onnxtrain_accuracy"] > 0.95
    assert result["onnxtrain_accuracy"] == pytest.approx(
        result["sklearn_accuracy"], abs=0.01)
    assert result["prediction_agreement"] > 0.98
    # the trained graph, run by a plain InferenceSession, predicts the same
    assert result["onnx_accuracy"] == result["onnxtrain_accuracy"]
    assert pathlib.Path(result["model"]).is_file()
    assert_pictures(result, output_dir, ["loss_curves.png"])


def check_train_on_gpu(result, output_dir):
    assert result["device"] == ("cuda" if HAS_CUDA else "cpu")
    assert result["weights_device"].lower() == result["device"]
    assert len(result["losses"]) == 20
    # CUDA kernels sum in another order: looser there
    assert_allclose(result["losses"], result["sklearn_losses"],
                    rtol=1e-3 if HAS_CUDA else 1e-4)
    assert_decreasing(result["losses"], 10)
    assert result["test_r2"] > 0.9
    assert result["test_r2"] == pytest.approx(result["sklearn_r2"], abs=5e-3)
    if HAS_CUDA:
        assert_allclose(result["cpu_losses"], result["losses"], rtol=1e-3)
    else:
        assert result["cpu_losses"] is None
    assert result["drawn_node_counts"] == result["node_counts"]
    assert_pictures(result, output_dir, ["loss_curves.png", "forward_gradient.png"])


def check_plot_graphs(result, output_dir):
    assert result["drawn_node_counts"] == result["node_counts"]
    assert result["node_counts"]["regression"] == 4  # Cast, MatMul, Add, Reshape
    assert "MatMul" in result["text"] and "coefficient" in result["text"]
    assert_pictures(result, output_dir, ["regression_graph.png", "gradient_graph.png"])


def check_dask_data_parallel(result, output_dir):
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert_allclose(result["losses"], result["single_losses"], rtol=1e-5)
    assert result["max_rel_diff"] < 1e-5
    assert_decreasing(result["losses"], 2)
    assert_pictures(result, output_dir, ["loss_curves.png"])


CHECKS = {
    "seed_004_linear_regression": check_seed_004_linear_regression,
    "seed_000_custom_loss": check_seed_000_custom_loss,
    "diabetes_mlp": check_diabetes_mlp,
    "digits_classifier": check_digits_classifier,
    "train_on_gpu": check_train_on_gpu,
    "plot_graphs": check_plot_graphs,
    "dask_data_parallel": check_dask_data_parallel,
}
FILES = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", sorted(set(FILES) | set(CHECKS)))
def test_example(name, tmp_path):
    if name not in FILES:
        pytest.fail(f"examples/{name}.py is checked by tests/test_examples.py "
                    "but does not exist")
    if name not in CHECKS:
        pytest.fail(f"examples/{name}.py has no row in CHECKS "
                    "(tests/test_examples.py): add a check of its key numbers")
    output_dir = tmp_path / "output"
    result = run_example(name, output_dir)
    assert isinstance(result, dict), f"examples/{name}.py: main() returned {result!r}"
    CHECKS[name](result, output_dir)


@pytest.mark.parametrize("name", FILES)
def test_example_is_runnable_as_a_script(name):
    source = (EXAMPLES / f"{name}.py").read_text(encoding="utf-8")
    assert 'if __name__ == "__main__":' in source
    assert "def main(output_dir" in source
    assert 'matplotlib.use("Agg")' in source
