"""Gradients of PyTorch exports equal torch autograd's on the same weights.

Small networks are exported with ``torch.onnx.export`` (TorchScript
exporter, training mode, symbolic batch size): a CNN (Conv,
BatchNormalization in training mode, Relu, MaxPool, Dropout, Flatten, Gemm),
a transformer block (Gather embedding, LayerNormalization, MatMul,
Softmax, Erf GELU) and 2-layer bidirectional LSTM and GRU through the
training graphs' preparation (their nodes lowered to Scans emitting their
gates). The
vector-Jacobian product of one step computed by
onnxtrain's split gradient models must match torch autograd's; Dropout's
mask is the one onnxruntime drew in the forward run, applied in torch too.
A few steps of plain SGD with onnxtrain's gradients lower a squared error.

Skipped when torch is not installed (``pip install onnxtrain[torch]``).
"""
import io
import warnings

import numpy as np
import onnx
import pytest

from gradcheck import run, session, split_gradients
from onnxtrain.autodiff import build_gradient_models

torch = pytest.importorskip("torch")


class SmallCNN(torch.nn.Module):
    """Conv -> BatchNorm (training) -> Relu -> MaxPool -> Dropout -> Linear."""

    def __init__(self, size=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.MaxPool2d(2)
        self.drop = torch.nn.Dropout(0.25)
        self.fc = torch.nn.Linear(4 * (size // 2) ** 2, 3)

    def forward(self, x, mask=None):
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        h = self.drop(h) if mask is None else h * mask / (1 - self.drop.p)
        return self.fc(torch.flatten(h, 1))


class TransformerBlock(torch.nn.Module):
    """Embedding, then pre-norm single-head attention and a GELU MLP."""

    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.dim = dim

    def forward(self, tokens, mask=None):
        h = self.embed(tokens)
        q, k, v = self.qkv(self.norm1(h)).split(self.dim, dim=-1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / self.dim ** 0.5
        h = h + torch.matmul(torch.softmax(scores, dim=-1), v)
        mlp = self.down(torch.nn.functional.gelu(self.up(self.norm2(h))))
        return h + mlp


def _export(module, example, input_name):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (example,), buffer, dynamo=False, opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False, input_names=[input_name],
            output_names=["y"], dynamic_axes={input_name: {0: "N"}, "y": {0: "N"}})
    return onnx.load_from_string(buffer.getvalue())


def _parameters(module):
    return {n: p.detach().numpy().copy() for n, p in module.named_parameters()}


def _onnx_vjp(model, weights, feeds, grad_y):
    gm = build_gradient_models(model, list(weights))
    forward, grads = split_gradients(gm, {**feeds, **weights}, {"y": grad_y})
    return gm, forward, grads


def _assert_matches_torch(net, y, grad_y, forward, grads):
    """onnxtrain's output equals torch's ``y`` and its weight gradients equal
    autograd's VJP of ``grad_y`` through ``net``."""
    np.testing.assert_allclose(forward["y"], y.detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    (y * torch.from_numpy(grad_y)).sum().backward()
    for name, param in net.named_parameters():
        np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-3,
                                   atol=1e-5, err_msg=name)


def _dropout_mask(model, gm, forward):
    """The mask the forward run drew (Dropout's second output)."""
    node = next(n for n in model.graph.node if n.op_type == "Dropout")
    return forward[node.output[1]]


@pytest.mark.parametrize("size", [8, 4, 2])
def test_cnn_gradients_match_torch_autograd(size):
    torch.manual_seed(0)
    net = SmallCNN(size).train()
    # 8 images: at size 2 the Dropout draws 8 x 4 values, all kept with a
    # probability of 1e-4 (3 images, 12 values: 3%, a flaky test)
    x = torch.randn(8, 2, size, size)
    model = _export(net, x, "x")
    weights = _parameters(net)
    grad_y = np.random.default_rng(0).uniform(-1, 1, (8, 3)).astype(np.float32)
    gm, forward, grads = _onnx_vjp(model, weights, {"x": x.numpy()}, grad_y)
    # BatchNorm's per-channel operands are expanded over feature maps of 2
    # to 16 pixels (GraphBuilder.per_channel), its statistics as they are
    graph = gm.backward_model.graph
    constants = {i.name: onnx.numpy_helper.to_array(i).tolist() for i in graph.initializer}
    expanded = [n for n in graph.node if n.op_type == "Expand"
                and constants.get(n.input[1]) == [4, size, size]]
    assert (len(expanded) > 0) == (size < 8)
    mask = _dropout_mask(model, gm, forward)
    assert 0 < mask.mean() < 1  # a real training-mode draw
    net.zero_grad()
    y = net(x, mask=torch.from_numpy(mask.astype(np.float32)))
    _assert_matches_torch(net, y, grad_y, forward, grads)


def test_transformer_block_gradients_match_torch_autograd():
    torch.manual_seed(0)
    net = TransformerBlock()
    tokens = torch.tensor([[1, 4, 7, 4, 2], [3, 0, 9, 10, 5]])
    model = _export(net, tokens, "tokens")
    ops = {n.op_type for n in model.graph.node}
    assert {"Gather", "LayerNormalization", "MatMul", "Softmax", "Erf"} <= ops
    weights = _parameters(net)
    grad_y = np.random.default_rng(1).uniform(-1, 1, (2, 5, 8)).astype(np.float32)
    _, forward, grads = _onnx_vjp(model, weights, {"tokens": tokens.numpy()},
                                  grad_y)
    y = net(tokens)
    _assert_matches_torch(net, y, grad_y, forward, grads)


def test_sgd_with_onnxtrain_gradients_lowers_the_loss():
    # plain numpy SGD on 0.5 * mean squared error of the transformer block
    torch.manual_seed(0)
    net = TransformerBlock()
    tokens = torch.tensor([[1, 4, 7, 4, 2], [3, 0, 9, 10, 5]]).numpy()
    model = _export(net, torch.from_numpy(tokens), "tokens")
    weights = _parameters(net)
    target = np.random.default_rng(2).normal(size=(2, 5, 8)).astype(np.float32)
    gm = build_gradient_models(model, list(weights))
    sessions = session(gm.forward_model), session(gm.backward_model)
    inference = session(gm.inference_model)

    def loss(w):
        y = run(inference, {"tokens": tokens, **w})["y"]
        return 0.5 * float(np.mean((y - target) ** 2))

    losses = [loss(weights)]
    for _ in range(30):
        y = run(inference, {"tokens": tokens, **weights})["y"]
        grad_y = ((y - target) / y.size).astype(np.float32)
        _, grads = split_gradients(gm, {"tokens": tokens, **weights},
                                   {"y": grad_y}, sessions)
        weights = {n: w - 0.5 * grads[n] for n, w in weights.items()}
        losses.append(loss(weights))
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(b <= a + 1e-6 for a, b in zip(losses, losses[1:])), losses


class TwoLayerRecurrent(torch.nn.Module):
    """A bidirectional 2-layer LSTM or GRU, batch first, its last step's
    output."""

    def __init__(self, layer):
        super().__init__()
        self.rnn = layer(3, 4, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0][:, -1]


@pytest.mark.parametrize("op, layer", [("LSTM", torch.nn.LSTM), ("GRU", torch.nn.GRU)])
def test_recurrent_prepared_for_training_matches_torch_autograd(op, layer):
    # the training graphs' preparation lowers the exported LSTM and GRU
    # nodes (torch's GRU: linear_before_reset) to Scans emitting their
    # gates (onnxtrain.graph.recurrent_lowering)
    from onnxtrain.assembly.pipeline import prepare
    torch.manual_seed(0)
    net = TwoLayerRecurrent(layer)
    x = torch.randn(2, 5, 3)
    model = _export(net, x, "x")
    weights = _parameters(net)
    prepared = prepare(model, list(weights))
    ops = [n.op_type for n in prepared.model.graph.node]
    assert op not in ops and ops.count("Scan") == 4
    grad_y = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    _, forward, grads = _onnx_vjp(prepared.model, weights, {"x": x.numpy()}, grad_y)
    _assert_matches_torch(net, net(x), grad_y, forward, grads)
