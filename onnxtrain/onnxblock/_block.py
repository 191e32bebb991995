"""Block, ForwardBlock and TrainingBlock."""
from __future__ import annotations

import abc

import onnx

from ._base import current_base
from ._training import build_training_models, set_graph_outputs

__all__ = ["Block", "ForwardBlock", "TrainingBlock"]


def _as_names(output):
    """The tensor names a ``build`` returned, as a list."""
    names = list(output) if isinstance(output, (list, tuple)) else [output]
    bad = [n for n in names if not isinstance(n, str)]
    if bad or not names:
        raise TypeError(f"build() must return a tensor name or a sequence of "
                        f"tensor names, not {output!r}.")
    return names


class Block(abc.ABC):
    """Base class of the blocks stacked on top of each other.

    A block takes tensor names, appends nodes to the base model set by
    ``with onnxblock.base(model):`` (or ``empty_base()``) and returns the
    names of the tensors it produced. Subclasses implement :meth:`build`;
    they may also edit :attr:`base` directly.

    Parameters
    ----------
    temp_file_name : str, default="temp.onnx"
        Accepted for compatibility with onnxruntime's onnxblock; unused
        (onnxtrain never writes temporary files).

    Notes
    -----
    Unlike onnxruntime's onnxblock, calling a block does not run the ONNX
    checker on the whole model: :class:`ForwardBlock` and
    :class:`TrainingBlock` check the finished models once.
    """

    def __init__(self, temp_file_name="temp.onnx"):
        self._temp_file_name = temp_file_name

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Append this block's nodes on top of the input names; return the
        output name(s)."""

    def __call__(self, *args, **kwargs):
        """Append this block's nodes to the current base model.

        Brings the base model up to date with the nodes earlier blocks
        added, then calls :meth:`build` with the same arguments.

        Parameters
        ----------
        *args, **kwargs
            Passed to :meth:`build`: usually the names of tensors of the
            base model (str) and the block's options.

        Returns
        -------
        str or tuple of str
            What :meth:`build` returned: the name(s) of the tensor(s) the
            block produced, to pass to the next block.

        Raises
        ------
        RuntimeError
            Outside ``with onnxblock.base(model):`` or
            ``with onnxblock.empty_base():``.
        """
        current_base().sync()
        return self.build(*args, **kwargs)

    @property
    def base(self):
        """onnx.ModelProto: the base model of the enclosing ``with`` block."""
        return current_base().model

    def infer_shapes_on_base(self):
        """Run ONNX shape inference on (a copy of) the base model.

        Returns
        -------
        onnx.ModelProto
            The shape-inferred copy; the base model is not modified.
        """
        return onnx.shape_inference.infer_shapes(self.base)

    # helpers for subclasses ------------------------------------------------
    @staticmethod
    def _state():
        return current_base()


class ForwardBlock(Block):
    """A block whose ``build`` output names become the graph outputs.

    Calling the block builds the forward model; :meth:`to_model_proto`
    returns it.
    """

    def __init__(self):
        super().__init__()
        self._model = None

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Stack blocks on the inputs; return the graph output name(s)."""

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        state = current_base()
        set_graph_outputs(state, _as_names(output))
        onnx.checker.check_model(state.model)
        self._model = onnx.ModelProto()
        self._model.CopyFrom(state.model)
        return output

    def to_model_proto(self):
        """The forward model.

        Returns
        -------
        onnx.ModelProto
            The base model with the block's nodes, whose outputs are those
            ``build`` returned (checked by :func:`onnx.checker.check_model`).

        Raises
        ------
        RuntimeError
            If the block was not called yet.
        """
        if getattr(self, "_model", None) is None:
            raise RuntimeError("The forward model is not built yet: call the "
                               "block inside `with onnxblock.base(model):`.")
        return self._model


class TrainingBlock(Block):
    """A block whose first output is the loss backpropagation starts from.

    Calling the block builds the training model (forward, gradient and
    gradient-accumulation nodes, standard ONNX ops only) and the eval model.
    Nothing is trainable by default: mark parameters with
    :meth:`requires_grad` (with none marked, the training model computes
    the outputs without gradients).

    Notes
    -----
    The training model's layout:

    inputs
        the user inputs (those of the base model and the targets the loss
        blocks created), the parameters (trainable and frozen, in the order
        of the base model's initializers), one gradient-accumulation buffer
        ``<param>_grad.accumulation.buffer`` per trainable parameter, and a
        rank-0 bool ``lazy_reset_grad``.
    outputs
        the names ``build`` returned (the loss first), then one
        ``<param>_grad.accumulation.out`` per trainable parameter, equal to
        ``Where(lazy_reset_grad, grad, buffer + grad)`` (then the same for
        the graph inputs marked by :meth:`requires_grad`).

    The eval model has the same user inputs and parameters, no buffers, the
    same first outputs, and Dropout/BatchNormalization in inference mode.
    """

    def __init__(self):
        super().__init__()
        self._grad_flags = {}
        self._result = None

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Stack blocks on the inputs; return the loss name (then, optionally,
        more names to output)."""

    def requires_grad(self, argument_name, value=True):
        """Mark an initializer of the base model as a parameter, or ask for
        the gradient of a graph input.

        Parameters
        ----------
        argument_name : str
            Name of an initializer or a float graph input of the base model
            (checked when the block is called).
        value : bool, default=True
            True: a trainable parameter (its gradient is computed). False: a
            frozen parameter (an input of the models, stored in the
            checkpoint, never updated). For a graph input, True adds the
            ``<input>_grad.accumulation.buffer`` input and the
            ``<input>_grad.accumulation.out`` output (its accumulated
            gradient); False does nothing.
        """
        if not hasattr(self, "_grad_flags"):
            self._grad_flags = {}
        self._grad_flags[str(argument_name)] = bool(value)

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        flags = getattr(self, "_grad_flags", {})
        trainable = [n for n, v in flags.items() if v]
        frozen = [n for n, v in flags.items() if not v]
        state = current_base()
        self._result = build_training_models(state, _as_names(output),
                                             trainable, frozen)
        return output

    def _built(self):
        result = getattr(self, "_result", None)
        if result is None:
            raise RuntimeError("The training model is not built yet. Please "
                               "build the training model first before trying "
                               "to retrieve the parameters. Call the block "
                               "inside `with onnxblock.base(model):`.")
        return result

    def parameters(self):
        """Trainable and frozen parameters, as they were in the base model.

        Returns
        -------
        trainable_params : list of onnx.TensorProto
        frozen_params : list of onnx.TensorProto

        Raises
        ------
        RuntimeError
            If the block was not called yet.
        """
        result = self._built()
        return list(result.trainable), list(result.frozen)

    def to_model_proto(self):
        """The training and eval models.

        Returns
        -------
        training_model : onnx.ModelProto
        eval_model : onnx.ModelProto

        Raises
        ------
        RuntimeError
            If the block was not called yet.
        """
        result = self._built()
        return result.training_model, result.eval_model
