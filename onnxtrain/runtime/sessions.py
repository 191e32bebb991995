"""Sessions and OrtValues: build a session from a ModelProto, move arrays to
the device, run with IOBinding so results stay on the device."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime
from onnx import TensorProto
from onnxruntime import OrtValue
from onnxruntime.capi.onnxruntime_pybind11_state import OrtValue as C_OrtValue

from ..graph import elem_type_to_numpy
from ..graph.scopes import subgraphs
from .devices import parse_device
from .threads import current_session_spinning, current_session_threads

__all__ = ["make_session", "to_ortvalue", "to_numpy", "SessionRunner",
           "SessionRunError", "check_session_options", "default_session_options",
           "with_user_options"]


class SessionRunError(RuntimeError):
    """onnxruntime failed while running a model (a kernel refused its
    inputs: shapes that do not broadcast, an index out of range...). The
    message is onnxruntime's; callers that know the inputs turn it into a
    clearer one."""


#: Graphs of fewer nodes (subgraphs counted) run with sleeping intra-op
#: threads: spinning pays off over many kernels per run, and stopping the
#: spin costs a little at every run (a scikit-learn MLP's prediction graph has 3 to
#: 10 nodes, a training step dozens to thousands).
SPIN_MIN_NODES = 32


def _node_count(graph):
    return len(graph.node) + sum(_node_count(sub) for node in graph.node
                                 for sub in subgraphs(node))


def default_session_options(intra_op_num_threads=None, spinning=None, model=None):
    """Session options suited to training.

    Full graph optimization; no memory pattern (see below); the intra-op
    threads spin between the kernels
    of a run when ``spinning`` (onnxruntime's default) but stop spinning
    as soon as the run returns (``session.force_spinning_stop``), so that
    no thread burns a core while Python works between the many short runs
    of a training loop. The intra-op threads: ``intra_op_num_threads``,
    else the count set by :func:`~onnxtrain.runtime.threads.session_threads`
    or joblib's budget in a joblib worker
    (:func:`~onnxtrain.runtime.threads.current_session_threads`), else
    onnxruntime's default (every physical core).

    Parameters
    ----------
    intra_op_num_threads : int, default=None
    spinning : bool, default=None
        None: :func:`~onnxtrain.runtime.threads.current_session_spinning`
        (True unless a :func:`~onnxtrain.runtime.threads.session_spinning`
        block or the ``ONNXTRAIN_SPINNING`` environment variable turns it
        off), and False for a ``model`` of fewer than
        :data:`SPIN_MIN_NODES` nodes. Spinning speeds up a training step
        of many short kernels (whose threads otherwise sleep and wake
        between kernels) on an idle machine, and slows it down while
        another process keeps a core busy.
    model : onnx.ModelProto, default=None
        The model the session will run (for ``spinning=None``).

    Returns
    -------
    onnxruntime.SessionOptions

    Notes
    -----
    onnxruntime's memory pattern (``enable_mem_pattern``, on by default)
    records the first run's allocations and makes every later run take one
    block of their total size from the arena, which keeps the first run's
    blocks: a training step's session could hold both, depending on what
    the process allocated and freed before (glibc's threshold for giving
    large blocks back to the system moves with its history). Without it
    the arena reuses its blocks: less peak resident memory and steps as
    fast (the README's "Speed" section).
    """
    if intra_op_num_threads is None:
        intra_op_num_threads = current_session_threads()
    if spinning is None:
        spinning = current_session_spinning() and (
            model is None or _node_count(model.graph) >= SPIN_MIN_NODES)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = (
        onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if spinning else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if intra_op_num_threads:
        options.intra_op_num_threads = int(intra_op_num_threads)
    options.log_severity_level = 3
    return options


#: SessionOptions properties :func:`with_user_options` copies.
USER_OPTION_FIELDS = (
    "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level",
    "execution_mode", "execution_order", "log_severity_level",
    "log_verbosity_level", "logid", "enable_profiling", "profile_file_prefix",
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
    "use_deterministic_compute", "use_per_session_threads",
    "optimized_model_filepath")


def check_session_options(user):
    """``user`` if it is None or an onnxruntime.SessionOptions.

    Raises
    ------
    TypeError
        Anything else.
    """
    if user is not None and not isinstance(user, onnxruntime.SessionOptions):
        raise TypeError(f"session_options must be an onnxruntime.SessionOptions, "
                        f"not {type(user).__name__}.")
    return user


def with_user_options(options, user):
    """``options`` with every property of :data:`USER_OPTION_FIELDS` that
    ``user`` sets to other than a new ``SessionOptions``' value.

    Parameters
    ----------
    options : onnxruntime.SessionOptions
        Modified and returned.
    user : onnxruntime.SessionOptions or None
        A caller's options: read, never modified (its config entries and
        registered providers cannot be listed, so they are not read).

    Returns
    -------
    onnxruntime.SessionOptions

    Raises
    ------
    TypeError
        ``user`` is not a SessionOptions.
    """
    if check_session_options(user) is None:
        return options
    fresh = onnxruntime.SessionOptions()
    for field in USER_OPTION_FIELDS:
        value = getattr(user, field)
        if value != getattr(fresh, field):
            setattr(options, field, value)
    return options


def make_session(model, device="cpu", options=None):
    """An InferenceSession running ``model`` (ModelProto) on ``device``."""
    device = parse_device(device)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options or default_session_options(model=model),
        providers=device.providers)


def to_ortvalue(value, device="cpu", dtype=None, owned=False):
    """An OrtValue on ``device`` from a numpy array (cast to ``dtype``) or an
    OrtValue (returned as is; a C-level one, as onnxcustom handled, is
    wrapped in ``onnxruntime.OrtValue``).

    On the CPU the OrtValue shares the array's memory and the Python
    OrtValue keeps the array alive, but an array from its ``numpy()`` does
    not (onnxruntime 1.32): an OrtValue handed to a caller who may drop it
    while keeping ``numpy()`` views needs ``owned=True``, a copy into memory
    onnxruntime allocates and keeps alive for those views."""
    if isinstance(value, OrtValue):
        return value
    if isinstance(value, C_OrtValue):  # onnxcustom's loaders gave these
        return OrtValue(value)
    device = parse_device(device)
    array = np.asarray(value)
    if dtype is not None and array.dtype != dtype:
        array = array.astype(dtype)
    if not array.flags.c_contiguous:  # np.ascontiguousarray makes rank 0 rank 1
        array = np.ascontiguousarray(array)
    if owned and device.type == "cpu":
        result = OrtValue.ortvalue_from_shape_and_type(list(array.shape), array.dtype,
                                                       device.type, device.index)
        result.numpy()[...] = array
        return result
    return OrtValue.ortvalue_from_numpy(array, device.type, device.index)


def is_ortvalue(value):
    """True for an onnxruntime OrtValue."""
    return isinstance(value, OrtValue)


def ortvalue_dtype(value):
    """numpy dtype of an OrtValue tensor (``data_type()`` is
    "tensor(float)"...)."""
    name = value.data_type()[len("tensor("):-1]
    return elem_type_to_numpy(TensorProto.DataType.Value(name.upper()))


def to_numpy(value):
    """A numpy array from an OrtValue (copied to the host) or an array."""
    return value.numpy() if isinstance(value, OrtValue) else np.asarray(value)


class SessionRunner:
    """Run one model on one device, inputs and outputs as OrtValues.

    Thread-safe: each thread binds its inputs and outputs on an IOBinding
    of its own, kept for its next calls (onnxruntime runs one session from
    several threads, but an IOBinding shared by two concurrent runs mixes
    their inputs and outputs or crashes the process). A new IOBinding per
    call would be as safe but adds work to every run, four per step of
    the split training path.

    Parameters
    ----------
    model : onnx.ModelProto
    device : str or Device
    options : onnxruntime.SessionOptions, default=None
    """

    def __init__(self, model, device="cpu", options=None):
        self.device = parse_device(device)
        self.session = make_session(model, self.device, options)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_dtypes = {
            vi.name: elem_type_to_numpy(vi.type.tensor_type.elem_type)
            for vi in model.graph.input if vi.type.HasField("tensor_type")}
        self._local = threading.local()  # .binding: this thread's IOBinding

    def __call__(self, feeds, output_names=None, into=None):
        """Run with ``feeds`` (dict name -> OrtValue or array) and return the
        outputs as a list of OrtValues on the device.

        ``into`` (dict name -> OrtValue, default None) names outputs to be
        written into the given OrtValues (of the output's dtype and shape)
        instead of memory onnxruntime allocates; those OrtValues are
        returned for them. An OrtValue may also be a feed of the same run
        only where every node reading that feed runs before the node
        writing the output (:func:`onnxtrain.graph.aliasing.writes_after_reads`
        checks a graph for it)."""
        binding = getattr(self._local, "binding", None)  # see the class doc
        if binding is None:
            binding = self._local.binding = self.session.io_binding()
        else:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        for name, value in feeds.items():
            if not isinstance(value, OrtValue):
                value = to_ortvalue(value, self.device, self.input_dtypes.get(name))
            binding.bind_ortvalue_input(name, value)
        names = self.output_names if output_names is None else output_names
        into = into or {}
        for name in names:
            if name in into:
                binding.bind_ortvalue_output(name, into[name])
            else:
                binding.bind_output(name, self.device.type, self.device.index)
        try:
            self.session.run_with_iobinding(binding)
        except Exception as exc:  # onnxruntime raises RuntimeError or Fail
            raise SessionRunError(str(exc)) from exc
        outputs = list(binding.get_outputs())
        if into:
            # the caller's objects: an OrtValue made from a numpy array keeps
            # that array alive, the one onnxruntime returns does not
            outputs = [into.get(name, value) for name, value in zip(names, outputs)]
        return outputs
