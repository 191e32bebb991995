"""PyTorch exports with training-mode layers train as PyTorch trains them.

A CNN (Conv, BatchNormalization in training mode, Relu, MaxPool, Dropout,
Flatten, Gemm) on scikit-learn's digits as 1x8x8 images and a small
transformer encoder (Embedding, ``nn.TransformerEncoderLayer``, masked mean
pooling; two graph inputs) are exported with the TorchScript exporter
(training mode, dynamic batch) and trained through the estimators (dict X
for two inputs) and through ``generate_artifacts`` + ``api``, from the
same initial weights on the same batches as a plain PyTorch SGD loop. The
math is deterministic (Dropout p=0 where curves are compared), so the loss
curves match PyTorch's; the running statistics are updated by PyTorch's
rule (momentum, unbiased variance) and predictions, ``get_trained_onnx``
and the eval model run in inference mode on them. Dropout p=0.5 draws a
new mask at every training call (estimator and api) and is off at
predict/eval, where the results equal ``model.eval()``'s.

Skipped when torch is not installed (``pip install onnxtrain[torch]``).
"""
import io
import pickle
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV

from onnxtrain import (CrossEntropyLearningLoss, GraphInputs, LearningRateSGD,
                       OrtGradientForwardBackwardOptimizer,
                       OrtGradientForwardBackwardClassifier, api, artifacts)

torch = pytest.importorskip("torch")

LR, BATCH = 0.1, 32


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """PyTorch's idle OpenMP threads spin on the cores onnxruntime's
    threads run on (a 2-core machine: seconds lost per test)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class CNN(torch.nn.Module):
    """Conv -> BatchNorm -> Relu -> MaxPool -> Dropout -> Linear, 10 classes."""

    def __init__(self, p=0.0, size=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(p)
        self.fc = torch.nn.Linear(4 * (size // 2) ** 2, 10)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(self.drop(h), 1))


class Encoder(torch.nn.Module):
    """Embedding -> one transformer encoder layer -> masked mean -> Linear."""

    def __init__(self, vocab=12, dim=8, n_classes=3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layer = torch.nn.TransformerEncoderLayer(
            dim, 2, 16, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(dim, n_classes)

    def forward(self, tokens, mask):
        h = self.layer(self.embed(tokens))
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def _export(net, examples, names):
    buffer = io.BytesIO()
    axes = {n: {0: "N"} for n in names + ["logits"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, tuple(examples), buffer, dynamo=False, opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
            input_names=names, output_names=["logits"], dynamic_axes=axes)
    return onnx.load_from_string(buffer.getvalue())


def _digits():
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32).reshape(-1, 1, 8, 8)
    return X[:480], y[:480], X[1500:], y[1500:]


def _sequences(n, seed):
    """Token sequences of lengths 3-6 (padded with 0); the class is which of
    tokens 1, 2, 3 appears most often."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 12, (n, 6))
    mask = (np.arange(6) < rng.integers(3, 7, (n, 1))).astype(np.float32)
    tokens = np.where(mask > 0, tokens, 0).astype(np.int64)
    counts = np.stack([(tokens == k).sum(1) for k in (1, 2, 3)], 1)
    return tokens, mask, counts.argmax(1)


def _torch_fit(net, inputs, y, epochs):
    """Plain SGD, batches in row order; loss per epoch weighted by rows."""
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    inputs = [torch.from_numpy(a) for a in inputs]
    target = torch.from_numpy(np.asarray(y, dtype=np.int64))
    curve = []
    for _ in range(epochs):
        net.train()
        total = 0.0
        for start in range(0, len(target), BATCH):
            batch = [a[start:start + BATCH] for a in inputs]
            loss = torch.nn.functional.cross_entropy(
                net(*batch), target[start:start + BATCH])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch[0])
        curve.append(total / len(target))
    return curve


def _torch_eval(net, inputs):
    net.eval()
    with torch.no_grad():
        return net(*[torch.from_numpy(a) for a in inputs]).numpy()


def _estimator(model, epochs, path):
    return OrtGradientForwardBackwardClassifier(
        model, learning_rate=LearningRateSGD(LR, learning_rate="constant"),
        learning_loss=CrossEntropyLearningLoss(from_logits=True),
        batch_size=BATCH, max_iter=epochs, training_path=path)


def _run(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
def test_cnn_with_batchnorm_trains_as_torch_through_the_estimator(path):
    X, y, X_test, y_test = _digits()
    torch.manual_seed(0)
    net = CNN()
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    est = _estimator(model, 3, path).fit(X, y)  # from the graph's own weights
    curve = _torch_fit(net, [X], y, 3)
    assert est.training_path_ == path
    np.testing.assert_allclose(est.train_losses_, curve, rtol=2e-4)
    assert "bn.running_mean" not in est.weights_to_train_
    buffers = est._trainer.get_buffers()
    np.testing.assert_allclose(buffers["bn.running_mean"],
                               net.bn.running_mean.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(buffers["bn.running_var"],
                               net.bn.running_var.numpy(), rtol=1e-4, atol=1e-6)
    expected = _torch_eval(net, [X_test])
    assert abs(est.score(X_test, y_test)
               - np.mean(expected.argmax(1) == y_test)) <= 0.01
    trained = est.get_trained_onnx()
    (bn,) = [n for n in trained.graph.node if n.op_type == "BatchNormalization"]
    assert len(bn.output) == 1 and all(
        a.i == 0 for a in bn.attribute if a.name == "training_mode")
    (logits,) = _run(trained, {"x": X_test})
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)


def test_batchnorm1d_mlp_at_opset_18_trains_as_torch():
    # rank-2 BatchNormalization (statistics over axis 0 only), ReduceMean
    # taking its axes as an input (opset 18)
    X, y, X_test, _ = _digits()
    X, X_test = X.reshape(len(X), -1), X_test.reshape(len(X_test), -1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                              torch.nn.ReLU(), torch.nn.Linear(16, 10))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(X[:2]),), buffer, dynamo=False,
                          opset_version=18, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"],
                          dynamic_axes={"x": {0: "N"}})
    est = _estimator(onnx.load_from_string(buffer.getvalue()), 2, "loop").fit(X, y)
    np.testing.assert_allclose(est.train_losses_, _torch_fit(net, [X], y, 2),
                               rtol=2e-4)
    np.testing.assert_allclose(est.predict_proba(X_test), torch.softmax(
        torch.from_numpy(_torch_eval(net, [X_test])), 1), rtol=1e-3, atol=1e-5)


def test_a_batch_of_one_row_through_batchnorm1d_is_refused():
    """PyTorch refuses a training batch of one row through BatchNorm1d (one
    value per channel: no unbiased variance; the running variance would
    become NaN). So does the estimator, before any step, for the last
    batch of a fit and a partial_fit of one row; a batch of one image of
    several pixels per channel (BatchNorm2d) is fine."""
    X, y, _, _ = _digits()
    rows = 41  # every class; batches of 4 leave one row, of 3 two
    assert len(np.unique(y[:rows])) == 10
    flat, y = X.reshape(len(X), -1)[:rows], y[:rows]
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                              torch.nn.ReLU(), torch.nn.Linear(16, 10))
    with pytest.raises(ValueError, match="Expected more than 1 value"):
        net.train()(torch.from_numpy(flat[:1]))
    model = _export(net, [torch.from_numpy(flat[:2])], ["x"])
    est = _estimator(model, 1, "split").set_params(batch_size=4)
    with pytest.raises(ValueError, match="batch of 1 row reaches BatchNormalization"):
        est.fit(flat, y)  # batches of 4 and a last one of 1 row
    assert not hasattr(est, "weights_to_train_")
    with pytest.raises(ValueError, match="batch of 1 row"):
        est.partial_fit(flat[:1], y[:1], classes=np.arange(10))
    est.set_params(batch_size=3).fit(flat, y)
    assert np.isfinite(est.predict_proba(flat)).all()
    cnn = _estimator(_export(CNN(), [torch.from_numpy(X[:2])], ["x"]), 1, "split")
    cnn.set_params(batch_size=4).fit(X[:rows], y)
    assert np.isfinite(cnn.predict_proba(X[:rows])).all()


def test_batchnorm_over_rows_times_steps_takes_a_batch_of_one_row():
    """BatchNorm1d over (N * T, C) after a reshape normalizes T values per
    channel for one row: PyTorch trains on it, the estimator too."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.bn, self.b = (torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                       torch.nn.Linear(8, 1))

        def forward(self, x):
            h = self.bn(self.a(x).reshape(-1, 8)).reshape(x.shape[0], x.shape[1], 8)
            return self.b(torch.relu(h).mean(1))

    torch.manual_seed(0)
    net = Net()
    X = np.random.RandomState(0).randn(5, 3, 4).astype(np.float32)
    y = X.sum((1, 2))[:, None].astype(np.float32)
    net.train()(torch.from_numpy(X[:1]))  # accepted by PyTorch
    est = OrtGradientForwardBackwardOptimizer(
        _export(net, [torch.from_numpy(X[:2])], ["x"]), batch_size=4, max_iter=1,
        learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        training_path="split").fit(X, y)  # batches of 4 and 1 row
    assert np.isfinite(est.predict(X)).all()


def test_running_statistics_are_never_weights_to_train():
    X, y, _, _ = _digits()
    torch.manual_seed(0)
    model = _export(CNN(), [torch.from_numpy(X[:2])], ["x"])
    est = _estimator(model, 1, "split").set_params(
        weights_to_train=["fc.weight", "bn.running_var"])
    with pytest.raises(ValueError, match=r"\['bn.running_var'\] are running statistics"):
        est.fit(X, y)
    assert not hasattr(est, "weights_to_train_")


def test_dropout_is_active_in_training_and_off_at_predict():
    X, y, X_test, _ = _digits()
    torch.manual_seed(0)
    net = CNN(p=0.5)
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    assert any(n.op_type == "Dropout" for n in model.graph.node)
    est = _estimator(model, 2, "loop").fit(X, y)
    trainer = est._trainer
    first, second = (trainer._forward(X[:64], True)[0].numpy() for _ in range(2))
    assert np.abs(first - second).max() > 1e-3  # masks drawn at every step
    prediction = trainer.predict(X_test)
    np.testing.assert_array_equal(prediction, trainer.predict(X_test))
    # predict is the inference graph: torch's eval on the trained weights
    weights = dict(zip(est.weights_to_train_, est.get_state()))
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    state.update({k: torch.from_numpy(v)
                  for k, v in trainer.get_buffers().items()})
    net.load_state_dict(state, strict=False)
    np.testing.assert_allclose(prediction, _torch_eval(net, [X_test]),
                               rtol=1e-3, atol=1e-4)
    trained = est.get_trained_onnx()
    assert all(len(n.input) < 3 for n in trained.graph.node if n.op_type == "Dropout")


def test_estimator_state_survives_pickling_with_running_statistics():
    X, y, X_test, _ = _digits()
    torch.manual_seed(0)
    model = _export(CNN(), [torch.from_numpy(X[:2])], ["x"])
    est = _estimator(model, 1, "loop").fit(X, y)
    copy = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(copy.predict_proba(X_test), est.predict_proba(X_test))
    est.partial_fit(X, y)
    copy.partial_fit(X, y)
    np.testing.assert_allclose(copy._trainer.get_buffers()["bn.running_var"],
                               est._trainer.get_buffers()["bn.running_var"],
                               rtol=1e-6)


def test_a_torch_graph_starts_every_fit_from_its_own_weights():
    X, y, _, _ = _digits()
    torch.manual_seed(0)
    model = _export(CNN(), [torch.from_numpy(X[:2])], ["x"])
    est = _estimator(model, 1, "loop")
    first = est.fit(X, y).train_losses_
    assert est.fit(X, y).train_losses_ == pytest.approx(first, rel=1e-6)
    assert est.set_params(warm_start=True).fit(X, y).train_losses_[0] < 0.9 * first[0]


def test_initializers_kept_as_inputs_train_the_same():
    X, y, _, _ = _digits()
    curves = []
    for keep in (False, True):
        torch.manual_seed(0)
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                CNN(), (torch.from_numpy(X[:2]),), buffer, dynamo=False,
                training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False, input_names=["x"],
                dynamic_axes={"x": {0: "N"}}, keep_initializers_as_inputs=keep)
        model = onnx.load_from_string(buffer.getvalue())
        assert ("bn.running_var" in {i.name for i in model.graph.input}) == keep
        curves.append(_estimator(model, 2, "loop").fit(X, y).train_losses_)
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-6)


def test_fixed_batch_dimension_is_refused_with_the_fix():
    X, y, _, _ = _digits()
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(CNN(), (torch.from_numpy(X[:1]),), buffer, dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"])
    est = _estimator(onnx.load_from_string(buffer.getvalue()), 1, "split")
    with pytest.raises(ValueError, match="fixed batch dimension of 1.*dynamic_axes"):
        est.fit(X, y)
    assert not hasattr(est, "weights_to_train_")


def _cnn_artifacts(tmp_path, model):
    names = [i.name for i in model.graph.initializer]
    # the running statistics are listed as trainable on purpose: they are
    # classified as buffers whatever the lists say
    paths = artifacts.generate_artifacts(
        model, requires_grad=names, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(LR)
    return state, module, optimizer


def _api_fit(module, optimizer, X, y, epochs):
    """The api's training loop over batches in row order; the loss per
    epoch weighted by rows (as :func:`_torch_fit`)."""
    curve = []
    for _ in range(epochs):
        module.train()
        total = 0.0
        for start in range(0, len(y), BATCH):
            loss = module(X[start:start + BATCH], y[start:start + BATCH])
            optimizer.step()
            module.lazy_reset_grad()
            total += loss.item() * len(y[start:start + BATCH])
        curve.append(total / len(y))
    return curve


def test_cnn_with_batchnorm_trains_as_torch_through_artifacts(tmp_path):
    X, y, X_test, y_test = _digits()
    torch.manual_seed(0)
    net = CNN()
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    state, module, optimizer = _cnn_artifacts(tmp_path, model)
    assert not state.parameters["bn.running_var"].requires_grad
    curve = _api_fit(module, optimizer, X, y, 3)
    np.testing.assert_allclose(curve, _torch_fit(net, [X], y, 3), rtol=2e-4)
    np.testing.assert_allclose(state.parameters["bn.running_var"].data,
                               net.bn.running_var.numpy(), rtol=1e-4, atol=1e-6)
    module.eval()
    eval_loss = module(X_test, y_test).item()
    expected = _torch_eval(net, [X_test])
    torch_loss = float(torch.nn.functional.cross_entropy(
        torch.from_numpy(expected), torch.from_numpy(y_test)))
    assert eval_loss == pytest.approx(torch_loss, rel=1e-3)
    exported = module.export_model_for_inferencing(tmp_path / "inference.onnx",
                                                    ["logits"])
    (logits,) = _run(exported, {"x": X_test})
    assert abs(np.mean(logits.argmax(1) == y_test)
               - np.mean(expected.argmax(1) == y_test)) <= 0.01


@pytest.mark.parametrize("size", [8, 4])
def test_one_step_gradients_statistics_and_eval_match_torch(tmp_path, size):
    # at 4x4 (16 pixels) the BatchNorm's per-channel operands are expanded
    # over the feature map, in the gradient and in the running statistics'
    # update (GraphBuilder.per_channel)
    X, y, X_test, _ = (np.ascontiguousarray(a[:, :, :size, :size]) if a.ndim == 4
                       else a for a in _digits())
    torch.manual_seed(1)
    net = CNN(size=size)
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    state, module, optimizer = _cnn_artifacts(tmp_path, model)
    module.train()
    loss = module(X[:BATCH], y[:BATCH])
    net.train()
    expected = torch.nn.functional.cross_entropy(
        net(torch.from_numpy(X[:BATCH])), torch.from_numpy(y[:BATCH]))
    expected.backward()
    assert loss.item() == pytest.approx(float(expected.detach()), rel=1e-5)
    for name, param in net.named_parameters():
        # conv.bias: zero up to rounding (BatchNorm removes any bias before it)
        np.testing.assert_allclose(state.parameters[name].grad, param.grad.numpy(),
                                   rtol=1e-3, atol=1e-5, err_msg=name)
    for name in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(state.parameters[name].data,
                                   net.state_dict()[name].numpy(), rtol=1e-5,
                                   atol=1e-7, err_msg=name)
    optimizer.step()
    torch.optim.SGD(net.parameters(), lr=LR).step()
    module.eval()
    eval_loss = module(X_test, np.zeros(len(X_test), dtype=np.int64)).item()
    logits = torch.from_numpy(_torch_eval(net, [X_test]))
    torch_loss = float(torch.nn.functional.cross_entropy(
        logits, torch.zeros(len(X_test), dtype=torch.int64)))
    assert eval_loss == pytest.approx(torch_loss, rel=1e-4)


def _encoder_setup():
    tokens, mask, y = _sequences(192, 0)
    torch.manual_seed(0)
    net = Encoder()
    model = _export(net, [torch.from_numpy(tokens[:2]), torch.from_numpy(mask[:2])],
                    ["tokens", "mask"])
    return net, model, tokens, mask, y


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
def test_transformer_encoder_trains_as_torch_through_the_estimator(path):
    net, model, tokens, mask, y = _encoder_setup()
    t_test, m_test, y_test = _sequences(120, 1)
    est = _estimator(model, 4, path).fit({"tokens": tokens, "mask": mask}, y)
    curve = _torch_fit(net, [tokens, mask], y, 4)
    np.testing.assert_allclose(est.train_losses_, curve, rtol=5e-4)
    expected = _torch_eval(net, [t_test, m_test])
    proba = est.predict_proba({"mask": m_test, "tokens": t_test})
    np.testing.assert_allclose(proba, torch.softmax(torch.from_numpy(expected), 1),
                               rtol=1e-3, atol=1e-5)
    assert abs(est.score({"tokens": t_test, "mask": m_test}, y_test)
               - np.mean(expected.argmax(1) == y_test)) <= 0.01


def test_several_inputs_in_grid_search_and_errors():
    _, model, tokens, mask, y = _encoder_setup()
    X = GraphInputs({"tokens": tokens, "mask": mask})
    search = GridSearchCV(_estimator(model, 1, "loop"),
                          {"batch_size": [16, 64]}, cv=2).fit(X, y)
    best = _estimator(model, 1, "loop").set_params(**search.best_params_).fit(X, y)
    np.testing.assert_allclose(search.best_estimator_.predict_proba(X),
                               best.predict_proba(X), rtol=1e-5)
    with pytest.raises(ValueError, match=r"missing \['mask'\]"):
        best.predict({"tokens": tokens})
    with pytest.raises(ValueError, match="takes 2 inputs"):
        best.predict(tokens)
    with pytest.raises(ValueError, match="same number of rows"):
        GraphInputs({"tokens": tokens, "mask": mask[:5]})


def test_image_rank_is_checked():
    X, y, _, _ = _digits()
    torch.manual_seed(0)
    est = _estimator(_export(CNN(), [torch.from_numpy(X[:2])], ["x"]), 1, "split")
    with pytest.raises(ValueError, match=r"4 dims \(N, 1, 8, 8\)"):
        est.fit(X.reshape(len(X), -1), y)
    with pytest.raises(ValueError, match="axis 2: 8, got 7"):
        est.fit(X[:, :, :7], y)


def test_transformer_encoder_trains_as_torch_through_artifacts(tmp_path):
    net, model, tokens, mask, y = _encoder_setup()
    params = [n for n, _ in net.named_parameters()]
    assert set(params) <= {i.name for i in model.graph.initializer}
    paths = artifacts.generate_artifacts(
        model, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(LR)
    curve = []
    for _ in range(3):
        total = 0.0
        for start in range(0, len(y), BATCH):
            rows = slice(start, start + BATCH)
            loss = module(tokens[rows], mask[rows], y[rows])
            optimizer.step()
            module.lazy_reset_grad()
            total += loss.item() * len(y[rows])
        curve.append(total / len(y))
    np.testing.assert_allclose(curve, _torch_fit(net, [tokens, mask], y, 3),
                               rtol=5e-4)
    # the trained result: eval loss and inference accuracy on unseen data
    t_test, m_test, y_test = _sequences(120, 1)
    expected = _torch_eval(net, [t_test, m_test])
    torch_loss = float(torch.nn.functional.cross_entropy(
        torch.from_numpy(expected), torch.from_numpy(y_test)))
    module.eval()
    assert module(t_test, m_test, y_test).item() == pytest.approx(torch_loss,
                                                                  rel=1e-4)
    exported = module.export_model_for_inferencing(tmp_path / "inference.onnx",
                                                    ["logits"])
    (logits,) = _run(exported, {"tokens": t_test, "mask": m_test})
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)
    assert abs(np.mean(logits.argmax(1) == y_test)
               - np.mean(expected.argmax(1) == y_test)) <= 0.01


@pytest.mark.parametrize("path", ["fused", "loop"])
def test_dict_inputs_partial_fit_and_pickling_continue_training(path):
    net, model, tokens, mask, y = _encoder_setup()
    X = {"tokens": tokens, "mask": mask}
    first = {k: v[:96] for k, v in X.items()}  # 3 whole batches of 32
    second = {"mask": mask[96:], "tokens": tokens[96:]}  # keys in another order
    est = _estimator(model, 1, path).partial_fit(first, y[:96])
    assert est.training_path_ == path
    copy = pickle.loads(pickle.dumps(est))
    est.partial_fit(second, y[96:])
    # two chunks of whole batches are one epoch, as torch's
    one_epoch = _estimator(model, 1, path).fit(X, y)
    (torch_loss,) = _torch_fit(net, [tokens, mask], y, 1)
    assert one_epoch.train_losses_[0] == pytest.approx(torch_loss, rel=5e-4)
    for a, b in zip(est.get_state(), one_epoch.get_state()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    t_test, m_test, _ = _sequences(120, 1)
    test = {"tokens": t_test, "mask": m_test}
    np.testing.assert_allclose(
        est.predict_proba(test),
        torch.softmax(torch.from_numpy(_torch_eval(net, [t_test, m_test])), 1),
        rtol=1e-3, atol=1e-5)
    # the unpickled copy continues exactly as the original did
    copy.partial_fit(second, y[96:])
    for a, b in zip(copy.get_state(), est.get_state()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(copy.predict_proba(test), est.predict_proba(test))
    est.partial_fit(X, y)
    copy.partial_fit(X, y)
    assert copy.train_losses_ == est.train_losses_
    np.testing.assert_array_equal(copy.predict_proba(test), est.predict_proba(test))


def test_dropout_is_active_in_api_training_and_off_at_eval(tmp_path):
    X, y, X_test, y_test = _digits()
    torch.manual_seed(0)
    net = CNN(p=0.5)
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    assert any(n.op_type == "Dropout" for n in model.graph.node)
    state, module, optimizer = _cnn_artifacts(tmp_path, model)
    module.train()
    for start in range(0, 128, BATCH):
        module(X[start:start + BATCH], y[start:start + BATCH])
        optimizer.step()
        module.lazy_reset_grad()
    # same weights, same batch: a new mask at every training call
    losses = [module(X[:BATCH], y[:BATCH]).item() for _ in range(3)]
    module.lazy_reset_grad()
    assert len(set(losses)) == 3 and max(losses) - min(losses) > 1e-3
    module.eval()
    eval_losses = [module(X_test, y_test).item() for _ in range(2)]
    assert eval_losses[0] == eval_losses[1]
    # torch's eval (no dropout, running statistics) on the api's weights
    net.load_state_dict({name: torch.from_numpy(np.array(state.parameters[name].data))
                         for name in net.state_dict()
                         if name != "bn.num_batches_tracked"}, strict=False)
    assert not np.allclose(net.bn.running_var.numpy(), 1)  # stats were updated
    expected = _torch_eval(net, [X_test])
    torch_loss = float(torch.nn.functional.cross_entropy(
        torch.from_numpy(expected), torch.from_numpy(y_test)))
    assert eval_losses[0] == pytest.approx(torch_loss, rel=1e-4)
    exported = module.export_model_for_inferencing(tmp_path / "inference.onnx",
                                                    ["logits"])
    (logits,) = _run(exported, {"x": X_test})
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(_run(exported, {"x": X_test})[0], logits)


class DepthwiseNet(torch.nn.Module):
    """MobileNet's layers on 1x8x8 digits: a 3x3/2 stem, an inverted
    residual block whose depthwise 3x3 runs over 4x4 images (onnxruntime's
    grouped kernels), a stride-2 one from 4x4 down to 2x2 (the same) and
    one over 2x2 with a residual (lowered: graph/conv_gemm.py), ReLU6
    (Clip), BatchNorms in
    training mode, an average pool and a linear head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn

        def block(cin, cout, stride, hidden):
            return nn.Sequential(
                nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
                nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                nn.BatchNorm2d(hidden), nn.ReLU6(),
                nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(8), nn.ReLU6())
        self.b1, self.b2, self.b3 = block(8, 8, 1, 16), block(8, 12, 2, 24), block(12, 12, 1, 24)
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.b1(h)
        h = self.b2(h)
        h = h + self.b3(h)
        return self.fc(torch.mean(h, dim=(2, 3)))


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
def test_depthwise_separable_cnn_trains_as_torch(path):
    X, y, X_test, y_test = _digits()
    torch.manual_seed(0)
    net = DepthwiseNet()
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    est = _estimator(model, 3, path).fit(X, y)
    curve = _torch_fit(net, [X], y, 3)
    assert est.training_path_ == path
    np.testing.assert_allclose(est.train_losses_, curve, rtol=2e-4)
    if path != "split":  # the depthwise Convs over 2x2 images are lowered
        step = est._trainer.fused_graph("flat step", False).model
        convs = {i for n in step.graph.node if n.op_type in ("Conv", "ConvTranspose")
                 for i in n.input}
        # over 4x4 images: onnxruntime's kernels; over 2x2: lowered
        assert {"b1.3.weight", "b2.3.weight"} <= convs
        assert "b3.3.weight" not in convs
    (logits,) = _run(est.get_trained_onnx(), {"x": X_test})
    np.testing.assert_allclose(logits, _torch_eval(net, [X_test]), rtol=1e-3, atol=1e-4)


def test_depthwise_separable_cnn_trains_as_torch_through_artifacts(tmp_path):
    X, y, _, _ = _digits()
    torch.manual_seed(0)
    net = DepthwiseNet()
    model = _export(net, [torch.from_numpy(X[:2])], ["x"])
    state, module, optimizer = _cnn_artifacts(tmp_path, model)
    training = onnx.load(tmp_path / "training_model.onnx")
    convs = {i for n in training.graph.node if n.op_type in ("Conv", "ConvTranspose")
             for i in n.input}
    assert "b2.3.weight" in convs and "b3.3.weight" not in convs  # lowered
    curve = _api_fit(module, optimizer, X, y, 2)
    np.testing.assert_allclose(curve, _torch_fit(net, [X], y, 2), rtol=2e-4)
    np.testing.assert_allclose(state.parameters["b3.4.running_var"].data,
                               net.b3[4].running_var.numpy(), rtol=1e-4, atol=1e-6)
