#!/usr/bin/env python3
"""make_corpus.py: writes the seed corpus of fuzz_api.c into tests/fuzz/corpus/.

Each seed is one decoded program (see the reader in fuzz_api.c; a stream that runs out
reads as zeros): byte 0 picks the entry point (0 dense, 1 varlen, 2 contiguous cache,
3 paged cache, 4 merge, 5 the small calls), 8 bytes seed the value generator, then the
fields in the order the decoder reads them. Byte 0 = 6 (dense) or 7 (varlen), or
0x60..0x7F by parity, fuzzes fa_backward. Dropout fields come last in a branch's
program, so the seeds from before dropout keep their meaning. Rerun after changing the
decoder; the fuzzer's own corpus grows from these.
"""
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
RNG = [0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF1]
SPECIAL = {"0": 0xF0, "-1": 0xF1, "2^16": 0xF2, "2^31": 0xF3, "2^32": 0xF4, "3037000500": 0xF5,
           "2^56": 0xF6, "1.5*2^56": 0xF7, "2^59": 0xF8, "2^62": 0xF9, "MAX": 0xFA, "MIN": 0xFB}
ZERO_STRIDES = [0x80, 7 << 2]  # layout byte with the "weird" bit, then "all strides 0"
WIN = {"-1": 0, "0": 3, "1": 4, "2": 5, "3": 6, "7": 7, "MAX": 8, "MAX-1": 9, "2^61": 10, "2^62": 11}
POS = {"0": 0, "1": 3, "5": 4, "2^60": 5, "2^60+1": 6, "-1": 7}


def st(settings, tiles=(2, 3), splits=3, dot=1):
    """The settings byte and the bytes it asks for (tiles, KV splits, bf16 dot)."""
    b = [settings]
    if settings & 8:
        b += list(tiles)
    if settings & 16:
        b += [splits]
    if settings & 32:
        b += [dot]
    return b


def dense(settings=0, dims=(1, 4, 6, 1, 2, 8, 8), dt=0, dts=0, sigma=1, layouts=(0, 0, 0, 0), opt=0, extra=(),
          struct=0):
    b = [0] + RNG + st(settings) + list(dims) + [dt, dts, sigma]
    for lay in layouts:
        b += lay if isinstance(lay, list) else [lay]
    b += [opt] + list(extra) + [struct]
    return bytes(b)


def varlen(settings=0, n=3, cq=(2, 0, 5), cqbad=0, ck=(4, 3, 9), ckbad=0, hk=0, grp=1, D=16, Dv=8, dt=0,
           layouts=(0, 0, 0), olay=0, lselay=0, odt=0, nseq=0, opt=0, extra=(), struct=0):
    b = [1] + RNG + st(settings) + [n] + list(cq) + [cqbad, 0] + list(ck) + [ckbad, 0, hk, grp, D, Dv, dt]
    b += list(layouts) + [odt, olay, lselay, nseq, opt] + list(extra) + [struct]
    return bytes(b)


def cache(paged, settings=0, B=2, Sq=1, snew_on=1, snew=1, hk=1, grp=2, D=16, Dv=16, slots0_flag=0, slots0=6,
          slots1=24, qdt=0, cd=0, klay=0, vlay=0, scales=(), seq=(10, 3, 0, 0, 0, 0, 0, 0), table=None,
          max_pages=3, odt=0, newdt=(0, 0), opt=0, extra=()):
    b = [3 if paged else 2] + RNG + st(settings) + [B, Sq, snew_on] + ([snew] if snew_on & 3 else []) + [hk, grp, D, Dv]
    b += [slots0] if paged else [slots0_flag]
    b += [slots1, qdt, cd, klay, vlay] + list(scales)
    for s in seq:
        b += [s, 1]  # seqlen, batch_idx
    t = table if table is not None else list(range(1, 33))
    b += t
    if paged:
        b += [max_pages]
    b += [0]  # struct_size untouched
    b += [0, odt, 0, 0]  # q layout, o dtype, o layout, lse layout
    if (snew_on & 3 and snew) or cd & 0x10:
        b += [newdt[0], 0, newdt[1], 0]
    b += [opt] + list(extra)
    return bytes(b)


def merge(settings=0, n=1, dims=(2, 3, 2, 8), parts=None, opt=2, rest=()):
    b = [4] + RNG + st(settings) + [n] + list(dims)
    for p in parts or [(0, 0, 0, 0)] * 2:
        b += list(p)  # part dtype, part layout, lse dtype, lse layout
    b += [1, 0, 1, 0] + [opt] + list(rest)
    return bytes(b)


def drop(p=1, seed=0x10, offset=3, mask=0, seed64=None):
    """The dropout byte of rd_dropout and its fields: p indexes the table (1: 0.1, 2: 0.5,
    4: 0.999, 8: -0.1, 9: 1.0, 10: NaN, 13: the float below 1), mask 0x40/0x80."""
    d = p | mask | (0x10 if seed64 is not None else 0)
    b = [d] + (list(seed64.to_bytes(8, "little")) if seed64 is not None else [seed]) + [offset]
    return b


def bwd(varlen=False, settings=0, dims=(1, 5, 7, 1, 2, 8, 8), vl=None, dt=0, dts=0, sigma=1,
        layouts=(0, 0, 0, 0, 0), opt=0, extra=(), dropout=(0,), struct=0, grads=7, gdts=(0, 0, 0), glay=(0, 0, 0),
        do_lay=0, variant=0, vextra=()):
    """fuzz_backward: the forward as the dense or varlen branch reads it (q, k, v, o, lse
    layouts), opt (2 bias, 4 mask: dense only; 8 ALiBi; 16 scale; 32 softcap; 64 causal
    and windows; 128 positions; 1 a bad num_seqs for varlen), dropout, the forward's
    struct byte, then the grads byte (1 dq, 2 dk, 4 dv, 8 dO f32), dO's layout, per grad
    a dtype byte and a layout, and the variant byte (>= 0xC0: 0 fwd NULL, 1 lse NULL,
    2 KV cache, 3 long struct, 4 non-zero tail, 5 struct_size 0, 6 no dv, 7 any)."""
    b = [7 if varlen else 6] + RNG + st(settings)
    if varlen:
        n, cq, ck, hk, grp, D, Dv = vl
        b += [n] + list(cq) + [0, 0] + list(ck) + [0, 0, hk, grp, D, Dv]
    else:
        b += list(dims)
    b += [dt, dts, sigma]
    for lay in layouts:
        b += lay if isinstance(lay, list) else [lay]
    b += [opt] + list(extra) + list(dropout) + [struct]
    b += [grads]
    b += do_lay if isinstance(do_lay, list) else [do_lay]
    for x in range(3):
        if grads >> x & 1:
            b += (gdts[x] if isinstance(gdts[x], list) else [gdts[x]]) + (glay[x] if isinstance(glay[x], list) else [glay[x]])
    b += [variant] + list(vextra)
    return bytes(b)


VL = (3, (2, 0, 4), (5, 3, 6), 1, 1, 16, 8)

seeds = {
    "dense_basic": dense(opt=1, extra=[0]),
    "dense_f16_masks": dense(dims=(2, 5, 9, 2, 2, 24, 16), dt=1, opt=1 | 2 | 4 | 64,
                             extra=[0, 0, 0, 1, 0, 1, WIN["2"], WIN["1"]]),
    "dense_bf16_alibi": dense(dims=(1, 6, 7, 1, 4, 16, 16), dt=2, dts=1, opt=1 | 8 | 16 | 32 | 128,
                              extra=[0, 1, 0, 1, 2, POS["5"], POS["1"]]),
    "dense_huge_D": dense(dims=(1, 1, 1, 1, 1, SPECIAL["1.5*2^56"], SPECIAL["1.5*2^56"]),
                          layouts=(ZERO_STRIDES,) * 4),
    "dense_2e16": dense(dims=(SPECIAL["2^16"], SPECIAL["2^16"], SPECIAL["2^16"], SPECIAL["2^16"], 1,
                              SPECIAL["2^16"], SPECIAL["2^16"]), layouts=(ZERO_STRIDES,) * 4),
    "dense_standard_tasks": dense(settings=2 | 4 | 1, dims=(SPECIAL["2^32"], 1, 1, SPECIAL["2^32"], 1, 1, 1),
                                  layouts=(ZERO_STRIDES,) * 4),
    "dense_empty_keys": dense(dims=(2, 3, 0, 1, 2, 8, 8), opt=1 | 64, extra=[0, 1, WIN["-1"], WIN["-1"]]),
    "dense_empty_batch": dense(dims=(0, 3, 4, 1, 1, 8, 0), opt=1, extra=[0]),
    "dense_window_max": dense(dims=(1, 7, 5, 1, 1, 8, 8), opt=1 | 64, extra=[0, 0, WIN["MAX"], WIN["-1"]]),
    "dense_strided": dense(dims=(2, 5, 6, 2, 1, 12, 10), dt=1, dts=1, layouts=(1, 2, 3 | 4, 0x10 | (1 << 5)),
                           opt=1, extra=[1]),
    "dense_old_struct": dense(opt=128, extra=[POS["5"], POS["0"]], struct=0xE0),
    "dense_bad_tail": dense(struct=0xE3),
    "dense_threads_tiles": dense(settings=1 | 8 | 16, dims=(1, 17, 40, 2, 2, 64, 64), opt=1 | 64,
                                 extra=[0, 0, WIN["-1"], WIN["-1"]]),
    "varlen_basic": varlen(opt=1, extra=[1]),
    "varlen_empty_seqs": varlen(n=5, cq=(0, 3, 0, 2, 0), ck=(5, 0, 2, 0, 3), opt=1 | 2 | 16,
                                extra=[1, WIN["3"], WIN["0"]]),
    "cache_contig": cache(0, snew_on=0, snew=0),
    "cache_append_f16": cache(0, cd=1 | 0x20, qdt=0, Sq=2),
    "cache_paged_append": cache(1, cd=0, slots0=8, slots1=4),
    "cache_paged_int8": cache(1, cd=3, slots0=8, slots1=5, scales=(0, 0)),
    "cache_int8_decode": cache(0, settings=16, extra=(), cd=3, scales=(0, 0), grp=4, D=64, Dv=64),
    "cache_f8e4m3_decode": cache(0, settings=16, extra=(), cd=3 | 0x04, scales=(0, 0), grp=4, D=64, Dv=64),
    "cache_paged_f8e5m2": cache(1, cd=3 | 0x08, slots0=8, slots1=5, scales=(0, 0)),
    "cache_f8e4m3_shared_scale": cache(0, cd=3 | 0x04, scales=ZERO_STRIDES + ZERO_STRIDES, Sq=2),
    "merge_two": merge(n=1),
    "merge_n4_dv55": merge(n=3, dims=(1, 2, 2, 55), parts=[(0, 0, 0, 0)] * 4),
    "merge_in_place": merge(n=2, dims=(2, 2, 1, 1), parts=[(0, 0, 0, 0)] * 3, opt=1),
    # dropout in the forward branches (the byte after the struct byte)
    "dense_dropout_mask": dense(dims=(2, 5, 9, 1, 2, 16, 8), opt=1 | 64, extra=[0, 1, WIN["-1"], WIN["-1"]])[:-1]
    + bytes([0] + drop(p=2, mask=0x40) + [0]),
    "dense_dropout_pos_f16": dense(dims=(1, 4, 12, 2, 1, 8, 8), dt=1, opt=1 | 128, extra=[0, POS["5"], POS["1"]])[:-1]
    + bytes([0] + drop(p=1, seed64=0x123456789ABCDEF0) + [0]),
    "dense_dropout_near1": dense(dims=(1, 3, 6, 1, 1, 8, 8), opt=1, extra=[0])[:-1] + bytes([0] + drop(p=13)),
    "dense_dropout_nan": dense(opt=1, extra=[0])[:-1] + bytes([0] + drop(p=10)),
    "dense_dropout_one": dense(opt=1, extra=[0])[:-1] + bytes([0] + drop(p=9)),
    "dense_dropout_neg": dense(opt=1, extra=[0])[:-1] + bytes([0] + drop(p=8)),
    "dense_dropout_old_struct": dense(opt=1, extra=[0])[:-1] + bytes([0xE8] + drop(p=2)),
    "varlen_dropout": varlen(settings=1, opt=1, extra=[1])[:-1] + bytes([0] + drop(p=2)),
    "varlen_dropout_mask": varlen(opt=1, extra=[1])[:-1] + bytes([0] + drop(p=1, mask=0x40)),
    "cache_dropout": cache(0, snew_on=0, snew=0) + bytes(drop(p=1)),
    "cache_dropout_nan": cache(0, snew_on=0, snew=0) + bytes(drop(p=10)),
    # MLA latent caches (v_in_k): after the dropout byte, the mla byte (1 on, 2 cache v as
    # K's view, 4 new v as k's view, 8 v_scale = k_scale, 0x10 a v not K's, 0x80 bad value)
    "cache_mla_append": cache(0, grp=4, D=24, Dv=16) + bytes([0, 1 | 2 | 4]),
    "cache_mla_empty_v": cache(0, grp=4, D=24, Dv=16) + bytes([0, 1]),
    "cache_mla_paged_int8": cache(1, cd=3, slots0=8, slots1=5, scales=(0, 0), D=20, Dv=12) + bytes([0, 1 | 8]),
    "cache_mla_not_view": cache(0, D=24, Dv=16) + bytes([0, 1 | 0x10]),
    "cache_mla_dv_over_d": cache(0, D=8, Dv=16) + bytes([0, 1 | 2]),
    "cache_mla_bad_flag": cache(0, D=24, Dv=16) + bytes([0, 0x80]),
    # fa_backward
    "bwd_basic": bwd(),
    "bwd_f32_2threads": bwd(settings=1, dims=(2, 9, 17, 2, 2, 24, 16)),
    "bwd_f16_causal": bwd(dt=1, opt=64 | 16, extra=[1, 1, WIN["-1"], WIN["-1"]]),
    "bwd_bf16_dq_f32": bwd(dt=2, dims=(1, 6, 10, 1, 4, 16, 16), gdts=(1, 1, 1), opt=32, extra=[2]),
    "bwd_bias_mask_alibi": bwd(dims=(2, 4, 6, 1, 2, 8, 8), opt=2 | 4 | 8 | 128,
                               extra=[2, 0, 0, 0, 1, POS["1"], POS["5"]]),
    "bwd_dropout": bwd(dims=(1, 6, 9, 2, 2, 16, 8), opt=64, extra=[0, WIN["3"], WIN["1"]], dropout=drop(p=1)),
    "bwd_dropout_near1": bwd(dropout=drop(p=4)),
    "bwd_dropout_invalid": bwd(dropout=drop(p=9)),
    "bwd_only_dk": bwd(grads=2),
    "bwd_none": bwd(grads=0),
    "bwd_strided": bwd(dt=1, dts=1, layouts=(1, 2, 3 | 4, 0x10 | (1 << 5), 0), grads=7 | 8, do_lay=1,
                       glay=(2, 1, 0x10)),
    "bwd_zero_strides_dk": bwd(grads=7, glay=(0, ZERO_STRIDES, 0)),
    "bwd_wrong_dtype": bwd(gdts=(0, [2, 0xF0], 3), dt=1),
    "bwd_dk_bf16_of_f16": bwd(gdts=(0, [2, 2], 0), dt=1),
    "bwd_wrong_shape": bwd(glay=(0, 0, [0x80, 3 << 2 | 1, 3])),
    "bwd_empty_keys": bwd(dims=(2, 3, 0, 1, 2, 8, 8)),
    "bwd_empty_queries": bwd(dims=(1, 0, 5, 1, 1, 8, 8)),
    "bwd_huge_zero_strides": bwd(dims=(SPECIAL["2^32"], 1, 1, SPECIAL["2^32"], 1, 1, 1), layouts=(ZERO_STRIDES,) * 5,
                                 grads=0),
    "bwd_standard": bwd(settings=4 | 2 | 1, dims=(1, 5, 7, 2, 1, 8, 8)),
    "bwd_fwd_null": bwd(variant=0xC0),
    "bwd_lse_null": bwd(variant=0xC1),
    "bwd_kv_cache": bwd(variant=0xC2),
    "bwd_long_struct": bwd(variant=0xC3),
    "bwd_bad_tail": bwd(variant=0xC4, vextra=[5]),
    "bwd_struct_zero": bwd(variant=0xC5),
    "bwd_no_dv": bwd(variant=0xC6),
    "bwd_fwd_old_struct": bwd(struct=0xE0),
    "bwd_varlen": bwd(varlen=True, vl=VL),
    "bwd_varlen_dropout": bwd(varlen=True, vl=(4, (3, 0, 2, 4), (4, 2, 0, 6), 2, 2, 8, 8), dropout=drop(p=2),
                              settings=1),
    "bwd_varlen_causal_alibi": bwd(varlen=True, vl=VL, opt=8 | 64, extra=[1, 1, WIN["2"], WIN["-1"]]),
    "bwd_varlen_bad_count": bwd(varlen=True, vl=VL, opt=1),
    "bwd_varlen_dropout_mask": bwd(varlen=True, vl=VL, dropout=drop(p=1, mask=0x40) + [0]),
    # attention sinks: the byte after the dropout fields (after the variant byte in a
    # backward program); 0x80 reads one table index per head (14 NaN, 15 +inf)
    "dense_sinks": dense(dims=(2, 5, 9, 1, 2, 16, 8), opt=1 | 64, extra=[0, 1, WIN["-1"], WIN["-1"]]) + bytes([0, 5]),
    "dense_sinks_window_f16": dense(dims=(1, 7, 12, 2, 2, 16, 16), dt=1, opt=1 | 64, extra=[0, 0, WIN["3"], WIN["1"]])
    + bytes([0, 9]),
    "dense_sinks_inf": dense(opt=1, extra=[0]) + bytes([0, 0x80, 0, 15]),
    "dense_sinks_nan": dense(opt=1, extra=[0]) + bytes([0, 0x80, 14, 1]),
    "dense_sinks_old_struct": dense(opt=1, extra=[0])[:-1] + bytes([0xE9, 0, 0x80, 15, 15]),
    "dense_sinks_dropout": dense(dims=(1, 4, 8, 1, 2, 8, 8), opt=1, extra=[0]) + bytes(drop(p=2) + [12]),
    "varlen_sinks": varlen(settings=1, opt=1, extra=[1]) + bytes([0, 7]),
    # a cache program reads the dropout, MLA and leftpad bytes before the sinks byte
    "cache_sinks": cache(0) + bytes([0, 0, 0, 9]),
    "cache_sinks_split": cache(0, settings=16) + bytes([0, 0, 0, 5]),
    "paged_sinks": cache(1) + bytes([0, 0, 0, 3]),
    "cache_mla_sinks": cache(0, grp=4, D=24, Dv=16) + bytes([0, 1 | 2 | 4, 0, 0x80, 3, 14, 0, 1]),
    "cache_fp8_sinks_split": cache(0, settings=16, cd=3 | 0x04, scales=(0, 0), grp=4, D=32, Dv=32)
    + bytes([0, 0, 0, 7]),
    # leftpad (the byte after the MLA byte, >= 0xC0 on, then one byte per sequence slot:
    # x % (seqlen + 1), 0xFC a pad past the sequence, 0xFD -1, both refused)
    "cache_leftpad": cache(0, seq=(10, 7, 0, 0, 0, 0, 0, 0)) + bytes([0, 0, 0xC0, 3, 5, 0, 0, 0, 0, 0, 0]),
    "cache_leftpad_sinks_split": cache(0, settings=16, seq=(10, 7, 0, 0, 0, 0, 0, 0))
    + bytes([0, 0, 0xC0, 4, 1, 0, 0, 0, 0, 0, 0, 5]),
    "cache_leftpad_too_long": cache(0) + bytes([0, 0, 0xC0, 0xFC, 0, 0, 0, 0, 0, 0, 0]),
    "cache_leftpad_negative": cache(0) + bytes([0, 0, 0xC0, 0, 0xFD, 0, 0, 0, 0, 0, 0]),
    "paged_leftpad_refused": cache(1) + bytes([0, 0, 0xC0, 1, 1, 0, 0, 0, 0, 0, 0]),
    "bwd_sinks": bwd(dims=(1, 6, 9, 2, 2, 16, 8), opt=64, extra=[1, WIN["-1"], WIN["-1"]]) + bytes([5]),
    "bwd_sinks_inf": bwd() + bytes([0x80, 0, 15]),
    "bwd_varlen_sinks": bwd(varlen=True, vl=VL, settings=1) + bytes([11]),
    # block masks: the byte after the sinks byte, then block sizes, kept and partial shares
    # (bits 0, 1: per batch row, per head; bits 2-4: one spoilt field the call must refuse)
    "dense_block_mask": dense(dims=(2, 9, 13, 1, 2, 16, 8), opt=1 | 64, extra=[0, 1, WIN["-1"], WIN["-1"]])
    + bytes([0, 0, 3, 3, 4, 180, 120]),
    "dense_block_mask_sinks_bf16": dense(dims=(1, 12, 20, 2, 2, 16, 16), dt=2, opt=1 | 4, extra=[0, 0])
    + bytes([0, 5, 2, 7, 9, 200, 60]),
    "dense_block_mask_bad_index": dense(opt=1, extra=[0]) + bytes([0, 0, 1 | (2 << 2), 1, 2, 255, 100]),
    "dense_block_mask_duplicate": dense(opt=1, extra=[0]) + bytes([0, 0, 3 << 2, 1, 1, 255, 0]),
    "dense_block_mask_bad_batch": dense(dims=(2, 4, 6, 1, 2, 8, 8), opt=1, extra=[0]) + bytes([0, 0, 7 << 2, 1, 2, 128, 128]),
    "misc": bytes([5] + RNG + [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 3, 2, 2, 2, 2, 1, 1, 1, 1]),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
