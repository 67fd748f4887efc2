"""flashattn.score_mods: the score_mods flashattn.flex_attention runs, as torch score_mods.

flex_attention takes no arbitrary score_mod callable (the library computes scores in
its own kernels, not by tracing Python), but the score modifications it has map onto
its arguments: softcap, an additive bias and ALiBi (docs/semantics.md, section 3).
Each factory returns a ScoreMod, which flashattn.flex_attention turns into those
arguments and which is also a plain torch score_mod, score_mod(score, b, h, q_idx,
kv_idx), so torch's own flex_attention runs the very same modification:

    mod = score_mods.combine(score_mods.softcap(30.0), score_mods.alibi(slopes))
    flashattn.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod=mod, block_mask=bm)

They apply in the library's order whatever the order given: softcap, then the bias,
then ALiBi.
"""

__all__ = ["ScoreMod", "softcap", "bias", "alibi", "combine"]


class ScoreMod:
    """softcap (0 = off), bias (None or a tensor broadcast to (B, H, Sq, Sk), 2-d to
    4-d: (Sq, Sk), (H, Sq, Sk) or (B|1, H|1, Sq, Sk)) and alibi_slopes (None or (H,)
    float32): score -> cap * tanh(score / cap) + bias[b, h, q, kv] - slope[h] * |q - kv|."""

    __slots__ = ("softcap", "bias", "alibi_slopes", "_cap")

    def __init__(self, softcap=0.0, bias=None, alibi_slopes=None):
        self.softcap = float(softcap)
        if self.softcap < 0 or self.softcap != self.softcap:
            raise ValueError(f"score_mods.softcap: the cap must be > 0, got {softcap}")
        if bias is not None:
            if not 2 <= bias.dim() <= 4:
                raise ValueError(f"score_mods.bias: a 2-d to 4-d tensor (.., Sq, Sk), got shape {tuple(bias.shape)}")
            while bias.dim() < 4:
                bias = bias.unsqueeze(0)
        if alibi_slopes is not None and alibi_slopes.dim() != 1:
            raise ValueError(f"score_mods.alibi: slopes must be (nheads,), got shape {tuple(alibi_slopes.shape)}")
        self.bias = bias
        self.alibi_slopes = alibi_slopes
        # the cap as a 0-d tensor for __call__: torch's flex_attention traces the
        # score_mod and refuses a captured float (it becomes a symbolic float)
        self._cap = None
        if self.softcap:
            import torch

            self._cap = torch.tensor(self.softcap, dtype=torch.float32)

    def __call__(self, score, b, h, q_idx, kv_idx):
        if self.softcap:
            cap = self._cap.to(score.dtype)
            score = cap * (score / cap).tanh()
        if self.bias is not None:
            t = self.bias
            score = score + t[b if t.shape[0] > 1 else 0, h if t.shape[1] > 1 else 0, q_idx, kv_idx].to(score.dtype)
        if self.alibi_slopes is not None:
            score = score - self.alibi_slopes[h].to(score.dtype) * (q_idx - kv_idx).abs().to(score.dtype)
        return score

    def __repr__(self):
        parts = []
        if self.softcap:
            parts.append(f"softcap={self.softcap}")
        if self.bias is not None:
            parts.append(f"bias={tuple(self.bias.shape)}")
        if self.alibi_slopes is not None:
            parts.append(f"alibi_slopes={tuple(self.alibi_slopes.shape)}")
        return f"ScoreMod({', '.join(parts)})"


def softcap(cap):
    """Gemma-2's logit softcap: score -> cap * tanh(score / cap), cap > 0."""
    if not cap > 0:
        raise ValueError(f"score_mods.softcap: the cap must be > 0, got {cap}")
    return ScoreMod(softcap=cap)


def bias(tensor):
    """An additive bias, score + tensor[b, h, q_idx, kv_idx] (per head, per batch row, or
    shared: extents of 1 broadcast). No gradient flows to it (flashattn gives none)."""
    return ScoreMod(bias=tensor)


def alibi(slopes):
    """ALiBi: score - slopes[h] * |q_idx - kv_idx|, slopes (nheads,) float32."""
    return ScoreMod(alibi_slopes=slopes)


def combine(*mods):
    """One ScoreMod of several, each kind at most once (applied softcap, bias, ALiBi)."""
    out = ScoreMod()
    for m in mods:
        if not isinstance(m, ScoreMod):
            raise ValueError(f"score_mods.combine: takes flashattn.score_mods objects, got {type(m).__name__}")
        for name in ("softcap", "bias", "alibi_slopes"):
            value = getattr(m, name)
            if name == "softcap" and not value or name != "softcap" and value is None:
                continue
            if (getattr(out, name) if name != "softcap" else out.softcap or None) is not None:
                raise ValueError(f"score_mods.combine: {name} given twice")
            setattr(out, name, value)
    return ScoreMod(out.softcap, out.bias, out.alibi_slopes)
