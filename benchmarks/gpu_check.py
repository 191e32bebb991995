"""GPU check: the CUDA tests, then W3 on the GPU, in a few minutes.

Run on a machine with onnxruntime-gpu and a CUDA device:
``python benchmarks/gpu_check.py``. Without CUDAExecutionProvider it says
so and exits 0 (the CUDA tests skip cleanly on such machines).
"""
import os
import subprocess
import sys

import onnxruntime

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    providers = onnxruntime.get_available_providers()
    print("onnxruntime", onnxruntime.__version__, "providers:", providers)
    if "CUDAExecutionProvider" not in providers:
        print("no CUDAExecutionProvider: install onnxruntime-gpu on a CUDA machine")
        return 0
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-k", "cuda or gpu",
         os.path.join(ROOT, "tests")], cwd=ROOT)
    env = dict(os.environ, ONNXTRAIN_BENCH_DEVICE="cuda")
    bench = subprocess.run(
        [sys.executable, os.path.join(HERE, "bench_training.py"), "--workloads",
         "W3", "--systems", "torch", "onnxtrain-fused", "onnxtrain-loop"],
        env=env, cwd=ROOT)
    return tests.returncode or bench.returncode


if __name__ == "__main__":
    sys.exit(main())
