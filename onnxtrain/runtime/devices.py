"""Devices: parse "cpu", "cuda", "cuda:N" and check the execution provider."""
from __future__ import annotations

from dataclasses import dataclass

import onnxruntime

from ..exceptions import DeviceError

__all__ = ["Device", "parse_device"]


@dataclass(frozen=True)
class Device:
    """A device onnxruntime can place tensors on.

    Attributes
    ----------
    type : str
        "cpu" or "cuda".
    index : int
        Device ordinal (0 for the CPU).
    """

    type: str
    index: int = 0

    @property
    def providers(self):
        """Execution providers for a session on this device, in priority order."""
        if self.type == "cuda":
            return [("CUDAExecutionProvider", {"device_id": self.index}),
                    "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def __str__(self):
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"


def parse_device(device):
    """Parse ``device`` ("cpu", "cuda", "cuda:N" or a :class:`Device`).

    Raises
    ------
    DeviceError
        For an unknown device string, or "cuda" when the installed
        onnxruntime has no CUDAExecutionProvider (install ``onnxruntime-gpu``
        in place of ``onnxruntime``).
    """
    if isinstance(device, Device):
        return device
    text = str(device).strip().lower()
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise DeviceError(f"Unknown device {device!r}; expected 'cpu', 'cuda' "
                          "or 'cuda:N'.")
    if kind == "cpu":
        return Device("cpu", 0)
    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise DeviceError(
            f"device={device!r} needs onnxruntime's CUDAExecutionProvider, "
            f"which this installation lacks (available: {available}). "
            "Install onnxruntime-gpu in place of onnxruntime.")
    return Device("cuda", int(index or 0))
