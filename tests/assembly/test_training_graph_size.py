"""The training graph of a small BERT-like encoder (transformers'
BertModel, exported by torch.onnx): its size and what it must not hold
(run-time broadcast reductions, Dropouts of probability 0), and its
gradients, which must equal torch autograd's.

Skipped without torch and transformers (``pip install onnxtrain[bench]``).
"""
import io
import warnings

import numpy as np
import onnx
import pytest

from gradcheck import run, session
from onnxtrain import artifacts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LAYERS = 2


class _Classifier(torch.nn.Module):
    """BertModel (2 heads of 8, no dropout, eager attention) whose [CLS]
    row goes through a linear head to 3 classes."""

    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=20, hidden_size=16, num_hidden_layers=LAYERS,
            num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=8, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, attn_implementation="eager")
        self.bert = transformers.BertModel(config, add_pooling_layer=False)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, tokens):
        return self.head(self.bert(input_ids=tokens).last_hidden_state[:, 0])


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    torch.manual_seed(0)
    net = _Classifier()
    # no token 0: torch's embedding gives its padding row no gradient, the
    # exported graph does not know it is one
    tokens = np.random.default_rng(0).integers(1, 20, (5, 8))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.from_numpy(tokens[:2]),), buffer, dynamo=False,
            opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False, input_names=["tokens"],
            output_names=["logits"],
            dynamic_axes={"tokens": {0: "N"}, "logits": {0: "N"}})
    model = onnx.load_from_string(buffer.getvalue())
    params = [n for n, _ in net.named_parameters()]
    folder = tmp_path_factory.mktemp("encoder")
    artifacts.generate_artifacts(
        model, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=folder)
    training = onnx.load(folder / "training_model.onnx")
    return net, params, tokens, training


def test_no_runtime_broadcast_reduction_nor_identity_dropout(encoder):
    _, params, _, training = encoder
    ops = [n.op_type for n in training.graph.node]
    assert "Dropout" not in ops
    # the heads' dim is static: no Compress (run-time reduction of a
    # broadcast) in the layers, only for the embeddings' sums
    assert ops.count("Compress") <= 5
    assert len(params) == 39
    # measured: 547 (the layer norms' saved statistics, no Transpose of an
    # exported linear layer's weight, constant Reshape targets); 619 before
    assert len(ops) <= 547


def test_gradients_equal_torch(encoder):
    net, params, tokens, training = encoder
    y = np.array([0, 2, 1, 1, 0])
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(torch.from_numpy(tokens)),
                                      torch.from_numpy(y)).backward()
    expected = dict(net.named_parameters())
    feeds = {"tokens": tokens, "labels": y, "lazy_reset_grad": np.array(True)}
    for name in params:
        value = expected[name].detach().numpy()
        feeds[name] = value
        feeds[f"{name}_grad.accumulation.buffer"] = np.zeros_like(value)
    outputs = run(session(training), feeds)
    for name in params:
        np.testing.assert_allclose(
            outputs[f"{name}_grad.accumulation.out"], expected[name].grad.numpy(),
            rtol=1e-4, atol=1e-6, err_msg=name)
