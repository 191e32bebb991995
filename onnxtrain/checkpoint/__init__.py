"""The onnxtrain checkpoint file (:mod:`.format`), below both
:mod:`onnxtrain.api` and :mod:`onnxtrain.onnxblock`, which read and write it."""
from .format import (FORMAT, VERSION, check_checkpoint_entries,
                     checkpoint_to_bytes, decode_property, encode_property,
                     read_checkpoint, write_checkpoint)

__all__ = ["FORMAT", "VERSION", "check_checkpoint_entries",
           "checkpoint_to_bytes", "decode_property", "encode_property",
           "read_checkpoint", "write_checkpoint"]
