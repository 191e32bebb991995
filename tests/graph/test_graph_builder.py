"""GraphBuilder.op: the nodes onnx.helper.make_node makes, attributes from a
cache that keeps their types apart and is never changed by the nodes."""
import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from onnxtrain.graph import GraphBuilder


def test_op_makes_the_nodes_make_node_makes():
    g = GraphBuilder(17)
    tensor = numpy_helper.from_array(np.arange(3, dtype=np.float32), "t")
    cases = [("Transpose", ["x"], {"perm": [1, 0]}),
             ("LeakyRelu", ["x"], {"alpha": 1.0}),
             ("Cast", ["x"], {"to": TensorProto.FLOAT16}),
             ("Constant", [], {"value": tensor}),
             ("Pad", ["x", None], {"mode": "reflect"}),
             ("Gemm", ["a", "b"], {"alpha": 0.5, "transB": 1, "beta": None})]
    for op_type, inputs, attrs in cases:
        out = g.op(op_type, *inputs, **attrs)
        node = g.nodes[-1]
        expected = helper.make_node(op_type, ["" if i is None else i for i in inputs],
                                    [out], name=node.name, domain="", **attrs)
        assert node.SerializeToString() == expected.SerializeToString(), op_type


def test_cached_attributes_keep_their_types_and_values():
    g = GraphBuilder(17)
    g.op("LeakyRelu", "x", alpha=1)    # an INT attribute (invalid, but as asked)
    g.op("LeakyRelu", "x", alpha=1.0)  # a FLOAT one, although 1 == 1.0
    g.op("LeakyRelu", "x", alpha=-0.0)  # not the 0.0 of the next node
    g.op("LeakyRelu", "x", alpha=0.0)
    g.op("Transpose", "x", perm=(1, 0))
    g.op("Transpose", "x", perm=[1, 0])
    types = [n.attribute[0].type for n in g.nodes]
    assert types == [AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.FLOAT,
                     AttributeProto.FLOAT, AttributeProto.INTS, AttributeProto.INTS]
    signs = [np.copysign(1, n.attribute[0].f) for n in g.nodes[2:4]]
    assert signs == [-1, 1]
    # editing a node's attribute leaves the next node's as asked
    g.nodes[-1].attribute[0].ints[0] = 7
    g.op("Transpose", "x", perm=[1, 0])
    assert list(g.nodes[-1].attribute[0].ints) == [1, 0]


def test_tensor_value_info_is_make_tensor_value_info():
    from onnxtrain.graph.builder import tensor_value_info
    for elem, shape in [(TensorProto.FLOAT, None), (TensorProto.FLOAT, []),
                        (TensorProto.DOUBLE, [None, "N", 3]), (TensorProto.INT64, (2,))]:
        for name in ("a", "b"):  # the second from the cache
            got = tensor_value_info(name, elem, shape)
            expected = helper.make_tensor_value_info(name, elem, shape)
            assert got.SerializeToString() == expected.SerializeToString(), shape
    # what the helper refuses (numpy dims), refused the same way
    with pytest.raises(ValueError, match="Invalid item in shape"):
        tensor_value_info("n", TensorProto.FLOAT, [np.int64(4), 5])
    # the cached type is copied: editing one value info leaves the next
    first = tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    first.type.tensor_type.shape.dim[0].dim_value = 9
    second = tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    assert second.type.tensor_type.shape.dim[0].dim_value == 1
