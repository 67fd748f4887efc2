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

route_flex_attention() sends the models that ask for attn_implementation=
"flex_attention" to flashattn.flex_attention instead of torch's (which has no
backward on CPU): transformers builds the same BlockMask as before, and its
softcap and additive score mask become flashattn score_mods. What it cannot take
(dropout, attention sinks, a position_bias that takes a gradient) goes to
transformers' own flex function, counted in stats() as well.
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


_torch_flex_forward = None  # transformers' own flex_attention function while routed


def flex_attention_forward(module, query, key, value, attention_mask, scaling=None, softcap=None, s_aux=None,
                           position_bias=None, **kwargs):
    """transformers' "flex_attention" AttentionInterface function on flashattn.flex_attention:
    BNSD in, ((batch, seq, heads, head_dim), None) out."""
    from torch.nn.attention.flex_attention import BlockMask

    from . import score_mods
    from .torch.flex import flex_attention

    block_mask = attention_mask if isinstance(attention_mask, BlockMask) else None
    score_mask = None if block_mask is not None else attention_mask
    reason = None
    if kwargs.get("dropout", 0.0) > 0:
        reason = "dropout"
    elif s_aux is not None:
        reason = "sinks"
    elif position_bias is not None and position_bias.requires_grad and torch.is_grad_enabled():
        reason = "position_bias_grad"
    elif score_mask is not None and score_mask.dtype == torch.bool:
        reason = "bool_score_mask"
    if reason is not None:
        _count(reason)
        _verbose(f"transformers-flex,fallback:{reason}")
        return _torch_flex_forward(module, query, key, value, attention_mask, scaling=scaling, softcap=softcap,
                                   s_aux=s_aux, position_bias=position_bias, **kwargs)
    mods = []
    if softcap:
        mods.append(score_mods.softcap(float(softcap)))
    bias = None
    if score_mask is not None:
        bias = score_mask[:, :, :, : key.shape[-2]]
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    if bias is not None:
        mods.append(score_mods.bias(bias.detach()))
    _count(None)
    out = flex_attention(query, key, value, score_mod=score_mods.combine(*mods) if mods else None,
                         block_mask=block_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def route_flex_attention(on=True):
    """Routes transformers' attn_implementation="flex_attention" to flashattn (on=True)
    or back to transformers' own function (on=False), for every model of the process."""
    global _torch_flex_forward
    from transformers import AttentionInterface

    mapping = AttentionInterface._global_mapping
    if on and _torch_flex_forward is None:
        _torch_flex_forward = mapping["flex_attention"]
        AttentionInterface.register("flex_attention", flex_attention_forward)
    elif not on and _torch_flex_forward is not None:
        AttentionInterface.register("flex_attention", _torch_flex_forward)
        _torch_flex_forward = None
