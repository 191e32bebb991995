"""Reliability of the command line (issue 32, items 7 and 8): CSV files as
spreadsheet programs and editors write them (a UTF-8 byte-order mark,
blank lines) train; options and files that are wrong get a message naming
the option, the file and the line; models that cannot be loaded are named.
Grouped by kind: options, CSV encoding, CSV layout, models."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from onnxtrain.cli import main, read_csv
from onnxtrain.runtime.opsets import highest_opset
from linear_models import linear_model

ROWS = 60


@pytest.fixture
def table():
    """Rows of y = 3 x1 - 2 x2 + 1.5 as CSV text lines (no header)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((ROWS, 2))
    y = X @ np.array([3.0, -2.0]) + 1.5
    return [f"{float(a)!r},{float(b)!r},{float(t)!r}"
            for (a, b), t in zip(X, y)], X, y


@pytest.fixture
def model_path(tmp_path):
    model = linear_model(2, scale=0.0, opset=15, ir_version=8)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def train(model, data, tmp_path, *options):
    return main(["train", str(model), str(data), "--target", "target",
                 "--output", str(tmp_path / "out.onnx"), "--overwrite",
                 "--learning-rate", "0.05", "--schedule", "constant",
                 *options])


def trained_weights(tmp_path):
    return {i.name: numpy_helper.to_array(i)
            for i in onnx.load(tmp_path / "out.onnx").graph.initializer}


# ------------------------------------------------------------------ options

@pytest.mark.parametrize("option, value", [
    ("--epochs", "0"), ("--epochs", "-3"), ("--epochs", "ten"),
    ("--batch-size", "0")])
def test_counts_below_one_are_refused_under_the_options_name(
        option, value, table, model_path, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("x1,x2,target\n" + "\n".join(table[0]) + "\n")
    with pytest.raises(SystemExit) as info:
        train(model_path, data, tmp_path, option, value)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"argument {option}: must be an integer >= 1, got {value!r}" in err
    assert "max_iter" not in err and "batch_size" not in err
    assert not (tmp_path / "out.onnx").exists()


def test_demo_epochs_below_one_is_refused_under_its_name(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--epochs", "0"])
    assert "argument --epochs: must be an integer >= 1" in capsys.readouterr().err


# -------------------------------------------------------------- CSV encoding

def test_csv_with_a_utf8_byte_order_mark_reads_as_without(table, tmp_path):
    lines, X, y = table
    text = "target,x1,x2\n" + "\n".join(
        ",".join([t, a, b]) for a, b, t in (r.split(",") for r in lines)) + "\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes()[:3] == b"\xef\xbb\xbf"
    X_bom, y_bom, names = read_csv(str(marked), "target")
    assert names == ["x1", "x2"]
    np.testing.assert_array_equal(X_bom, X)
    np.testing.assert_array_equal(y_bom, y)


def test_train_on_a_csv_with_a_byte_order_mark_fits_the_weights(
        table, model_path, tmp_path):
    """The target in the first column, where the mark sticks to its name."""
    data = tmp_path / "bom.csv"
    data.write_text("target,x1,x2\n" + "\n".join(
        ",".join([t, a, b]) for a, b, t in (r.split(",") for r in table[0]))
        + "\n", encoding="utf-8-sig")
    assert train(model_path, data, tmp_path, "--epochs", "30") == 0
    np.testing.assert_allclose(trained_weights(tmp_path)["W"].ravel(),
                               [3.0, -2.0], atol=2e-2)


@pytest.mark.parametrize("line", [1, 2, 40])
def test_csv_not_in_utf8_names_the_file_and_line(line, table, model_path,
                                                 tmp_path, capsys):
    lines = ["x1,x2,target"] + table[0]
    encoded = [text.encode() for text in lines]
    encoded[line - 1] += b",caf\xe9"  # Latin-1, not UTF-8
    data = tmp_path / "latin1.csv"
    data.write_bytes(b"\n".join(encoded) + b"\n")
    with pytest.raises(ValueError, match=(
            rf"latin1\.csv, line {line}: byte 0xe9 is not UTF-8")):
        read_csv(str(data), "target")
    assert train(model_path, data, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"latin1.csv, line {line}: byte 0xe9 is not UTF-8" in err


# ---------------------------------------------------------------- CSV layout

@pytest.mark.parametrize("ending", ["\n\n", "\n\n\n", "\r\n\r\n", "\n   \n"])
def test_trailing_blank_lines_are_skipped(ending, table, tmp_path):
    lines, X, y = table
    data = tmp_path / "blank.csv"
    newline = "\r\n" if "\r" in ending else "\n"
    data.write_bytes((("x1,x2,target" + newline + newline.join(lines))
                      + ending).encode())
    X_read, y_read, _ = read_csv(str(data), "target")
    np.testing.assert_array_equal(X_read, X)
    np.testing.assert_array_equal(y_read, y)


def test_blank_lines_inside_keep_the_line_numbers_of_the_file(table, tmp_path):
    lines = table[0]
    data = tmp_path / "gaps.csv"
    # line 1 header, 2 blank, 3..12 rows, 13 blank, 14 a bad value
    data.write_text("x1,x2,target\n\n" + "\n".join(lines[:10]) + "\n\n"
                    "1.0,oops,2.0\n")
    with pytest.raises(ValueError, match=r"gaps\.csv, line 14, column 'x2': "
                       r"'oops' is not a finite number"):
        read_csv(str(data), "target")
    data.write_text("x1,x2,target\n\n" + "\n".join(lines[:10]) + "\n\n")
    X_read, _, _ = read_csv(str(data), "target")
    np.testing.assert_array_equal(X_read, table[1][:10])


def test_train_with_a_trailing_blank_line_fits_the_weights(
        table, model_path, tmp_path):
    data = tmp_path / "blank.csv"
    data.write_text("x1,x2,target\n" + "\n".join(table[0]) + "\n\n")
    assert train(model_path, data, tmp_path, "--epochs", "30") == 0
    np.testing.assert_allclose(trained_weights(tmp_path)["W"].ravel(),
                               [3.0, -2.0], atol=2e-2)


# -------------------------------------------------------------------- models

def test_model_with_an_opset_beyond_the_runtime_is_named(
        table, model_path, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("x1,x2,target\n" + "\n".join(table[0]) + "\n")
    model = onnx.load(model_path)
    model.opset_import[0].version = highest_opset("") + 1
    onnx.save(model, model_path)
    assert train(model_path, data, tmp_path) == 2
    err = capsys.readouterr().err
    assert (f"error: {model_path} imports opset {highest_opset('') + 1} of "
            "domain 'ai.onnx', but the installed onnxruntime") in err
    assert not (tmp_path / "out.onnx").exists()


def test_model_with_external_data_outside_its_folder_is_named(
        table, model_path, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("x1,x2,target\n" + "\n".join(table[0]) + "\n")
    model = onnx.load(model_path)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../weights.bin")
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "model.onnx"
    onnx.save(model, path)
    assert train(path, data, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: the external data of an initializer" in err
    assert "tensor name: W" in err and "points outside the directory" in err
    assert "Traceback" not in err
