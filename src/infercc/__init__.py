"""infercc: an ahead-of-time graph compiler and optimizer for ONNX models."""

from __future__ import annotations

__version__ = "0.1.0"
