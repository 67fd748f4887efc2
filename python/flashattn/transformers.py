"""flashattn.transformers: flashattn as a Hugging Face transformers attention implementation.

register() adds "fa_cpu" to transformers' AttentionInterface (the documented
custom-attention contract: a function (module, query, key, value,
attention_mask, **kwargs) -> (attn_output (batch, seq, heads, head_dim),
attn_weights or None), queries and keys in (batch, heads, seq, head_dim)) and to
its AttentionMaskInterface with the sdpa mask builder, so the model hands it the
same masks (None when plain causal, else a bool mask) that SDPA gets. Then

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_cpu")

Why not the name "flashattn": transformers 5 takes every implementation name that
contains "flash" for a flash-attention kernel to be fetched from the Hub
(utils.generic.is_flash_attention_requested, then lazy_import_flash_attention),
and model construction fails with "Could not find the currently requested flash
attention implementation". register() still registers "flashattn" as an alias for
transformers versions without that rule, but "fa_cpu" is the name that works (and
is tested) with transformers 5.

runs every attention call, prefill and generate()'s KV-cached decoding, on
flashattn; calls it cannot take go to transformers' own sdpa function and are
counted in flashattn.torch.stats() like the SDPA fallbacks.
"""

import torch

from . import _core
from . import torch as _torch_side
from .torch import _count, _ops, _verbose, _why_not

NAME = "fa_cpu"
ALIASES = ("flashattn",)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """The AttentionInterface function: BNSD in, (batch, seq, heads, head_dim) out."""
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    gqa = query.shape[1] != key.shape[1]
    reason = _why_not(query, key, value, attention_mask, dropout, False, scaling, gqa)
    if reason is None and kwargs.get("output_attentions"):
        reason = "output_attentions"
    if reason is None and kwargs.get("position_bias") is not None:
        reason = "position_bias"
    if reason is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _count(reason)
        _verbose(f"transformers,fallback:{reason}")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    Sq, Sk = query.shape[2], key.shape[2]
    # With no mask the model means plain causal over the cache: the last query row
    # sees every key, i.e. bottom-right (equal to top-left when Sq == Sk).
    causal = _core.CAUSAL_BOTTOM_RIGHT if attention_mask is None and is_causal and Sq > 1 else _core.CAUSAL_NONE
    bias = mask = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:
            bias = attention_mask
    softcap = float(kwargs.get("softcap") or 0.0)
    window = (-1, -1)
    sw = kwargs.get("sliding_window")
    if sw is not None and attention_mask is None:
        # as transformers' flash-attention path: (sliding_window - 1) each side,
        # bottom-right aligned (the right side is moot under causal)
        window = (int(sw) - 1, int(sw) - 1)
    p = float(dropout)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if p > 0 else 0
    opts = _core.Options(scale=_core.scale_of(scaling), softcap=softcap, causal=causal, window_left=window[0],
                         window_right=window[1], dropout_p=p, dropout_seed=seed)
    # gpt-oss's attention sinks (one logit per head, passed as s_aux): a term of each
    # row's softmax normaliser with no value, the library's `sinks`; autograd reaches
    # the model's parameter through the f32 conversion
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if sinks is not None:
        sinks = sinks.to(torch.float32).contiguous()
    _count(None)
    if _torch_side._VERBOSE:
        _verbose(f"transformers,routed,dtype:{str(query.dtype).replace('torch.', '')},B:{query.shape[0]},"
                 f"Hq:{query.shape[1]},Hk:{key.shape[1]},Sq:{Sq},Sk:{Sk},D:{query.shape[3]},"
                 f"mask:{'none' if attention_mask is None else 'yes'}")
    # Inference (generate()): the binding reads BNSD itself; its (B, H, S, Dv) view of
    # a (B, S, H, Dv) buffer transposes back to that contiguous buffer.
    out = _ops.sdpa_lean(query, key, value, bias, mask, opts) if query.dim() == 4 and sinks is None else None
    if out is not None:
        return out.transpose(1, 2), None
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # BSND views
    out, _, _ = _ops.attention(q, k, v, bias, mask, None, None, None, opts, False, need_lse=False, checked=True,
                               sinks=sinks)
    return out, None


def register(name=NAME):
    """Registers `name` (default "fa_cpu", plus the alias "flashattn") with transformers'
    attention and mask interfaces; returns the name to pass as attn_implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for n in (name,) + tuple(a for a in ALIASES if a != name):
        AttentionInterface.register(n, attention_forward)
        AttentionMaskInterface.register(n, sdpa_mask)
    return name
