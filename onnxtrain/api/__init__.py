"""Train from the artifacts of :func:`onnxtrain.onnxblock.artifacts.generate_artifacts`
on the plain onnxruntime package (the API of ``onnxruntime.training.api``).

- :class:`CheckpointState`: parameters, optimizer state and properties,
  loaded from and saved to a checkpoint file (format:
  :mod:`onnxtrain.checkpoint`, no pickle).
- :class:`Module`: runs the training model (loss and accumulated gradients)
  and the eval model; exports an inference model.
- :class:`Optimizer`: runs the optimizer model (SGD, AdamW).
- :class:`LinearLRScheduler`: linear warmup and decay of the learning rate.

Examples
--------
A training loop over the four artifacts::

    from onnxtrain import api
    state = api.CheckpointState.load_checkpoint("checkpoint")
    module = api.Module("training_model.onnx", state, "eval_model.onnx")
    optimizer = api.Optimizer("optimizer_model.onnx", module)
    for x, y in batches:
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
"""
from .module import Module
from .optimizer import LinearLRScheduler, Optimizer
from .state import CheckpointState, OptimizerState, Parameter

__all__ = ["CheckpointState", "LinearLRScheduler", "Module", "Optimizer",
           "OptimizerState", "Parameter"]
