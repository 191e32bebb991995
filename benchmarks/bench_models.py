"""Training speed on real models: a resnet18 CNN (32x32 and 112x112
images), a MobileNetV2 CNN and a BERT-like encoder, onnxtrain against PyTorch eager (and
onnxruntime-training when it is installed in a separate virtual
environment), plus the time to build the training artifacts of a 24-layer
encoder.

Run: ``python benchmarks/bench_models.py [--models resnet18 resnet18-112
mobilenetv2 encoder] [--repeat 3] [--build]`` (PyTorch and transformers come with
``pip install -e ".[bench]"``). ``--ortt PYTHON`` names the interpreter of a
virtual environment holding ``onnxruntime-training`` (never a dependency of
onnxtrain; its ``onnxruntime`` would replace the stock one). Default:
``$ONNXTRAIN_ORTT_PYTHON`` when set.

Models (float32, random init with ``torch.manual_seed(0)``, synthetic data
drawn by numpy, the same batches for every system):

- resnet18: torchvision's resnet18 layer shapes (7x7/2 stem, max pool,
  BasicBlocks [2, 2, 2, 2], 64-512 channels, BatchNorm in training mode),
  10 classes, 3x32x32 images given as rows of 3072 floats (the model
  reshapes them), batch 32, softmax cross-entropy, SGD lr 0.01 momentum
  0.9 (onnxruntime-training's SGD has no momentum: the api rows and its
  rows use plain SGD, compared with PyTorch's plain SGD);
- resnet18-112: the same network on
  3x112x112 images, batch 8, 15 timed steps: the outputs of the stem
  and of layers 1-3 are wider than the 4x4 up to which onnxtrain lowers a
  Conv to one matrix product (``graph/conv_gemm.py``), so onnxruntime's
  Conv kernels and their gradients run there (at 32x32 they run in the
  stem and layer1 only);
- mobilenetv2: MobileNetV2's layer table (Sandler et al., "MobileNetV2:
  Inverted Residuals and Linear Bottlenecks", 2018, table 2: a 3x3/2 stem
  of 32 channels, 17 inverted residual blocks of expansion 6 with 3x3
  depthwise convolutions (``groups`` = channels), ReLU6, BatchNorm in
  training mode, a 1x1 convolution to 1280 channels, average pool, a
  linear head), width 1.0, 10 classes, 3x32x32 images as rows, batch 32,
  softmax cross-entropy, SGD lr 0.01 momentum 0.9 (the api rows plain SGD,
  as resnet18's): depthwise convolutions and many small layers (158
  parameters, 52 BatchNorms);
- resnet18-64b2, resnet18-64b8: the same network on 3x64x64 images at
  batch 2 and 8, 30 timed steps: small batches, where a step's many small
  kernels weigh more than its products (not in the default run; name them
  in ``--models``);
- encoder: transformers' ``BertModel`` from a ``BertConfig`` (hidden 128,
  2 layers, 2 heads, intermediate 512, vocabulary 1000, no dropout, eager
  attention), the [CLS] row through a linear head to 2 classes; token ids
  given as floats (the model casts them), sequence 64, batch 16, AdamW lr
  1e-3 weight decay 0.01.

Systems, each in its own process, one after the other, alternating over the
repeats: ``torch`` (eager, all cores, or ``--threads``), ``estimator``
(``OrtGradientForwardBackwardClassifier`` on the TorchScript export
loaded by ``onnx.load``, which the caller holds, training_path 'auto'),
``estimator-file`` (the same, given the file's path: the estimator holds
no loaded copy of the model between its builds), ``estimator-fused`` and
``estimator-loop`` (the loaded model, training_path 'fused' or 'loop':
'auto' takes the loop up to 8 MiB of weights and optimizer state, the
fused step above, so that one of the two is the ``estimator`` row), ``api``
(``artifacts.generate_artifacts`` then
``api.Module``/``api.Optimizer``, one call per step), ``ortt``
(onnxruntime-training's artifacts and api on the same export). Printed:
steps per second of the timed steps (after warm-up steps that build the
sessions; timed in chunks of 5 steps, the median chunk counts, so that a
burst of load on a shared machine moves one chunk, not the run; the
column ``spread`` is max/min - 1 of the medians over the repeats), the ratio to PyTorch eager of the same optimizer measured in the
same run (``x torch``: of the medians over the repeats; ``paired``: the
median over the repeats of the ratio within each repeat, the two runs a
few minutes apart, which a slow drift of a shared machine's speed moves
together), the mean loss of the warm-up steps (equal across systems: the
same math; later steps drift apart by rounding, these trainings being
chaotic), the peak resident memory the run adds to the process (``peak
MB``; for the api systems, that of the training, the artifacts being
built by a process of their own, whose peak is ``build MB``: artifacts
are built once, offline; the estimator builds its graphs inside ``fit``,
counted in its peak).

``--threads N``: every system on N threads (PyTorch's intra-op threads,
the estimator's and the api's ``n_threads``) instead of every core: one
thread compares the work each system does, which a machine shared with
other processes measures more steadily than its parallel speed.

``--build``: ``generate_artifacts`` on the 24-layer encoder (onnxtrain and,
with ``--ortt``, onnxruntime-training, alternating over ``--build-repeat``
repeats, 9 by default; ``paired``: the median over the repeats of the
build's seconds over onnxruntime-training's in the same repeat; the
median shown): seconds, nodes of the training graph, peak memory added.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

MODELS = {
    "resnet18": dict(batch=32, warmup=3, steps=25, classes=10, size=32,
                     features=3 * 32 * 32, optimizer="sgd", lr=0.01, momentum=0.9),
    # the same network on images of 112x112 pixels: only layer4's outputs
    # (4x4) are lowered to one matrix product, the others run onnxruntime's
    # Conv kernels
    "resnet18-112": dict(batch=8, warmup=3, steps=15, classes=10, size=112,
                         features=3 * 112 * 112, optimizer="sgd", lr=0.01,
                         momentum=0.9),
    # small batches of larger images: the per-kernel costs of a step
    "resnet18-64b2": dict(batch=2, warmup=3, steps=30, classes=10, size=64,
                          features=3 * 64 * 64, optimizer="sgd", lr=0.01,
                          momentum=0.9),
    "resnet18-64b8": dict(batch=8, warmup=3, steps=30, classes=10, size=64,
                          features=3 * 64 * 64, optimizer="sgd", lr=0.01,
                          momentum=0.9),
    "mobilenetv2": dict(batch=32, warmup=3, steps=25, classes=10, size=32,
                        features=3 * 32 * 32, optimizer="sgd", lr=0.01, momentum=0.9),
    "encoder": dict(batch=16, warmup=3, steps=40, classes=2, features=64,
                    optimizer="adamw", lr=1e-3, weight_decay=0.01, layers=2,
                    vocab=1000),
    "encoder24": dict(batch=16, warmup=0, steps=0, classes=2, features=64,
                      optimizer="adamw", lr=1e-3, weight_decay=0.01, layers=24,
                      vocab=1000),
}
SYSTEMS = ["torch", "estimator", "estimator-file", "estimator-fused", "estimator-loop",
           "torch-plain", "api", "ortt"]
#: the models a run trains unless ``--models`` says otherwise
DEFAULT_MODELS = ("resnet18", "resnet18-112", "mobilenetv2", "encoder")
HERE = os.path.dirname(os.path.abspath(__file__))
# the onnxtrain of this checkout, not an installed one
sys.path.insert(0, os.path.dirname(HERE))


#: Threads of every system (``--threads``, passed to the child processes
#: by this environment variable); None: every core.
THREADS = int(os.environ.get("ONNXTRAIN_BENCH_THREADS", "0")) or None


# ------------------------------------------------------------------ data
def batches(name):
    """``(X, y)``: all the rows of the warm-up and timed steps (numpy)."""
    cfg = MODELS[name]
    n = cfg["batch"] * (cfg["warmup"] + cfg["steps"])
    rng = np.random.RandomState(0)
    if "size" in cfg:  # images, as rows
        X = rng.randn(n, cfg["features"]).astype(np.float32)
    else:
        X = rng.randint(0, cfg["vocab"], size=(n, cfg["features"])).astype(np.float32)
    y = rng.randint(0, cfg["classes"], size=n).astype(np.int64)
    return X, y


# ------------------------------------------------------------ torch models
def torch_model(name):
    """The PyTorch module of ``name``, weights drawn with manual_seed(0)."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    if name.startswith("resnet18"):
        size = MODELS[name]["size"]

        class BasicBlock(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(cout)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout)
                self.downsample = None
                if stride != 1 or cin != cout:
                    self.downsample = nn.Sequential(
                        nn.Conv2d(cin, cout, 1, stride, bias=False),
                        nn.BatchNorm2d(cout))

            def forward(self, x):
                h = torch.relu(self.bn1(self.conv1(x)))
                h = self.bn2(self.conv2(h))
                skip = x if self.downsample is None else self.downsample(x)
                return torch.relu(h + skip)

        class ResNet18(nn.Module):
            def __init__(self, classes):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
                self.bn1 = nn.BatchNorm2d(64)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
                layers, cin = [], 64
                for i, cout in enumerate([64, 128, 256, 512]):
                    stride = 1 if i == 0 else 2
                    layers.append(nn.Sequential(BasicBlock(cin, cout, stride),
                                                BasicBlock(cout, cout, 1)))
                    cin = cout
                self.layer1, self.layer2, self.layer3, self.layer4 = layers
                self.fc = nn.Linear(512, classes)

            def forward(self, x):
                x = x.reshape(-1, 3, size, size)
                x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
                x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
                return self.fc(torch.flatten(torch.mean(x, dim=(2, 3)), 1))

        return ResNet18(MODELS[name]["classes"])
    if name.startswith("mobilenetv2"):
        return _mobilenet_v2(MODELS[name])

    from transformers import BertConfig, BertModel
    cfg = MODELS[name]

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            config = BertConfig(
                vocab_size=cfg["vocab"], hidden_size=128,
                num_hidden_layers=cfg["layers"], num_attention_heads=2,
                intermediate_size=512, max_position_embeddings=cfg["features"],
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                attn_implementation="eager")
            self.bert = BertModel(config, add_pooling_layer=False)
            self.head = nn.Linear(128, cfg["classes"])

        def forward(self, x):
            hidden = self.bert(input_ids=x.long()).last_hidden_state
            return self.head(hidden[:, 0])

    return Encoder()


def _mobilenet_v2(cfg):
    """MobileNetV2 (see the module docstring) on images given as rows."""
    import torch
    from torch import nn
    size = cfg["size"]

    def conv_bn(cin, cout, kernel, stride=1, groups=1, relu=True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                            bias=False), nn.BatchNorm2d(cout)]
        return layers + [nn.ReLU6()] if relu else layers

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expansion):
            super().__init__()
            hidden = cin * expansion
            layers = conv_bn(cin, hidden, 1) if expansion != 1 else []
            layers += conv_bn(hidden, hidden, 3, stride, groups=hidden)
            layers += conv_bn(hidden, cout, 1, relu=False)  # linear bottleneck
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    class MobileNetV2(nn.Module):
        # (expansion, channels, blocks, first stride): the paper's table 2
        TABLE = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                 (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

        def __init__(self, classes):
            super().__init__()
            layers, cin = conv_bn(3, 32, 3, 2), 32
            for expansion, cout, blocks, stride in self.TABLE:
                for i in range(blocks):
                    layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1,
                                                   expansion))
                    cin = cout
            layers += conv_bn(cin, 1280, 1)
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x):
            x = self.features(x.reshape(-1, 3, size, size))
            return self.classifier(torch.flatten(torch.mean(x, dim=(2, 3)), 1))

    return MobileNetV2(cfg["classes"])


def export(name, path):
    """Export the module of ``name`` to ``path`` (TorchScript exporter,
    training mode, symbolic batch); return the names of its parameters in
    the graph, in the module's order."""
    import torch
    model = torch_model(name)
    model.train()
    X, _ = batches(name) if MODELS[name]["steps"] else (
        np.zeros((2, MODELS[name]["features"]), np.float32), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.from_numpy(X[:2]),), path, dynamo=False, opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
            input_names=["X"], output_names=["logits"],
            dynamic_axes={"X": {0: "N"}, "logits": {0: "N"}})
    import onnx
    onx = onnx.load(path)
    inits = {i.name for i in onx.graph.initializer}
    names = [n for n, _ in model.named_parameters() if n in inits]
    missing = [n for n, _ in model.named_parameters() if n not in inits]
    if missing:
        raise RuntimeError(f"export renamed parameters: {missing[:5]}")
    return names


# --------------------------------------------------------------- systems
def run_torch(name, plain):
    import torch
    torch.set_num_threads(THREADS or os.cpu_count())
    cfg = MODELS[name]
    model = torch_model(name)
    model.train()
    if cfg["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"],
                              momentum=0.0 if plain else cfg["momentum"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"],
                                weight_decay=cfg["weight_decay"])
    X, y = batches(name)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    b, losses, clock = cfg["batch"], [], _Chunks(cfg)
    for step in range(cfg["warmup"] + cfg["steps"]):
        clock.tick(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(Xt[step * b:(step + 1) * b]), yt[step * b:(step + 1) * b])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return clock.done(), losses


def run_estimator(name, path, params, from_file=False, training_path="auto"):
    """Steps of the estimator on the model loaded here (its ``model_onnx``
    the loaded ModelProto, which the caller holds) or, ``from_file``, on
    the file's path (the estimator loads it at each build and holds no
    loaded copy of it between its builds), on ``training_path``."""
    import onnx
    from onnxtrain import (LearningRateAdamW, LearningRateSGDNesterov,
                           OrtGradientForwardBackwardClassifier)
    from onnxtrain.losses import CrossEntropyLearningLoss
    cfg = MODELS[name]
    if cfg["optimizer"] == "sgd":
        rate = LearningRateSGDNesterov(cfg["lr"], learning_rate="constant",
                                       momentum=cfg["momentum"], nesterov=False)
    else:
        rate = LearningRateAdamW(cfg["lr"], weight_decay=cfg["weight_decay"])
    X, y = batches(name)
    b, w = cfg["batch"], cfg["warmup"]
    onx = path if from_file else onnx.load(path)

    # warm_start: training starts from the graph's initializers; the
    # warm-up partial_fit builds the graphs and sessions, the timed one
    # continues from its weights and optimizer state as the other systems do
    est = OrtGradientForwardBackwardClassifier(
        onx, weights_to_train=params, learning_rate=rate, max_iter=1,
        batch_size=b, learning_loss=CrossEntropyLearningLoss(from_logits=True),
        random_state=0, warm_start=True, n_threads=THREADS,
        training_path=training_path)
    est.partial_fit(X[:w * b], y[:w * b], classes=np.arange(cfg["classes"]))
    warm_loss = float(est.train_losses_[-1])
    times, chunk = [], CHUNK * b
    for first in range(w * b, len(X), chunk):
        start = time.perf_counter()
        est.partial_fit(X[first:first + chunk], y[first:first + chunk])
        times.append(time.perf_counter() - start)
    return times, [warm_loss, float(est.train_losses_[-1])]


#: steps timed together; a run's speed is the median over its chunks
CHUNK = 5


class _Chunks:
    """Times of the chunks of CHUNK steps after the warm-up."""

    def __init__(self, cfg):
        self.warmup, self.times, self.start = cfg["warmup"], [], None

    def tick(self, step):
        """Call before each step."""
        if step >= self.warmup and (step - self.warmup) % CHUNK == 0:
            now = time.perf_counter()
            if self.start is not None:
                self.times.append(now - self.start)
            self.start = now

    def done(self):
        self.times.append(time.perf_counter() - self.start)
        return self.times


def _artifacts(name, path, params, folder, ort):
    """generate_artifacts of onnxtrain (``ort`` False) or
    onnxruntime-training (True) into ``folder``."""
    import onnx
    if ort:
        from onnxruntime.training import artifacts
    else:
        from onnxtrain import artifacts
    cfg = MODELS[name]
    if cfg["optimizer"] == "sgd":
        optim = artifacts.OptimType.SGD
    else:  # PyTorch's AdamW defaults (the block's own eps is 1e-6)
        if ort:
            from onnxruntime.training import onnxblock
        else:
            from onnxtrain import onnxblock
        optim = onnxblock.optim.AdamW(eps=1e-8, weight_decay=cfg["weight_decay"])
    model = onnx.load(path)
    if ort:
        # onnxruntime-training's LayerNormalization gradient reads the
        # node's optional mean and inverse-deviation outputs: name them
        for node in model.graph.node:
            if node.op_type == "LayerNormalization" and len(node.output) == 1:
                node.output.extend([node.output[0] + "_mean", node.output[0] + "_inv_std"])
    artifacts.generate_artifacts(
        model, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim, artifact_directory=folder)
    if ort:
        # onnxruntime-training 1.19 reads IR versions <= 10; its optimizer
        # model is written with the IR version of the installed onnx
        opt_path = os.path.join(folder, "optimizer_model.onnx")
        opt = onnx.load(opt_path)
        opt.ir_version = min(opt.ir_version, 10)
        onnx.save(opt, opt_path)


def run_api(name, path, params, ort, memory=None):
    """Steps of the api on ``generate_artifacts``'s files, built by a
    process of their own (artifacts are built once, offline, in
    onnxruntime-training's workflow; in this process, the memory the build
    freed but its allocator kept would hold part of the training's
    allocations and hide them from the training's peak). ``memory`` (a
    dict, optional) receives ``build_mb``, the peak resident memory the
    build added to its process, and ``before_kb``, this process's resident
    memory before the training, where the peak is reset."""
    if ort:
        from onnxruntime.training import api
    else:
        from onnxtrain import api
    cfg = MODELS[name]
    folder = tempfile.mkdtemp(prefix="bench_models_")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--artifacts", name, path,
         json.dumps(params), folder, "ortt" if ort else "onnxtrain"],
        capture_output=True, text=True, check=True)
    if memory is not None:
        memory["build_mb"] = json.loads(out.stdout.strip().splitlines()[-1])["build_mb"]
        memory["before_kb"] = _rss_kb(reset_peak=True)
    state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    # no eval model: onnxruntime-training's eval model of a training-mode
    # BatchNormalization keeps its statistics outputs and does not load
    module = (api.Module(os.path.join(folder, "training_model.onnx"), state)
              if THREADS is None or ort else
              api.Module(os.path.join(folder, "training_model.onnx"), state,
                         n_threads=THREADS))
    optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(cfg["lr"])
    module.train()
    X, y = batches(name)
    b, losses, clock = cfg["batch"], [], _Chunks(cfg)
    for step in range(cfg["warmup"] + cfg["steps"]):
        clock.tick(step)
        loss = module(X[step * b:(step + 1) * b], y[step * b:(step + 1) * b])
        optimizer.step()
        module.lazy_reset_grad()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    return clock.done(), losses


def run_build(path, params, ort):
    """Seconds of generate_artifacts and nodes of its training graph."""
    import onnx
    folder = tempfile.mkdtemp(prefix="bench_build_")
    start = time.perf_counter()
    _artifacts("encoder24", path, params, folder, ort)
    seconds = time.perf_counter() - start
    train = onnx.load(os.path.join(folder, "training_model.onnx"),
                      load_external_data=False)
    return seconds, len(train.graph.node)


def one(name, system, path, params):
    """Run one (model, system) in this process; print a JSON line."""
    # imports are neither the run's time nor its memory: the artifact
    # builders too (their modules are compiled at first import when no
    # bytecode cache is written, 30-40 ms)
    if system.startswith("torch"):
        import torch  # noqa: F401
    elif system in ("ortt", "build-ortt"):
        import onnxruntime.training.artifacts  # noqa: F401
        import onnxruntime.training.onnxblock  # noqa: F401
    else:
        import onnxtrain.artifacts  # noqa: F401
        import onnxtrain.onnxblock  # noqa: F401
    before = _rss_kb(reset_peak=True)
    memory = {}
    if system == "build":
        seconds, nodes = run_build(path, params, ort=False)
        losses = [nodes]
    elif system == "build-ortt":
        seconds, nodes = run_build(path, params, ort=True)
        losses = [nodes]
    elif system.startswith("torch"):
        seconds, losses = run_torch(name, plain=system == "torch-plain")
    elif system.startswith("estimator"):
        path_kind = system.split("-")[1] if system in (
            "estimator-fused", "estimator-loop") else "auto"
        seconds, losses = run_estimator(name, path, params,
                                        from_file=system == "estimator-file",
                                        training_path=path_kind)
    else:
        seconds, losses = run_api(name, path, params, ort=system == "ortt",
                                  memory=memory)
        before = memory["before_kb"]
    peak = _rss_kb(field="VmHWM")
    rate = (CHUNK / float(np.median(seconds)) if isinstance(seconds, list)
            else None)
    print(json.dumps(dict(model=name, system=system, seconds=seconds, rate=rate,
                          steps=MODELS[name]["steps"], losses=losses,
                          peak_mb=(peak - before) / 1024,
                          build_mb=memory.get("build_mb"))))


def _rss_kb(reset_peak=False, field="VmRSS"):
    """Resident memory (kB) from /proc; ``reset_peak`` restarts VmHWM."""
    try:
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(python, name, system, path, params):
    env = dict(os.environ)
    root = os.path.dirname(HERE)
    if system in ("ortt", "build-ortt"):
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--one", name, system, path,
         json.dumps(params)], capture_output=True, text=True, env=env)
    if out.returncode:
        print(f"{name} {system}: failed\n{out.stderr[-3000:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _paired_ratio(runs, base_runs, key="rate"):
    """Median over the repeats of the ratio of a system's ``key`` (steps per
    second, or a build's seconds) to its baseline's measured in the same
    repeat (minutes apart, not the whole run apart): a drift of the
    machine's speed over the run moves both members of a pair. ``runs``:
    ``(repeat, result)`` pairs. NaN without a common repeat."""
    base = dict(base_runs)
    ratios = sorted(r[key] / base[k][key] for k, r in runs if k in base)
    if not ratios:
        return float("nan")
    return float(np.median(ratios))


def _warmup_loss(name, r):
    """Mean loss of the warm-up steps. Later steps drift apart by rounding:
    these trainings are chaotic (PyTorch on one thread and on two differs
    by 2e-4 at the fourth resnet18 step and by 0.1 at the sixth)."""
    losses = r["losses"]
    return float(losses[0] if r["system"].startswith("estimator")
                 else np.mean(losses[:MODELS[name]["warmup"]]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS),
                        help="models to train (none: with --build, the build only)")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per cell, alternating systems; median shown")
    parser.add_argument("--build", action="store_true",
                        help="also time generate_artifacts on the 24-layer encoder")
    parser.add_argument("--build-repeat", type=int, default=9,
                        help="builds per system, alternating (each a second or two)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every system (default: every core)")
    parser.add_argument("--ortt", default=os.environ.get("ONNXTRAIN_ORTT_PYTHON"),
                        help="python of a venv with onnxruntime-training")
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "SYSTEM", "PATH", "PARAMS"))
    parser.add_argument("--artifacts", nargs=5,
                        metavar=("MODEL", "PATH", "PARAMS", "FOLDER", "BUILDER"))
    args = parser.parse_args(argv)
    if args.artifacts:  # the api rows' build, in a process of its own
        name, path, params, folder, builder = args.artifacts
        if builder == "ortt":
            import onnxruntime.training.artifacts  # noqa: F401
        else:
            import onnxtrain.artifacts  # noqa: F401
        before = _rss_kb(reset_peak=True)
        _artifacts(name, path, json.loads(params), folder, builder == "ortt")
        print(json.dumps(dict(build_mb=(_rss_kb(field="VmHWM") - before) / 1024)))
        return
    if args.one:
        name, system, path, params = args.one
        one(name, system, path, json.loads(params))
        return
    if args.threads:
        os.environ["ONNXTRAIN_BENCH_THREADS"] = str(args.threads)
    systems = [s for s in args.systems if s != "ortt" or args.ortt]
    folder = tempfile.mkdtemp(prefix="bench_models_onnx_")
    header = (f"{'model':12} {'system':16} {'steps/s':>8} {'x torch':>8} "
              f"{'paired':>8} {'spread':>7} {'warm loss':>10} {'peak MB':>8} "
              f"{'build MB':>8}")
    if args.models:
        print(header)
        print("-" * len(header))
    for name in args.models:
        path = os.path.join(folder, f"{name}.onnx")
        params = export(name, path)
        runs = {s: [] for s in systems}  # (repeat, result)
        for repeat in range(args.repeat):
            for system in systems:
                if system == "torch-plain" and MODELS[name]["optimizer"] != "sgd":
                    continue
                python = args.ortt if system == "ortt" else sys.executable
                r = _child(python, name, system, path, params)
                if r is not None:
                    runs[system].append((repeat, r))
        rows = {}
        for system, rs in runs.items():
            if rs:
                rates = sorted(r["rate"] for _, r in rs)
                mid = rates[len(rates) // 2]
                r = min((r for _, r in rs), key=lambda r: abs(r["rate"] - mid))
                rows[system] = (mid, rates[-1] / rates[0] - 1, r)
        for system, (rate, spread, r) in rows.items():
            base = "torch-plain" if (system in ("api", "ortt", "torch-plain") and
                                     MODELS[name]["optimizer"] == "sgd") else "torch"
            ratio = rate / rows[base][0] if base in rows else float("nan")
            paired = _paired_ratio(runs[system], runs.get(base, []))
            build = "" if r.get("build_mb") is None else f"{r['build_mb']:8.0f}"
            print(f"{name:12} {system:16} {rate:8.2f} {ratio:8.2f} {paired:8.2f} "
                  f"{spread:7.0%} {_warmup_loss(name, r):10.5f} {r['peak_mb']:8.0f} "
                  f"{build:>8}")
        print()
    if args.build:
        path = os.path.join(folder, "encoder24.onnx")
        params = export("encoder24", path)
        print(f"{'build':12} {'system':16} {'seconds':>8} {'paired':>8} "
              f"{'nodes':>8} {'peak MB':>8}")
        systems = ["build"] + (["build-ortt"] if args.ortt else [])
        runs = {system: [] for system in systems}  # (repeat, result)
        for repeat in range(args.build_repeat):  # alternating, as the training runs
            for system in systems:
                python = args.ortt if system == "build-ortt" else sys.executable
                r = _child(python, "encoder24", system, path, params)
                if r is not None:
                    runs[system].append((repeat, r))
        for system in systems:
            rs = sorted((r for _, r in runs[system]), key=lambda r: r["seconds"])
            if rs:
                r = rs[len(rs) // 2]
                # seconds relative to onnxruntime-training's build of the
                # same repeat (the inverse of a speed ratio: below 1 is faster)
                paired = _paired_ratio(runs[system], runs.get("build-ortt", []),
                                       key="seconds")
                print(f"{'encoder24':12} {system:16} {r['seconds']:8.2f} {paired:8.2f} "
                      f"{r['losses'][0]:8d} {r['peak_mb']:8.0f}")


if __name__ == "__main__":
    main()
