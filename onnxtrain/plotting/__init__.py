"""Draw ONNX graphs and loss curves; render ONNX graphs as text.

matplotlib is optional (``pip install onnxtrain[plot]``): importing this
package and :func:`onnx_to_text` work without it, the plot functions raise
an ImportError naming the extra.
"""
from .curves import plot_loss_curves
from .graph_plot import plot_onnxs
from .layout import GraphLayout, layout_onnx
from .text import onnx_to_text

__all__ = ["GraphLayout", "layout_onnx", "onnx_to_text", "plot_loss_curves", "plot_onnxs"]
