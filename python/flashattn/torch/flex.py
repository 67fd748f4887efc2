"""flashattn.torch.flex: PyTorch's flex_attention on flashattn's block masks.

Owns:
  - flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa,
    return_lse), torch's signature and (B, H, S, D) layout, differentiable through the
    custom ops flashattn::flex_fwd and flashattn::flex_bwd (torch's own has no CPU
    backward);
  - the conversion of torch's BlockMask into the library's fa_block_mask
    (docs/semantics.md, "Block mask"): the kept kv blocks of each (batch, head, q
    block), full ones as they are, partial ones with element bits from the mask's
    mask_mod, evaluated once per partial block (vectorised over its q x k pairs),
    never over the whole Sq x Sk. A BlockMask's conversion is kept with it for the
    next call with the same shapes (a model calls every layer with one mask).
"""

import weakref

import torch

from .. import _core
from ..score_mods import ScoreMod
from . import _ops

__all__ = ["flex_attention", "to_library_mask"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# partial blocks whose mask_mod is evaluated at once: bounds the booleans held
_EVAL_PAIRS = 1 << 22


def _noop_mask():
    try:
        from torch.nn.attention.flex_attention import noop_mask
    except ImportError:  # pragma: no cover - torch without flex_attention
        return None
    return noop_mask


def _eval_mask_mod(mask_mod, b, h, q_idx, kv_idx):
    """mask_mod over P blocks: b, h (P,), q_idx (P, bq), kv_idx (P, bk) -> (P, bq, bk)
    bool, vmapped as torch's create_mask does (a mask_mod is written for scalars)."""
    fn = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
    fn = torch.vmap(fn, in_dims=(None, None, 0, None))
    fn = torch.vmap(fn, in_dims=(0, 0, 0, 0))
    return fn(b, h, q_idx, kv_idx).to(torch.bool)


def _pack(keep):
    """(P, bq, bk) bool -> (P * bq * ceil(bk / 8),) uint8, numpy's packbits(bitorder="little")."""
    P, bq, bk = keep.shape
    nb = (bk + 7) // 8
    if nb * 8 != bk:
        keep = torch.nn.functional.pad(keep, (0, nb * 8 - bk))
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    return (keep.reshape(P, bq, nb, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8).reshape(-1)


def _entries(num, idx, n_kv):
    """The listed kv blocks of every mask row, row by row: (row of each entry, kv block)."""
    rows = num.reshape(-1).to(torch.int64)
    idx = idx.reshape(rows.numel(), -1)
    width = idx.shape[1]
    if (rows < 0).any() or (rows > width).any():
        raise ValueError(f"flex_attention: BlockMask kv_num_blocks must be in [0, {width}] (its kv_indices' last extent)")
    listed = torch.arange(width)[None, :] < rows[:, None]
    row_of = torch.arange(rows.numel())[:, None].expand(-1, width)[listed]
    kv = idx[listed].to(torch.int64)
    if kv.numel() and (kv.min() < 0 or kv.max() >= n_kv):
        raise ValueError(f"flex_attention: BlockMask kv_indices must be in [0, {n_kv}) for {n_kv} kv blocks")
    return row_of, kv


def to_library_mask(block_mask, batch, heads, seqlen_q, seqlen_k, mask_mod=None):
    """torch's BlockMask as the binding's block_mask tuple (block_q, block_k, batch,
    heads, q_blocks, offsets int64, kv_blocks int32, partial int64 or None, bits uint8
    or None). block_mask's (B, H) must be (1 or batch, 1 or heads); its blocks count
    ceil(seqlen / block) on each side. mask_mod (default the mask's own) gives the
    partial blocks' bits; noop_mask makes them full."""
    bq, bk = (int(x) for x in block_mask.BLOCK_SIZE)
    num, idx = block_mask.kv_num_blocks, block_mask.kv_indices
    if num.dim() != 3 or idx.dim() != 4:
        raise ValueError("flex_attention: a BlockMask with (B, H, q_blocks) kv_num_blocks and (B, H, q_blocks, "
                         f"kv_blocks) kv_indices is needed, got {tuple(num.shape)} and {tuple(idx.shape)}")
    mb, mh, q_blocks = num.shape
    if mb not in (1, batch) or mh not in (1, heads):
        raise ValueError(f"flex_attention: the BlockMask is for (B, H) = ({mb}, {mh}), the call has ({batch}, "
                         f"{heads}): each must be 1 (broadcast) or the call's")
    want_q, n_kv = -(-seqlen_q // bq), -(-seqlen_k // bk)
    if q_blocks != want_q:
        raise ValueError(f"flex_attention: the BlockMask has {q_blocks} q blocks of {bq}, a query of {seqlen_q} rows "
                         f"needs {want_q}")
    if tuple(block_mask.seq_lengths) != (seqlen_q, seqlen_k):
        raise ValueError(f"flex_attention: the BlockMask was made for (Q_LEN, KV_LEN) = {tuple(block_mask.seq_lengths)}"
                         f", the call has ({seqlen_q}, {seqlen_k}); create_block_mask with the call's lengths")
    if num.device.type != "cpu":
        raise ValueError(f"flex_attention: the BlockMask is on {num.device}; flashattn runs on CPU tensors only")
    mask_mod = block_mask.mask_mod if mask_mod is None else mask_mod
    rows_p, kv_p = _entries(num, idx, n_kv)
    if block_mask.full_kv_num_blocks is not None:
        rows_f, kv_f = _entries(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_kv)
    else:
        rows_f = kv_f = torch.empty(0, dtype=torch.int64)
    all_partial = mask_mod is None or mask_mod is _noop_mask()
    # CSR: each row's full entries, then its partial ones (the order does not matter)
    row = torch.cat([rows_f, rows_p])
    kv = torch.cat([kv_f, kv_p])
    is_partial = torch.cat([torch.zeros(rows_f.numel(), dtype=torch.bool),
                            torch.ones(rows_p.numel(), dtype=torch.bool)])
    order = torch.sort(row, stable=True).indices
    row, kv, is_partial = row[order], kv[order], is_partial[order]
    n_rows = mb * mh * q_blocks
    offsets = torch.zeros(n_rows + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.bincount(row, minlength=n_rows), 0)
    if all_partial or not is_partial.any():
        return (bq, bk, mb, mh, q_blocks, offsets, kv.to(torch.int32).contiguous(), None, None)
    partial = torch.full((row.numel(),), -1, dtype=torch.int64)
    which = is_partial.nonzero().squeeze(1)
    partial[which] = torch.arange(which.numel(), dtype=torch.int64)
    # the partial blocks' element bits: mask_mod at each block's own (b, h, q, kv),
    # indices past the sequence clamped (their bits are never read)
    prow, pkv = row[which], kv[which]
    b = prow // (mh * q_blocks)
    h = (prow // q_blocks) % mh
    qb = prow % q_blocks
    q_idx = (qb[:, None] * bq + torch.arange(bq)[None, :]).clamp_(max=seqlen_q - 1)
    kv_idx = (pkv[:, None] * bk + torch.arange(bk)[None, :]).clamp_(max=seqlen_k - 1)
    chunk = max(1, _EVAL_PAIRS // (bq * bk))
    bits = torch.cat([_pack(_eval_mask_mod(mask_mod, b[s:s + chunk], h[s:s + chunk], q_idx[s:s + chunk],
                                           kv_idx[s:s + chunk])) for s in range(0, which.numel(), chunk)])
    return (bq, bk, mb, mh, q_blocks, offsets, kv.to(torch.int32).contiguous(), partial, bits)


# A BlockMask's conversion, kept with it (weakly) for the next call of the same shapes.
_converted = weakref.WeakKeyDictionary()


def _library_mask(block_mask, batch, heads, seqlen_q, seqlen_k):
    key = (batch, heads, seqlen_q, seqlen_k, block_mask.kv_num_blocks._version, block_mask.kv_indices._version)
    try:
        got = _converted.get(block_mask)
    except TypeError:  # not weakly referable: convert every time
        got = None
    if got is not None and got[0] == key:
        return got[1]
    lib = to_library_mask(block_mask, batch, heads, seqlen_q, seqlen_k)
    try:
        _converted[block_mask] = (key, lib)
    except TypeError:
        pass
    return lib


# ---------------------------------------------------------------- the custom ops
# The block mask travels as its four arrays and its five extents (an int list: [] when
# there is none); scale, softcap and the offsets that align ALiBi are the options
# flex_attention sets. out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) as flashattn::fwd's.
_SCHEMA_IN = ("Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? alibi_slopes, Tensor? offsets, "
              "Tensor? kv_blocks, Tensor? partial, Tensor? bits, int[] dims, float scale, float softcap, "
              "int q_start, int k_start")
torch.library.define("flashattn::flex_fwd", "(" + _SCHEMA_IN + ") -> (Tensor, Tensor)")
torch.library.define("flashattn::flex_bwd", "(Tensor dout, Tensor out, Tensor lse, " + _SCHEMA_IN +
                     ") -> (Tensor, Tensor, Tensor)")


def _call_parts(bias, alibi, offsets, kv_blocks, partial, bits, dims, scale, softcap, q_start, k_start, q, k, v):
    inputs = _ops._inputs(q, k, v, bias, None, alibi, None, None, None)
    opts = _core.Options(scale=scale, softcap=softcap, q_start=q_start, k_start=k_start)
    bm = None if not dims else tuple(dims) + (offsets, kv_blocks, partial, bits)
    return inputs, opts, bm


@torch.library.impl("flashattn::flex_fwd", "cpu")
def _flex_fwd(q, k, v, bias, alibi, offsets, kv_blocks, partial, bits, dims, scale, softcap, q_start, k_start):
    inputs, opts, bm = _call_parts(bias, alibi, offsets, kv_blocks, partial, bits, dims, scale, softcap, q_start,
                                   k_start, q, k, v)
    out, lse, _ = _ops._fwd_impl(inputs, opts, False, block_mask=bm)
    return out, lse


@torch.library.register_fake("flashattn::flex_fwd")
def _(q, k, v, *rest):
    B, Sq, Hq, _ = q.shape
    return q.new_empty((B, Sq, Hq, v.shape[3])), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@torch.library.impl("flashattn::flex_bwd", "cpu")
def _flex_bwd(dout, out, lse, q, k, v, bias, alibi, offsets, kv_blocks, partial, bits, dims, scale, softcap, q_start,
              k_start):
    inputs, opts, bm = _call_parts(bias, alibi, offsets, kv_blocks, partial, bits, dims, scale, softcap, q_start,
                                   k_start, q, k, v)
    dq, dk, dv, _ = _ops._bwd_impl(dout.contiguous(), inputs, out, lse, opts, block_mask=bm)
    return dq, dk, dv


@torch.library.register_fake("flashattn::flex_bwd")
def _(dout, out, lse, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    out, lse = output
    ctx.save_for_backward(*inputs[:9], out, lse)
    ctx.rest = inputs[9:]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    saved = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.flex_bwd(dout, saved[9], saved[10], *saved[:9], *ctx.rest)
    return (dq, dk, dv) + (None,) * 11


torch.library.register_autograd("flashattn::flex_fwd", _backward, setup_context=_setup)


# ---------------------------------------------------------------- flex_attention
def _score_parts(score_mod, q, k):
    """(bias, alibi slopes, softcap) of a flashattn ScoreMod; ValueError for anything else."""
    if score_mod is None:
        return None, None, 0.0
    if not isinstance(score_mod, ScoreMod):
        raise ValueError(
            "flashattn.flex_attention: score_mod must be None or a flashattn.score_mods object (softcap(cap), "
            "bias(tensor), alibi(slopes), or combine() of them): flashattn runs its own kernels and cannot trace "
            f"an arbitrary callable, got {getattr(score_mod, '__name__', type(score_mod).__name__)}")
    B, Hq, Sq, _ = q.shape
    Sk = k.shape[2]
    bias = score_mod.bias
    if bias is not None:
        if bias.requires_grad and torch.is_grad_enabled():
            raise ValueError("flashattn.flex_attention: a bias that requires grad is not supported: flashattn gives "
                             "no bias gradient")
        if bias.shape[0] not in (1, B) or bias.shape[1] not in (1, Hq) or tuple(bias.shape[2:]) != (Sq, Sk):
            raise ValueError(f"flashattn.flex_attention: score_mods.bias of shape {tuple(bias.shape)} does not "
                             f"broadcast to (B, H, Sq, Sk) = ({B}, {Hq}, {Sq}, {Sk})")
        bias = bias.detach()
    slopes = score_mod.alibi_slopes
    if slopes is not None:
        if slopes.numel() != Hq:
            raise ValueError(f"flashattn.flex_attention: score_mods.alibi needs {Hq} slopes, got {slopes.numel()}")
        slopes = slopes.detach().to(torch.float32).contiguous()
    return bias, slopes, score_mod.softcap


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention.flex_attention on flashattn.

    query (B, Hq, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev) CPU tensors of one
    float dtype (float32, float16, bfloat16); Hq != Hkv needs enable_gqa (Hq a multiple
    of Hkv). block_mask: torch's BlockMask (create_block_mask) for these (B|1, Hq|1, L,
    S), or None for every pair. score_mod: None or a flashattn.score_mods object
    (softcap, bias, ALiBi); an arbitrary callable raises ValueError. scale: default
    1/sqrt(E). Returns out (B, Hq, L, Ev), and with return_lse (or return_aux asking for
    lse) the natural-log logsumexp (B, Hq, L) float32 too; a row that keeps no key has
    out 0 and lse -inf. Differentiable in query, key and value (torch's own flex has no
    CPU backward). kernel_options is accepted and ignored (torch's Triton tiling)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"flashattn.flex_attention: {name} must be a 4-d (B, H, S, D) tensor")
        if x.device.type != "cpu":
            raise ValueError(f"flashattn.flex_attention: {name} is on {x.device}; flashattn runs on CPU tensors only")
        if x.dtype not in _FLOATS:
            raise ValueError(f"flashattn.flex_attention: {name} must be float32, float16 or bfloat16, got {x.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"flashattn.flex_attention: query, key and value must have one dtype, got {query.dtype}, "
                         f"{key.dtype}, {value.dtype}")
    B, Hq, Sq, E = query.shape
    Bk, Hk, Sk, _ = key.shape
    if Bk != B or value.shape[0] != B or value.shape[1] != Hk or value.shape[2] != Sk or key.shape[3] != E:
        raise ValueError(f"flashattn.flex_attention: shapes do not agree: query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)}")
    if Hq != Hk and not enable_gqa:
        raise ValueError(f"flashattn.flex_attention: query has {Hq} heads and key {Hk}: pass enable_gqa=True")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"flashattn.flex_attention: query heads ({Hq}) must be a multiple of key heads ({Hk})")
    want_lse = bool(return_lse)
    if return_aux is not None:
        if getattr(return_aux, "max_scores", False):
            raise ValueError("flashattn.flex_attention: return_aux max_scores is not supported (lse is)")
        want_lse = want_lse or bool(getattr(return_aux, "lse", False))
    bias, slopes, cap = _score_parts(score_mod, query, key)
    if block_mask is not None:
        if not all(hasattr(block_mask, a) for a in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "seq_lengths")):
            raise ValueError("flashattn.flex_attention: block_mask must be a torch BlockMask (create_block_mask), "
                             f"got {type(block_mask).__name__}")
        bm = _library_mask(block_mask, B, Hq, Sq, Sk)
        dims, arrays = list(bm[:5]), bm[5:]
    else:
        dims, arrays = [], (None,) * 4
    # ALiBi as torch's score_mod writes it, |q_idx - kv_idx|: the library's diagonal is
    # bottom-right, i + Sk - Sq, which position offsets move back to i
    q_start, k_start = (max(Sq - Sk, 0), max(Sk - Sq, 0)) if slopes is not None else (0, 0)
    s = 0.0 if scale is None else float(scale)
    if scale is not None and s == 0.0:
        raise ValueError("flashattn.flex_attention: scale 0 is not supported (flashattn reads 0 as 1/sqrt(E))")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views
    out, lse = torch.ops.flashattn.flex_fwd(q, k, v, bias, slopes, *arrays, dims, s, cap, q_start, k_start)
    out = out.transpose(1, 2)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        return out, AuxOutput(lse=lse if getattr(return_aux, "lse", False) else None)
    return (out, lse) if want_lse else out
