"""The opsets the installed onnxruntime runs, found by asking it once."""
from __future__ import annotations

import functools

import onnx
import onnxruntime
from onnx import TensorProto, helper

from ..exceptions import InvalidModelError

__all__ = ["highest_opset", "check_runtime_opsets"]

#: The domains onnxruntime validates the opset of when it loads a model
#: (it refuses a version beyond the last one released); custom domains
#: have no such limit.
CHECKED_DOMAINS = ("", "ai.onnx.ml")


def _probe_model(domain, version):
    """A one-node model importing ``domain`` at ``version``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "opset_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    imports = [helper.make_opsetid(domain, version)]
    if domain:  # the Identity node needs the default domain
        imports.append(helper.make_opsetid("", 13))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8  # onnxruntime >= 1.10 reads it
    return model


def _runs(domain, version):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4
    try:
        onnxruntime.InferenceSession(
            _probe_model(domain, version).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises Fail for an opset it refuses
        return False
    return True


@functools.lru_cache(maxsize=None)
def highest_opset(domain=""):
    """The highest opset of ``domain`` the installed onnxruntime loads.

    Found once per process by building sessions of a one-node model
    (a binary search from the version the installed onnx knows), so it
    follows the installed onnxruntime without a version table.

    Parameters
    ----------
    domain : str, default=''
        '' (ai.onnx) or 'ai.onnx.ml'.

    Returns
    -------
    int or None
        None when onnxruntime refuses even opset 1 of ``domain`` (nothing
        to compare with).
    """
    known = onnx.defs.C.schema_version_map().get(domain, (1, 1))[1]
    if not _runs(domain, 1):
        return None
    low, high = 1, None  # low runs, high (once found) does not
    probe = max(known, 1)
    while high is None:
        if _runs(domain, probe):
            low, probe = probe, probe * 2
        else:
            high = probe
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _runs(domain, middle) else (low, middle)
    return low


def check_runtime_opsets(model, what="the model"):
    """Refuse a model importing an opset beyond what the installed
    onnxruntime runs (it would refuse the model only when a session is
    built, with an internal error).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    what : str, default='the model'
        How the message calls ``model``.

    Raises
    ------
    onnxtrain.exceptions.InvalidModelError
        A ValueError naming the domain, the model's opset and the highest
        one the installed onnxruntime runs.
    """
    for opset in model.opset_import:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        if domain not in CHECKED_DOMAINS:
            continue
        highest = highest_opset(domain)
        if highest is not None and opset.version > highest:
            raise InvalidModelError(
                f"{what} imports opset {opset.version} of domain "
                f"{domain or 'ai.onnx'!r}, but the installed onnxruntime "
                f"{onnxruntime.__version__} runs opsets up to {highest}: "
                f"convert the model to opset {highest} or lower "
                "(onnx.version_converter.convert_version) or install a newer "
                "onnxruntime.")
