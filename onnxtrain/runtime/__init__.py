"""Execution on onnxruntime: sessions, OrtValues, devices and the
forward/backward engine. The only package of onnxtrain importing onnxruntime."""
from .devices import Device, parse_device
from .engine import ForwardBackwardEngine, OrtGradientForwardBackward
from .fused import FusedRunner
from .sessions import (SessionRunError, SessionRunner, default_session_options,
                       is_ortvalue, make_session, ortvalue_dtype, to_numpy,
                       to_ortvalue)
from .threads import session_spinning, session_threads

__all__ = ["Device", "ForwardBackwardEngine", "FusedRunner",
           "OrtGradientForwardBackward",
           "SessionRunError", "SessionRunner", "default_session_options",
           "is_ortvalue", "make_session", "ortvalue_dtype", "parse_device",
           "session_spinning", "session_threads", "to_numpy", "to_ortvalue"]
