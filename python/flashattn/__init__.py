"""flashattn: exact FlashAttention for CPUs, from Python.

The flash-attn 2.x functions (flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache, ...) take NumPy arrays or torch tensors of any strides,
zero-copy; torch tensors are differentiable. flashattn.torch routes PyTorch's
scaled_dot_product_attention here; flashattn.transformers registers the
attn_implementation "flashattn" with Hugging Face transformers; flex_attention
is torch's FlexAttention (a BlockMask, flashattn.score_mods) on the library's
block masks. Only NumPy is required: torch is imported when a torch tensor
arrives or flashattn.torch is.
"""

from . import _C, score_mods
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
    "flex_attention",
    "score_mods",
    "cpu_features",
    "cpu_model",
]


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None):
    """torch's flex_attention (B, H, S, D) with a BlockMask, on flashattn's block masks:
    see flashattn.torch.flex.flex_attention (imports torch)."""
    from .torch.flex import flex_attention as flex

    return flex(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options,
                return_aux=return_aux)


def cpu_features():
    """The CPU features the library detected, e.g. "sse2 avx2 fma f16c avx512f"."""
    return _C.cpu_features()


def cpu_model():
    """The CPU model the tune file's entries are keyed by, e.g. "AMD EPYC 9R14 96-Core Processor"."""
    return _C.cpu_model()
