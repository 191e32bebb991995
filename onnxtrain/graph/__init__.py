"""Graph construction helpers: one builder, shapes and types of values."""
from .builder import (FLOAT_TYPES, GraphBuilder, OpsetError, compact_model,
                      default_ir_version, elem_type_to_numpy, make_model,
                      numpy_to_elem_type, opset_of, without_initializer_values)
from .shapes import clean_shape, infer_value_types, type_of_value_info

__all__ = ["FLOAT_TYPES", "GraphBuilder", "OpsetError", "compact_model",
           "default_ir_version", "elem_type_to_numpy", "make_model",
           "numpy_to_elem_type", "opset_of", "without_initializer_values",
           "clean_shape", "infer_value_types", "type_of_value_info"]
