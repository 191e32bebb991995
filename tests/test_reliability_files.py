"""Reliability with files (issue 14): bad CSV files and output paths on the
command line, hostile checkpoints, artifact files written over, and files
that are not ONNX models. Hostile checkpoints are ZIP archives written byte
by byte here, so they can lie where zipfile would not."""
import copy
import json
import os
import re
import struct
import tracemalloc
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts
from onnxtrain.cli import build_parser, main, read_csv
from test_artifacts_models import two_head_model
from linear_models import linear_model

TRAINABLE = ["weight1", "bias1", "weight2", "bias2"]
FROZEN = ["weight3", "bias3"]
CLI_DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md")


# command line -------------------------------------------------------------
@pytest.fixture
def csv_and_model(tmp_path):
    """A CSV of y = 3 x1 - 2 x2 + 1.5 and a linear model to train on it."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 2))
    y = X @ np.array([3.0, -2.0]) + 1.5
    data = tmp_path / "data.csv"
    data.write_text("x1,x2,target\n" + "".join(
        f"{a},{b},{t}\n" for (a, b), t in zip(X, y)))
    model = linear_model(2, scale=0.0, opset=15, ir_version=8)
    model_path = tmp_path / "model.onnx"
    onnx.save(model, model_path)
    return data, model_path


@pytest.fixture
def no_training(monkeypatch):
    """Makes any training fail the test (an AssertionError the command
    line does not catch)."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer

    def fit(*args, **kwargs):
        raise AssertionError("the command trained before refusing")
    monkeypatch.setattr(OrtGradientForwardBackwardOptimizer, "fit", fit)


def test_read_csv_refuses_repeated_header_names(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("a,b,a,target\n1,2,3,4\n5,6,7,8\n")
    with pytest.raises(ValueError, match=r"dup\.csv: the header repeats the "
                       r"column names \['a'\]"):
        read_csv(str(path), "target")


def test_read_csv_refuses_target_as_feature_and_repeated_features(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("a,b,target\n1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match=r"the target 'target' is also a "
                       "feature"):
        read_csv(str(path), "target", ["a", "target"])
    with pytest.raises(ValueError, match=r"features \['b'\] are given more "
                       "than once"):
        read_csv(str(path), "target", ["b", "a", "b"])


def test_train_refuses_bad_output_before_reading_or_training(
        csv_and_model, tmp_path, capsys, no_training):
    """A directory, a missing folder or an existing file as --output: status
    2 and one line, before the CSV is even read (here: a CSV that would be
    refused too) and before any training."""
    data, model_path = csv_and_model
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("a,a,target\n1,2,3\n")
    existing = tmp_path / "old.onnx"
    existing.write_bytes(b"previous result")
    cases = [(tmp_path, "is a directory, not a file name"),
             (tmp_path / "missing" / "o.onnx", "does not exist"),
             (existing, "exists; pass --overwrite to replace it")]
    for output, message in cases:
        for csv_file in (data, bad_csv):
            status = main(["train", str(model_path), str(csv_file), "--target",
                           "target", "--output", str(output)])
            err = capsys.readouterr().err
            assert status == 2 and message in err, err
            assert str(output) in err or str(output.parent) in err
    assert existing.read_bytes() == b"previous result"


def test_train_overwrites_only_with_the_flag(csv_and_model, tmp_path):
    data, model_path = csv_and_model
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous result")
    args = ["train", str(model_path), str(data), "--target", "target",
            "--epochs", "30", "--learning-rate", "0.05", "--schedule",
            "constant", "--output", str(out)]
    assert main(args) == 2
    assert out.read_bytes() == b"previous result"
    assert main(args + ["--overwrite"]) == 0
    trained = {i.name: numpy_helper.to_array(i)
               for i in onnx.load(out).graph.initializer}
    np.testing.assert_allclose(trained["W"].ravel(), [3.0, -2.0], atol=2e-2)


def test_overwrite_flag_documented_in_help_and_readme(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--overwrite replace the output file if it exists" in text
    with open(CLI_DOCS, encoding="utf-8") as f:
        assert "--overwrite" in f.read()


# checkpoints --------------------------------------------------------------
def hand_zip(entries):
    """A ZIP archive built byte by byte.

    ``entries``: list of ``(name, data, options)``; options ``deflate``
    (compress the data), ``declared_size`` (the size written in both
    headers, whatever the data's real size)."""
    local, central = b"", b""
    for name, data, options in entries:
        raw = name.encode()
        crc = zlib.crc32(data)
        size = options.get("declared_size", len(data))
        method, stored = 0, data
        if options.get("deflate"):
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            method, stored = 8, compressor.compress(data) + compressor.flush()
        csize = len(stored) if method else size
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0,
                               method, 0, 0x21, crc, csize, size, len(raw), 0,
                               0, 0, 0, 0, len(local)) + raw
        local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0,
                             0x21, crc, csize, size, len(raw), 0) + raw + stored
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries),
                      len(entries), len(central), len(local), 0)
    return local + central + end


W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, -1.5, 2.0], dtype=np.float32)


def valid_header():
    """The header of a checkpoint of W, B with an optimizer state."""
    def record(entry, array):
        return {"dtype": array.dtype.str, "shape": list(array.shape),
                "data": entry}
    return {"format": "onnxtrain.checkpoint", "version": 1, "nominal": False,
            "parameters": [
                {"name": "W", "requires_grad": True, **record("arrays/0.bin", W)},
                {"name": "B", "requires_grad": False,
                 **record("arrays/1.bin", B)}],
            "properties": {"epoch": {"type": "int", "value": 3},
                           "best": {"type": "float", "value": (0.25).hex()}},
            "optimizer": {"step": 3, "learning_rate": (0.001).hex(),
                          "states": {"W": {"exp_avg": record("arrays/2.bin",
                                                             2 * W)}}}}


def write_hand_checkpoint(path, header, arrays=None, options=None):
    arrays = {"arrays/0.bin": W.tobytes(), "arrays/1.bin": B.tobytes(),
              "arrays/2.bin": (2 * W).tobytes()} if arrays is None else arrays
    options = options or {}
    entries = [("header.json", json.dumps(header).encode(),
                options.get("header.json", {}))]
    entries += [(name, data, options.get(name, {}))
                for name, data in arrays.items()]
    path.write_bytes(hand_zip(entries))
    return path


def _set(path_in_header, value):
    def mutate(header):
        target = header
        for key in path_in_header[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path_in_header[-1]]
        else:
            target[path_in_header[-1]] = value
        return header
    return mutate


_DELETE = object()
P0 = ("parameters", 0)
HOSTILE_HEADERS = [
    # (what, mutation of the valid header, field named in the error)
    ("list instead of object", lambda h: [h], "header.json"),
    ("no parameters", _set(("parameters",), _DELETE), "parameters"),
    ("no properties", _set(("properties",), _DELETE), "properties"),
    ("no shape", _set(P0 + ("shape",), _DELETE), r"parameters\[0\]\.shape"),
    ("parameter not an object", _set(P0, ["W"]), r"parameters\[0\]"),
    ("format", _set(("format",), "other"), "format"),
    ("version true", _set(("version",), True), "version"),
    ("nominal 'false'", _set(("nominal",), "false"), "nominal"),
    ("requires_grad 'false'", _set(P0 + ("requires_grad",), "false"),
     r"parameters\[0\]\.requires_grad"),
    ("requires_grad 0", _set(P0 + ("requires_grad",), 0),
     r"parameters\[0\]\.requires_grad"),
    ("duplicate names", _set(("parameters", 1, "name"), "W"),
     r"parameters\[1\]\.name"),
    ("name not str", _set(P0 + ("name",), 7), r"parameters\[0\]\.name"),
    ("NaN learning rate", _set(("optimizer", "learning_rate"), "nan"),
     r"optimizer\.learning_rate"),
    ("negative learning rate", _set(("optimizer", "learning_rate"),
                                    (-0.001).hex()), r"optimizer\.learning_rate"),
    ("infinite learning rate", _set(("optimizer", "learning_rate"), "inf"),
     r"optimizer\.learning_rate"),
    ("learning rate not hex", _set(("optimizer", "learning_rate"), 0.001),
     r"optimizer\.learning_rate"),
    ("negative step", _set(("optimizer", "step"), -1), r"optimizer\.step"),
    ("fractional step", _set(("optimizer", "step"), 1.5), r"optimizer\.step"),
    ("step true", _set(("optimizer", "step"), True), r"optimizer\.step"),
    ("state of no parameter", _set(("optimizer", "states"),
                                   {"C": {}}), r"optimizer\.states\['C'\]"),
    ("object dtype", _set(P0 + ("dtype",), "|O"), r"parameters\[0\]\.dtype"),
    ("unicode dtype", _set(P0 + ("dtype",), "<U6"), r"parameters\[0\]\.dtype"),
    ("big-endian dtype", _set(P0 + ("dtype",), ">f4"), r"parameters\[0\]\.dtype"),
    ("subarray dtype", _set(P0 + ("dtype",), "(3,)<f4"),
     r"parameters\[0\]\.dtype"),
    ("dtype not str", _set(P0 + ("dtype",), 4), r"parameters\[0\]\.dtype"),
    ("negative dim", _set(P0 + ("shape",), [-2, -3]), r"parameters\[0\]\.shape"),
    ("float dim", _set(P0 + ("shape",), [2.0, 3]), r"parameters\[0\]\.shape"),
    ("shape not a list", _set(P0 + ("shape",), "2,3"), r"parameters\[0\]\.shape"),
    ("absurd shape", _set(P0 + ("shape",), [10 ** 6] * 3),
     r"parameters\[0\]\.shape"),
    # W's 6 values, so the entry's size agrees: only the rank is wrong
    ("more than 64 dimensions", _set(P0 + ("shape",), [2, 3] + [1] * 63),
     r"parameters\[0\]\.shape"),
    ("optimizer state of 65 dimensions", _set(
        ("optimizer", "states", "W", "exp_avg", "shape"), [1] * 63 + [2, 3]),
     r"optimizer\.states\['W'\]\['exp_avg'\]\.shape"),
    ("size disagrees with shape", _set(P0 + ("shape",), [3, 3]),
     r"parameters\[0\]\.data"),
    ("missing entry", _set(P0 + ("data",), "arrays/9.bin"),
     r"parameters\[0\]\.data"),
    ("entry used twice", _set(("parameters", 1, "data"), "arrays/0.bin"),
     r"parameters\[1\]\.data"),
    ("properties not an object", _set(("properties",), []), "properties"),
    ("unknown property type", _set(("properties", "epoch", "type"), "bool"),
     r"properties\['epoch'\]\.type"),
    ("int property as str", _set(("properties", "epoch", "value"), "3"),
     r"properties\['epoch'\]\.value"),
    ("float property not hex", _set(("properties", "best", "value"), "zz"),
     r"properties\['best'\]\.value"),
    ("property type a list", _set(("properties", "epoch", "type"), ["int"]),
     r"properties\['epoch'\]\.type"),
    ("huge shape list", _set(P0 + ("shape",), [-1] * 100000),
     r"parameters\[0\]\.shape"),
    ("optimizer in a nominal checkpoint", lambda h: {
        **h, "nominal": True, "parameters": [
            {**p, "data": None} for p in h["parameters"]]}, "optimizer"),
]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """The hand-built archive of :func:`valid_header` is a valid checkpoint
    and reads back exactly: the hostile variants differ from it only by
    their mutation."""
    path = write_hand_checkpoint(tmp_path_factory.mktemp("control") / "ok",
                                 valid_header())
    state = api.CheckpointState.load_checkpoint(path)
    np.testing.assert_array_equal(state.parameters["W"].data, W)
    assert state.parameters["B"].requires_grad is False
    assert state.properties["best"] == 0.25
    assert state.optimizer_state.learning_rate == 0.001
    np.testing.assert_array_equal(
        state.optimizer_state.states["W"]["exp_avg"], 2 * W)


@pytest.mark.parametrize("what,mutate,field", HOSTILE_HEADERS,
                         ids=[h[0] for h in HOSTILE_HEADERS])
def test_hostile_checkpoint_header_refused_naming_file_and_field(
        control, tmp_path, what, mutate, field):
    path = write_hand_checkpoint(tmp_path / "hostile",
                                 mutate(copy.deepcopy(valid_header())))
    with pytest.raises(ValueError) as info:
        api.CheckpointState.load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message
    assert re.search(f"field {field}[: ]", message), message
    assert len(message) < 500  # one line, even for a huge hostile value


@pytest.mark.parametrize("damage", ["flipped", "short"])
def test_damaged_array_entry_refused_naming_file_and_field(tmp_path, damage):
    """An array whose bytes changed (its CRC no longer matches) or whose
    entry holds fewer bytes than declared is refused, naming the field: the
    reader reads the entry into the array block by block and checks the
    CRC at its end."""
    from onnxtrain.checkpoint import write_checkpoint
    path = tmp_path / "checkpoint"
    big = np.arange(1 << 19, dtype=np.float32)  # over one read block
    write_checkpoint(path, [("W", big, True)])
    data = bytearray(path.read_bytes())
    start = bytes(data).index(big[:4].tobytes())
    if damage == "flipped":
        data[start + big.nbytes - 3] ^= 0xFF  # in the last block
        path.write_bytes(bytes(data))
    else:  # the data cut, the headers declaring it whole
        path.write_bytes(bytes(data[:start + big.nbytes // 2])
                         + bytes(data[start + big.nbytes:]))
    with pytest.raises(ValueError) as info:
        api.CheckpointState.load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "parameters[0].data" in message, message


def test_checkpoint_of_array_likes_converts_them(tmp_path):
    """A value whose ``dtype`` is not numpy's (a torch tensor) is converted
    by ``np.asarray``, in the checks and in nominal checkpoints too."""
    torch = pytest.importorskip("torch")
    from onnxtrain.checkpoint import (checkpoint_to_bytes, read_checkpoint,
                                      write_checkpoint)
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    write_checkpoint(tmp_path / "checkpoint", [("W", tensor, True)])
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    np.testing.assert_array_equal(state.parameters["W"].data, tensor.numpy())
    (tmp_path / "nominal").write_bytes(
        checkpoint_to_bytes([("W", tensor, True)], nominal=True))
    [(name, (dtype, shape), _)] = read_checkpoint(tmp_path / "nominal")["parameters"]
    assert (name, dtype, shape) == ("W", np.float32, (2, 3))


def test_compressed_members_refused(control, tmp_path):
    """A deflated entry (a ZIP bomb inflates 1000 to 1) is refused before
    it is inflated, also when its sizes are honest."""
    big = np.zeros(1 << 20, np.float32)
    header = valid_header()
    header["parameters"][0].update(shape=[1 << 20])
    path = write_hand_checkpoint(
        tmp_path / "bomb", header,
        arrays={"arrays/0.bin": big.tobytes(), "arrays/1.bin": B.tobytes(),
                "arrays/2.bin": (2 * W).tobytes()},
        options={"arrays/0.bin": {"deflate": True}})
    assert path.stat().st_size < 64 << 10
    with pytest.raises(ValueError, match=r"field archive entry 'arrays/0.bin': "
                       "is compressed"):
        api.CheckpointState.load_checkpoint(path)


def _peak_bytes(function):
    tracemalloc.start()
    try:
        function()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_declared_sizes_beyond_the_file_refused_without_allocating(control, tmp_path):
    """A 2 MB file whose ZIP directory declares a 256 MB entry (and a shape
    agreeing with it) is refused without reading (allocating) 256 MB."""
    n = 1 << 26  # float32: 256 MB declared
    header = valid_header()
    header["parameters"][0].update(shape=[n])
    path = write_hand_checkpoint(
        tmp_path / "liar", header,
        arrays={"arrays/0.bin": bytes(2 << 20), "arrays/1.bin": B.tobytes(),
                "arrays/2.bin": (2 * W).tobytes()},
        options={"arrays/0.bin": {"declared_size": 4 * n}})
    errors = []

    def load():
        with pytest.raises(ValueError) as info:
            api.CheckpointState.load_checkpoint(path)
        errors.append(str(info.value))
    assert _peak_bytes(load) < 16 << 20
    assert str(path) in errors[0] and "archive entry 'arrays/0.bin'" in errors[0]


def test_nominal_absurd_shape_refused_without_allocating(control, tmp_path):
    header = valid_header()
    header.update(nominal=True, optimizer=None)
    for record in header["parameters"]:
        record["data"] = None
    header["parameters"][0]["shape"] = [10 ** 6, 10 ** 6]  # 3.6 TiB of <f4
    path = write_hand_checkpoint(tmp_path / "nominal", header, arrays={})
    errors = []

    def load():
        with pytest.raises(ValueError) as info:
            api.CheckpointState.load_checkpoint(path)
        errors.append(str(info.value))
    assert _peak_bytes(load) < 16 << 20
    assert str(path) in errors[0]
    assert "field parameters[0].shape" in errors[0]


def test_repeated_archive_entries_refused(control, tmp_path):
    """Two entries of one name: zipfile would silently read the last."""
    header = json.dumps(valid_header()).encode()
    path = tmp_path / "twice"
    path.write_bytes(hand_zip(
        [("header.json", header, {}), ("arrays/0.bin", W.tobytes(), {}),
         ("arrays/0.bin", (W + 1).tobytes(), {}),
         ("arrays/1.bin", B.tobytes(), {}), ("arrays/2.bin", W.tobytes(), {})]))
    with pytest.raises(ValueError, match=r"field archive: entries "
                       r"\['arrays/0.bin'\] appear more than once"):
        api.CheckpointState.load_checkpoint(path)


def test_format_doc_lists_every_rule_the_reader_checks():
    """docs/checkpoint_format.md says what is validated."""
    doc_path = os.path.join(os.path.dirname(__file__), "..", "docs",
                            "checkpoint_format.md")
    with open(doc_path, encoding="utf-8") as f:
        doc = " ".join(f.read().split())
    for rule in ("stored uncompressed", "appears once", "JSON boolean",
                 "finite and non-negative", "non-negative integers",
                 "prod(shape) * itemsize", "at most 64 entries",
                 "ValueError naming the file and the field"):
        assert rule in doc, rule


# generate_artifacts -------------------------------------------------------
def _generate(directory, optimizer=artifacts.OptimType.AdamW, **kwargs):
    return artifacts.generate_artifacts(
        two_head_model(), requires_grad=TRAINABLE, frozen_params=FROZEN,
        loss=onnxblock.loss.MSELoss(), loss_input_names=["output1"],
        optimizer=optimizer, artifact_directory=directory, **kwargs)


def _contents(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_overwrite_false_refuses_existing_artifacts_before_any_work(tmp_path):
    _generate(tmp_path, nominal_checkpoint=True)
    before = _contents(tmp_path)
    with pytest.raises(FileExistsError, match="overwrite=False") as info:
        _generate(tmp_path, optimizer=None, overwrite=False)
    for name in before:
        assert name in str(info.value)
    assert _contents(tmp_path) == before
    # another prefix is another set of files
    paths = _generate(tmp_path, prefix="second_", overwrite=False)
    assert os.path.basename(paths["checkpoint"]) == "second_checkpoint"


def test_overwrite_removes_the_stale_optimizer_model(tmp_path):
    """Default overwrite=True (as onnxruntime-training): the second
    generation, without optimizer and nominal checkpoint, leaves no file of
    the first one behind."""
    first = _generate(tmp_path, nominal_checkpoint=True)
    assert set(first) == {"training_model", "eval_model", "optimizer_model",
                          "checkpoint", "nominal_checkpoint"}
    kept = tmp_path / "notes.txt"
    kept.write_text("mine")
    second = _generate(tmp_path, optimizer=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [os.path.basename(p) for p in second.values()] + ["notes.txt"])
    assert not (tmp_path / "optimizer_model.onnx").exists()


@pytest.mark.parametrize("prefix", ["../", "../escaped_", "sub/x_", "..",
                                    "a\\b_", "C:x_", None])
def test_prefix_that_leaves_the_directory_refused(tmp_path, prefix):
    inside = tmp_path / "artifacts"
    inside.mkdir()
    prefix = str(tmp_path / "abs_") if prefix is None else prefix
    with pytest.raises(ValueError, match=r"prefix .* contains"):
        _generate(inside, prefix=prefix)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["artifacts"]


def test_artifact_paths_that_are_not_files_refused_before_work(tmp_path,
                                                              monkeypatch):
    path = tmp_path / "a_file"
    path.write_text("x")

    def build(*args, **kwargs):
        raise AssertionError("built the artifacts before refusing")
    monkeypatch.setattr(artifacts, "build_optimizer_model", build)
    with pytest.raises(ValueError, match="is a file, not a directory"):
        _generate(path)
    (tmp_path / "x_checkpoint").mkdir()
    with pytest.raises(ValueError, match=r"x_checkpoint'\] are directories "
                       "where artifact files go"):
        _generate(tmp_path, prefix="x_")


def test_external_data_rewritten_not_appended(tmp_path, monkeypatch):
    """onnx appends to an existing external data file: a second generation
    of large models must not double it, and a small generation must not leave
    the large one's data file behind."""
    constant = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)  # 4 KiB
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "C"], ["xc"]),
         helper.make_node("Add", ["xc", "b"], ["Y"])], "wide",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(constant, "C"),
         numpy_helper.from_array(np.zeros(32, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    def generate():
        artifacts.generate_artifacts(model, requires_grad=["b"],
                                     loss=artifacts.LossType.MSELoss,
                                     artifact_directory=tmp_path)
    monkeypatch.setattr(artifacts, "_EXTERNAL_DATA_BYTES", 0)
    generate()
    data = tmp_path / "training_model.onnx.data"
    assert data.stat().st_size == constant.nbytes
    generate()
    assert data.stat().st_size == constant.nbytes
    loaded = onnx.load(str(tmp_path / "training_model.onnx"))
    np.testing.assert_array_equal(
        [numpy_helper.to_array(i) for i in loaded.graph.initializer
         if i.name == "C"][0], constant)
    monkeypatch.setattr(artifacts, "_EXTERNAL_DATA_BYTES", 1 << 40)
    generate()
    assert not list(tmp_path.glob("*.data"))


# ONNX files loaded by path ------------------------------------------------
def _load_with_every_loader(path, tmp_path):
    """Each public entry point that takes a path to an ONNX file."""
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    from onnxtrain.models import load_model
    paths = _generate(tmp_path / "ok")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    X = np.zeros((4, 2), np.float32)
    return {
        "models.load_model": lambda: load_model(path),
        "generate_artifacts": lambda: artifacts.generate_artifacts(
            path, requires_grad=["W"], artifact_directory=tmp_path / "art"),
        "onnxblock.base": lambda: onnxblock.base(path).__enter__(),
        "api.Module train": lambda: api.Module(path, state),
        "api.Module eval": lambda: api.Module(paths["training_model"], state,
                                              path),
        "api.Optimizer": lambda: api.Optimizer(path, module),
        "estimator fit": lambda: OrtGradientForwardBackwardOptimizer(
            str(path)).fit(X, np.zeros(4, np.float32)),
    }


@pytest.mark.parametrize("content,reason", [
    (b"a,b,target\n1,2,3\n", "protobuf could not parse it"),
    (b"", "no graph in it")], ids=["csv", "empty"])
def test_non_onnx_file_named_by_every_loader(tmp_path, content, reason):
    path = tmp_path / "not_a_model.onnx"
    path.write_bytes(content)
    for where, load in _load_with_every_loader(path, tmp_path).items():
        with pytest.raises(ValueError) as info:
            load()
        message = str(info.value)
        assert f"{path} is not an ONNX model ({reason}" in message, \
            (where, message)


def test_checkpoint_write_failing_midway_keeps_the_previous_file(tmp_path,
                                                                  monkeypatch):
    # streamed into a file beside the target, which replaces it only once
    # complete: a failure leaves the previous checkpoint and no partial file
    from onnxtrain.api import checkpoint
    path = tmp_path / "checkpoint"
    entries = [("a", np.arange(6, dtype=np.float32).reshape(2, 3), True),
               ("b", np.ones(4, dtype=np.float64), False)]
    # a generator of parameters is read once for the check, once to write
    checkpoint.write_checkpoint(path, (entry for entry in entries), {"epoch": 3})
    before = path.read_bytes()
    state = api.CheckpointState.load_checkpoint(str(path))
    assert list(state.parameters.keys()) == ["a", "b"]
    np.testing.assert_array_equal(state.parameters["a"].data, entries[0][1])
    original = checkpoint._Writer.array
    calls = []

    def failing(self, value, dtype=None):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return original(self, value, dtype)

    monkeypatch.setattr(checkpoint._Writer, "array", failing)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.write_checkpoint(path, [(n, v + 1, g) for n, v, g in entries])
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]
    with pytest.raises(TypeError, match="bool, int and float"):
        checkpoint.write_checkpoint(tmp_path / "other", [("s", np.array(["x"]), False)])
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and links")
def test_checkpoint_write_keeps_permissions_and_links(tmp_path):
    from onnxtrain.api import checkpoint
    entries = [("a", np.arange(3, dtype=np.float32), True)]
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "checkpoint"
    checkpoint.write_checkpoint(target, entries)
    os.chmod(target, 0o640)
    link = tmp_path / "link"
    link.symlink_to(target)
    checkpoint.write_checkpoint(link, [("a", np.ones(3, dtype=np.float32), True)])
    assert link.is_symlink()  # written through the link, into its target
    assert (target.stat().st_mode & 0o777) == 0o640
    state = api.CheckpointState.load_checkpoint(str(target))
    np.testing.assert_array_equal(state.parameters["a"].data, np.ones(3))
    assert sorted(os.listdir(tmp_path / "real")) == ["checkpoint"]
    with pytest.raises(FileNotFoundError, match="nodir"):
        checkpoint.write_checkpoint(tmp_path / "nodir" / "checkpoint", entries)
