"""The command line: the demo and `train` on a user's CSV file."""
import io

import numpy as np
import onnx
import onnxruntime
import pytest

from onnxtrain.cli import main, read_csv
from onnxtrain.demo import run_demo
from linear_models import linear_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    results = run_demo(str(folder), epochs=8, out=out)
    return folder, results, out.getvalue()


def test_demo_losses_overlay_scikit_learn(demo):
    _, results, _ = demo
    assert len(results) == 2
    for result in results:
        ours = np.array(result.onnxtrain_losses)
        theirs = np.array(result.sklearn_losses)
        assert ours.shape == theirs.shape == (8,)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4)
        assert ours[-1] < ours[0]
        assert abs(result.onnxtrain_r2 - result.sklearn_r2) < 1e-3


def test_demo_writes_models_that_predict(demo):
    folder, results, text = demo
    for result in results:
        assert result.model_path in text
        sess = onnxruntime.InferenceSession(result.model_path,
                                            providers=["CPUExecutionProvider"])
        n_features = sess.get_inputs()[0].shape[1]
        pred = sess.run(None, {sess.get_inputs()[0].name:
                               np.zeros((3, n_features), np.float32)})[0]
        assert pred.shape == (3, 1)
    assert (folder / "loss_curves.png").stat().st_size > 10_000
    assert "test R2: onnxtrain" in text


@pytest.fixture
def csv_and_model(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 2))
    y = X @ np.array([3.0, -2.0]) + 1.5
    path = tmp_path / "data.csv"
    with open(path, "w") as f:
        f.write("x1,x2,target\n")
        for row, t in zip(X, y):
            f.write(f"{row[0]},{row[1]},{t}\n")
    model = linear_model(2, scale=0.0, opset=15, ir_version=8)
    model_path = tmp_path / "model.onnx"
    onnx.save(model, model_path)
    return path, model_path, X, y


def test_train_command_fits_user_csv(csv_and_model, tmp_path, capsys):
    data, model_path, X, y = csv_and_model
    out = tmp_path / "out.onnx"
    status = main(["train", str(model_path), str(data), "--target", "target",
                   "--epochs", "40", "--learning-rate", "0.05", "--schedule",
                   "constant", "--output", str(out)])
    assert status == 0
    trained = {i.name: onnx.numpy_helper.to_array(i)
               for i in onnx.load(out).graph.initializer}
    np.testing.assert_allclose(trained["W"].ravel(), [3.0, -2.0], atol=1e-2)
    np.testing.assert_allclose(trained["B"].ravel(), [1.5], atol=1e-2)
    assert "R2 on the training data: 1.0000" in capsys.readouterr().out


def test_train_command_reads_external_weights_into_the_weights(tmp_path, capsys):
    # a model whose weight (100 floats) is external data: the command gives
    # the estimator the path (the weight is read from its file straight
    # into the trained weight) and trains as on the same model in one file
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 100))
    data = tmp_path / "data.csv"
    with open(data, "w") as f:
        f.write(",".join(f"x{k}" for k in range(100)) + ",target\n")
        for row, t in zip(X, X[:, :3].sum(axis=1)):
            f.write(",".join(str(v) for v in row) + f",{t}\n")
    trained = {}
    for name, external in (("inline", False), ("external", True)):
        folder = tmp_path / name
        folder.mkdir()
        onnx.save(linear_model(100, opset=15, ir_version=8), folder / "model.onnx",
                  save_as_external_data=external, size_threshold=0,
                  location="weights.data")
        out = folder / "out.onnx"
        assert main(["train", str(folder / "model.onnx"), str(data), "--target",
                     "target", "--epochs", "3", "--output", str(out)]) == 0
        trained[name] = {i.name: onnx.numpy_helper.to_array(i)
                         for i in onnx.load(out).graph.initializer}
    assert trained["inline"].keys() == trained["external"].keys()
    for key, value in trained["inline"].items():
        np.testing.assert_array_equal(trained["external"][key], value)
    assert not np.allclose(trained["inline"]["W"],
                           onnx.numpy_helper.to_array(
                               linear_model(100).graph.initializer[0]))
    # the file the model names is read, never written
    assert (tmp_path / "external" / "weights.data").stat().st_size == 404


def test_train_command_reports_bad_column(csv_and_model, tmp_path, capsys):
    data, model_path, _, _ = csv_and_model
    status = main(["train", str(model_path), str(data), "--target", "nope",
                   "--output", str(tmp_path / "o.onnx")])
    assert status == 2
    assert "no column 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "o.onnx").exists()


def test_read_csv_names_bad_cell(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,target\n1,2\nx,3\n")
    with pytest.raises(ValueError, match=r"line 3, column 'a': 'x'"):
        read_csv(str(path), "target")


@pytest.mark.parametrize("cell", ["1_000", "1e3_0"])
def test_read_csv_refuses_python_only_number_spellings(tmp_path, cell):
    """Python's float reads '1_000' as 1000; a CSV cell so written is not a
    number (a thousands separator, a typo): refused, not read as 1000."""
    path = tmp_path / "bad.csv"
    path.write_text(f"a,target\n1,2\n{cell},3\n")
    with pytest.raises(ValueError, match=rf"line 3, column 'a': '{cell}'"):
        read_csv(str(path), "target")


def test_read_csv_selects_features(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("a,b,target\n1,2,3\n4,5,6\n")
    X, y, names = read_csv(str(path), "target", ["b", "a"])
    assert names == ["b", "a"]
    np.testing.assert_array_equal(X, [[2, 1], [5, 4]])
    np.testing.assert_array_equal(y, [3, 6])


def test_train_command_clean_errors(csv_and_model, tmp_path, capsys):
    """Errors the user can cause print one line and exit with status 2,
    before any training: not an ONNX file, a missing output folder, a NaN
    cell, a diverging learning rate."""
    data, model_path, _, _ = csv_and_model
    status = main(["train", str(data), str(data), "--target", "target",
                   "--output", str(tmp_path / "o.onnx")])
    assert status == 2 and "is not an ONNX model" in capsys.readouterr().err
    status = main(["train", str(model_path), str(data), "--target", "target",
                   "--output", str(tmp_path / "missing" / "o.onnx")])
    assert status == 2 and "does not exist" in capsys.readouterr().err
    status = main(["train", str(model_path), str(data), "--target", "target",
                   "--learning-rate", "1e6", "--schedule", "constant",
                   "--output", str(tmp_path / "o.onnx")])
    assert status == 2 and "loss became" in capsys.readouterr().err
    bad = tmp_path / "nan.csv"
    bad.write_text("a,target\n1,2\nnan,3\n")
    with pytest.raises(ValueError, match=r"line 3, column 'a': 'nan'"):
        read_csv(str(bad), "target")


@pytest.mark.parametrize("command,defaults", [
    ("train", {"--epochs": "100", "--batch-size": "10", "--learning-rate": "0.01",
               "--schedule": "invscaling", "--device": "cpu",
               "--features": "every column but the target",
               "--weights": "the model's weights, preprocessing and arithmetic "
                            "constants frozen", "--init": "model",
               "--task": "auto", "--optimizer": "sgd",
               "--loss": "square_error for regression, cross_entropy for "
                         "classification",
               "--validation-fraction": "0.1", "--n-iter-no-change": "10",
               "--tol": "no stopping on the training loss, 1e-4 with early "
                        "stopping"}),
    ("demo", {"--output-dir": "onnxtrain_demo", "--epochs": "50",
              "--device": "cpu", "--verbose": "0"})])
def test_help_gives_each_default_once(command, defaults, capsys):
    """Each option's help states its real default once; required options
    and options whose None means something else never say 'None'."""
    from onnxtrain.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # undo the wrapping
    text = text.split(" options: ", 1)[1].split(" examples: ")[0]
    assert "None" not in text
    sections = text.split(" --")
    for option, default in defaults.items():
        section = [s for s in sections if s.startswith(option[2:] + " ")]
        assert len(section) == 1, option
        assert section[0].count("(default:") == 1, section[0]
        assert f"(default: {default})" in section[0], section[0]
    if command == "train":
        for required in ("target", "output"):
            section = [s for s in sections if s.startswith(required + " ")]
            assert len(section) == 1 and "(default" not in section[0]


def test_train_fine_tunes_a_classifier_with_adam(tmp_path, capsys):
    """A converted scikit-learn classifier pipeline (labels and ZipMap
    outputs: the task is classification) fine-tuned with Adam on shifted
    data: the written model is more accurate there than the original, and
    the accuracy printed is the written model's."""
    import warnings

    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from skl2onnx import to_onnx

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skl = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    model = tmp_path / "clf.onnx"
    onnx.save(to_onnx(skl, X[:1], target_opset=17), model)
    shifted = X + 0.5 * X.std(axis=0)
    data = tmp_path / "new.csv"
    with open(data, "w") as f:
        f.write("a,b,c,d,label\n")
        for row, label in zip(shifted, y):
            f.write(",".join(str(v) for v in row) + f",{label}\n")
    out = tmp_path / "tuned.onnx"
    status = main(["train", str(model), str(data), "--target", "label",
                   "--optimizer", "adam", "--learning-rate", "0.01",
                   "--epochs", "10", "--batch-size", "16", "--shuffle",
                   "--random-state", "0", "--output", str(out)])
    assert status == 0
    text = capsys.readouterr().out
    sess = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    accuracy = (sess.run(None, {"X": shifted})[0] == y).mean()
    assert accuracy > skl.score(shifted, y) + 0.1
    assert f"accuracy on the training data: {accuracy:.4f}" in text
    assert "trained weights: ['coefficient', 'intercepts']" in text
    status = main(["train", str(model), str(data), "--target", "label",
                   "--optimizer", "adam", "--schedule", "constant",
                   "--output", str(tmp_path / "no.onnx")])
    assert status == 2
    assert "--schedule applies to sgd and nesterov" in capsys.readouterr().err
    assert not (tmp_path / "no.onnx").exists()


def test_read_csv_missing_features_as_nan(tmp_path):
    path = tmp_path / "gaps.csv"
    path.write_text("a,b,target\n1,,3\nNA,5,6\n")
    X, y, _ = read_csv(str(path), "target", missing_features=True)
    np.testing.assert_array_equal(np.isnan(X), [[False, True], [True, False]])
    np.testing.assert_array_equal(y, [3, 6])
    with pytest.raises(ValueError, match=r"line 2, column 'b'"):
        read_csv(str(path), "target")
    path.write_text("a,target\n1,\n")
    with pytest.raises(ValueError, match=r"line 2, column 'target'"):
        read_csv(str(path), "target", missing_features=True)


def test_train_command_reads_gaps_for_an_imputing_graph(tmp_path, capsys):
    import warnings

    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    from onnxtrain import to_onnx
    rng = np.random.RandomState(0)
    X = rng.randn(40, 2).astype(np.float32)
    y = X @ np.array([2.0, -1.0], dtype=np.float32) + 0.5
    pipe = make_pipeline(SimpleImputer(), Ridge(alpha=1e-3)).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(pipe, X[:1])
    model_path = tmp_path / "imputed.onnx"
    model_path.write_bytes(onx.SerializeToString())
    rows = [f"{'' if i % 7 == 0 else a},{b},{t}" for i, (a, b, t) in
            enumerate(zip(X[:, 0], X[:, 1], y))]
    data = tmp_path / "gaps.csv"
    data.write_text("a,b,target\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out.onnx"
    status = main(["train", str(model_path), str(data), "--target", "target",
                   "--epochs", "2", "--learning-rate", "1e-4", "--output", str(out)])
    assert status == 0, capsys.readouterr().err
    # the trained graph imputes the gaps it was trained on: finite
    # predictions, near y on the complete rows
    import onnxruntime
    sess = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    X_gaps = X.copy()
    X_gaps[::7, 0] = np.nan
    pred = sess.run(None, {sess.get_inputs()[0].name: X_gaps})[0].ravel()
    assert np.isfinite(pred).all()
    np.testing.assert_allclose(pred[1::7], y[1::7], atol=0.05)


def test_version_prints_the_package_version():
    import subprocess
    import sys

    import onnxtrain

    out = subprocess.run([sys.executable, "-m", "onnxtrain", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"onnxtrain {onnxtrain.__version__}"
