"""Training speed at small batches, long sequences and on recurrent nets:
onnxtrain against PyTorch eager, one training step (forward, backward,
update) at a time, where per-step overhead, the number of kernels and the
attention and recurrence kernels weigh more than the big matrix products.

Run: ``python benchmarks/bench_small.py [--models resnet18-64b2 ...]
[--systems torch estimator torch-plain api] [--repeat 1] [--threads N]``.
``--threads N`` gives PyTorch and every onnxruntime session of onnxtrain N
intra-op threads (default: each library's own default, every core): on a
machine other processes keep busy, PyTorch's threads wait at each
parallel region for a thread the system has descheduled, and one thread
each compares the kernels rather than the scheduler. The
measurement (systems in processes of their own, alternating over the
repeats, chunks of 5 steps, the median chunk, ratios to PyTorch eager in the
same run, ``paired`` within each repeat) is bench_models.py's, which this
script drives with its own models: read that script's docstring for the
columns.

Models (float32, random init with ``torch.manual_seed(0)``, synthetic data
drawn by numpy, softmax cross-entropy on 10 classes unless said):

- resnet18-64b2, resnet18-64b8: bench_models.py's resnet18 on 3x64x64
  images, batch 2 and 8; SGD lr 0.01 momentum 0.9 (the api rows plain SGD
  against PyTorch's plain SGD, as in bench_models.py);
- vgg-64b2: a VGG-style net (Simonyan and Zisserman, 2014): 3x3
  convolutions with ReLU, 64-128-256-256-512 channels, a 2x2 max pool after
  each stage but the fourth, a linear head on the flattened 512x4x4 map,
  batch 2, SGD momentum as above;
- swin-64b2: a Swin-style model (Liu et al., "Swin Transformer", 2021): a
  4x4/4 patch embedding to 96 channels, two stages (2 and 2 blocks, 3 and
  6 heads) of window attention (windows of 4x4 tokens, every second block
  on windows shifted by half a window through ``torch.roll``) with
  pre-LayerNorm, a GELU MLP of ratio 4, a patch merging between the
  stages, mean pooling and a linear head, batch 2, AdamW lr 1e-3 weight
  decay 0.01;
- maxvit-64b2: a MaxViT-style model (Tu et al., "MaxViT: Multi-Axis
  Vision Transformer", 2022): a stem of two 3x3 convolutions to 64
  channels (the first of stride 2, BatchNorm and GELU between them), two
  stages (64 and 128 channels, 2 blocks each, heads of 32 channels) of
  MaxViT blocks: an MBConv (1x1 expansion by 4, BatchNorm, GELU, 3x3
  depthwise convolution, of stride 2 in a stage's first block, BatchNorm,
  GELU, squeeze-and-excitation, 1x1 projection, BatchNorm, the residual
  through a 2x2 average pool and a 1x1 convolution where the shape
  changes), then block attention (windows of 4x4 tokens) and grid
  attention (a 4x4 grid of tokens strided across the map), each with
  pre-LayerNorm, a learned relative position bias (a table gathered by a
  constant index) and a GELU MLP of ratio 4; mean pooling, LayerNorm and
  a linear head, batch 2, AdamW as swin-64b2;
- encoder512: bench_models.py's BERT-like encoder (hidden 128, 2 layers,
  2 heads) at sequence length 512, batch 2, AdamW as above;
- alexnet-64b2: an AlexNet-style net (Krizhevsky et al., 2012): an
  11x11/4 convolution to 64 channels, a 5x5 to 192, three 3x3 (384, 256,
  256), ReLUs, overlapping 3x3/2 max pools after the first two, then two
  Dropout + 4096-unit linear layers with ReLU and a linear head on the
  flattened 256x3x3 map, batch 2, SGD momentum as above (28.7M weights,
  most in the linear layers; the dropout masks differ between systems, so
  the warm losses do too);
- lstm: a 2-layer bidirectional ``nn.LSTM`` (input 64, hidden 128) over 50
  time steps, the last step's output through a linear head, batch 8,
  sequences given as rows of 50 * 64 floats, SGD momentum as above;
- gru: the same with a 2-layer bidirectional ``nn.GRU`` (input 64, hidden
  128).
"""
from __future__ import annotations

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# the onnxtrain of this checkout, not an installed one
sys.path.insert(0, os.path.dirname(HERE))

import bench_models as bench  # noqa: E402

_SGD = dict(optimizer="sgd", lr=0.01, momentum=0.9)
_ADAMW = dict(optimizer="adamw", lr=1e-3, weight_decay=0.01)
SMALL_MODELS = {
    "resnet18-64b2": dict(batch=2, warmup=3, steps=30, classes=10, size=64,
                          features=3 * 64 * 64, **_SGD),
    "resnet18-64b8": dict(batch=8, warmup=3, steps=20, classes=10, size=64,
                          features=3 * 64 * 64, **_SGD),
    "vgg-64b2": dict(batch=2, warmup=3, steps=30, classes=10, size=64,
                     features=3 * 64 * 64, **_SGD),
    "swin-64b2": dict(batch=2, warmup=3, steps=30, classes=10, size=64,
                      features=3 * 64 * 64, **_ADAMW),
    "maxvit-64b2": dict(batch=2, warmup=3, steps=30, classes=10, size=64,
                        features=3 * 64 * 64, **_ADAMW),
    "encoder512": dict(batch=2, warmup=3, steps=20, classes=2, features=512,
                       layers=2, vocab=1000, **_ADAMW),
    # "size" marks float rows (bench_models.batches): sequences of 50 x 64
    "alexnet-64b2": dict(batch=2, warmup=3, steps=20, classes=10, size=64,
                         features=3 * 64 * 64, **_SGD),
    "lstm": dict(batch=8, warmup=3, steps=30, classes=10, size=50,
                 features=50 * 64, **_SGD),
    "gru": dict(batch=8, warmup=3, steps=30, classes=10, size=50,
                features=50 * 64, **_SGD),
}
DEFAULT_SYSTEMS = ["torch", "estimator", "torch-plain", "api"]


def small_torch_model(name):
    """The PyTorch module of ``name``: this script's models, or
    bench_models.py's for the others (resnet18 and the encoder)."""
    import torch
    torch.manual_seed(0)
    if name.startswith("vgg"):
        return _vgg(SMALL_MODELS[name])
    if name.startswith("swin"):
        return _swin(SMALL_MODELS[name])
    if name.startswith("maxvit"):
        return _maxvit(SMALL_MODELS[name])
    if name.startswith(("lstm", "gru")):
        return _lstm(SMALL_MODELS[name], gru=name.startswith("gru"))
    if name.startswith("alexnet"):
        return _alexnet(SMALL_MODELS[name])
    return _bench_torch_model(name)


def _vgg(cfg):
    from torch import nn
    size, layers, cin = cfg["size"], [], 3
    for i, cout in enumerate([64, 128, 256, 256, 512]):
        layers += [nn.Conv2d(cin, cout, 3, 1, 1), nn.ReLU()]
        if i != 3:
            layers.append(nn.MaxPool2d(2))
        cin = cout

    class VGG(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(512 * (size // 16) ** 2, cfg["classes"])

        def forward(self, x):
            x = self.features(x.reshape(-1, 3, size, size))
            return self.classifier(x.flatten(1))

    return VGG()


def _swin(cfg):
    import torch
    from torch import nn
    size, window = cfg["size"], 4

    class Block(nn.Module):
        def __init__(self, dim, heads, shift):
            super().__init__()
            self.heads, self.shift = heads, shift
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                     nn.Linear(4 * dim, dim))

        def forward(self, x):  # x: (B, H, W, C)
            B, H, W, C = x.shape
            h = self.norm1(x)
            if self.shift:
                h = torch.roll(h, (-window // 2, -window // 2), (1, 2))
            # windows: (B * nW, window * window, C)
            h = h.reshape(B, H // window, window, W // window, window, C)
            h = h.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, C)
            q, k, v = self.qkv(h).reshape(
                h.shape[0], window * window, 3, self.heads, C // self.heads
            ).permute(2, 0, 3, 1, 4)
            attn = torch.softmax(q @ k.transpose(-2, -1) * (C // self.heads) ** -0.5,
                                 dim=-1)
            h = (attn @ v).transpose(1, 2).reshape(-1, window * window, C)
            h = self.proj(h).reshape(B, H // window, W // window, window, window, C)
            h = h.permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
            if self.shift:
                h = torch.roll(h, (window // 2, window // 2), (1, 2))
            x = x + h
            return x + self.mlp(self.norm2(x))

    class Merge(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm, self.reduce = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim,
                                                                        bias=False)

        def forward(self, x):
            B, H, W, C = x.shape
            x = x.reshape(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5)
            return self.reduce(self.norm(x.reshape(B, H // 2, W // 2, 4 * C)))

    class Swin(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, 96, 4, 4)
            self.stage1 = nn.Sequential(Block(96, 3, False), Block(96, 3, True))
            self.merge = Merge(96)
            self.stage2 = nn.Sequential(Block(192, 6, False), Block(192, 6, True))
            self.norm = nn.LayerNorm(192)
            self.head = nn.Linear(192, cfg["classes"])

        def forward(self, x):
            x = self.embed(x.reshape(-1, 3, size, size)).permute(0, 2, 3, 1)
            x = self.stage2(self.merge(self.stage1(x)))
            return self.head(self.norm(x).mean(dim=(1, 2)))

    return Swin()


def _maxvit(cfg):
    import torch
    from torch import nn
    size, part, head_dim = cfg["size"], 4, 32

    class MBConv(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            mid, squeeze = 4 * cout, cout // 4
            self.conv = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.GELU(),
                nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
                nn.BatchNorm2d(mid), nn.GELU())
            self.se = nn.Sequential(
                nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, squeeze, 1), nn.SiLU(),
                nn.Conv2d(squeeze, mid, 1), nn.Sigmoid())
            self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False),
                                         nn.BatchNorm2d(cout))
            self.shortcut = (nn.Identity() if stride == 1 and cin == cout else
                             nn.Sequential(nn.AvgPool2d(stride), nn.Conv2d(cin, cout, 1)))

        def forward(self, x):  # x: (B, C, H, W)
            h = self.conv(x)
            return self.shortcut(x) + self.project(h * self.se(h))

    class Attention(nn.Module):
        """Pre-LayerNorm attention and MLP over groups of part * part tokens:
        windows of neighbours (``grid`` False) or a grid strided across the
        map."""

        def __init__(self, dim, grid):
            super().__init__()
            self.heads, self.grid = dim // head_dim, grid
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                     nn.Linear(4 * dim, dim))
            self.bias_table = nn.Parameter(
                torch.randn((2 * part - 1) ** 2, self.heads) * 0.02)
            pos = torch.stack(torch.meshgrid(torch.arange(part), torch.arange(part),
                                             indexing="ij")).flatten(1)
            rel = (pos[:, :, None] - pos[:, None, :]).permute(1, 2, 0) + part - 1
            self.register_buffer("bias_index", rel[..., 0] * (2 * part - 1) + rel[..., 1],
                                 persistent=False)

        def partition(self, x):
            B, H, W, C = x.shape
            if self.grid:  # token (i, j) of group (a, b) at (i * H/part + a, ...)
                x = x.reshape(B, part, H // part, part, W // part, C)
                x = x.permute(0, 2, 4, 1, 3, 5)
            else:
                x = x.reshape(B, H // part, part, W // part, part, C)
                x = x.permute(0, 1, 3, 2, 4, 5)
            return x.reshape(-1, part * part, C)

        def unpartition(self, x, shape):
            B, H, W, C = shape
            if self.grid:
                x = x.reshape(B, H // part, W // part, part, part, C)
                x = x.permute(0, 3, 1, 4, 2, 5)
            else:
                x = x.reshape(B, H // part, W // part, part, part, C)
                x = x.permute(0, 1, 3, 2, 4, 5)
            return x.reshape(shape)

        def forward(self, x):  # x: (B, H, W, C)
            C, n = x.shape[-1], part * part
            h = self.partition(self.norm1(x))
            q, k, v = self.qkv(h).reshape(-1, n, 3, self.heads, head_dim
                                          ).permute(2, 0, 3, 1, 4)
            bias = self.bias_table[self.bias_index.reshape(-1)].reshape(n, n, self.heads)
            attn = q @ k.transpose(-2, -1) * head_dim ** -0.5 + bias.permute(2, 0, 1)
            h = (torch.softmax(attn, dim=-1) @ v).transpose(1, 2).reshape(-1, n, C)
            x = x + self.unpartition(self.proj(h), x.shape)
            return x + self.mlp(self.norm2(x))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.mbconv = MBConv(cin, cout, stride)
            self.block, self.grid = Attention(cout, False), Attention(cout, True)

        def forward(self, x):
            x = self.mbconv(x).permute(0, 2, 3, 1)
            return self.grid(self.block(x)).permute(0, 3, 1, 2)

    class MaxViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.GELU(),
                nn.Conv2d(64, 64, 3, 1, 1))
            self.stages = nn.Sequential(
                Block(64, 64, 2), Block(64, 64, 1), Block(64, 128, 2), Block(128, 128, 1))
            self.norm = nn.LayerNorm(128)
            self.head = nn.Linear(128, cfg["classes"])

        def forward(self, x):
            x = self.stages(self.stem(x.reshape(-1, 3, size, size)))
            return self.head(self.norm(x.mean(dim=(2, 3))))

    return MaxViT()


def _alexnet(cfg):
    from torch import nn
    size = cfg["size"]

    class AlexNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
                nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
                nn.Conv2d(256, 256, 3, padding=1), nn.ReLU())
            # 64x64 inputs leave a 3x3 map here
            self.classifier = nn.Sequential(
                nn.Dropout(), nn.Linear(256 * 3 * 3, 4096), nn.ReLU(),
                nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(),
                nn.Linear(4096, cfg["classes"]))

        def forward(self, x):
            x = self.features(x.reshape(-1, 3, size, size))
            return self.classifier(x.flatten(1))

    return AlexNet()


def _lstm(cfg, gru=False):
    from torch import nn
    steps = cfg["size"]
    layer = nn.GRU if gru else nn.LSTM

    class LSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = layer(64, 128, num_layers=2, bidirectional=True,
                              batch_first=True)
            self.head = nn.Linear(256, cfg["classes"])

        def forward(self, x):
            out, _ = self.lstm(x.reshape(-1, steps, 64))
            return self.head(out[:, -1])

    return LSTM()


def small_export(name, path):
    """bench_models.export; for the LSTM and the GRU, whose exporter writes
    the weights into initializers of its own (gates reordered, biases
    joined), the
    names of the graph's float initializers instead of the module's."""
    try:
        return _bench_export(name, path)
    except RuntimeError:
        if not name.startswith(("lstm", "gru")):
            raise
    import onnx
    onx = onnx.load(path)
    return [i.name for i in onx.graph.initializer
            if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) > 0]


_bench_torch_model = bench.torch_model
_bench_export = bench.export
bench.MODELS.update(SMALL_MODELS)
bench.torch_model = small_torch_model
bench.export = small_export
# bench_models' processes (one per system, the api's artifact builds) run
# this script, which knows the models above
bench.__file__ = os.path.abspath(__file__)


#: environment variable through which ``--threads`` reaches the processes
#: of the systems
THREADS_VARIABLE = "BENCH_SMALL_THREADS"


def _pin_threads(n):
    """PyTorch and onnxtrain's sessions on ``n`` intra-op threads in this
    process (bench_models sets PyTorch's count to every core; the
    estimators and the api take onnxruntime's default)."""
    import torch
    import onnxtrain.runtime.sessions as sessions
    set_threads, options = torch.set_num_threads, sessions.default_session_options
    torch.set_num_threads = lambda _: set_threads(n)

    def pinned(intra_op_num_threads=None, *args, **kwargs):
        return options(n, *args, **kwargs)

    for name in ("onnxtrain.api.module", "onnxtrain.runtime.fused"):
        importlib.import_module(name)  # the modules importing the options
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "").startswith("onnxtrain")
                and getattr(module, "default_session_options", None) is options):
            module.default_session_options = pinned


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--threads" in argv:
        at = argv.index("--threads")
        os.environ[THREADS_VARIABLE] = argv[at + 1]
        del argv[at:at + 2]
    if os.environ.get(THREADS_VARIABLE) and ("--one" in argv or "--artifacts" in argv):
        _pin_threads(int(os.environ[THREADS_VARIABLE]))
    if not any(a in argv for a in ("--one", "--artifacts", "--models")):
        argv += ["--models", *SMALL_MODELS]
    if not any(a in argv for a in ("--one", "--artifacts", "--systems")):
        argv += ["--systems", *DEFAULT_SYSTEMS]
    bench.main(argv)


if __name__ == "__main__":
    main()
