"""flashattn: exact FlashAttention for CPUs, from Python.

The flash-attn 2.x functions (flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache, ...) take NumPy arrays or torch tensors of any strides,
zero-copy; torch tensors are differentiable. flashattn.torch routes PyTorch's
scaled_dot_product_attention here; flashattn.transformers registers the
attn_implementation "flashattn" with Hugging Face transformers. Only NumPy is
required: torch is imported when a torch tensor arrives or flashattn.torch is.
"""

from . import _C
from ._core import Context, current_context
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    forward_work,
    merge_states,
    tune,
)

__version__ = _C.version()

__all__ = [
    "Context",
    "current_context",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "forward_work",
    "merge_states",
    "tune",
    "cpu_features",
    "cpu_model",
]


def cpu_features():
    """The CPU features the library detected, e.g. "sse2 avx2 fma f16c avx512f"."""
    return _C.cpu_features()


def cpu_model():
    """The CPU model the tune file's entries are keyed by, e.g. "AMD EPYC 9R14 96-Core Processor"."""
    return _C.cpu_model()
