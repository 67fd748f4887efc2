/*
 * traffic.c: the main-memory traffic model behind `bench --seqs` and
 * `bench --model-only` (documented again, with the numbers it predicts, in
 * bench/README.md).
 *
 * "Main memory" means beyond the per-core L2: the model counts the bytes a call
 * must fetch into the L2 and write back out of it, assuming each call starts
 * with none of its data cached (true once B*H heads of inputs exceed the caches,
 * as in every realistic shape) and that a buffer bigger than the L2 is evicted
 * between two passes over it (an LRU-like cache streaming a larger buffer keeps
 * none of it). Bytes are counted at the tensors' own dtype; the score matrix is
 * always fp32. It is a model of what the algorithm forces, not a measurement:
 * bench/cachegrind.sh checks it against a simulated cache.
 */
#define _POSIX_C_SOURCE 200809L

#include "traffic.h"

#include <string.h>
#include <unistd.h>

#include "measure.h"

/* sysconf's size of the level-2 or level-3 cache, or 0 where it has none to say. */
static int64_t cache_bytes(int level)
{
    long v = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    if (level == 2)
        v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
#if defined(_SC_LEVEL3_CACHE_SIZE)
    if (level == 3)
        v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return v > 0 ? (int64_t)v : 0;
}

int64_t cli_l2_bytes(void)
{
    const int64_t l2 = cache_bytes(2);
    return l2 > 0 ? l2 : (int64_t)2 << 20;
}

int64_t cli_llc_bytes(void)
{
    int64_t v = cache_bytes(3);
    if (v == 0)
        v = cache_bytes(2);
    return v > 0 ? v : (int64_t)32 << 20;
}

/*
 * Standard (src/algos/algo_standard.c), per (b, h) query head, one after the other:
 * it reads the head's Q, K and V once, writes its O once, and between those
 * makes these passes over the Sq x Sk fp32 matrix S (later P, in place):
 *
 *   pass                                  reads S   writes S
 *   qk:        S = scale Q K^T              -         1   (a write-only pass)
 *   scores:    fa_scores_finish, always     1         1   (masks, softcap, bias)
 *   softmax:   row maxima                   1         -
 *              exp(S - m), row sums         1         1
 *   normalise: P *= 1 / l                   1         1
 *   pv:        O = P V                      1         -
 *                                           5         4
 *
 * When S is larger than the L2 every pass streams it from memory and every
 * written pass writes it back; when S fits, none of that leaves the L2. Only
 * the qk pass stores to lines it did not read first, so a write-allocate cache
 * sees one S of store misses; the other three written passes miss on their read.
 * Not counted (each at most a few MiB per head, small next to S once S spills):
 * the f32 copies standard makes of f16/bf16 rows, its transposed Q panel and
 * its (Sq, Dv) output buffer.
 */
enum { STANDARD_S_READS = 5, STANDARD_S_WRITES = 4, STANDARD_S_WRITE_ONLY = 1 };

void cli_traffic_standard(const cli_shape *s, int64_t l2, cli_traffic *t)
{
    memset(t, 0, sizeof *t);
    const double e = (double)fa_dtype_size(s->dtype);
    const double heads = (double)s->batch * (double)s->heads;
    const double q = (double)s->seq * (double)s->dim * e;
    const double kv = (double)s->seq_kv * (double)(s->dim + s->dim_v) * e;
    const double o = (double)s->seq * (double)s->dim_v * e;
    t->s_bytes = (double)s->seq * (double)s->seq_kv * 4.0;
    t->resident = t->s_bytes <= (double)l2;
    const double spill = t->resident ? 0.0 : t->s_bytes;
    t->passes = t->resident ? 0.0 : STANDARD_S_READS;
    t->read_bytes = heads * (q + kv + STANDARD_S_READS * spill);
    t->write_bytes = heads * (o + STANDARD_S_WRITES * spill);
    t->write_miss_bytes = heads * (o + STANDARD_S_WRITE_ONLY * spill);
}

/*
 * Flash (src/algos/algo_flash.c) reads each query head's Q once and writes its O once
 * (a write-only pass); scores, probabilities and the accumulator stay in tiles
 * that live in the L2. K and V are what it re-reads: the rows in the band of
 * one q block (tile_q query rows; for a causal or windowed call only the rows
 * that block's masks keep) are read once per q block, i.e. ceil(Sq/tile_q)
 * times without a mask, unless they are still in the L2 from the previous q
 * block. The library hands tasks out round-robin over the heads (q block 0 of
 * every (b, h), then block 1, ...), so between two q blocks of one head every
 * other head's K/V passes through: K/V stays resident only when the K and V of
 * all B*Hk kv heads, plus one thread's tile scratch, fit in the L2 together.
 * Then each kv head's band is read once. For B = H = 1 that is the plain rule
 * "once if one head's K+V fits in L2, else once per q tile".
 */
void cli_traffic_flash(const cli_shape *s, int64_t l2, int64_t tile_q, int64_t workspace,
                       cli_traffic *t)
{
    memset(t, 0, sizeof *t);
    const double e = (double)fa_dtype_size(s->dtype);
    const double heads = (double)s->batch * (double)s->heads;
    const double kv_heads = (double)s->batch * (double)s->kv_heads;
    const double row = (double)(s->dim + s->dim_v) * e; /* one K row plus one V row */
    if (tile_q < 1)
        tile_q = 1;

    /* K/V rows each q block reads, summed over the blocks of one head; and the
     * rows any block reads at all (the band ends grow with i, so that is
     * [lo of row 0, hi of row Sq-1]). */
    double per_block_rows = 0.0;
    for (int64_t i0 = 0; i0 < s->seq; i0 += tile_q) {
        int64_t last = i0 + tile_q - 1 < s->seq - 1 ? i0 + tile_q - 1 : s->seq - 1;
        int64_t lo, hi, unused;
        cli_row_band(s, i0, &lo, &unused);
        cli_row_band(s, last, &unused, &hi);
        if (hi >= lo)
            per_block_rows += (double)(hi - lo + 1);
    }
    int64_t lo, hi, unused;
    cli_row_band(s, 0, &lo, &unused);
    cli_row_band(s, s->seq - 1, &unused, &hi);
    const double band_rows = hi >= lo ? (double)(hi - lo + 1) : 0.0;

    const double kv_all = kv_heads * (double)s->seq_kv * row;
    t->resident = kv_all + (double)workspace <= (double)l2;
    const double kv_read = t->resident ? kv_heads * band_rows * row : heads * per_block_rows * row;
    t->passes = band_rows > 0 ? (t->resident ? 1.0 : per_block_rows / band_rows) : 0.0;
    const double q = (double)s->seq * (double)s->dim * e;
    const double o = (double)s->seq * (double)s->dim_v * e;
    t->read_bytes = heads * q + kv_read;
    t->write_bytes = heads * o;
    t->write_miss_bytes = heads * o;
}
