"""Count how many of onnxruntime-training's own on-device API tests pass on onnxtrain.

The two test files are onnxruntime's
``orttraining/orttraining/test/python/orttraining_test_ort_apis_onnxblock.py``
and ``orttraining_test_ort_apis_py_bindings.py``. They ship in no installed
package and this project neither ships nor fetches them: the user passes a
directory holding them (or the two paths)::

    python benchmarks/compat_ort_suite.py /path/to/onnxruntime/orttraining/orttraining/test/python

The script copies them into a temporary directory, rewrites their import
lines only, runs pytest there on CPU and prints how many tests passed.

Import mapping (every other line stays as written):

=====================================================  ==========================================
onnxruntime-training                                    onnxtrain
=====================================================  ==========================================
``import onnxruntime.training.onnxblock as onnxblock``  ``import onnxtrain.onnxblock as onnxblock``
``from onnxruntime.training import artifacts``          ``from onnxtrain import artifacts``
``from onnxruntime.training.api import ...``            ``from onnxtrain.api import ...``
``from onnxruntime.training.X import ...``              ``from onnxtrain.X import ...``
=====================================================  ==========================================

``import onnxruntime``, ``from onnxruntime import OrtValue, ...`` and
``onnxruntime.capi`` stay: they are stock onnxruntime, which onnxtrain runs on.

One non-import rewrite, only when torch has no CUDA device: the onnxblock
file places its torch reference models with ``device = "cuda"``; that line
becomes ``device = "cpu"`` (it only says where torch computes the reference
values). Tests that need onnxruntime's CUDA provider or its custom-op test
library are counted apart as excepted: ``test_cuda_execution_provider``,
``test_get_and_set_parameter_values[cuda]`` and ``test_ort_custom_ops``.

The tests export their torch models with the TorchScript exporter's options
(``training=``, ``dynamic_axes=``); torch >= 2.9 defaults to the dynamo
exporter, which needs onnxscript and names parameters otherwise. A
``conftest.py`` written next to the copies makes ``dynamo=False`` the
default of ``torch.onnx.export`` (the tests' code is unchanged).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

FILES = ("orttraining_test_ort_apis_onnxblock.py",
         "orttraining_test_ort_apis_py_bindings.py")
EXCEPTED = ("test_cuda_execution_provider",
            "test_get_and_set_parameter_values[cuda]",
            "test_ort_custom_ops")
_IMPORT = re.compile(r"^(\s*(?:import|from)\s+)onnxruntime\.training(\b.*)$")
_CUDA_DEVICE = re.compile(r'^(\s*device\s*=\s*)"cuda"(\s*)$')


_CONFTEST = """\
import functools

import torch.onnx

_export = torch.onnx.export


@functools.wraps(_export)
def _torchscript_export(*args, **kwargs):
    kwargs.setdefault("dynamo", False)
    return _export(*args, **kwargs)


torch.onnx.export = _torchscript_export
"""


def rewrite_source(text, cuda_to_cpu):
    """Rewrite the import lines of one test file (and CUDA device lines).

    Parameters
    ----------
    text : str
        Source of one onnxruntime test file.
    cuda_to_cpu : bool
        Replace ``device = "cuda"`` by ``device = "cpu"``.

    Returns
    -------
    text : str
        The rewritten source.
    """
    lines = []
    for line in text.splitlines():
        line = _IMPORT.sub(r"\1onnxtrain\2", line)
        if cuda_to_cpu:
            line = _CUDA_DEVICE.sub(r'\1"cpu"\2', line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _find_files(paths):
    found = {}
    for path in paths:
        if os.path.isdir(path):
            for name in FILES:
                if os.path.exists(os.path.join(path, name)):
                    found[name] = os.path.join(path, name)
        elif os.path.basename(path) in FILES:
            found[os.path.basename(path)] = path
    missing = [name for name in FILES if name not in found]
    if missing:
        raise SystemExit(f"missing test file(s) {missing} under {paths}")
    return found


def _cuda_available():
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def _package_root():
    """The directory onnxtrain is imported from: this checkout's when the
    script runs from one, else the installed package's."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isdir(os.path.join(root, "onnxtrain")):
        return root
    import onnxtrain
    return os.path.dirname(os.path.dirname(os.path.abspath(onnxtrain.__file__)))


def _results(junit_path):
    results = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        name = case.get("name")
        module = case.get("classname", "").rsplit(".", 1)[-1]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        results[f"{module}::{name}"] = outcome
    return results


def run_suite(paths, workers=0, verbose=False):
    """Run the two test files against onnxtrain and return the outcomes.

    Parameters
    ----------
    paths : list of str
        Directories holding the two files, or the two file paths.
    workers : int, default=0
        ``pytest -n`` workers (pytest-xdist); 0 runs in one process.
    verbose : bool, default=False
        Print pytest's output.

    Returns
    -------
    results : dict
        ``"module::test_id"`` -> ``"passed" | "failed" | "skipped"``.
    """
    found = _find_files(paths)
    cuda_to_cpu = not _cuda_available()
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in found.items():
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(rewrite_source(text, cuda_to_cpu))
        with open(os.path.join(tmp, "conftest.py"), "w", encoding="utf-8") as f:
            f.write(_CONFTEST)
        junit = os.path.join(tmp, "junit.xml")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [tmp, _package_root()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--rootdir", tmp, f"--junitxml={junit}", *FILES]
        if workers:
            cmd[3:3] = ["-n", str(workers)]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=not verbose,
                              text=True)
        if not os.path.exists(junit):
            raise SystemExit(f"pytest did not run:\n{proc.stdout}\n{proc.stderr}")
        return _results(junit)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+",
                        help="directory holding the two test files, or the files")
    parser.add_argument("-n", "--workers", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    results = run_suite(args.paths, args.workers, args.verbose)
    excepted = {k: v for k, v in results.items()
                if k.split("::", 1)[1] in EXCEPTED}
    counted = {k: v for k, v in results.items() if k not in excepted}
    for key in sorted(counted):
        if counted[key] != "passed":
            print(f"{counted[key]:8s} {key}")
    passed = sum(v == "passed" for v in counted.values())
    print(f"passed {passed}/{len(counted)} (excepted, CUDA / custom-op library: "
          f"{len(excepted)}; all collected: {len(results)}, passed "
          f"{sum(v == 'passed' for v in results.values())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
