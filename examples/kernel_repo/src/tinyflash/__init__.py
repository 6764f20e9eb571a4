"""tinyflash: a flash-attention forward kernel in Triton."""

from .attention import attention

__all__ = ["attention"]
