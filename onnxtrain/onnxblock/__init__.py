"""Build ONNX models by stacking blocks (the API of onnxruntime's onnxblock).

Blocks take tensor names and return tensor names; they edit the base model
set by ``with onnxblock.base(model):`` or ``with onnxblock.empty_base():``
(held in a context variable). :class:`TrainingBlock` turns the base model and
a loss into a training model and an eval model that run on the plain
onnxruntime package (standard ONNX ops only). Submodules: :mod:`.blocks`,
:mod:`.loss`, :mod:`.optim`; :func:`save_checkpoint` and
:func:`load_checkpoint_to_model` write and read parameters.

Examples
--------
>>> import onnxtrain.onnxblock as onnxblock
>>> class MyTrainingBlock(onnxblock.TrainingBlock):
...     def __init__(self):
...         super().__init__()
...         self.loss = onnxblock.loss.MSELoss()
...     def build(self, output_name):
...         return self.loss(output_name)
"""
from . import blocks, loss, optim
from ._base import base, current_base, empty_base
from ._block import Block, ForwardBlock, TrainingBlock
from .checkpoint_utils import load_checkpoint_to_model, save_checkpoint

__all__ = ["Block", "ForwardBlock", "TrainingBlock", "base", "empty_base",
           "current_base", "blocks", "loss", "optim", "save_checkpoint",
           "load_checkpoint_to_model"]
