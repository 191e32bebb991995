"""onnxblock.optim.build_optimizer_model names its outputs on the update
nodes themselves, and the model is, byte for byte, the one made by
renaming the rule's outputs afterwards (what earlier versions wrote):
api.Optimizer recognizes the models it runs over flat buffers by their
bytes (api/_flat.py), so artifacts written before stay recognized."""
import json

import onnx
import pytest
from onnx import TensorProto

from onnxtrain.onnxblock import _base, optim

SPECS = [("w", TensorProto.FLOAT, [3, 2]), ("b", TensorProto.FLOAT, [2]),
         ("dw", TensorProto.DOUBLE, [4])]


def _renamed_afterwards(block, specs):
    """The optimizer model as earlier versions built it: the rule names
    every value, then the outputs are renamed in the finished graph."""
    with _base.empty_base(_base.DEFAULT_OPSET) as accessor:
        state = _base.current_base()
        lr = state.add_input("learning_rate", TensorProto.DOUBLE, ())
        step = state.add_input("step", TensorProto.INT64, ())
        names, grads, states = [], [], []
        for name, elem, shape in specs:
            names.append(state.add_input(name, elem, shape))
            grads.append(state.add_input(f"{name}_grad", elem, shape))
            states.append(tuple(state.add_input(f"{name}.{s}", elem, shape)
                                for s in block.state_names))
        new_params, new_states = block(lr, step, names, grads, states)
        pairs, outputs = [], []
        for (name, elem, shape), p, ss in zip(specs, new_params, new_states):
            targets = [f"{name}.updated"] + [f"{name}.{s}.updated"
                                             for s in block.state_names]
            for target, value in zip(targets, (p,) + tuple(ss)):
                state.builder.reserve(target)
                pairs.append((target, value))
                outputs.append(onnx.helper.make_tensor_value_info(target, elem, shape))
        accessor.model.graph.output.extend(outputs)
        result = onnx.ModelProto()
        result.CopyFrom(accessor.model)
    assert any(t != v for t, v in pairs)  # a renaming did happen
    optim._name_outputs(result.graph, pairs)
    return result.graph


@pytest.mark.parametrize("block", [
    optim.SGD(), optim.AdamW(), optim.AdamW(weight_decay=0.01, bias_correction=False),
    optim.AdamW(clip_grad=optim.ClipGradNorm(1.0))],
    ids=["sgd", "adamw", "adamw-decay", "adamw-clip"])
def test_outputs_named_on_the_nodes_make_the_renamed_model(block):
    model = optim.build_optimizer_model(block, SPECS)
    expected = _renamed_afterwards(block, SPECS)
    assert model.graph.SerializeToString() == expected.SerializeToString()
    # no Identity copies: each output is written by the node computing it
    assert not [n for n in model.graph.node if n.op_type == "Identity"]
    layout = json.loads(model.metadata_props[0].value)
    assert layout["parameters"] == ["w", "b", "dw"]


class _OldStyleRule(optim.SGD().update_rule().__class__):
    """A custom rule written before ``outputs`` existed: plain SGD."""

    def update(self, g, elem_type, param, grad, states, scalars):
        step = g.op("Mul", grad, scalars["learning_rate"])
        return g.op("Sub", param, step), ()


class _OldStyleRuleBlock(optim.SGD):
    def update_rule(self):
        return _OldStyleRule()


class _OldStyleBuildBlock(optim.SGD):
    """A custom block overriding build with the signature it had before."""

    def build(self, learning_rate, step=None, parameters=None, gradients=None,
              states=None):
        return super().build(learning_rate, step, parameters, gradients, states)


@pytest.mark.parametrize("block", [_OldStyleRuleBlock(), _OldStyleBuildBlock()],
                         ids=["old-rule", "old-build"])
def test_custom_blocks_without_outputs_get_their_outputs_renamed(block):
    model = optim.build_optimizer_model(block, SPECS)
    # the same model as the built-in SGD's (the same update, renamed)
    expected = optim.build_optimizer_model(optim.SGD(), SPECS)
    assert model.graph.SerializeToString() == expected.graph.SerializeToString()
    assert [o.name for o in model.graph.output] == ["w.updated", "b.updated",
                                                    "dw.updated"]
