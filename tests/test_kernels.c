/*
 * test_kernels.c: the micro-kernel tables, tested directly, call by call. Every table in
 * the registry that runs on this CPU (the others are named and skipped) gets the same
 * inputs as the scalar reference table, and both are held to an fp64 computation of the
 * contract in src/kernels/kernels.h:
 *   pack_qt, pack_qt_bf16   bitwise (one float multiply; pure copies)
 *   f32_to_f16, f32_to_bf16 bitwise vs the reference around every 16-bit value, ties, NaNs
 *   f16_to_f32, bf16_to_f32 all 65536 inputs bitwise vs the reference (an f16 signalling
 *                           NaN may come back quieted), plus short misaligned rows
 *   qk, pv, qk_bf16, pv_bf16  within (DOT_ULPS + sqrt(terms)) x FLT_EPSILON x sum|terms|
 *                           (TOLERANCES); a NaN/inf in K poisons only its column, a NaN
 *                           p or alpha only its row
 *   ds, stx, stx_bf16       the same bound (ds: 2 terms); ds gives exactly 0 where p == 0
 *   (backward)              even for dp = +-inf/NaN; a NaN st poisons only its acc row;
 *                           stx_bf16's rounding of st bitwise (ties, NaN, overflow to inf)
 *   softmax                 m exact; p and alpha within the path's stated exp accuracy;
 *                           l within that plus the worst-case summation bound; bands
 *                           (empty rows too), incoming m = -inf / finite / NaN, NaN and
 *                           +-inf scores, underflow
 *   exp                     through softmax (one kept column, m = 0, so p = exp(x)) over a
 *                           dense sweep of [-87.3, 0]: <= 4 ulps vs double exp, printed
 *   the tables themselves   no entry is NULL; a table inherits from its parent every entry
 *                           it does not override (kernels.h), the parent sits later in the
 *                           registry and the chain ends at ref; flags, blocking
 *   the pool's thread hooks called around every thread's share, thread 0 included
 * Sizes run over rows 1..300, cols 1..600, d/dv 1..512 (edges and odd sizes favoured),
 * K/V with odd, zero and negative leading dimensions and unaligned starts. Every buffer a
 * kernel writes sits between guard zones and carries sentinels wherever the contract says
 * "do not touch", checked after each call; inputs must come back unchanged; exact-size
 * input allocations let ASan (the sanitizer build) catch over-reads.
 *
 * Legend: r < rows query rows, c < cols key columns, x < d head dim of q/k, e < dv head
 * dim of v; qt (d, ldqt), st (cols, ldst), k (cols, ldk), v (cols, ldv), acc (rows, ldacc),
 * qt2 (ceil(d/2), ldqt2) bf16 pairs.
 *
 * This program needs the library's internals: it links flashattn_objects and includes
 * src/kernels/kernels.h. FA_TEST_SEED changes the random cases; FA_TEST_SCALE the count.
 */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/amx/amx_tile.h"
#include "kernels/kernels.h"
#include "threadpool.h"

#include <pthread.h>

/* ------------------------------------------------------------ TOLERANCES */

/*
 * qk, pv and the bf16 forms sum n <= 600 products in fp32, in an order each kernel
 * chooses (register blocks, partial sums, FMA). Any order is within (n-1) * 2^-24 *
 * sum|terms| of the exact sum, but that worst case needs every rounding error to line
 * up; in practice the errors add like a random walk, and
 *   |got - exact| <= (DOT_ULPS + sqrt(n)) * FLT_EPSILON * sum|terms| + FLT_MIN
 * holds (Higham and Mary's probabilistic bound, lambda*sqrt(n)*u, with room to spare),
 * sum|terms| taken over every term of that output (alpha * acc included for pv, |scale|
 * applied for qk_bf16). With terms of random sign the measured error stays near one unit
 * of FLT_EPSILON * sum|terms|; the sqrt(n) part is for sums whose terms share a sign
 * (ldv = 0 repeats one V row, so P >= 0 times the same v for every c: measured up to
 * ~10 at n = 600). A dropped, repeated or misplaced term of typical size, sum|terms| / n,
 * is still hundreds of times the tolerance at n = 600. The measured worst err / (FLT_EPSILON *
 * sum|terms|) is printed per path. bf16 products are exact in fp32 (8-bit
 * significands), so the same bound holds against the fp64 sum of the same bf16
 * operands, with P rounded to bf16 (nearest even) first, as kernels.h says pv_bf16 does.
 */
static const double DOT_ULPS = 4.0;
/* The contract's exp ("a few ulps"), and the limit of the explicit exp sweep. */
static const double EXP_MAX_ULPS = 4.0;

/*
 * What each path says of its own exp, as |result - exact| in ulps of the exact value
 * (kernels' notes): ref is libm's expf (glibc: < 0.51 ulp); avx2 <= 0.95 ulp; avx512 and
 * avx512bf16 <= 1 ulp from glibc's expf, so < 1.51 from the exact value; neon <= 1.04 ulp.
 * softmax's p and alpha are held to these; unknown paths to the contract's EXP_MAX_ULPS.
 */
static double stated_exp_ulps(const char *isa) {
    static const struct {
        const char *name;
        double ulps;
    } table[] = {{"ref", 1.0}, {"avx2", 1.0}, {"avx512", 2.0}, {"avx512bf16", 2.0}, {"neon", 2.0}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(isa, table[i].name) == 0) return table[i].ulps;
    return EXP_MAX_ULPS;
}

/* ------------------------------------------------------------ the tables */

enum { MAX_TABLES = 16 };

typedef struct table_stats {
    const fa_kernels *k;
    double qk, pv, qk16, pv16;         /* max |err| / (FLT_EPSILON * sum|terms|) */
    double p_ulps, alpha_ulps;         /* softmax cases */
    double qks, pvs;                   /* qk_small, pv_small: as qk, pv */
    double ds, stx, stx16;             /* the backward's: as qk, pv (stx16: stx_bf16) */
    double sp_ulps, salpha_ulps;       /* softmax_small cases */
    int64_t small_cases;               /* small-row kernel calls checked */
    double sweep_ulps, sweep_alpha_ulps;
    double sweep_worst_x;
    int64_t sweep_points;
    int64_t snan_quieted;              /* f16 signalling NaNs the path returned quieted */
} table_stats;

static table_stats g_tab[MAX_TABLES];
static int g_ntab;
static h_rng g_rng;

static int64_t round16(int64_t n) { return (n + FA_ROW_ALIGN - 1) / FA_ROW_ALIGN * FA_ROW_ALIGN; }

/* ------------------------------------------------------------ tile state */

/*
 * A tile table's kernels run between its thread_begin and thread_end, as the pool runs
 * them (kernels.h); the tests call them the same way (a no-op elsewhere). After the
 * end, the calling thread must hold no tile configuration: on the hardware as
 * ldtilecfg's mirror reads it (fa_amx_tile_configured, built with the AMX flags), on the
 * model from its own state, which must also have recorded no fault (an instruction the
 * hardware would have refused).
 */
#if defined(FA_BUILD_AMX)
int fa_amx_tile_configured(void);
#endif

static int is_table(const fa_kernels *k, const char *name) { return strcmp(k->name, name) == 0; }

/* 1 when the calling thread holds tiles of table k's kind (0 for tables without tiles). */
static int tiles_held(const fa_kernels *k) {
#if defined(FA_BUILD_AMX)
    if (is_table(k, "amx")) return fa_amx_tile_configured();
#endif
#if defined(FA_BUILD_AMX_MODEL)
    if (is_table(k, "amx-model")) return fa_tm_configured();
#endif
    (void)k;
    return 0;
}

static void tiles_begin(const fa_kernels *k) { k->thread_begin(); }

static void tiles_end(const fa_kernels *k) {
    k->thread_end();
    CHECK(!tiles_held(k), "the thread still holds a tile configuration after thread_end");
#if defined(FA_BUILD_AMX_MODEL)
    if (is_table(k, "amx-model")) {
        CHECK(fa_tm_faults() == 0, "the tile model recorded faults 0x%x (the hardware would refuse)", fa_tm_faults());
        fa_tm_clear_faults();
    }
#endif
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* 64-byte aligned, exactly `bytes` when that is a multiple of 64 (so ASan sees the end). */
static void *xaligned(size_t bytes) {
    const size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ------------------------------------------------------------ buffers */

/*
 * An output buffer: `bytes` of payload, 64-byte aligned, between guard zones. The whole
 * allocation starts as SENTINEL bytes (a float NaN 0xffffffff, a bf16 NaN, int32 -1), so a
 * region the kernel must not touch is checked by comparing with the sentinel.
 */
enum { GUARD = 256, SENTINEL = 0xff };
static const uint32_t SENT32 = 0xffffffffu;

typedef struct obuf {
    unsigned char *raw;
    void *p;
    size_t bytes, total;
} obuf;

static obuf ob_alloc(size_t bytes) {
    obuf b;
    b.bytes = bytes;
    b.total = 2 * GUARD + (bytes + 63) / 64 * 64;
    b.raw = xaligned(b.total);
    memset(b.raw, SENTINEL, b.total);
    b.p = b.raw + GUARD;
    return b;
}

static int ob_guards_ok(const obuf *b) {
    for (size_t i = 0; i < GUARD; i++)
        if (b->raw[i] != SENTINEL) return 0;
    for (size_t i = GUARD + b->bytes; i < b->total; i++)
        if (b->raw[i] != SENTINEL) return 0;
    return 1;
}

static float *obf(const obuf *b) { return (float *)b->p; }

/*
 * An input matrix of n rows of len elements, row i at row0 + i*ld (ld any value: 0
 * repeats one row, negative walks backwards, |ld| < len overlaps rows). The allocation is
 * exactly the span the rows cover, after `offset` bytes (an unaligned start), so reading
 * past its end (or, with offset 0, before its start) is an ASan error. The span starts
 * as NaN (so gaps between rows poison any output that reads them); rows are written
 * in order (overlapping rows overwrite), and the oracle reads back through the same
 * addressing, so it sees exactly what the kernel sees.
 */
typedef struct smat {
    unsigned char *raw, *copy;
    unsigned char *row0;
    int64_t n, len, ld;
    size_t esz, bytes; /* bytes of raw */
} smat;

static smat sm_alloc(int64_t n, int64_t len, int64_t ld, size_t esz, size_t offset) {
    smat m;
    const int64_t a = ld < 0 ? -ld : ld;
    const int64_t span = (n - 1) * a + len;
    m.n = n, m.len = len, m.ld = ld, m.esz = esz;
    m.bytes = offset + (size_t)span * esz;
    m.raw = xmalloc(m.bytes);
    memset(m.raw, SENTINEL, m.bytes);
    m.row0 = m.raw + offset + (size_t)(ld < 0 ? (n - 1) * a : 0) * esz;
    m.copy = NULL;
    return m;
}

static float *sm_f(const smat *m, int64_t i) { return (float *)(void *)m->row0 + i * m->ld; }
static uint16_t *sm_u(const smat *m, int64_t i) { return (uint16_t *)(void *)m->row0 + i * m->ld; }

/* Normal(0, 1) rows (bf16-rounded bits for esz 2). */
static void sm_fill(smat *m, h_rng *r) {
    for (int64_t i = 0; i < m->n; i++)
        for (int64_t x = 0; x < m->len; x++) {
            const float v = (float)h_rng_normal(r);
            if (m->esz == 4) sm_f(m, i)[x] = v;
            else sm_u(m, i)[x] = h_f32_to_bf16(v);
        }
    m->copy = xmalloc(m->bytes);
    memcpy(m->copy, m->raw, m->bytes);
}

/* Takes the snapshot sm_unchanged compares with again (after the test edits values). */
static void sm_snapshot(smat *m) { memcpy(m->copy, m->raw, m->bytes); }

/*
 * Puts a NaN into one row and +inf, -inf into two others (at random x), for cases that
 * check a non-finite input poisons only the outputs that read it. With overlapping rows
 * (|ld| < len) the value lands in several rows; the oracle reads the same memory.
 */
static void sm_poison(smat *m, h_rng *r) {
    static const float vals[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3 && i < m->n; i++) {
        const int64_t row = h_rng_int(r, 0, m->n - 1), x = h_rng_int(r, 0, m->len - 1);
        if (m->esz == 4) sm_f(m, row)[x] = vals[i];
        else sm_u(m, row)[x] = h_f32_to_bf16(vals[i]);
    }
    sm_snapshot(m);
}

static int sm_unchanged(const smat *m) { return memcmp(m->raw, m->copy, m->bytes) == 0; }

static void sm_free(smat *m) {
    free(m->raw);
    free(m->copy);
}

/* An exact-size copy of `bytes` for an input the kernel must not change. */
typedef struct ibuf {
    void *p, *copy;
    size_t bytes;
} ibuf;

static ibuf ib_dup(const void *src, size_t bytes, int aligned) {
    ibuf b;
    b.bytes = bytes;
    b.p = aligned ? xaligned(bytes) : xmalloc(bytes);
    b.copy = xmalloc(bytes);
    memcpy(b.p, src, bytes);
    memcpy(b.copy, src, bytes);
    return b;
}

static int ib_unchanged(const ibuf *b) { return memcmp(b->p, b->copy, b->bytes) == 0; }

static void ib_free(ibuf *b) {
    free(b->p);
    free(b->copy);
}

/* ------------------------------------------------------------ case sizes */

static const int64_t ROWS_EDGE[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33,
                                    48, 63, 64, 65, 66, 67, 100, 129, 200, 255, 300};
static const int64_t COLS_EDGE[] = {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 47, 48, 49,
                                    63, 64, 65, 127, 128, 129, 256, 257, 600};
static const int64_t DIM_EDGE[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64,
                                   65, 127, 128, 129, 130, 255, 256, 257, 384, 511, 512};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int64_t pick_size(h_rng *r, const int64_t *edge, int n, int64_t max) {
    return h_rng_uniform(r) < 0.6 ? edge[h_rng_int(r, 0, n - 1)] : h_rng_int(r, 1, max);
}

/* Halves the largest of a, b, c (relative to its maximum) until a*b*c <= budget. */
static void fit_budget(int64_t *a, int64_t amax, int64_t *b, int64_t bmax, int64_t *c, int64_t cmax,
                       double budget) {
    while ((double)*a * (double)*b * (double)*c > budget) {
        const double ra = (double)*a / (double)amax, rb = (double)*b / (double)bmax,
                     rc = (double)*c / (double)cmax;
        int64_t *big = ra >= rb && ra >= rc ? a : rb >= rc ? b : c;
        *big = (*big + 1) / 2;
    }
}

/* A leading dimension for rows of len elements: dense, odd, 0, negative or overlapping. */
static int64_t pick_ld(h_rng *r, int64_t len) {
    switch (h_rng_int(r, 0, 8)) {
    case 0:
    case 1: return len;
    case 2: return len + 1;
    case 3: return len + 2 * h_rng_int(r, 1, 8) + 1;
    case 4: return 0;
    case 5: return -len;
    case 6: return -(len + 3);
    case 7: return len > 1 ? h_rng_int(r, 1, len - 1) : 1;
    default: return 2 * len + 5;
    }
}

/* ------------------------------------------------------------ pack_qt */

static void case_pack_qt(int64_t rows, int64_t d, int64_t ldq, size_t qoff, int64_t ldqt, float scale) {
    smat q = sm_alloc(rows, d, ldq, 4, qoff);
    sm_fill(&q, &g_rng);
    const int64_t pad = round16(rows);
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *k = g_tab[t].k;
        h_case("pack_qt isa=%s rows=%lld d=%lld ldq=%lld q_offset=%zu ldqt=%lld scale=%g", k->name,
               (long long)rows, (long long)d, (long long)ldq, qoff, (long long)ldqt, (double)scale);
        obuf qt = ob_alloc((size_t)(d * ldqt) * 4);
        k->pack_qt(rows, d, sm_f(&q, 0), ldq, scale, obf(&qt), ldqt);
        int64_t bad = 0, badpad = 0, touched = 0, fx = -1, fr = -1;
        for (int64_t x = 0; x < d; x++)
            for (int64_t r = 0; r < ldqt; r++) {
                const float got = obf(&qt)[x * ldqt + r];
                if (r < rows) {
                    const float want = scale * sm_f(&q, r)[x];
                    if (fbits(got) != fbits(want) && bad++ == 0) fx = x, fr = r;
                } else if (r < pad) {
                    badpad += got != 0.0f;
                } else {
                    touched += fbits(got) != SENT32 && got != 0.0f;
                }
            }
        CHECK(bad == 0, "%lld entries differ from scale*q (first x=%lld r=%lld)", (long long)bad, (long long)fx,
              (long long)fr);
        CHECK(badpad == 0, "%lld padding entries (rows <= r < round16(rows)) are not 0", (long long)badpad);
        CHECK(touched == 0, "%lld entries past round16(rows) changed to something other than 0", (long long)touched);
        CHECK(ob_guards_ok(&qt), "writes outside qt");
        CHECK(sm_unchanged(&q), "q changed");
        free(qt.raw);
    }
    sm_free(&q);
}

static void test_pack_qt(void) {
    static const float scales[] = {1.0f, 0.125f, -0.3f, 0.0883883476f};
    const int n = h_scaled(60);
    for (int i = 0; i < n; i++) {
        int64_t rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t d = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 512);
        int64_t one = 1;
        fit_budget(&rows, 300, &d, 512, &one, INT32_MAX, 60000.0);
        const int64_t ldq = pick_ld(&g_rng, d);
        const int64_t ldqt = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        case_pack_qt(rows, d, ldq, (size_t)h_rng_int(&g_rng, 0, 15) * 4, ldqt, scales[i % 4]);
    }
    case_pack_qt(300, 512, 512, 4, 304, 0.5f);
    case_pack_qt(1, 1, 1, 0, 16, 2.0f);
}

/* ------------------------------------------------------------ qk */

/* max |got - exact| / (FLT_EPSILON * sumabs) over finite outputs, bad = count over tol. */
typedef struct dot_check {
    int64_t bad, nan_bad, fi, fj;
    double worst, fgot, fwant, ftol;
} dot_check;

static void dot_one(dot_check *dc, double got, double want, double sumabs, int64_t n, int64_t i, int64_t j) {
    if (isnan(want) || isnan(got) || isinf(want)) { /* non-finite inputs: the same NaN or inf */
        if ((isnan(want) ? !isnan(got) : got != want) && dc->nan_bad++ == 0 && dc->bad == 0)
            dc->fi = i, dc->fj = j, dc->fgot = got, dc->fwant = want, dc->ftol = 0;
        return;
    }
    const double err = fabs(got - want), tol = (DOT_ULPS + sqrt((double)n)) * FLT_EPSILON * sumabs + FLT_MIN;
    const double ratio = sumabs > 0 ? err / (FLT_EPSILON * sumabs) : (err > 0 ? INFINITY : 0);
    if (ratio > dc->worst) dc->worst = ratio;
    if (!(err <= tol) && dc->bad++ == 0 && dc->nan_bad == 0)
        dc->fi = i, dc->fj = j, dc->fgot = got, dc->fwant = want, dc->ftol = tol;
}

/* One CHECK for a whole output block; i, j name the first bad output's coordinates. */
static void dot_report(const dot_check *dc, const char *i, const char *j) {
    CHECK(dc->bad == 0 && dc->nan_bad == 0,
          "%lld outputs off by more than (%g + sqrt(n)) * eps * sum|terms|, %lld non-finite mismatches "
          "(first %s=%lld %s=%lld: got %.9g want %.9g tol %.3g)",
          (long long)dc->bad, DOT_ULPS, (long long)dc->nan_bad, i, (long long)dc->fi, j, (long long)dc->fj, dc->fgot,
          dc->fwant, dc->ftol);
}

/*
 * qt (d, ldqt): rows < rows random, rows..round16 zero (as pack_qt leaves them), past that
 * NaN (no output may depend on it). With bf16 set, the same values as bf16 pairs qt2.
 */
static void case_qk(int64_t rows, int64_t cols, int64_t d, int64_t ldk, size_t koff, int64_t ldqt, int64_t ldst,
                    int poison) {
    const int64_t pad = round16(rows);
    float *qt_init = xmalloc((size_t)(d * ldqt) * 4);
    for (int64_t x = 0; x < d; x++)
        for (int64_t r = 0; r < ldqt; r++)
            qt_init[x * ldqt + r] = r < rows ? (float)h_rng_normal(&g_rng) : r < pad ? 0.0f : NAN;
    ibuf qt = ib_dup(qt_init, (size_t)(d * ldqt) * 4, 1);
    free(qt_init);
    smat k = sm_alloc(cols, d, ldk, 4, koff);
    sm_fill(&k, &g_rng);
    if (poison) sm_poison(&k, &g_rng);

    double *want = xmalloc(sizeof(double) * (size_t)(rows * cols));
    double *sum = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int64_t x = 0; x < d; x++) {
                const double term = (double)((float *)qt.p)[x * ldqt + r] * sm_f(&k, c)[x];
                s += term, a += fabs(term);
            }
            want[c * rows + r] = s, sum[c * rows + r] = a;
        }

    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("qk isa=%s rows=%lld cols=%lld d=%lld ldk=%lld k_offset=%zu ldqt=%lld ldst=%lld nonfinite_k=%d",
               kt->name, (long long)rows, (long long)cols, (long long)d, (long long)ldk, koff, (long long)ldqt,
               (long long)ldst, poison);
        obuf st = ob_alloc((size_t)(cols * ldst) * 4);
        kt->qk(rows, cols, d, qt.p, ldqt, sm_f(&k, 0), ldk, obf(&st), ldst);
        dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
        int64_t badpad = 0, touched = 0;
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < ldst; r++) {
                const float got = obf(&st)[c * ldst + r];
                if (r < rows) dot_one(&dc, got, want[c * rows + r], sum[c * rows + r], d, c, r);
                else if (r < pad) badpad += got != 0.0f && !(poison && isnan(got)); /* 0 * inf */
                else touched += fbits(got) != SENT32;
            }
        if (dc.worst > g_tab[t].qk) g_tab[t].qk = dc.worst;
        dot_report(&dc, "c", "r");
        CHECK(badpad == 0, "%lld padding rows (rows <= r < round16(rows)) of st are not 0", (long long)badpad);
        CHECK(touched == 0, "%lld st entries past round16(rows) were written", (long long)touched);
        CHECK(ob_guards_ok(&st), "writes outside st");
        CHECK(ib_unchanged(&qt) && sm_unchanged(&k), "qt or k changed");
        free(st.raw);
    }
    free(want), free(sum);
    ib_free(&qt);
    sm_free(&k);
}

static void test_qk(void) {
    const int n = h_scaled(90);
    for (int i = 0; i < n; i++) {
        int64_t rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t cols = pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
        int64_t d = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 512);
        fit_budget(&rows, 300, &cols, 600, &d, 512, 1.2e6);
        const int64_t ldqt = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t ldst = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t ldk = pick_ld(&g_rng, d); /* one draw per statement: argument order is unspecified */
        const size_t koff = (size_t)h_rng_int(&g_rng, 0, 15) * 4;
        case_qk(rows, cols, d, ldk, koff, ldqt, ldst, i % 4 == 3);
    }
    /* the corners of the size ranges */
    case_qk(300, 600, 3, 3, 4, 304, 320, 0);
    case_qk(1, 600, 512, -512, 8, 16, 16, 0);
    case_qk(300, 1, 512, 0, 0, 304, 304, 0);
    case_qk(9, 600, 511, 513, 12, 16, 32, 1);
    case_qk(129, 49, 129, 129, 60, 144, 144, 1);
}

/* ------------------------------------------------------------ softmax */

/*
 * |got - want| in ulps of want (the float spacing at want). exp(-inf) must be exactly 0,
 * NaN must stay NaN, and an exact value under FLT_MIN (x < -87.33) only needs a result in
 * [0, FLT_MIN]: 0 or a subnormal, as kernels.h allows.
 */
static int exp_close(float got, double want, double max_ulps, double *ulps) {
    *ulps = 0;
    if (isnan(want)) return isnan(got);
    if (want == 0) return got == 0.0f;
    if (want < FLT_MIN) return got >= 0.0f && got <= FLT_MIN;
    if (!isfinite(got)) {
        *ulps = INFINITY;
        return 0;
    }
    *ulps = fabs((double)got - want) / ldexp(1.0, ilogb(want) - 23);
    return *ulps <= max_ulps;
}

/* Row kinds of a softmax case. */
enum {
    ROW_PLAIN,     /* scores N(0, sigma), m = -inf, l = 0 (first tile) */
    ROW_MFINITE,   /* m finite, above or below the scores; l > 0 */
    ROW_MNAN,      /* incoming m NaN */
    ROW_SNAN,      /* one NaN score */
    ROW_SPINF,     /* one +inf score */
    ROW_SNINF,     /* about half the scores -inf */
    ROW_ALLNINF,   /* every score -inf */
    ROW_UNDERFLOW, /* s - m_new between -130 and -80: p underflows to subnormals or 0 */
    ROW_KINDS
};

/*
 * One softmax case. small = 0: the wide softmax on st (cols, ldst). small = 1: softmax_small on
 * the same scores row-major, s (rows, ld) with ld = the ldst argument; st0 is then generated
 * with ldst = round16(rows) and transposed, the padding columns cols..round16(cols) get junk
 * (NaN, inf, large: no real column may notice, even with a band reaching past cols) and the
 * columns past that the sentinel (they must stay untouched).
 */
static void case_softmax_layout(int64_t rows, int64_t cols, int64_t ld, int banded, int small) {
    const int64_t pad = round16(rows), ldst = small ? pad : ld, cpad = round16(cols);
    float *st0 = xmalloc((size_t)(cols * ldst) * 4);
    float *m0 = xmalloc((size_t)rows * 4), *l0 = xmalloc((size_t)rows * 4);
    int32_t *lo = banded ? xmalloc((size_t)rows * 4) : NULL, *hi = banded ? xmalloc((size_t)rows * 4) : NULL;
    int kinds[ROW_KINDS] = {0};
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = pad; r < ldst; r++) st0[c * ldst + r] = bitsf(SENT32);
    for (int64_t r = 0; r < pad; r++) {
        if (r >= rows) { /* padding rows: anything, NaN included; no real row may notice */
            for (int64_t c = 0; c < cols; c++) {
                const double u = h_rng_uniform(&g_rng);
                st0[c * ldst + r] = u < 0.2 ? NAN : u < 0.3 ? INFINITY : (float)(50 * h_rng_normal(&g_rng));
            }
            continue;
        }
        const double u = h_rng_uniform(&g_rng);
        const int kind = u < 0.37 ? ROW_PLAIN : ROW_MFINITE + (int)((u - 0.37) / 0.09);
        kinds[kind < ROW_KINDS ? kind : ROW_PLAIN]++;
        static const double sigmas[] = {0.5, 3.0, 30.0};
        const double sigma = sigmas[h_rng_int(&g_rng, 0, 2)];
        float mx = -INFINITY;
        for (int64_t c = 0; c < cols; c++) {
            const float s = (float)(sigma * h_rng_normal(&g_rng));
            st0[c * ldst + r] = s;
            mx = s > mx ? s : mx;
        }
        m0[r] = -INFINITY;
        l0[r] = 0.0f;
        const int64_t cc = h_rng_int(&g_rng, 0, cols - 1);
        switch (kind) {
        case ROW_MFINITE:
            m0[r] = mx + (float)(sigma * h_rng_range(&g_rng, -3.0, 3.0));
            l0[r] = (float)h_rng_range(&g_rng, 0.5, 50.0);
            break;
        case ROW_MNAN:
            m0[r] = NAN;
            l0[r] = 1.0f;
            break;
        case ROW_SNAN: st0[cc * ldst + r] = NAN; break;
        case ROW_SPINF: st0[cc * ldst + r] = INFINITY; break;
        case ROW_SNINF:
            for (int64_t c = 0; c < cols; c++)
                if (h_rng_uniform(&g_rng) < 0.5) st0[c * ldst + r] = -INFINITY;
            break;
        case ROW_ALLNINF:
            for (int64_t c = 0; c < cols; c++) st0[c * ldst + r] = -INFINITY;
            if (h_rng_uniform(&g_rng) < 0.5) m0[r] = (float)h_rng_normal(&g_rng), l0[r] = 2.0f;
            break;
        case ROW_UNDERFLOW:
            m0[r] = 0.0f;
            l0[r] = 1.0f;
            for (int64_t c = 0; c < cols; c++) st0[c * ldst + r] = (float)h_rng_range(&g_rng, -130.0, -80.0);
            break;
        default: break;
        }
        if (kind != ROW_PLAIN && kind != ROW_MFINITE && kind != ROW_UNDERFLOW && h_rng_uniform(&g_rng) < 0.5)
            m0[r] = (float)h_rng_normal(&g_rng), l0[r] = 3.0f; /* the specials with a finite m too */
        if (banded) {
            /* the driver's bands are within [0, cols] x [-1, cols-1]; a few go wider */
            const double b = h_rng_uniform(&g_rng);
            if (b < 0.2) lo[r] = 0, hi[r] = (int32_t)cols - 1;
            else if (b < 0.35) lo[r] = (int32_t)cols, hi[r] = -1; /* empty, as the driver writes it */
            else if (b < 0.4)
                lo[r] = (int32_t)h_rng_int(&g_rng, 1, cols), hi[r] = lo[r] - 1 - (int32_t)h_rng_int(&g_rng, 0, 3);
            else if (b < 0.5) lo[r] = hi[r] = (int32_t)h_rng_int(&g_rng, 0, cols - 1);
            else if (b < 0.55) lo[r] = -3, hi[r] = (int32_t)cols + 2;
            else {
                lo[r] = (int32_t)h_rng_int(&g_rng, 0, cols - 1);
                hi[r] = (int32_t)h_rng_int(&g_rng, lo[r], cols - 1);
            }
        }
    }

    /* the oracle: m_new exactly, alpha and p as exp of the same float differences */
    float *mnew = xmalloc((size_t)rows * 4);
    double *alpha_want = xmalloc(sizeof(double) * (size_t)rows), *l_want = xmalloc(sizeof(double) * (size_t)rows);
    double *l_tol = xmalloc(sizeof(double) * (size_t)rows), *p_want = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        float tmax = -INFINITY;
        int tnan = 0;
        for (int64_t c = 0; c < cols; c++) {
            if (banded && (c < lo[r] || c > hi[r])) continue;
            const float s = st0[c * ldst + r];
            if (isnan(s)) tnan = 1;
            else if (s > tmax) tmax = s;
        }
        const float mn = (tnan || isnan(m0[r])) ? NAN : (m0[r] > tmax ? m0[r] : tmax);
        mnew[r] = mn;
        if (mn == -INFINITY) {
            alpha_want[r] = 1.0;
            l_want[r] = l0[r];
            l_tol[r] = 0;
            for (int64_t c = 0; c < cols; c++) p_want[c * rows + r] = 0.0;
            continue;
        }
        const float ax = m0[r] - mn;
        alpha_want[r] = exp((double)ax);
        double lsum = (double)l0[r] * alpha_want[r], labs = fabs(lsum);
        for (int64_t c = 0; c < cols; c++) {
            double p = 0.0;
            if (!banded || (c >= lo[r] && c <= hi[r])) {
                const float x = st0[c * ldst + r] - mn;
                p = exp((double)x);
            }
            p_want[c * rows + r] = p;
            lsum += p;
            labs += fabs(p);
        }
        l_want[r] = lsum;
        /* each term within the path's exp accuracy, then any summation order: gamma_(cols+2) */
        l_tol[r] =
            (EXP_MAX_ULPS * FLT_EPSILON + (double)(cols + 2) * FLT_EPSILON / 2) * labs + (double)(cols + 1) * FLT_MIN;
    }

    /* the row-major input of softmax_small */
    float *s0 = NULL;
    if (small) {
        s0 = xmalloc((size_t)(rows * ld) * 4);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < ld; c++) {
                const double u = h_rng_uniform(&g_rng);
                s0[r * ld + c] = c < cols    ? st0[c * ldst + r]
                                 : c >= cpad ? bitsf(SENT32)
                                 : u < 0.3   ? NAN
                                 : u < 0.5   ? INFINITY
                                             : (float)(1e3 * h_rng_normal(&g_rng));
            }
    }

    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        if (small && !kt->softmax_small) continue;
        const double ulps = stated_exp_ulps(kt->name);
        h_case("%s isa=%s rows=%lld cols=%lld %s=%lld banded=%d (row kinds: plain %d, m finite %d, m NaN %d, "
               "NaN score %d, +inf score %d, -inf scores %d, all -inf %d, underflow %d)",
               small ? "softmax_small" : "softmax", kt->name, (long long)rows, (long long)cols, small ? "lds" : "ldst",
               (long long)ld, banded, kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5], kinds[6], kinds[7]);
        const size_t st_bytes = (size_t)(small ? rows * ld : cols * ldst) * 4;
        obuf st = ob_alloc(st_bytes), m = ob_alloc((size_t)rows * 4), l = ob_alloc((size_t)rows * 4),
             al = ob_alloc((size_t)rows * 4);
        memcpy(st.p, small ? s0 : st0, st_bytes);
        memcpy(m.p, m0, (size_t)rows * 4);
        memcpy(l.p, l0, (size_t)rows * 4);
        ibuf blo = {0}, bhi = {0};
        if (banded) blo = ib_dup(lo, (size_t)rows * 4, 0), bhi = ib_dup(hi, (size_t)rows * 4, 0);
        if (small)
            kt->softmax_small(rows, cols, obf(&st), ld, banded ? blo.p : NULL, banded ? bhi.p : NULL, obf(&m),
                              obf(&l), obf(&al));
        else
            kt->softmax(rows, cols, obf(&st), ldst, banded ? blo.p : NULL, banded ? bhi.p : NULL, obf(&m), obf(&l),
                        obf(&al));

        int64_t bad_m = 0, bad_a = 0, bad_l = 0, bad_p = 0, touched = 0, fr = -1, fc = -1;
        double worst_p = 0, worst_a = 0, u = 0;
        float fgot = 0;
        double fwant = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float gm = obf(&m)[r], ga = obf(&al)[r], gl = obf(&l)[r];
            if (!(gm == mnew[r] || (isnan(gm) && isnan(mnew[r])))) bad_m++;
            u = 0;
            if (mnew[r] == -INFINITY ? ga != 1.0f : !exp_close(ga, alpha_want[r], ulps, &u)) bad_a++;
            if (u > worst_a) worst_a = u;
            if (isnan(l_want[r]) ? !isnan(gl) : !(fabs((double)gl - l_want[r]) <= l_tol[r])) bad_l++;
            for (int64_t c = 0; c < cols; c++) {
                const float got = small ? obf(&st)[r * ld + c] : obf(&st)[c * ldst + r];
                const double want = p_want[c * rows + r];
                if (!exp_close(got, want, ulps, &u) && bad_p++ == 0) fr = r, fc = c, fgot = got, fwant = want;
                if (u > worst_p) worst_p = u;
            }
        }
        if (small)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = cpad; c < ld; c++) touched += fbits(obf(&st)[r * ld + c]) != SENT32;
        else
            for (int64_t c = 0; c < cols; c++)
                for (int64_t r = pad; r < ldst; r++) touched += fbits(obf(&st)[c * ldst + r]) != SENT32;
        double *wp = small ? &g_tab[t].sp_ulps : &g_tab[t].p_ulps, *wa = small ? &g_tab[t].salpha_ulps
                                                                               : &g_tab[t].alpha_ulps;
        if (worst_p > *wp) *wp = worst_p;
        if (worst_a > *wa) *wa = worst_a;
        g_tab[t].small_cases += small;
        CHECK(bad_m == 0, "%lld rows with m != max(m_old, max of kept scores)", (long long)bad_m);
        CHECK(bad_a == 0, "%lld rows with alpha off (1 when m_new = -inf, else exp(m_old - m_new) within %g ulps)",
              (long long)bad_a, ulps);
        CHECK(bad_l == 0, "%lld rows with l != l_old*alpha + sum p", (long long)bad_l);
        CHECK(bad_p == 0, "%lld p off by more than %g ulps (first r=%lld c=%lld: got %.9g want %.9g)", (long long)bad_p,
              ulps, (long long)fr, (long long)fc, (double)fgot, fwant);
        CHECK(touched == 0, "%lld %s entries past %s were written", (long long)touched, small ? "s" : "st",
              small ? "round16(cols)" : "round16(rows)");
        CHECK(ob_guards_ok(&st) && ob_guards_ok(&m) && ob_guards_ok(&l) && ob_guards_ok(&al),
              "writes outside %s, or past row %lld of m, l or alpha", small ? "s (rows x lds)" : "st", (long long)rows);
        CHECK(!banded || (ib_unchanged(&blo) && ib_unchanged(&bhi)), "lo or hi changed");
        free(st.raw), free(m.raw), free(l.raw), free(al.raw);
        if (banded) ib_free(&blo), ib_free(&bhi);
    }
    free(st0), free(s0), free(m0), free(l0), free(lo), free(hi);
    free(mnew), free(alpha_want), free(l_want), free(l_tol), free(p_want);
}

static void case_softmax(int64_t rows, int64_t cols, int64_t ldst, int banded) {
    case_softmax_layout(rows, cols, ldst, banded, 0);
}

static void test_softmax(void) {
    const int n = h_scaled(90);
    for (int i = 0; i < n; i++) {
        int64_t rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t cols = pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
        int64_t one = 1;
        fit_budget(&rows, 300, &cols, 600, &one, INT32_MAX, 60000.0);
        case_softmax(rows, cols, round16(rows) + 16 * h_rng_int(&g_rng, 0, 2), i % 2);
    }
    case_softmax(300, 600, 304, 0);
    case_softmax(300, 600, 320, 1);
    case_softmax(1, 1, 16, 0);
    case_softmax(1, 1, 16, 1);
}

/*
 * The vectorised exp, through softmax: with m_old = 0 and scores x <= 0, m_new = 0 and
 * every p is exp(x - 0) = exp(x); with m_old = x and a single score 0, alpha = exp(x).
 * Points: float bit patterns of [-87.3, 0] at a fixed stride (every binade, so tiny |x|
 * too), a uniform grid, and every float within 48 of the range-reduction boundaries
 * (k + 1/2) ln 2 and of the ends. Limits: <= EXP_MAX_ULPS vs double exp; -inf gives 0,
 * NaN gives NaN, x < -87.34 gives 0 or a subnormal.
 */
static float *g_sweep;
static int64_t g_nsweep;

static void sweep_points(void) {
    const uint32_t lo_bits = fbits(-87.3f); /* 0xc2ae999a */
    const int64_t stride = (int64_t)floor(509.0 / h_test_scale());
    const int64_t uniform = h_scaled(1 << 20);
    int64_t cap = (int64_t)((lo_bits - 0x80000000u) / (uint64_t)stride) + 2 + uniform + 130 * 97 + 4 * 4097;
    g_sweep = xmalloc(sizeof(float) * (size_t)cap);
    int64_t n = 0;
    for (uint64_t b = 0x80000000u; b <= lo_bits; b += (uint64_t)stride) g_sweep[n++] = bitsf((uint32_t)b);
    for (int64_t i = 0; i < uniform; i++) g_sweep[n++] = (float)(-87.3 * (double)i / (double)(uniform - 1));
    for (int k = 0; k < 126; k++) {
        const float c = (float)(-(k + 0.5) * 0.69314718055994531);
        for (int j = -48; j <= 48; j++) {
            const float x = bitsf((uint32_t)((int64_t)fbits(c) + j));
            if (x >= -87.3f && x <= 0.0f) g_sweep[n++] = x;
        }
    }
    static const float ends[] = {-87.3f, -0.0f, -1.0f, -0.693147182f};
    for (int e = 0; e < 4; e++)
        for (int j = -2048; j <= 2048; j++) {
            const float x = bitsf((uint32_t)((int64_t)fbits(ends[e]) + j));
            if (x >= -87.3f && x <= 0.0f && !(x == 0.0f && j != 0)) g_sweep[n++] = x;
        }
    g_nsweep = n;
}

enum { SW_ROWS = 256, SW_COLS = 256 };

static void sweep_table(table_stats *ts) {
    const fa_kernels *kt = ts->k;
    h_case("exp sweep isa=%s: softmax with m = 0 over %lld points of [-87.3, 0]", kt->name, (long long)g_nsweep);
    float *st = xaligned(sizeof(float) * SW_ROWS * SW_COLS);
    float m[SW_ROWS], l[SW_ROWS], al[SW_ROWS];
    int64_t bad = 0, other = 0;
    double worst = 0, worst_x = 0;
    for (int64_t base = 0; base < g_nsweep; base += SW_ROWS * SW_COLS) {
        const int64_t cnt = g_nsweep - base < SW_ROWS * SW_COLS ? g_nsweep - base : SW_ROWS * SW_COLS;
        for (int64_t i = 0; i < SW_ROWS * SW_COLS; i++) st[i] = i < cnt ? g_sweep[base + i] : -1.0f;
        for (int r = 0; r < SW_ROWS; r++) m[r] = 0.0f, l[r] = 0.0f;
        kt->softmax(SW_ROWS, SW_COLS, st, SW_ROWS, NULL, NULL, m, l, al);
        for (int64_t i = 0; i < cnt; i++) {
            const float x = g_sweep[base + i];
            double u;
            if (!exp_close(st[i], exp((double)x), EXP_MAX_ULPS, &u) && bad++ == 0)
                printf("  exp [%s]: x=%a got %a want %a\n", kt->name, (double)x, (double)st[i], exp((double)x));
            if (u > worst) worst = u, worst_x = x;
        }
        for (int r = 0; r < SW_ROWS; r++) other += m[r] != 0.0f || al[r] != 1.0f;
    }
    ts->sweep_ulps = worst;
    ts->sweep_worst_x = worst_x;
    ts->sweep_points = g_nsweep;
    CHECK(bad == 0, "%lld points with p = exp(x) off by more than %g ulps (worst %.3f ulps at x = %a)", (long long)bad,
          EXP_MAX_ULPS, worst, worst_x);
    CHECK(other == 0, "%lld rows with m != 0 or alpha != 1 (m_old = 0 >= every score)", (long long)other);

    /* alpha = exp(m_old - 0) over the same points: 1 column of score 0 */
    h_case("exp sweep isa=%s: alpha = exp(m_old) over %lld points", kt->name, (long long)g_nsweep);
    enum { AROWS = SW_ROWS * SW_COLS };
    float *am = xmalloc(sizeof(float) * AROWS), *alv = xmalloc(sizeof(float) * AROWS),
          *lv = xmalloc(sizeof(float) * AROWS);
    int64_t abad = 0;
    double aworst = 0;
    for (int64_t base = 0; base < g_nsweep; base += AROWS) {
        const int64_t cnt = g_nsweep - base < AROWS ? g_nsweep - base : AROWS;
        for (int64_t i = 0; i < AROWS; i++) st[i] = 0.0f, am[i] = i < cnt ? g_sweep[base + i] : -1.0f, lv[i] = 1.0f;
        kt->softmax(AROWS, 1, st, AROWS, NULL, NULL, am, lv, alv);
        for (int64_t i = 0; i < cnt; i++) {
            double u;
            if (!exp_close(alv[i], exp((double)g_sweep[base + i]), EXP_MAX_ULPS, &u)) abad++;
            if (u > aworst) aworst = u;
        }
    }
    ts->sweep_alpha_ulps = aworst;
    CHECK(abad == 0, "%lld points with alpha = exp(m_old) off by more than %g ulps (worst %.3f)", (long long)abad,
          EXP_MAX_ULPS, aworst);
    free(am), free(alv), free(lv);

    /* specials, one per row: -inf, NaN, and x below the normal range (0 or subnormal) */
    h_case("exp specials isa=%s", kt->name);
    enum { NSP = 64 };
    float sp[NSP];
    sp[0] = -INFINITY, sp[1] = NAN, sp[2] = -88.0f, sp[3] = -87.5f, sp[4] = -87.34f, sp[5] = -103.9f, sp[6] = -104.0f,
    sp[7] = -150.0f, sp[8] = -1e30f, sp[9] = -FLT_MAX;
    for (int i = 10; i < NSP; i++) sp[i] = (float)(-87.34 - 30.0 * (i - 10) / (NSP - 11));
    float sm[NSP], sl[NSP], sa[NSP];
    for (int i = 0; i < NSP; i++) st[i] = sp[i], sm[i] = 0.0f, sl[i] = 0.0f;
    kt->softmax(NSP, 1, st, NSP, NULL, NULL, sm, sl, sa);
    CHECK(st[0] == 0.0f, "exp(-inf) = %a, want 0", (double)st[0]);
    CHECK(isnan(st[1]) && isnan(sm[1]) && isnan(sa[1]) && isnan(sl[1]),
          "NaN score: p %g m %g alpha %g l %g, want NaN for all", (double)st[1], (double)sm[1], (double)sa[1],
          (double)sl[1]);
    int64_t sub_bad = 0;
    for (int i = 2; i < NSP; i++) {
        const int ok = st[i] >= 0.0f && st[i] < FLT_MIN;
        if (!ok && sub_bad++ == 0) printf("  exp [%s]: x=%a gives %a\n", kt->name, (double)sp[i], (double)st[i]);
    }
    CHECK(sub_bad == 0, "%lld points x < -87.34 whose exp is not 0 or a subnormal", (long long)sub_bad);
    free(st);
}

/* ------------------------------------------------------------ pv */

/*
 * st (cols, ldst): p in [0, 1] with exact zeros (masked), NaN in the padding rows and
 * past them (pv reads only rows < rows into real outputs). Some cases put a NaN in one
 * real row's p or alpha: that row must come out NaN and no other row may notice.
 */
typedef struct pv_in {
    int64_t rows, cols, dv, ldst, ldacc;
    ibuf st;
    float *alpha;   /* NULL or rows */
    float *acc0;    /* (rows, ldacc) */
} pv_in;

static pv_in pv_make(int64_t rows, int64_t cols, int64_t dv, int64_t ldst, int64_t ldacc, int alpha_mode,
                     int nan_rows) {
    pv_in in;
    in.rows = rows, in.cols = cols, in.dv = dv, in.ldst = ldst, in.ldacc = ldacc;
    float *st = xmalloc((size_t)(cols * ldst) * 4);
    const double zero_share = h_rng_uniform(&g_rng) < 0.5 ? 0.0 : 0.3;
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < ldst; r++)
            st[c * ldst + r] = r >= rows                            ? NAN
                               : h_rng_uniform(&g_rng) < zero_share ? 0.0f
                                                                    : (float)h_rng_uniform(&g_rng);
    in.alpha = NULL;
    if (alpha_mode) {
        in.alpha = xmalloc((size_t)rows * 4);
        for (int64_t r = 0; r < rows; r++) {
            const double u = h_rng_uniform(&g_rng);
            in.alpha[r] = u < 0.3 ? 1.0f : u < 0.4 ? 0.0f : u < 0.45 ? 1e-30f : (float)h_rng_uniform(&g_rng);
        }
    }
    if (nan_rows && rows >= 2) {
        const int64_t c = h_rng_int(&g_rng, 0, cols - 1);
        st[c * ldst + h_rng_int(&g_rng, 0, rows - 1)] = NAN;
        if (in.alpha) in.alpha[h_rng_int(&g_rng, 0, rows - 1)] = NAN;
    }
    in.st = ib_dup(st, (size_t)(cols * ldst) * 4, 1);
    free(st);
    in.acc0 = xmalloc((size_t)(rows * ldacc) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < ldacc; e++) in.acc0[r * ldacc + e] = e < dv ? (float)h_rng_normal(&g_rng) : NAN;
    return in;
}

static void pv_free(pv_in *in) {
    ib_free(&in->st);
    free(in->alpha);
    free(in->acc0);
}

/* want/sum (rows, dv): alpha*acc0 + sum_c P(st) v, with P = identity or bf16 rounding. */
static void pv_oracle(const pv_in *in, const smat *v, int bf16, double *want, double *sum) {
    const float *st = in->st.p;
    for (int64_t r = 0; r < in->rows; r++)
        for (int64_t e = 0; e < in->dv; e++) {
            const double a0 = (double)in->acc0[r * in->ldacc + e] * (in->alpha ? (double)in->alpha[r] : 1.0);
            double s = a0, a = fabs(a0);
            for (int64_t c = 0; c < in->cols; c++) {
                float p = st[c * in->ldst + r];
                if (bf16) p = h_bf16_to_f32(h_f32_to_bf16(p));
                const double vv = bf16 ? (double)h_bf16_to_f32(sm_u(v, c)[e]) : (double)sm_f(v, c)[e];
                const double term = (double)p * vv;
                s += term, a += fabs(term);
            }
            want[r * in->dv + e] = s, sum[r * in->dv + e] = a;
        }
}

/* Checks acc against the oracle; returns the worst ratio. */
static double pv_check(const pv_in *in, const obuf *acc, const double *want, const double *sum) {
    dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
    for (int64_t r = 0; r < in->rows; r++)
        for (int64_t e = 0; e < in->dv; e++)
            dot_one(&dc, obf(acc)[r * in->ldacc + e], want[r * in->dv + e], sum[r * in->dv + e], in->cols + 1, r, e);
    dot_report(&dc, "r", "e");
    CHECK(ob_guards_ok(acc), "writes outside acc (rows >= %lld, or before it)", (long long)in->rows);
    return dc.worst;
}

static void case_pv(int64_t rows, int64_t cols, int64_t dv, int64_t ldv, size_t voff, int64_t ldst, int64_t ldacc,
                    int alpha_mode, int nan_rows) {
    pv_in in = pv_make(rows, cols, dv, ldst, ldacc, alpha_mode, nan_rows);
    smat v = sm_alloc(cols, dv, ldv, 4, voff);
    sm_fill(&v, &g_rng);
    ibuf alpha = {0};
    if (in.alpha) alpha = ib_dup(in.alpha, (size_t)rows * 4, 0);
    double *want = xmalloc(sizeof(double) * (size_t)(rows * dv));
    double *sum = xmalloc(sizeof(double) * (size_t)(rows * dv));
    pv_oracle(&in, &v, 0, want, sum);
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("pv isa=%s rows=%lld cols=%lld dv=%lld ldv=%lld v_offset=%zu ldst=%lld ldacc=%lld alpha=%s nan_rows=%d",
               kt->name, (long long)rows, (long long)cols, (long long)dv, (long long)ldv, voff, (long long)ldst,
               (long long)ldacc, in.alpha ? "given" : "NULL", nan_rows);
        obuf acc = ob_alloc((size_t)(rows * ldacc) * 4);
        memcpy(acc.p, in.acc0, (size_t)(rows * ldacc) * 4);
        kt->pv(rows, cols, dv, in.st.p, ldst, sm_f(&v, 0), ldv, in.alpha ? alpha.p : NULL, obf(&acc), ldacc);
        const double w = pv_check(&in, &acc, want, sum);
        if (w > g_tab[t].pv) g_tab[t].pv = w;
        CHECK(ib_unchanged(&in.st) && sm_unchanged(&v) && (!in.alpha || ib_unchanged(&alpha)),
              "st, v or alpha changed");
        free(acc.raw);
    }
    free(want), free(sum);
    if (in.alpha) ib_free(&alpha);
    sm_free(&v);
    pv_free(&in);
}

static void test_pv(void) {
    const int n = h_scaled(90);
    for (int i = 0; i < n; i++) {
        int64_t rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t cols = pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
        int64_t dv = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 512);
        fit_budget(&rows, 300, &cols, 600, &dv, 512, 1.2e6);
        const int64_t ldst = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t ldacc = round16(dv) + 16 * h_rng_int(&g_rng, 0, 1);
        const int64_t ldv = pick_ld(&g_rng, dv);
        const size_t voff = (size_t)h_rng_int(&g_rng, 0, 15) * 4;
        case_pv(rows, cols, dv, ldv, voff, ldst, ldacc, i % 3 != 0, i % 5 == 0);
    }
    case_pv(300, 600, 3, 3, 4, 304, 16, 1, 1);
    case_pv(1, 600, 512, -512, 8, 16, 512, 1, 0);
    case_pv(300, 1, 512, 0, 0, 320, 528, 0, 0);
    case_pv(4, 600, 511, 513, 12, 16, 512, 1, 1);
    case_pv(67, 65, 33, 1, 60, 80, 48, 1, 1);
}

/* ------------------------------------------------------------ backward: ds, stx */

/*
 * ds (kernels.h): dp[c][r] = p * (dp - dvec[r]) for r < round16(rows), an elementwise
 * product of two terms held to the dot bound with n = 2. st: p in [0, 1] with exact
 * zeros (masked) for r < rows, 0 in the padding rows (as the contract gives it), NaN
 * past round16(rows); dp: normal values, and with `nonfinite` +-inf or NaN at some
 * masked p = 0 and in every padding row, where the result must still be exactly 0;
 * dp past round16(rows) is sentinel and must stay so. dvec is padded with 0 and not
 * aligned. nan_rows: a NaN p gives NaN at its place; a NaN dvec[r] gives NaN where p
 * != 0 and 0 where p == 0, as the math says.
 */
static void case_ds(int64_t rows, int64_t cols, int64_t ldst, int64_t lddp, int nonfinite, int nan_rows) {
    static const float bad[3] = {INFINITY, -INFINITY, NAN};
    const int64_t pad = round16(rows);
    const double zero_share = h_rng_uniform(&g_rng) < 0.3 ? 0.0 : 0.3;
    float *st0 = xmalloc((size_t)(cols * ldst) * 4), *dp0 = xmalloc((size_t)(cols * lddp) * 4);
    float *dv0 = xmalloc((size_t)pad * 4);
    for (int64_t r = 0; r < pad; r++) dv0[r] = r < rows ? (float)h_rng_normal(&g_rng) : 0.0f;
    for (int64_t c = 0; c < cols; c++) {
        for (int64_t r = 0; r < ldst; r++)
            st0[c * ldst + r] = r >= pad                             ? NAN
                                : r >= rows                          ? 0.0f
                                : h_rng_uniform(&g_rng) < zero_share ? 0.0f
                                                                     : (float)h_rng_uniform(&g_rng);
        for (int64_t r = 0; r < lddp; r++) {
            float d = r >= pad ? bitsf(SENT32) : (float)(4.0 * h_rng_normal(&g_rng));
            if (nonfinite && r < pad && st0[c * ldst + r] == 0.0f && (r >= rows || h_rng_uniform(&g_rng) < 0.5))
                d = bad[h_rng_int(&g_rng, 0, 2)];
            dp0[c * lddp + r] = d;
        }
    }
    if (nan_rows) {
        st0[h_rng_int(&g_rng, 0, cols - 1) * ldst + h_rng_int(&g_rng, 0, rows - 1)] = NAN;
        dv0[h_rng_int(&g_rng, 0, rows - 1)] = NAN;
    }
    ibuf st = ib_dup(st0, (size_t)(cols * ldst) * 4, 1), dvec = ib_dup(dv0, (size_t)pad * 4, 0);
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("ds isa=%s rows=%lld cols=%lld ldst=%lld lddp=%lld nonfinite_dp=%d nan_rows=%d", kt->name,
               (long long)rows, (long long)cols, (long long)ldst, (long long)lddp, nonfinite, nan_rows);
        obuf dp = ob_alloc((size_t)(cols * lddp) * 4);
        memcpy(dp.p, dp0, (size_t)(cols * lddp) * 4);
        kt->ds(rows, cols, st.p, ldst, obf(&dp), lddp, dvec.p);
        dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
        int64_t notzero = 0, touched = 0, fc = -1, fr = -1;
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < lddp; r++) {
                const float got = obf(&dp)[c * lddp + r];
                if (r >= pad) {
                    touched += fbits(got) != SENT32;
                    continue;
                }
                const double p = ((const float *)st.p)[c * ldst + r], d = dp0[c * lddp + r], v = dv0[r];
                if (p == 0.0) {
                    if (got != 0.0f && notzero++ == 0) fc = c, fr = r;
                    continue;
                }
                dot_one(&dc, got, p * (d - v), fabs(p * d) + fabs(p * v), 2, c, r);
            }
        if (dc.worst > g_tab[t].ds) g_tab[t].ds = dc.worst;
        dot_report(&dc, "c", "r");
        CHECK(notzero == 0, "%lld outputs with p == 0 are not 0 (first c=%lld r=%lld)", (long long)notzero,
              (long long)fc, (long long)fr);
        CHECK(touched == 0, "%lld dp entries past round16(rows) were written", (long long)touched);
        CHECK(ob_guards_ok(&dp), "writes outside dp");
        CHECK(ib_unchanged(&st) && ib_unchanged(&dvec), "st or dvec changed");
        free(dp.raw);
    }
    free(st0), free(dp0), free(dv0);
    ib_free(&st), ib_free(&dvec);
}

static void test_ds(void) {
    const int n = h_scaled(60);
    for (int i = 0; i < n; i++) {
        int64_t rows = i % 2 ? h_rng_int(&g_rng, 1, 40) : pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t cols = i % 2 ? h_rng_int(&g_rng, 1, 40) : pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
        const int64_t ldst = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t lddp = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        case_ds(rows, cols, ldst, lddp, i % 3 != 2, i % 4 == 1);
    }
    case_ds(1, 1, 16, 16, 1, 0);
    case_ds(300, 600, 304, 320, 1, 1);
    case_ds(64, 3, 64, 64, 1, 1);
    case_ds(65, 7, 96, 80, 1, 0);
}

/*
 * stx (kernels.h): acc[c][e] += sum_r st[c][r] x[r][e], held to the dot bound with
 * n = rows + 1 terms (acc included). st is P-like (in [0, 1], exact zeros) or dS-like
 * (signed), NaN past rows (no output may read it); x any ld and offset, as V for pv;
 * acc NaN in its padding columns (which stx may write). nan_st: a NaN st[c][r] makes
 * acc row c NaN and no other. Non-finite x (poison) only with no zero in st: a vector
 * stx may multiply st = 0 by x (the core takes the reference's stx for such tiles), so
 * only then do all tables agree with the oracle, which skips st == 0 as the reference.
 * bf16: stx_bf16 instead, x bf16 rows, the oracle's st rounded to bf16 (nearest even)
 * first, the scratch exactly FA_STX_BF16_SCRATCH (guarded).
 */
static void case_stx_any(int bf16, int64_t rows, int64_t cols, int64_t n, int64_t ldx, size_t xoff, int64_t ldst,
                         int64_t ldacc, int signed_st, int nan_st, int poison) {
    const double zero_share = poison || h_rng_uniform(&g_rng) < 0.4 ? 0.0 : 0.3;
    float *st0 = xmalloc((size_t)(cols * ldst) * 4);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < ldst; r++) {
            float s = NAN;
            if (r < rows)
                s = h_rng_uniform(&g_rng) < zero_share ? 0.0f
                    : signed_st                        ? (float)h_rng_normal(&g_rng)
                                                       : (float)h_rng_uniform(&g_rng);
            if (r < rows && poison && s == 0.0f) s = 0.5f;
            st0[c * ldst + r] = s;
        }
    if (nan_st) st0[h_rng_int(&g_rng, 0, cols - 1) * ldst + h_rng_int(&g_rng, 0, rows - 1)] = NAN;
    ibuf st = ib_dup(st0, (size_t)(cols * ldst) * 4, 1);
    free(st0);
    smat x = sm_alloc(rows, n, ldx, bf16 ? 2 : 4, xoff);
    sm_fill(&x, &g_rng);
    if (poison) sm_poison(&x, &g_rng);
    float *acc0 = xmalloc((size_t)(cols * ldacc) * 4);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t e = 0; e < ldacc; e++) acc0[c * ldacc + e] = e < n ? (float)h_rng_normal(&g_rng) : NAN;
    double *want = xmalloc(sizeof(double) * (size_t)(cols * n)), *sum = xmalloc(sizeof(double) * (size_t)(cols * n));
    for (int64_t c = 0; c < cols; c++)
        for (int64_t e = 0; e < n; e++) {
            double s = acc0[c * ldacc + e], a = fabs(s);
            for (int64_t r = 0; r < rows; r++) {
                float w = ((const float *)st.p)[c * ldst + r];
                if (bf16) w = h_bf16_to_f32(h_f32_to_bf16(w));
                if (w == 0.0f) continue;
                const double xv = bf16 ? (double)h_bf16_to_f32(sm_u(&x, r)[e]) : (double)sm_f(&x, r)[e];
                const double term = (double)w * xv;
                s += term, a += fabs(term);
            }
            want[c * n + e] = s, sum[c * n + e] = a;
        }
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("%s isa=%s rows=%lld cols=%lld n=%lld ldx=%lld x_offset=%zu ldst=%lld ldacc=%lld st=%s nan_st=%d "
               "nonfinite_x=%d",
               bf16 ? "stx_bf16" : "stx", kt->name, (long long)rows, (long long)cols, (long long)n, (long long)ldx, xoff, (long long)ldst,
               (long long)ldacc, signed_st ? "signed" : "in [0,1]", nan_st, poison);
        obuf acc = ob_alloc((size_t)(cols * ldacc) * 4);
        memcpy(acc.p, acc0, (size_t)(cols * ldacc) * 4);
        obuf scratch = ob_alloc(sizeof(uint16_t) * (size_t)FA_STX_BF16_SCRATCH(rows, cols, n, ldst));
        if (bf16) {
            tiles_begin(kt);
            kt->stx_bf16(rows, cols, n, st.p, ldst, sm_u(&x, 0), ldx, obf(&acc), ldacc, scratch.p);
            tiles_end(kt);
        }
        else kt->stx(rows, cols, n, st.p, ldst, sm_f(&x, 0), ldx, obf(&acc), ldacc);
        dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
        for (int64_t c = 0; c < cols; c++)
            for (int64_t e = 0; e < n; e++)
                dot_one(&dc, obf(&acc)[c * ldacc + e], want[c * n + e], sum[c * n + e], rows + 1, c, e);
        double *worst = bf16 ? &g_tab[t].stx16 : &g_tab[t].stx;
        if (dc.worst > *worst) *worst = dc.worst;
        dot_report(&dc, "c", "e");
        CHECK(ob_guards_ok(&acc), "writes outside acc (rows c >= %lld, or before it)", (long long)cols);
        CHECK(!bf16 || ob_guards_ok(&scratch), "writes outside the promised scratch");
        CHECK(ib_unchanged(&st) && sm_unchanged(&x), "st or x changed");
        free(acc.raw), free(scratch.raw);
    }
    free(want), free(sum), free(acc0);
    ib_free(&st);
    sm_free(&x);
}

static void case_stx(int64_t rows, int64_t cols, int64_t n, int64_t ldx, size_t xoff, int64_t ldst, int64_t ldacc,
                     int signed_st, int nan_st, int poison) {
    case_stx_any(0, rows, cols, n, ldx, xoff, ldst, ldacc, signed_st, nan_st, poison);
}

static void case_stx_bf16(int64_t rows, int64_t cols, int64_t n, int64_t ldx, size_t xoff, int64_t ldst, int64_t ldacc,
                          int signed_st, int nan_st, int poison) {
    case_stx_any(1, rows, cols, n, ldx, xoff, ldst, ldacc, signed_st, nan_st, poison);
}

/* The random shapes of both stx tests: rows 1..300 (odd ones included), cols 1..40 or
 * the edge sizes up to 600, n 1..300, ld of x any (pick_ld), unaligned starts. */
static void stx_random_cases(int bf16, int cases) {
    for (int i = 0; i < cases; i++) {
        int64_t rows, cols, n = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 300);
        if (n > 300) n = h_rng_int(&g_rng, 1, 300);
        if (i % 2) {
            rows = h_rng_int(&g_rng, 1, 40), cols = h_rng_int(&g_rng, 1, 40);
        } else {
            rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
            cols = pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
            fit_budget(&rows, 300, &cols, 600, &n, 300, 1.2e6);
        }
        const int64_t ldst = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t ldacc = round16(n) + 16 * h_rng_int(&g_rng, 0, 1);
        const int64_t ldx = pick_ld(&g_rng, n);
        const size_t xoff = (size_t)h_rng_int(&g_rng, 0, 15) * (bf16 ? 2 : 4);
        case_stx_any(bf16, rows, cols, n, ldx, xoff, ldst, ldacc, i % 3 == 1, i % 5 == 0 && rows >= 2, i % 7 == 3);
    }
}

static void test_stx(void) {
    stx_random_cases(0, h_scaled(90));
    /* the backward's shapes, rows past one 128-row chunk, and x rows 4 KB or more apart */
    case_stx(128, 128, 128, 128, 0, 128, 128, 0, 0, 0);
    case_stx(128, 128, 64, 1024, 4, 128, 64, 1, 0, 0);
    case_stx(300, 37, 130, 4096 + 3, 8, 304, 144, 1, 1, 0);
    case_stx(257, 20, 200, -2048, 0, 272, 208, 0, 0, 1);
    case_stx(1, 600, 1, 0, 0, 16, 16, 0, 0, 0);
    case_stx(40, 1, 300, 300, 12, 48, 304, 1, 0, 0);
    case_stx(3, 13, 17, 5, 60, 16, 32, 1, 1, 0);
}

/*
 * stx_bf16's rounding of st, bit for bit: with x the 2 x 2 identity in bf16 and acc 0,
 * acc[c][e] = bf16(st[c][e]) exactly (the other term is a product with 0), so any
 * rounding but fa_f32_to_bf16's (nearest even) shows. st's low 16 bits sit at and
 * around the tie (0x7fff, 0x8000, 0x8001) with either parity of the kept bit, at
 * every normal exponent (the largest round to inf), plus +-0, +-inf and NaNs (quiet
 * and signalling: the result must be a NaN). rows = 1 pairs st[c][0] with a padding
 * row of NaN, which must not leak in. Subnormal st is left out: vdpbf16ps treats
 * subnormal bf16 inputs as 0, a difference below FLT_MIN per term (the dot bound's
 * slack).
 */
static float rounding_edge(h_rng *r) {
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                       0x7f800001u, 0xffbfffffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu};
    static const uint32_t low[] = {0x7fffu, 0x8000u, 0x8001u, 0x0000u, 0xffffu, 0x0001u};
    if (h_rng_int(r, 0, 15) == 0) return bitsf(special[h_rng_int(r, 0, NELEM(special) - 1)]);
    const uint32_t sign = (uint32_t)h_rng_int(r, 0, 1) << 31, ex = (uint32_t)h_rng_int(r, 1, 254) << 23;
    const uint32_t hi7 = (uint32_t)h_rng_int(r, 0, 127) << 16;
    const uint32_t lo = h_rng_int(r, 0, 3) ? low[h_rng_int(r, 0, NELEM(low) - 1)] : (uint32_t)h_rng_int(r, 0, 0xffff);
    return bitsf(sign | ex | hi7 | lo);
}

static void case_stx_bf16_rounding(int64_t rows, int64_t cols) {
    const int64_t ldst = round16(rows), n = 2, ldacc = 16;
    float *st0 = xmalloc((size_t)(cols * ldst) * 4);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < ldst; r++) st0[c * ldst + r] = r < rows ? rounding_edge(&g_rng) : NAN;
    ibuf st = ib_dup(st0, (size_t)(cols * ldst) * 4, 1);
    free(st0);
    uint16_t x[4] = {0x3f80u, 0, 0, 0x3f80u}; /* identity; with rows = 1 only its first row */
    if (rows == 1) x[1] = 0x3f80u;
    const float *stp = st.p;
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("stx_bf16 rounding isa=%s rows=%lld cols=%lld", kt->name, (long long)rows, (long long)cols);
        obuf acc = ob_alloc((size_t)(cols * ldacc) * 4);
        for (int64_t i = 0; i < cols * ldacc; i++) obf(&acc)[i] = i % ldacc < n ? 0.0f : NAN;
        obuf scratch = ob_alloc(sizeof(uint16_t) * (size_t)FA_STX_BF16_SCRATCH(rows, cols, n, ldst));
        tiles_begin(kt);
        kt->stx_bf16(rows, cols, n, stp, ldst, x, 2, obf(&acc), ldacc, scratch.p);
        tiles_end(kt);
        int64_t bad = 0, fc = -1, fe = -1;
        float fgot = 0, fwant = 0;
        for (int64_t c = 0; c < cols; c++)
            for (int64_t e = 0; e < n; e++) {
                double want = 0.0; /* the reference's sum: terms with w == 0 skipped */
                for (int64_t r = 0; r < rows; r++) {
                    const float w = h_bf16_to_f32(h_f32_to_bf16(stp[c * ldst + r]));
                    if (w != 0.0f) want += (double)w * (double)h_bf16_to_f32(x[2 * r + e]);
                }
                const float got = obf(&acc)[c * ldacc + e], wf = (float)want;
                const int ok = isnan(wf) ? isnan(got) : fbits(got) == fbits(wf);
                if (!ok && bad++ == 0) fc = c, fe = e, fgot = got, fwant = wf;
            }
        CHECK(bad == 0, "%lld outputs are not bf16(st) bit for bit (first c=%lld e=%lld st=0x%08x: got 0x%08x want 0x%08x)",
              (long long)bad, (long long)fc, (long long)fe, fc >= 0 ? fbits(stp[fc * ldst + fe % rows]) : 0u,
              fbits(fgot), fbits(fwant));
        CHECK(ob_guards_ok(&acc) && ob_guards_ok(&scratch), "writes outside acc or the promised scratch");
        CHECK(ib_unchanged(&st), "st changed");
        free(acc.raw), free(scratch.raw);
    }
    ib_free(&st);
}

static void test_stx_bf16(void) {
    stx_random_cases(1, h_scaled(90));
    case_stx_bf16(128, 128, 128, 128, 0, 128, 128, 0, 0, 0);
    case_stx_bf16(128, 128, 64, 2048, 2, 128, 64, 1, 0, 0);
    case_stx_bf16(300, 37, 130, 4096 + 3, 6, 304, 144, 1, 1, 0);
    case_stx_bf16(257, 20, 200, -2048, 0, 272, 208, 0, 0, 1);
    case_stx_bf16(299, 41, 33, 0, 2, 320, 48, 1, 1, 0);
    case_stx_bf16(1, 600, 1, 0, 0, 16, 16, 0, 0, 0);
    case_stx_bf16(40, 1, 300, 300, 12, 48, 304, 1, 0, 0);
    case_stx_bf16(3, 13, 17, 5, 62, 16, 32, 1, 1, 0);
    case_stx_bf16(33, 600, 65, 65, 2, 48, 80, 1, 0, 1);
    case_stx_bf16_rounding(2, 600);
    case_stx_bf16_rounding(1, 257);
}

/* ------------------------------------------------------------ small-row kernels */

/*
 * The decode path (kernels.h: qk_small, softmax_small, pv_small): rows <= FA_SMALL_ROWS,
 * row-major scores s (rows, lds), and K/V rows of type kv (f32, f16, bf16, int8 with a scale
 * per column) reached through one pointer per column. Oracles in fp64 of the same dequantised
 * values, the bounds of qk and pv (n = d terms for qk_small, cols + 1 for pv_small);
 * softmax_small runs case_softmax's inputs and checks, transposed.
 *
 * A pool holds the distinct K or V rows; layout 0 gives each row an allocation of its own,
 * exactly its size, at a random element offset (starts unaligned; reading past any row's end
 * is an ASan error), layout 1 puts them back to back in one allocation (a contiguous cache,
 * the last row ending it). Columns map to rows in order, reversed, in shuffled pages of 16 (a
 * paged cache) or at random with repeats (two columns reading one row, the int8 scales still
 * per column). The pointer and scale arrays are exact-size allocations too.
 */
enum { KV_LAYOUTS = 2, KV_MAPS = 4 };

static size_t kv_esz(int kv) { return kv == FA_KV_F32 ? 4 : kv == FA_KV_F16 || kv == FA_KV_BF16 ? 2 : 1; }

static const char *kv_str(int kv) {
    static const char *const name[FA_KV_TYPES] = {"f32", "f16", "bf16", "i8", "f8e4m3", "f8e5m2"};
    return name[kv];
}

static int kv_scaled(int kv) { return kv == FA_KV_I8 || kv == FA_KV_F8E4M3 || kv == FA_KV_F8E5M2; }
static int kv_fp8(int kv) { return kv == FA_KV_F8E4M3 || kv == FA_KV_F8E5M2; }
static fa_dtype kv_fp8_dtype(int kv) { return kv == FA_KV_F8E4M3 ? FA_DTYPE_F8E4M3 : FA_DTYPE_F8E5M2; }

/* A random fp8 code: finite, or (nonfinite) one of the format's NaN or inf codes. */
static uint8_t fp8_code(int kv, int nonfinite) {
    for (;;) {
        const uint8_t b = (uint8_t)h_rng_int(&g_rng, 0, 255);
        if (isfinite(h_fp8_to_double(b, kv_fp8_dtype(kv))) != nonfinite) return b;
    }
}

typedef struct kvpool {
    int kv, layout, mapping;
    int64_t n, len, cols;
    unsigned char **raw, **copy; /* n allocations (layout 0) or 1 */
    size_t *bytes;
    int64_t nalloc;
    const void **row;     /* n */
    ibuf ptr;             /* const void *[cols]: what the kernel gets */
    ibuf scale;           /* float[cols], int8 only (else p = NULL) */
} kvpool;

static const void *const *kvp_ptrs(const kvpool *p) { return (const void *const *)p->ptr.p; }
static const float *kvp_scales(const kvpool *p) { return kv_scaled(p->kv) ? (const float *)p->scale.p : NULL; }

/* Element x of column c, dequantised (scale * int8 exactly, for int8; scale times the
 * fp8 value by the format's definition, harness.c). */
static double kvp_get(const kvpool *p, int64_t c, int64_t x) {
    const void *row = kvp_ptrs(p)[c];
    switch (p->kv) {
    case FA_KV_F16: return h_f16_to_f32(((const uint16_t *)row)[x]);
    case FA_KV_BF16: return h_bf16_to_f32(((const uint16_t *)row)[x]);
    case FA_KV_I8: return (double)kvp_scales(p)[c] * (double)((const int8_t *)row)[x];
    case FA_KV_F8E4M3:
    case FA_KV_F8E5M2:
        return (double)kvp_scales(p)[c] * h_fp8_to_double(((const uint8_t *)row)[x], kv_fp8_dtype(p->kv));
    default: return ((const float *)row)[x];
    }
}

/* Normal(0, 1) values (rounded to f16/bf16), or any int8, or any finite fp8 code;
 * poison: a NaN, +inf and -inf in rows some column reads (not for int8, which has
 * none; fp8: three of its NaN or inf codes). */
static kvpool kvp_make(int kv, int64_t cols, int64_t len, int layout, int mapping, int poison) {
    kvpool p;
    const size_t esz = kv_esz(kv);
    p.kv = kv, p.layout = layout, p.mapping = mapping, p.len = len, p.cols = cols;
    p.n = mapping == 2 ? round16(cols) : mapping == 3 ? cols / 2 + 1 : cols;
    p.nalloc = layout == 0 ? p.n : 1;
    p.raw = xmalloc(sizeof(void *) * (size_t)p.nalloc);
    p.copy = xmalloc(sizeof(void *) * (size_t)p.nalloc);
    p.bytes = xmalloc(sizeof(size_t) * (size_t)p.nalloc);
    p.row = xmalloc(sizeof(void *) * (size_t)p.n);
    if (layout == 0) {
        for (int64_t i = 0; i < p.n; i++) {
            const size_t off = (size_t)h_rng_int(&g_rng, 0, 7) * esz;
            p.bytes[i] = off + (size_t)len * esz;
            p.raw[i] = xmalloc(p.bytes[i]);
            p.row[i] = p.raw[i] + off;
        }
    } else {
        const size_t off = (size_t)h_rng_int(&g_rng, 0, 15) * esz;
        p.bytes[0] = off + (size_t)(p.n * len) * esz;
        p.raw[0] = xmalloc(p.bytes[0]);
        for (int64_t i = 0; i < p.n; i++) p.row[i] = p.raw[0] + off + (size_t)(i * len) * esz;
    }
    for (int64_t i = 0; i < p.n; i++)
        for (int64_t x = 0; x < len; x++) {
            const float v = (float)h_rng_normal(&g_rng);
            void *row = (void *)(uintptr_t)p.row[i];
            switch (kv) {
            case FA_KV_F16: ((uint16_t *)row)[x] = h_f32_to_f16(v); break;
            case FA_KV_BF16: ((uint16_t *)row)[x] = h_f32_to_bf16(v); break;
            case FA_KV_I8: ((int8_t *)row)[x] = (int8_t)h_rng_int(&g_rng, -128, 127); break;
            case FA_KV_F8E4M3:
            case FA_KV_F8E5M2: ((uint8_t *)row)[x] = fp8_code(kv, 0); break;
            default: ((float *)row)[x] = v;
            }
        }
    int64_t *map = xmalloc(sizeof(int64_t) * (size_t)cols);
    int64_t *perm = xmalloc(sizeof(int64_t) * (size_t)(p.n / 16 + 1));
    if (mapping == 2) {
        for (int64_t g = 0; g < p.n / 16; g++) perm[g] = g;
        for (int64_t g = p.n / 16 - 1; g > 0; g--) {
            const int64_t j = h_rng_int(&g_rng, 0, g), tmp = perm[g];
            perm[g] = perm[j], perm[j] = tmp;
        }
    }
    for (int64_t c = 0; c < cols; c++)
        map[c] = mapping == 0 ? c : mapping == 1 ? cols - 1 - c : mapping == 2 ? perm[c / 16] * 16 + c % 16
                                                                               : h_rng_int(&g_rng, 0, p.n - 1);
    if (mapping == 3 && cols >= 2) map[cols - 1] = map[0]; /* at least one repeat, at the ends */
    const void **ptr = xmalloc(sizeof(void *) * (size_t)cols);
    for (int64_t c = 0; c < cols; c++) ptr[c] = p.row[map[c]];
    p.ptr = ib_dup(ptr, sizeof(void *) * (size_t)cols, 0);
    free(ptr), free(perm);
    if (poison && kv != FA_KV_I8) {
        static const float vals[3] = {NAN, INFINITY, -INFINITY};
        for (int i = 0; i < 3; i++) {
            void *row = (void *)(uintptr_t)p.row[map[h_rng_int(&g_rng, 0, cols - 1)]];
            const int64_t x = h_rng_int(&g_rng, 0, len - 1);
            if (kv == FA_KV_F32) ((float *)row)[x] = vals[i];
            else if (kv_fp8(kv)) ((uint8_t *)row)[x] = fp8_code(kv, 1);
            else ((uint16_t *)row)[x] = kv == FA_KV_F16 ? h_f32_to_f16(vals[i]) : h_f32_to_bf16(vals[i]);
        }
    }
    free(map);
    p.scale.p = NULL;
    if (kv_scaled(kv)) {
        /* scales over 2^-14 .. 2^4, and a few exact 1 and 0 */
        float *sc = xmalloc(sizeof(float) * (size_t)cols);
        for (int64_t c = 0; c < cols; c++) {
            const double u = h_rng_uniform(&g_rng);
            sc[c] = u < 0.05   ? 1.0f
                    : u < 0.07 ? 0.0f
                               : (float)ldexp(h_rng_range(&g_rng, 0.5, 1.0), (int)h_rng_int(&g_rng, -13, 5));
        }
        p.scale = ib_dup(sc, sizeof(float) * (size_t)cols, 0);
        free(sc);
    }
    for (int64_t i = 0; i < p.nalloc; i++) {
        p.copy[i] = xmalloc(p.bytes[i]);
        memcpy(p.copy[i], p.raw[i], p.bytes[i]);
    }
    return p;
}

static int kvp_unchanged(const kvpool *p) {
    for (int64_t i = 0; i < p->nalloc; i++)
        if (memcmp(p->raw[i], p->copy[i], p->bytes[i]) != 0) return 0;
    return ib_unchanged(&p->ptr) && (!p->scale.p || ib_unchanged(&p->scale));
}

static void kvp_free(kvpool *p) {
    for (int64_t i = 0; i < p->nalloc; i++) free(p->raw[i]), free(p->copy[i]);
    free(p->raw), free(p->copy), free(p->bytes), free(p->row);
    ib_free(&p->ptr);
    if (p->scale.p) ib_free(&p->scale);
}

static const char *const KV_LAYOUT_STR[KV_LAYOUTS] = {"rows apart", "rows contiguous"};
static const char *const KV_MAP_STR[KV_MAPS] = {"in order", "reversed", "shuffled pages", "random with repeats"};

/*
 * q (rows, ldq) at byte offset qoff of an exact-size allocation, NaN between d and ldq; s
 * (rows, lds): columns cols..round16(cols) may be written, the rest of each row not.
 */
static void case_qk_small(int64_t rows, int64_t cols, int64_t d, int kv, int layout, int mapping, int poison,
                          int64_t ldq, size_t qoff, int64_t lds) {
    const int64_t cpad = round16(cols);
    const size_t qbytes = qoff + (size_t)((rows - 1) * ldq + d) * 4;
    unsigned char *qraw = xmalloc(qbytes);
    float *q = (float *)(void *)(qraw + qoff);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < (r < rows - 1 ? ldq : d); x++) q[r * ldq + x] = x < d ? (float)h_rng_normal(&g_rng) : NAN;
    ibuf qb = ib_dup(qraw, qbytes, 0);
    free(qraw);
    q = (float *)(void *)((unsigned char *)qb.p + qoff);
    kvpool k = kvp_make(kv, cols, d, layout, mapping, poison);
    double *want = xmalloc(sizeof(double) * (size_t)(rows * cols)), *sum = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double s = 0, a = 0;
            for (int64_t x = 0; x < d; x++) {
                const double term = (double)q[r * ldq + x] * kvp_get(&k, c, x);
                s += term, a += fabs(term);
            }
            want[r * cols + c] = s, sum[r * cols + c] = a;
        }
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("qk_small isa=%s kv=%s rows=%lld cols=%lld d=%lld ldq=%lld q_offset=%zu lds=%lld K %s, columns %s, "
               "nonfinite_k=%d",
               kt->name, kv_str(kv), (long long)rows, (long long)cols, (long long)d, (long long)ldq, qoff,
               (long long)lds, KV_LAYOUT_STR[layout], KV_MAP_STR[mapping], poison);
        obuf s = ob_alloc((size_t)(rows * lds) * 4);
        kt->qk_small(rows, cols, d, q, ldq, kvp_ptrs(&k), kv, kvp_scales(&k), obf(&s), lds);
        dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
        int64_t touched = 0;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++)
                dot_one(&dc, obf(&s)[r * lds + c], want[r * cols + c], sum[r * cols + c], d, r, c);
            for (int64_t c = cpad; c < lds; c++) touched += fbits(obf(&s)[r * lds + c]) != SENT32;
        }
        if (dc.worst > g_tab[t].qks) g_tab[t].qks = dc.worst;
        g_tab[t].small_cases++;
        dot_report(&dc, "r", "c");
        CHECK(touched == 0, "%lld s entries past round16(cols) were written", (long long)touched);
        CHECK(ob_guards_ok(&s), "writes outside s (rows x lds)");
        CHECK(ib_unchanged(&qb) && kvp_unchanged(&k), "q, the K rows, krow or kscale changed");
        free(s.raw);
    }
    free(want), free(sum);
    ib_free(&qb);
    kvp_free(&k);
}

/*
 * p (rows, lds): values in [0, 1] with exact zeros (none when V holds non-finite values: a
 * vector kernel may multiply p = 0 by them, see kernels.h), NaN in the padding columns;
 * alpha and acc as pv_make's, nan_rows a NaN in one p and one alpha.
 */
static void case_pv_small(int64_t rows, int64_t cols, int64_t dv, int kv, int layout, int mapping, int poison,
                          int64_t lds, int64_t ldacc, int alpha_mode, int nan_rows) {
    float *p0 = xmalloc((size_t)(rows * lds) * 4);
    const double zero_share = poison || h_rng_uniform(&g_rng) < 0.5 ? 0.0 : 0.3;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < lds; c++)
            p0[r * lds + c] = c >= cols                            ? NAN
                              : h_rng_uniform(&g_rng) < zero_share ? 0.0f
                                                                   : (float)(1.0 - h_rng_uniform(&g_rng));
    float *alpha0 = NULL;
    if (alpha_mode) {
        alpha0 = xmalloc((size_t)rows * 4);
        for (int64_t r = 0; r < rows; r++) {
            const double u = h_rng_uniform(&g_rng);
            alpha0[r] = u < 0.3 ? 1.0f : u < 0.4 ? 0.0f : u < 0.45 ? 1e-30f : (float)h_rng_uniform(&g_rng);
        }
    }
    if (nan_rows) {
        p0[h_rng_int(&g_rng, 0, rows - 1) * lds + h_rng_int(&g_rng, 0, cols - 1)] = NAN;
        if (alpha0) alpha0[h_rng_int(&g_rng, 0, rows - 1)] = NAN;
    }
    ibuf pb = ib_dup(p0, (size_t)(rows * lds) * 4, 1), ab = {0};
    if (alpha0) ab = ib_dup(alpha0, (size_t)rows * 4, 0);
    float *acc0 = xmalloc((size_t)(rows * ldacc) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < ldacc; e++) acc0[r * ldacc + e] = e < dv ? (float)h_rng_normal(&g_rng) : NAN;
    kvpool v = kvp_make(kv, cols, dv, layout, mapping, poison);
    double *want = xmalloc(sizeof(double) * (size_t)(rows * dv)), *sum = xmalloc(sizeof(double) * (size_t)(rows * dv));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < dv; e++) {
            const double a0 = (double)acc0[r * ldacc + e] * (alpha0 ? (double)alpha0[r] : 1.0);
            double s = a0, a = fabs(a0);
            for (int64_t c = 0; c < cols; c++) {
                const double term = (double)p0[r * lds + c] * kvp_get(&v, c, e);
                s += term, a += fabs(term);
            }
            want[r * dv + e] = s, sum[r * dv + e] = a;
        }
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("pv_small isa=%s kv=%s rows=%lld cols=%lld dv=%lld lds=%lld ldacc=%lld alpha=%s nan_rows=%d V %s, "
               "columns %s, nonfinite_v=%d",
               kt->name, kv_str(kv), (long long)rows, (long long)cols, (long long)dv, (long long)lds,
               (long long)ldacc, alpha0 ? "given" : "NULL", nan_rows, KV_LAYOUT_STR[layout], KV_MAP_STR[mapping],
               poison);
        obuf acc = ob_alloc((size_t)(rows * ldacc) * 4);
        memcpy(acc.p, acc0, (size_t)(rows * ldacc) * 4);
        kt->pv_small(rows, cols, dv, pb.p, lds, kvp_ptrs(&v), kv, kvp_scales(&v), alpha0 ? ab.p : NULL, obf(&acc),
                     ldacc);
        dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
        for (int64_t r = 0; r < rows; r++)
            for (int64_t e = 0; e < dv; e++)
                dot_one(&dc, obf(&acc)[r * ldacc + e], want[r * dv + e], sum[r * dv + e], cols + 1, r, e);
        if (dc.worst > g_tab[t].pvs) g_tab[t].pvs = dc.worst;
        g_tab[t].small_cases++;
        dot_report(&dc, "r", "e");
        CHECK(ob_guards_ok(&acc), "writes outside acc (rows >= %lld, or before it)", (long long)rows);
        CHECK(ib_unchanged(&pb) && (!alpha0 || ib_unchanged(&ab)) && kvp_unchanged(&v),
              "s, alpha, the V rows, vrow or vscale changed");
        free(acc.raw);
    }
    free(want), free(sum), free(p0), free(alpha0), free(acc0);
    ib_free(&pb);
    if (alpha0) ib_free(&ab);
    kvp_free(&v);
}

static const int64_t SMALL_COLS_EDGE[] = {1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                                          100, 127, 128, 129, 255, 256, 257, 400, 511, 512};
static const int64_t SMALL_DIM_EDGE[] = {1, 3, 17, 64, 100, 128, 130, 256};

static void test_small(void) {
    /* every type x rows 1..8 x the listed head dims, the rest drawn */
    for (int kv = 0; kv < FA_KV_TYPES; kv++)
        for (int64_t rows = 1; rows <= FA_SMALL_ROWS; rows++)
            for (int di = 0; di < NELEM(SMALL_DIM_EDGE); di++) {
                if (h_rng_uniform(&g_rng) >= h_test_scale()) continue;
                const int64_t d = SMALL_DIM_EDGE[di];
                int64_t cols = pick_size(&g_rng, SMALL_COLS_EDGE, NELEM(SMALL_COLS_EDGE), FA_SMALL_COLS);
                const int layout = (int)h_rng_int(&g_rng, 0, KV_LAYOUTS - 1), mapping = (int)h_rng_int(&g_rng, 0, KV_MAPS - 1);
                const int poison = kv != FA_KV_I8 && h_rng_uniform(&g_rng) < 0.2;
                const int64_t ldq = h_rng_uniform(&g_rng) < 0.5 ? d : d + h_rng_int(&g_rng, 1, 40);
                const size_t qoff = (size_t)h_rng_int(&g_rng, 0, 15) * 4;
                const int64_t lds = round16(cols) + 16 * h_rng_int(&g_rng, 0, 2);
                case_qk_small(rows, cols, d, kv, layout, mapping, poison, ldq, qoff, lds);
                const int64_t dv = h_rng_uniform(&g_rng) < 0.7 ? d : SMALL_DIM_EDGE[h_rng_int(&g_rng, 0, NELEM(SMALL_DIM_EDGE) - 1)];
                const int64_t ldacc = round16(dv) + 16 * h_rng_int(&g_rng, 0, 1);
                const int alpha_mode = h_rng_uniform(&g_rng) < 0.7, nan_rows = h_rng_uniform(&g_rng) < 0.15;
                const int vlayout = (int)h_rng_int(&g_rng, 0, KV_LAYOUTS - 1), vmapping = (int)h_rng_int(&g_rng, 0, KV_MAPS - 1);
                case_pv_small(rows, cols, dv, kv, vlayout, vmapping, poison, lds, ldacc, alpha_mode, nan_rows);
            }
    /* other head dims, drawn */
    const int n = h_scaled(40);
    for (int i = 0; i < n; i++) {
        const int kv = i % FA_KV_TYPES;
        const int64_t rows = h_rng_int(&g_rng, 1, FA_SMALL_ROWS), d = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 512);
        const int64_t cols = pick_size(&g_rng, SMALL_COLS_EDGE, NELEM(SMALL_COLS_EDGE), FA_SMALL_COLS);
        const int64_t lds = round16(cols) + 16 * h_rng_int(&g_rng, 0, 1);
        const int mapping = (int)h_rng_int(&g_rng, 0, KV_MAPS - 1);
        const size_t qoff = (size_t)h_rng_int(&g_rng, 0, 15) * 4;
        case_qk_small(rows, cols, d, kv, i % 2, mapping, i % 3 == 0, d + (i % 5 == 0), qoff, lds);
        case_pv_small(rows, cols, d, kv, (i + 1) % 2, mapping, i % 3 == 0, lds, round16(d), i % 4 != 3, i % 7 == 0);
    }
    /* softmax_small: case_softmax's row kinds and bands, row-major */
    const int ns = h_scaled(120);
    for (int i = 0; i < ns; i++) {
        const int64_t rows = 1 + i % FA_SMALL_ROWS;
        const int64_t cols = pick_size(&g_rng, SMALL_COLS_EDGE, NELEM(SMALL_COLS_EDGE), FA_SMALL_COLS);
        case_softmax_layout(rows, cols, round16(cols) + 16 * h_rng_int(&g_rng, 0, 2), i % 3 != 0, 1);
    }
    /* the corners */
    for (int kv = 0; kv < FA_KV_TYPES; kv++) {
        case_qk_small(8, 512, 256, kv, 0, 3, kv != FA_KV_I8, 256, 4, 512);
        case_qk_small(1, 1, 1, kv, 0, 0, 0, 1, 0, 16);
        case_qk_small(7, 513 - 16, 130, kv, 1, 2, 0, 131, 8, 512);
        case_pv_small(8, 512, 256, kv, 0, 3, 0, 512, 256, 1, 1);
        case_pv_small(1, 1, 1, kv, 1, 0, 0, 16, 16, 1, 0);
        case_pv_small(5, 129, 130, kv, 0, 2, kv != FA_KV_I8, 160, 144, 0, 0);
        /* head dims past 512 (a kernel may copy q only up to some size) */
        case_qk_small(3, 40, 513, kv, 0, 3, 0, 520, 4, 48);
        case_qk_small(8, 33, 777, kv, 1, 1, kv != FA_KV_I8, 777, 12, 48);
        case_pv_small(6, 50, 777, kv, 0, 3, 0, 64, 784, 1, 0);
    }
    case_softmax_layout(8, 512, 512, 1, 1);
    case_softmax_layout(8, 512, 528, 0, 1);
    case_softmax_layout(1, 1, 16, 0, 1);
    case_softmax_layout(1, 1, 16, 1, 1);
}

/*
 * FA_PARAM_QUANT_MATMUL's decode kernels (kernels.h: qk_small_i8, pv_small_i8; docs/semantics.md,
 * section 11) against the contract's formulas computed here (integer sums in int64, the f32
 * steps in the written order), bit for bit on every table (a NaN matches any NaN); the
 * rows the contract leaves to the exact kernel against the reference's pv_small. And
 * fa_quant_row_i8 against the rule, written out here.
 */
static int same_or_nan(float a, float b) { return fbits(a) == fbits(b) || (isnan(a) && isnan(b)); }

static void case_quant_row(const fa_kernels *kt, int64_t n, int kind, int digits) {
    float *x = xmalloc(sizeof(float) * (size_t)n);
    const double sig = ldexp(1.0, (int)h_rng_int(&g_rng, -20, 20));
    for (int64_t i = 0; i < n; i++) x[i] = kind == 1 ? 0.0f : (float)(sig * h_rng_normal(&g_rng));
    if (kind == 2) x[h_rng_int(&g_rng, 0, n - 1)] = h_rng_uniform(&g_rng) < 0.5 ? NAN : -INFINITY;
    if (kind == 3) x[h_rng_int(&g_rng, 0, n - 1)] = (float)(127.5 * sig); /* ties around the max */
    const int64_t ld = (n + 63) / 64 * 64;
    int8_t *code = xmalloc((size_t)(digits * ld) + 64);
    memset(code, 0x55, (size_t)(digits * ld) + 64);
    h_case("quant_row_i8 isa=%s n=%lld kind=%d digits=%d", kt->name, (long long)n, kind, digits);
    const float sc = kt->quant_row_i8(x, n, digits, code);
    float amax = 0.0f;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]);
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    const float want = finite ? amax / 127.0f : NAN;
    CHECK(same_or_nan(sc, want), "scale %a, want %a", (double)sc, (double)want);
    int bad = 0;
    for (int64_t i = 0; i < ld; i++) {
        int w = 0, w2 = 0;
        if (i < n && finite && want > 0.0f) {
            const float y = x[i] * (1.0f / want), yr = nearbyintf(y);
            w = yr > 127.0f ? 127 : yr < -127.0f ? -127 : (int)yr;
            const float l = nearbyintf((y - (float)w) * 256.0f);
            w2 = l > 127.0f ? 127 : l < -127.0f ? -127 : (int)l;
        }
        bad += code[i] != w;
        if (digits == 2) bad += code[ld + i] != w2;
    }
    for (int64_t i = digits * ld; i < digits * ld + 64; i++) bad += code[i] != 0x55;
    CHECK(bad == 0, "%d codes wrong (or written past fa_q8_ld(n))", bad);
    free(x), free(code);
}

/* sum_rows_bf16 against its rule written out here: each channel's rows added in order in
 * double, onto sums that already hold a value (a tile after the first), bit for bit
 * (a NaN matches any NaN); the sums past d untouched. */
static void case_sum_rows(const fa_kernels *kt, int64_t rows, int64_t d) {
    const int64_t ld = d + h_rng_int(&g_rng, 0, 40);
    uint16_t *x = xmalloc(sizeof(uint16_t) * (size_t)(rows * ld + 1));
    double *sum = xmalloc(sizeof(double) * (size_t)(d + 8)), *want = xmalloc(sizeof(double) * (size_t)d);
    for (int64_t i = 0; i < rows * ld; i++) {
        const double u = h_rng_uniform(&g_rng);
        const float v = u < 0.01 ? NAN : u < 0.02 ? INFINITY : (float)ldexp(h_rng_normal(&g_rng), (int)h_rng_int(&g_rng, -30, 30));
        x[i] = h_f32_to_bf16(v);
    }
    for (int64_t e = 0; e < d + 8; e++) sum[e] = e < d ? ldexp(h_rng_normal(&g_rng), (int)h_rng_int(&g_rng, -10, 10)) : 1234.5;
    for (int64_t e = 0; e < d; e++) {
        double w = sum[e];
        for (int64_t r = 0; r < rows; r++) w += (double)h_bf16_to_f32(x[r * ld + e]);
        want[e] = w;
    }
    h_case("sum_rows_bf16 isa=%s rows=%lld d=%lld", kt->name, (long long)rows, (long long)d);
    kt->sum_rows_bf16(rows, d, x, ld, sum);
    int bad = 0;
    for (int64_t e = 0; e < d; e++) bad += !(memcmp(&sum[e], &want[e], sizeof(double)) == 0 || (isnan(sum[e]) && isnan(want[e])));
    for (int64_t e = d; e < d + 8; e++) bad += sum[e] != 1234.5;
    CHECK(bad == 0, "%d sums differ from the rule's bits (or written past d)", bad);
    free(x), free(sum), free(want);
}

/* dot_rows_f64 against its rule written out here (products exact in double, added in
 * order from 0), bit for bit (a NaN matches any NaN), rows ldx apart; out past rows
 * untouched. */
static void case_dot_rows(const fa_kernels *kt, int64_t rows, int64_t d) {
    const int64_t ldx = d + h_rng_int(&g_rng, 0, 40);
    float *x = xmalloc(sizeof(float) * (size_t)(rows * ldx + 1)), *y = xmalloc(sizeof(float) * (size_t)d);
    float *out = xmalloc(sizeof(float) * (size_t)(rows + 8));
    for (int64_t i = 0; i < rows * ldx; i++) {
        const double u = h_rng_uniform(&g_rng);
        x[i] = u < 0.005 ? NAN : u < 0.01 ? -INFINITY : (float)ldexp(h_rng_normal(&g_rng), (int)h_rng_int(&g_rng, -30, 30));
    }
    for (int64_t e = 0; e < d; e++) y[e] = (float)ldexp(h_rng_normal(&g_rng), (int)h_rng_int(&g_rng, -30, 30));
    for (int64_t r = 0; r < rows + 8; r++) out[r] = 1234.5f;
    h_case("dot_rows_f64 isa=%s rows=%lld d=%lld", kt->name, (long long)rows, (long long)d);
    kt->dot_rows_f64(rows, d, x, ldx, y, out);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        double c = 0.0;
        for (int64_t e = 0; e < d; e++) c += (double)x[r * ldx + e] * (double)y[e];
        bad += !same_or_nan(out[r], (float)c);
    }
    for (int64_t r = rows; r < rows + 8; r++) bad += out[r] != 1234.5f;
    CHECK(bad == 0, "%d dots differ from the rule's bits (or written past rows)", bad);
    free(x), free(y), free(out);
}

static void case_qk_small_i8(int64_t rows, int64_t cols, int64_t d, int digits, int layout, int mapping,
                             int64_t lds) {
    const int64_t ldq8 = (d + 63) / 64 * 64 + 64 * h_rng_int(&g_rng, 0, 1);
    int8_t *q0 = xmalloc((size_t)(rows * digits * ldq8));
    float qs0[FA_SMALL_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t x = 0; x < digits * ldq8; x++)
            q0[r * digits * ldq8 + x] = x % ldq8 < d ? (int8_t)h_rng_int(&g_rng, -127, 127) : 0;
        const double u = h_rng_uniform(&g_rng);
        qs0[r] = u < 0.1 ? 0.0f : u < 0.15 ? NAN : (float)ldexp(h_rng_range(&g_rng, 0.5, 1.0), (int)h_rng_int(&g_rng, -20, 3));
    }
    if (d > 200) /* the largest sums: every code -127 in one row (and K's -128 where drawn) */
        for (int64_t x = 0; x < d; x++) q0[x] = -127;
    ibuf qb = ib_dup(q0, (size_t)(rows * digits * ldq8), 1), sb = ib_dup(qs0, sizeof(float) * (size_t)rows, 0);
    kvpool k = kvp_make(FA_KV_I8, cols, d, layout, mapping, 0);
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("qk_small_i8 isa=%s rows=%lld cols=%lld d=%lld digits=%d ldq8=%lld lds=%lld K %s, columns %s",
               kt->name, (long long)rows, (long long)cols, (long long)d, digits, (long long)ldq8, (long long)lds,
               KV_LAYOUT_STR[layout], KV_MAP_STR[mapping]);
        obuf s = ob_alloc((size_t)(rows * lds) * 4);
        kt->qk_small_i8(rows, cols, d, digits, qb.p, ldq8, sb.p, kvp_ptrs(&k), kvp_scales(&k), obf(&s), lds);
        int64_t bad = 0, touched = 0;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) {
                int64_t sum[2] = {0, 0};
                const int8_t *kr = kvp_ptrs(&k)[c];
                for (int dg = 0; dg < digits; dg++)
                    for (int64_t x = 0; x < d; x++) sum[dg] += (int64_t)q0[(r * digits + dg) * ldq8 + x] * kr[x];
                const float dot = digits == 2 ? fmaf((float)sum[1], 0x1p-8f, (float)sum[0]) : (float)sum[0];
                const float want = dot * (qs0[r] * kvp_scales(&k)[c]);
                const float got = obf(&s)[r * lds + c];
                if (!same_or_nan(got, want) && bad++ < 3)
                    printf("  (r %lld, c %lld): got %a want %a\n", (long long)r, (long long)c, (double)got, (double)want);
            }
            for (int64_t c = round16(cols); c < lds; c++) touched += fbits(obf(&s)[r * lds + c]) != SENT32;
        }
        CHECK(bad == 0, "%lld scores differ from the contract's bits", (long long)bad);
        CHECK(touched == 0 && ob_guards_ok(&s), "writes outside s's rows and their padding");
        CHECK(ib_unchanged(&qb) && ib_unchanged(&sb) && kvp_unchanged(&k), "q8, qscale or K changed");
        free(s.raw);
    }
    free(q0);
    ib_free(&qb), ib_free(&sb);
    kvp_free(&k);
}

/* special: 0 none, 1 a NaN p, 2 a negative V scale, 3 an inf V scale, 4 tiny p (wmax
 * below FA_PV_I8_WMIN), 5 an all-zero row, 6 a NaN V scale at a p = 0 (masked) key */
static void case_pv_small_i8(int64_t rows, int64_t cols, int64_t dv, int digits, int layout, int mapping,
                             int64_t lds, int64_t ldacc, int alpha_mode, int special) {
    float *p0 = xmalloc((size_t)(rows * lds) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < lds; c++)
            p0[r * lds + c] = c >= cols ? NAN : h_rng_uniform(&g_rng) < 0.2 ? 0.0f : (float)(1.0 - h_rng_uniform(&g_rng));
    const int64_t sr = h_rng_int(&g_rng, 0, rows - 1), sc = h_rng_int(&g_rng, 0, cols - 1);
    if (special == 1) p0[sr * lds + sc] = NAN;
    if (special == 4)
        for (int64_t c = 0; c < cols; c++) p0[sr * lds + c] *= 0x1p-120f;
    if (special == 5 || special == 6)
        for (int64_t c = 0; c < cols; c++) p0[sr * lds + c] = 0.0f;
    float *alpha0 = NULL;
    if (alpha_mode) {
        alpha0 = xmalloc((size_t)rows * 4);
        for (int64_t r = 0; r < rows; r++) {
            const double u = h_rng_uniform(&g_rng);
            alpha0[r] = u < 0.3 ? 1.0f : u < 0.4 ? 0.0f : (float)h_rng_uniform(&g_rng);
        }
    }
    float *acc0 = xmalloc((size_t)(rows * ldacc) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < ldacc; e++) acc0[r * ldacc + e] = e < dv ? (float)h_rng_normal(&g_rng) : NAN;
    if (special == 5) acc0[sr * ldacc] = -0.0f;
    kvpool v = kvp_make(FA_KV_I8, cols, dv, layout, mapping, 0);
    float *vs = (float *)v.scale.p;
    if (special == 2) vs[sc] = -vs[sc] - 1.0f;
    if (special == 3) vs[sc] = INFINITY;
    if (special == 6) vs[sc] = NAN;
    memcpy(v.scale.copy, v.scale.p, v.scale.bytes);
    ibuf pb = ib_dup(p0, (size_t)(rows * lds) * 4, 1), ab = {0};
    if (alpha0) ab = ib_dup(alpha0, (size_t)rows * 4, 0);
    /* the contract's result, row by row; rows it leaves to the reference's exact kernel: that */
    float *want = xmalloc((size_t)(rows * ldacc) * 4);
    memcpy(want, acc0, (size_t)(rows * ldacc) * 4);
    for (int64_t r = 0; r < rows; r++) {
        const float *pr = p0 + r * lds, a = alpha0 ? alpha0[r] : 1.0f;
        float wmax = 0.0f;
        int ok = 1;
        for (int64_t c = 0; c < cols; c++) {
            const float w = pr[c] * vs[c];
            ok &= w >= 0.0f && w < INFINITY;
            if (w > wmax) wmax = w;
        }
        float *wr = want + r * ldacc;
        if (!ok || (wmax > 0.0f && wmax < 0x1p-100f)) {
            fa_kernels_ref.pv_small(1, cols, dv, pr, lds, kvp_ptrs(&v), FA_KV_I8, vs, alpha0 ? alpha0 + r : NULL, wr,
                                    ldacc);
            continue;
        }
        for (int64_t e = 0; e < dv; e++) {
            if (wmax == 0.0f) {
                wr[e] = a * wr[e];
                continue;
            }
            int64_t hs = 0, ls = 0;
            for (int64_t c = 0; c < cols; c++) {
                /* one digit: y to nearest; two: floor(y) and the rest to nearest in 2^-8, each clamped */
                const float y = pr[c] * vs[c] * (255.0f / wmax);
                float h = digits == 2 ? floorf(y) : nearbyintf(y), l = nearbyintf((y - h) * 256.0f);
                h = h > 255.0f ? 255.0f : h, l = l > 255.0f ? 255.0f : l;
                hs += (int64_t)h * ((const int8_t *)kvp_ptrs(&v)[c])[e];
                ls += (int64_t)l * ((const int8_t *)kvp_ptrs(&v)[c])[e];
            }
            const float dot = digits == 2 ? fmaf((float)ls, 0x1p-8f, (float)hs) : (float)hs;
            wr[e] = fmaf(wmax / 255.0f, dot, a * wr[e]);
        }
    }
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("pv_small_i8 isa=%s rows=%lld cols=%lld dv=%lld digits=%d lds=%lld ldacc=%lld alpha=%s special=%d "
               "V %s, columns %s, ahead %s",
               kt->name, (long long)rows, (long long)cols, (long long)dv, digits, (long long)lds, (long long)ldacc,
               alpha0 ? "given" : "NULL", special, KV_LAYOUT_STR[layout], KV_MAP_STR[mapping],
               (rows + cols) % 2 ? "V's rows" : "none");
        obuf acc = ob_alloc((size_t)(rows * ldacc) * 4);
        memcpy(acc.p, acc0, (size_t)(rows * ldacc) * 4);
        /* every other case with rows to prefetch (V's own): a hint, the bits stay the contract's */
        const fa_rows_ahead ahead = {kvp_ptrs(&v), cols, dv};
        kt->pv_small_i8(rows, cols, dv, digits, pb.p, lds, kvp_ptrs(&v), vs, alpha0 ? ab.p : NULL, obf(&acc), ldacc,
                        (rows + cols) % 2 ? &ahead : NULL);
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t e = 0; e < ldacc; e++) {
                const float got = obf(&acc)[r * ldacc + e], w = want[r * ldacc + e];
                if (e < dv ? !same_or_nan(got, w) : fbits(got) != fbits(w)) /* padding: untouched */
                    if (bad++ < 3)
                        printf("  (r %lld, e %lld): got %a want %a\n", (long long)r, (long long)e, (double)got, (double)w);
            }
        CHECK(bad == 0, "%lld outputs differ from the contract's bits", (long long)bad);
        CHECK(ob_guards_ok(&acc), "writes outside acc");
        CHECK(ib_unchanged(&pb) && (!alpha0 || ib_unchanged(&ab)) && kvp_unchanged(&v), "s, alpha or V changed");
        free(acc.raw);
    }
    free(p0), free(alpha0), free(acc0), free(want);
    ib_free(&pb);
    if (alpha0) ib_free(&ab);
    kvp_free(&v);
}

/*
 * qk_i8 (kernels.h; docs/semantics.md, 11) on every table against the contract's score
 * computed here (the integer sum in int64, then the f32 steps in the written order), bit
 * for bit (a NaN matches any NaN), for every row of the padded row block, with the columns
 * past cols and the rows past it in st untouched; its Q operand as fa_pack_qt_u8 packs it,
 * which is itself checked against the layout written out here.
 */
static void case_qk_i8(int64_t rows, int64_t cols, int64_t d, int smooth, int extreme) {
    const int64_t rp = round16(rows), nq = FA_QT4_QUADS(d), ldq8 = d + h_rng_int(&g_rng, 0, 9);
    const int64_t ldqt4 = rp + 16 * h_rng_int(&g_rng, 0, 2), ldk8 = (d + 3) / 4 * 4 + h_rng_int(&g_rng, 0, 7);
    const int64_t ldst = rp + 16 * h_rng_int(&g_rng, 0, 2);
    int8_t *q8 = xmalloc((size_t)(rows * ldq8)), *k8 = xmalloc((size_t)(cols * ldk8));
    for (int64_t i = 0; i < rows * ldq8; i++) q8[i] = (int8_t)(extreme ? -127 : h_rng_int(&g_rng, -127, 127));
    for (int64_t c = 0; c < cols; c++)
        for (int64_t x = 0; x < ldk8; x++)
            k8[c * ldk8 + x] = x >= (d + 3) / 4 * 4 ? 77 /* past the quads: never read */
                               : x >= d               ? 0
                               : extreme              ? -128
                                                      : (int8_t)h_rng_int(&g_rng, -128, 127);
    float *qs = xaligned(4 * (size_t)rp), *qc = xaligned(4 * (size_t)rp), *ks = xmalloc(4 * (size_t)cols);
    int32_t *ksum = xmalloc(4 * (size_t)cols);
    for (int64_t r = 0; r < rp; r++) {
        const double u = h_rng_uniform(&g_rng);
        qs[r] = u < 0.05 ? 0.0f : u < 0.08 ? NAN : (float)ldexp(h_rng_range(&g_rng, 0.5, 1.0), (int)h_rng_int(&g_rng, -20, 3));
        qc[r] = (float)(8.0 * h_rng_normal(&g_rng));
    }
    for (int64_t c = 0; c < cols; c++) {
        ks[c] = h_rng_uniform(&g_rng) < 0.05 ? 0.0f : (float)ldexp(h_rng_range(&g_rng, 0.5, 1.0), (int)h_rng_int(&g_rng, -20, 3));
        ksum[c] = 0;
        for (int64_t x = 0; x < d; x++) ksum[c] += k8[c * ldk8 + x];
    }
    /* the Q^T quads, from the layout */
    uint32_t *qt4 = xaligned(4 * (size_t)(nq * ldqt4)), *want4 = xmalloc(4 * (size_t)(nq * ldqt4));
    for (int64_t i = 0; i < nq * ldqt4; i++) qt4[i] = want4[i] = 0xdeadbeefu;
    for (int64_t p = 0; p < nq; p++)
        for (int64_t r = 0; r < rp; r++) {
            uint32_t w = 0;
            for (int b = 0; b < 4; b++) w |= (uint32_t)((r < rows && 4 * p + b < d ? q8[r * ldq8 + 4 * p + b] : 0) + 128) << 8 * b;
            want4[p * ldqt4 + r] = w;
        }
    h_case("fa_pack_qt_u8 rows=%lld d=%lld ldq8=%lld ldqt4=%lld", (long long)rows, (long long)d, (long long)ldq8,
           (long long)ldqt4);
    fa_pack_qt_u8(rows, d, q8, ldq8, qt4, ldqt4);
    CHECK(memcmp(qt4, want4, 4 * (size_t)(nq * ldqt4)) == 0, "Q^T quads differ from the layout (or written past it)");
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        h_case("qk_i8 isa=%s rows=%lld cols=%lld d=%lld smooth=%d extreme=%d ldqt4=%lld ldk8=%lld ldst=%lld", kt->name,
               (long long)rows, (long long)cols, (long long)d, smooth, extreme, (long long)ldqt4, (long long)ldk8,
               (long long)ldst);
        obuf st = ob_alloc((size_t)(cols * ldst) * 4);
        tiles_begin(kt);
        kt->qk_i8(rows, cols, d, qt4, ldqt4, qs, smooth ? qc : NULL, k8, ldk8, ks, ksum, obf(&st), ldst);
        tiles_end(kt);
        int64_t bad = 0, touched = 0;
        for (int64_t c = 0; c < cols; c++) {
            for (int64_t r = 0; r < rp; r++) {
                int64_t a = 0;
                for (int64_t x = 0; x < d && r < rows; x++) a += (int64_t)q8[r * ldq8 + x] * k8[c * ldk8 + x];
                float want = (float)a * (qs[r] * ks[c]);
                if (smooth) want += qc[r];
                const float got = obf(&st)[c * ldst + r];
                if (!same_or_nan(got, want) && bad++ < 3)
                    printf("  (r %lld, c %lld): got %a want %a\n", (long long)r, (long long)c, (double)got, (double)want);
            }
            for (int64_t r = rp; r < ldst; r++) touched += fbits(obf(&st)[c * ldst + r]) != SENT32;
        }
        CHECK(bad == 0, "%lld scores differ from the contract's bits", (long long)bad);
        CHECK(touched == 0 && ob_guards_ok(&st), "writes past the padded rows or outside st");
        free(st.raw);
    }
    free(q8), free(k8), free(qs), free(qc), free(ks), free(ksum), free(qt4), free(want4);
}

static void test_qk_i8(void) {
    static const int64_t dims[] = {1, 3, 4, 17, 63, 64, 65, 128, 130, 256, 577};
    for (int di = 0; di < NELEM(dims); di++)
        for (int64_t rows = 1; rows <= 150; rows += 1 + rows / 2) {
            if (h_rng_uniform(&g_rng) >= h_test_scale()) continue;
            const int64_t cols = h_rng_int(&g_rng, 1, 40) + (rows % 3 == 0 ? 100 : 0);
            case_qk_i8(rows, cols, dims[di], (int)(rows + di) % 2, 0);
        }
    case_qk_i8(64, 37, 2000, 1, 1); /* the largest sums: every q code -127, every k code -128 */
    case_qk_i8(70, 6, 128, 0, 0);
}

static void test_small_i8(void) {
    for (int64_t n = 1; n <= 300; n += (n < 20 ? 1 : 37))
        for (int kind = 0; kind < 4; kind++)
            for (int t = 0; t < g_ntab; t++)
                case_quant_row(g_tab[t].k, n, kind, 1 + kind % 2), case_quant_row(g_tab[t].k, n, kind, 2 - kind % 2);
    static const int64_t sum_dims[] = {1, 7, 8, 63, 64, 100, 128, 129, 200, 256, 300};
    for (int di = 0; di < NELEM(sum_dims); di++)
        for (int64_t rows = 0; rows <= 40; rows += 1 + rows / 3)
            for (int t = 0; t < g_ntab; t++)
                case_sum_rows(g_tab[t].k, rows, sum_dims[di]), case_dot_rows(g_tab[t].k, rows, sum_dims[di]);
    static const int64_t dims[] = {1, 3, 17, 63, 64, 65, 100, 128, 130, 256, 576, 777};
    for (int64_t rows = 1; rows <= FA_SMALL_ROWS; rows++)
        for (int di = 0; di < NELEM(dims); di++) {
            if (h_rng_uniform(&g_rng) >= h_test_scale()) continue;
            const int64_t d = dims[di];
            const int64_t cols = pick_size(&g_rng, SMALL_COLS_EDGE, NELEM(SMALL_COLS_EDGE), FA_SMALL_COLS);
            const int layout = (int)h_rng_int(&g_rng, 0, KV_LAYOUTS - 1), mapping = (int)h_rng_int(&g_rng, 0, KV_MAPS - 1);
            const int64_t lds = round16(cols) + 16 * h_rng_int(&g_rng, 0, 2);
            const int digits = 1 + (int)((rows + di) % 2);
            case_qk_small_i8(rows, cols, d, digits, layout, mapping, lds);
            const int64_t dv = h_rng_uniform(&g_rng) < 0.7 ? d : dims[h_rng_int(&g_rng, 0, NELEM(dims) - 1)];
            case_pv_small_i8(rows, cols, dv, 3 - digits, layout, mapping, lds, round16(dv) + 16 * h_rng_int(&g_rng, 0, 1),
                             h_rng_uniform(&g_rng) < 0.7, (int)(rows + di) % 7);
        }
    for (int special = 0; special < 7; special++)
        for (int digits = 1; digits <= 2; digits++) {
            case_pv_small_i8(8, 512, 128, digits, 0, 3, 512, 128, 1, special);
            case_pv_small_i8(3, 5, 1100, digits, 1, 0, 16, 1104, special % 2, special);
        }
    for (int digits = 1; digits <= 2; digits++) {
        case_qk_small_i8(8, 512, 128, digits, 0, 3, 512);
        case_qk_small_i8(4, 1, 2000, digits, 1, 0, 16);
    }
}

/*
 * Every code of both fp8 formats through each table's small-row kernels, against the
 * decoding harness.c writes from the formats' definitions: qk_small with q = 1 and K
 * rows holding one code among zeros (at every position of a 44-wide row: the whole
 * vectors and the tail), scale 1, 2^-20 and 3 (a scale that is not a power of two
 * rounds once: compared with the double product rounded to f32); pv_small with p = 1,
 * one V row of 44 codes at a time. Both are exact: one nonzero term. NaN codes must
 * give NaN, E5M2's infs inf.
 */
static void test_fp8_codes(const table_stats *ts) {
    const fa_kernels *kt = ts->k;
    enum { W = 44 };
    static const float scales[3] = {1.0f, 0x1.0p-20f, 3.0f};
    for (int kv = FA_KV_F8E4M3; kv <= FA_KV_F8E5M2; kv++)
        for (int si = 0; si < 3; si++) {
            h_case("fp8 codes isa=%s kv=%s scale=%g: all 256 through qk_small and pv_small", kt->name, kv_str(kv),
                   (double)scales[si]);
            static uint8_t rows[256][W];
            const void *ptr[256];
            float sc[256], q[W];
            _Alignas(64) float sv[256 + 16], acc[48];
            for (int c = 0; c < 256; c++) {
                memset(rows[c], 0, W);
                rows[c][c % W] = (uint8_t)c;
                ptr[c] = rows[c];
                sc[c] = scales[si];
            }
            for (int x = 0; x < W; x++) q[x] = 1.0f;
            kt->qk_small(1, 256, W, q, W, ptr, kv, sc, sv, 256 + 16);
            int bad = 0, first = -1;
            for (int c = 0; c < 256; c++) {
                const double v = h_fp8_to_double((unsigned)c, kv_fp8_dtype(kv));
                const float want = (float)(v * scales[si]);
                const int ok = isnan(v) ? isnan(sv[c]) : sv[c] == want;
                if (!ok && first < 0) first = c;
                bad += !ok;
            }
            CHECK(bad == 0, "qk_small: %d codes decode wrong, first 0x%02x: got %.9g, want %.9g", bad, first & 0xff,
                  first >= 0 ? (double)sv[first] : 0.0,
                  first >= 0 ? h_fp8_to_double((unsigned)first, kv_fp8_dtype(kv)) * scales[si] : 0.0);
            bad = 0, first = -1;
            for (int c0 = 0; c0 < 256; c0 += W) {
                uint8_t vrow[W];
                const void *vp[1] = {vrow};
                _Alignas(64) float p1[16] = {1.0f};
                for (int e = 0; e < W; e++) vrow[e] = (uint8_t)((c0 + e) & 0xff);
                for (int e = 0; e < 48; e++) acc[e] = 0.0f;
                kt->pv_small(1, 1, W, p1, 16, vp, kv, &sc[0], NULL, acc, 48);
                for (int e = 0; e < W && c0 + e < 256; e++) {
                    const double v = h_fp8_to_double((unsigned)(c0 + e), kv_fp8_dtype(kv));
                    const float want = (float)(v * scales[si]);
                    const int ok = isnan(v) ? isnan(acc[e]) : acc[e] == want;
                    if (!ok && first < 0) first = c0 + e;
                    bad += !ok;
                }
            }
            CHECK(bad == 0, "pv_small: %d codes decode wrong, first 0x%02x", bad, first & 0xff);
        }
}

/* ------------------------------------------------------------ conversions */

static int f16_is_snan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) && !(h & 0x200u); }

static void test_conversions(table_stats *ts) {
    const fa_kernels *kt = ts->k;
    enum { N = 65536 };
    uint16_t *src = xmalloc(sizeof(uint16_t) * N);
    float *ref = xmalloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) src[i] = (uint16_t)i;
    for (int which = 0; which < 2; which++) {
        const char *name = which ? "bf16_to_f32" : "f16_to_f32";
        void (*conv)(const uint16_t *, float *, int64_t) = which ? kt->bf16_to_f32 : kt->f16_to_f32;
        void (*rconv)(const uint16_t *, float *, int64_t) =
            which ? fa_kernels_ref.bf16_to_f32 : fa_kernels_ref.f16_to_f32;
        h_case("%s isa=%s: all 65536 inputs", name, kt->name);
        rconv(src, ref, N);
        if (kt == &fa_kernels_ref) { /* the reference against our own conversion */
            int64_t bad = 0;
            for (int i = 0; i < N; i++)
                bad += fbits(ref[i]) != fbits(which ? h_bf16_to_f32(src[i]) : h_f16_to_f32(src[i]));
            CHECK(bad == 0, "%lld reference results differ from the harness's exact widening", (long long)bad);
        }
        obuf dst = ob_alloc(sizeof(float) * N);
        conv(src, obf(&dst), N);
        int64_t bad = 0, quieted = 0, first = -1;
        for (int i = 0; i < N; i++) {
            const uint32_t g = fbits(obf(&dst)[i]), w = fbits(ref[i]);
            if (g == w) continue;
            /* IEEE conversions may quiet a signalling NaN (F16C and NEON do): same sign and payload, quiet bit set */
            if (!which && f16_is_snan(src[i]) && g == (w | 0x00400000u)) {
                quieted++;
                continue;
            }
            if (bad++ == 0) first = i;
        }
        if (!which) ts->snan_quieted = quieted;
        CHECK(bad == 0, "%lld inputs differ bitwise from the reference (first 0x%04llx: got 0x%08x want 0x%08x)",
              (long long)bad, (long long)first, first >= 0 ? (unsigned)fbits(obf(&dst)[first]) : 0u,
              first >= 0 ? (unsigned)fbits(ref[first]) : 0u);
        CHECK(ob_guards_ok(&dst), "writes outside dst");
        free(dst.raw);

        /* short rows at every alignment: tails, and nothing written past n */
        h_case("%s isa=%s: rows of 0..70 at unaligned addresses", name, kt->name);
        int64_t tail_bad = 0, outside = 0;
        for (int64_t n = 0; n <= 70; n++) {
            const int64_t soff = n % 7, doff = n % 13;
            uint16_t *s = xmalloc(sizeof(uint16_t) * (size_t)(soff + n));
            for (int64_t i = 0; i < n; i++) s[soff + i] = (uint16_t)h_rng_next(&g_rng);
            obuf d = ob_alloc(sizeof(float) * (size_t)(doff + n));
            conv(s + soff, obf(&d) + doff, n);
            for (int64_t i = 0; i < doff; i++) outside += fbits(obf(&d)[i]) != SENT32;
            for (int64_t i = 0; i < n; i++) {
                const uint32_t g = fbits(obf(&d)[doff + i]), w = fbits(ref[s[soff + i]]);
                tail_bad += g != w && !(!which && f16_is_snan(s[soff + i]) && g == (w | 0x00400000u));
            }
            outside += !ob_guards_ok(&d);
            free(s), free(d.raw);
        }
        CHECK(tail_bad == 0, "%lld short-row results differ from the reference", (long long)tail_bad);
        CHECK(outside == 0, "%lld short rows wrote outside dst[0..n)", (long long)outside);
    }
    free(src), free(ref);
}

/*
 * f32_to_f16 and f32_to_bf16 against the reference bitwise, NaNs included (the
 * contract: half.h's bits), and the reference against the harness's own rounding
 * (every non-NaN input; a NaN must stay a NaN of the same sign). Inputs: every
 * 16-bit value widened, one f32 ulp either side, the exact midpoints between
 * neighbours (the ties) and one ulp either side of them, f32 subnormals, NaNs of
 * many payloads, and random bit patterns; rows of every length up to 40 at odd
 * offsets for the tails.
 */
static void test_narrowing(const table_stats *ts) {
    const fa_kernels *kt = ts->k;
    enum { RANDOM = 1 << 16 };
    const int64_t n = 65536 * 2 * 6 + RANDOM;
    uint32_t *bits = xmalloc(sizeof(uint32_t) * (size_t)n);
    int64_t k = 0;
    for (int which = 0; which < 2; which++)
        for (uint32_t h = 0; h < 65536; h++) {
            const float a = which ? h_bf16_to_f32((uint16_t)h) : h_f16_to_f32((uint16_t)h);
            const float b = which ? h_bf16_to_f32((uint16_t)(h + 1)) : h_f16_to_f32((uint16_t)(h + 1));
            const uint32_t ua = fbits(a), um = fbits((float)(((double)a + (double)b) / 2));
            const uint32_t c[6] = {ua, ua + 1, ua - 1, um, um + 1, um - 1};
            for (int i = 0; i < 6; i++) bits[k++] = c[i];
        }
    for (int64_t i = 0; i < RANDOM; i++) bits[k++] = (uint32_t)h_rng_next(&g_rng);
    float *x = xmalloc(sizeof(float) * (size_t)n);
    memcpy(x, bits, sizeof(float) * (size_t)n);
    for (int which = 0; which < 2; which++) {
        const char *name = which ? "f32_to_bf16" : "f32_to_f16";
        void (*conv)(const float *, uint16_t *, int64_t) = which ? kt->f32_to_bf16 : kt->f32_to_f16;
        void (*rconv)(const float *, uint16_t *, int64_t) =
            which ? fa_kernels_ref.f32_to_bf16 : fa_kernels_ref.f32_to_f16;
        h_case("%s isa=%s: %lld inputs around every 16-bit value, ties, NaNs, random", name, kt->name,
               (long long)n);
        uint16_t *want = xmalloc(sizeof(uint16_t) * (size_t)n);
        rconv(x, want, n);
        if (kt == &fa_kernels_ref) {
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                const uint16_t h = which ? h_f32_to_bf16(x[i]) : h_f32_to_f16(x[i]);
                if (x[i] != x[i]) { /* NaN: a NaN of the same sign */
                    const float back = which ? h_bf16_to_f32(want[i]) : h_f16_to_f32(want[i]);
                    bad += back == back || (want[i] ^ h) >> 15;
                } else {
                    bad += want[i] != h;
                }
            }
            CHECK(bad == 0, "%lld reference results differ from the harness's rounding", (long long)bad);
        }
        obuf got = ob_alloc(sizeof(uint16_t) * (size_t)n);
        conv(x, got.p, n);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (((uint16_t *)got.p)[i] != want[i] && bad++ == 0) first = i;
        CHECK(bad == 0, "%lld inputs differ bitwise from the reference (first 0x%08x: got 0x%04x want 0x%04x)",
              (long long)bad, first >= 0 ? (unsigned)bits[first] : 0u,
              first >= 0 ? (unsigned)((uint16_t *)got.p)[first] : 0u, first >= 0 ? (unsigned)want[first] : 0u);
        CHECK(ob_guards_ok(&got), "writes outside dst");
        free(got.raw);
        h_case("%s isa=%s: rows of 0..40 at odd offsets", name, kt->name);
        int64_t tail_bad = 0, outside = 0;
        for (int64_t len = 0; len <= 40; len++) {
            const int64_t off = len % 5;
            obuf d = ob_alloc(sizeof(uint16_t) * (size_t)(off + len));
            conv(x + 7 * len, (uint16_t *)d.p + off, len);
            for (int64_t i = 0; i < off; i++) outside += ((uint16_t *)d.p)[i] != 0xffffu;
            for (int64_t i = 0; i < len; i++) tail_bad += ((uint16_t *)d.p)[off + i] != want[7 * len + i];
            outside += !ob_guards_ok(&d);
            free(d.raw);
        }
        CHECK(tail_bad == 0, "%lld short-row results differ from the reference", (long long)tail_bad);
        CHECK(outside == 0, "%lld short rows wrote outside dst[0..n)", (long long)outside);
        free(want);
    }
    free(x), free(bits);
}

/* ------------------------------------------------------------ bf16 */

/* Our own qt2: qt2[(x/2)*ldqt2 + 2r + (x&1)] = q[r][x]; zeros for x = d (odd d) and for
 * rows..round16(rows); NaN (0xffff) past round16(rows), which no output may use. */
static uint16_t *pack_qt2(const smat *q, int64_t rows, int64_t d, int64_t ldqt2) {
    const int64_t pairs = (d + 1) / 2, pad = round16(rows);
    uint16_t *qt2 = xmalloc(sizeof(uint16_t) * (size_t)(pairs * ldqt2));
    for (int64_t p = 0; p < pairs; p++)
        for (int64_t i = 0; i < ldqt2; i++) {
            const int64_t r = i / 2, x = 2 * p + (i & 1);
            qt2[p * ldqt2 + i] = r >= pad ? 0xffffu : (r < rows && x < d) ? sm_u(q, r)[x] : 0;
        }
    return qt2;
}

static void case_pack_qt_bf16(const table_stats *ts, int64_t rows, int64_t d, int64_t ldq, size_t qoff, int64_t ldqt2) {
    const fa_kernels *kt = ts->k;
    smat q = sm_alloc(rows, d, ldq, 2, qoff);
    sm_fill(&q, &g_rng);
    const int64_t pairs = (d + 1) / 2;
    uint16_t *want = pack_qt2(&q, rows, d, ldqt2);
    h_case("pack_qt_bf16 isa=%s rows=%lld d=%lld ldq=%lld q_offset=%zu ldqt2=%lld", kt->name, (long long)rows,
           (long long)d, (long long)ldq, qoff, (long long)ldqt2);
    obuf qt2 = ob_alloc(sizeof(uint16_t) * (size_t)(pairs * ldqt2));
    kt->pack_qt_bf16(rows, d, sm_u(&q, 0), ldq, qt2.p, ldqt2);
    const int64_t pad2 = 2 * round16(rows);
    int64_t bad = 0, touched = 0, first = -1;
    for (int64_t i = 0; i < pairs * ldqt2; i++) {
        const uint16_t g = ((uint16_t *)qt2.p)[i];
        if (i % ldqt2 < pad2) {
            const int zero_ok = want[i] == 0 && (g & 0x7fffu) == 0; /* a padding zero may be -0 */
            if (g != want[i] && !zero_ok && bad++ == 0) first = i;
        } else {
            touched += g != 0xffffu && (g & 0x7fffu) != 0;
        }
    }
    CHECK(bad == 0, "%lld entries differ from the qt2 layout (first at %lld: pair %lld, word %lld)", (long long)bad,
          (long long)first, first >= 0 ? (long long)(first / ldqt2) : -1LL,
          first >= 0 ? (long long)(first % ldqt2) : -1LL);
    CHECK(touched == 0, "%lld entries past round16(rows) changed to something other than 0", (long long)touched);
    CHECK(ob_guards_ok(&qt2), "writes outside qt2");
    CHECK(sm_unchanged(&q), "q changed");
    free(qt2.raw), free(want);
    sm_free(&q);
}

static void case_qk_bf16(table_stats *ts, int64_t rows, int64_t cols, int64_t d, int64_t ldk, size_t koff, int64_t ldqt,
                         int64_t ldst, float scale, int poison) {
    const fa_kernels *kt = ts->k;
    const int64_t pad = round16(rows), pairs = (d + 1) / 2, ldqt2 = 2 * ldqt;
    smat q = sm_alloc(rows, d, d, 2, 0);
    sm_fill(&q, &g_rng);
    uint16_t *qt2_init = pack_qt2(&q, rows, d, ldqt2);
    ibuf qt2 = ib_dup(qt2_init, sizeof(uint16_t) * (size_t)(pairs * ldqt2), 1);
    free(qt2_init);
    smat k = sm_alloc(cols, d, ldk, 2, koff);
    sm_fill(&k, &g_rng);
    if (poison) sm_poison(&k, &g_rng);
    double *want = xmalloc(sizeof(double) * (size_t)(rows * cols));
    double *sum = xmalloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int64_t x = 0; x < d; x++) {
                const double term = (double)h_bf16_to_f32(sm_u(&q, r)[x]) * h_bf16_to_f32(sm_u(&k, c)[x]);
                s += term, a += fabs(term);
            }
            want[c * rows + r] = (double)scale * s, sum[c * rows + r] = fabs((double)scale) * a;
        }
    h_case("qk_bf16 isa=%s rows=%lld cols=%lld d=%lld ldk=%lld k_offset=%zu ldqt2=%lld ldst=%lld scale=%g "
           "nonfinite_k=%d",
           kt->name, (long long)rows, (long long)cols, (long long)d, (long long)ldk, koff, (long long)ldqt2,
           (long long)ldst, (double)scale, poison);
    obuf st = ob_alloc((size_t)(cols * ldst) * 4);
    tiles_begin(kt);
    kt->qk_bf16(rows, cols, d, qt2.p, ldqt2, sm_u(&k, 0), ldk, scale, obf(&st), ldst);
    tiles_end(kt);
    dot_check dc = {0, 0, -1, -1, 0, 0, 0, 0};
    int64_t badpad = 0, touched = 0;
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < ldst; r++) {
            const float got = obf(&st)[c * ldst + r];
            if (r < rows) dot_one(&dc, got, want[c * rows + r], sum[c * rows + r], d, c, r);
            else if (r < pad) badpad += got != 0.0f && !(poison && isnan(got)); /* 0 * inf */
            else touched += fbits(got) != SENT32;
        }
    if (dc.worst > ts->qk16) ts->qk16 = dc.worst;
    dot_report(&dc, "c", "r");
    CHECK(badpad == 0, "%lld padding rows (rows <= r < round16(rows)) of st are not 0", (long long)badpad);
    CHECK(touched == 0, "%lld st entries past round16(rows) were written", (long long)touched);
    CHECK(ob_guards_ok(&st), "writes outside st");
    CHECK(ib_unchanged(&qt2) && sm_unchanged(&k), "qt2 or k changed");
    free(st.raw), free(want), free(sum);
    ib_free(&qt2);
    sm_free(&q), sm_free(&k);
}

/* The row-pair layout (kernels.h's pack_pairs_bf16), written from its definition:
 * dword [p][e] = (rows 2p, 2p+1 at column e), zero past len and for a missing
 * partner. ld32 dwords per pair row; 64-byte aligned, guarded. */
static obuf pairs_of(const smat *v, int64_t nrows, int64_t len, int64_t ld32) {
    const int64_t np = (nrows + 1) / 2;
    obuf b = ob_alloc((size_t)(np * ld32) * 4);
    uint32_t *d = b.p;
    for (int64_t p = 0; p < np; p++)
        for (int64_t e = 0; e < ld32; e++) {
            const uint32_t lo = e < len ? sm_u(v, 2 * p)[e] : 0;
            const uint32_t hi = e < len && 2 * p + 1 < nrows ? sm_u(v, 2 * p + 1)[e] : 0;
            d[p * ld32 + e] = lo | hi << 16;
        }
    return b;
}

static void case_pack_pairs_bf16(const table_stats *ts, int64_t nrows, int64_t len, int64_t ld, size_t off,
                                 int64_t ld32) {
    const fa_kernels *kt = ts->k;
    smat v = sm_alloc(nrows, len, ld, 2, off);
    sm_fill(&v, &g_rng);
    h_case("pack_pairs_bf16 isa=%s nrows=%lld len=%lld ld=%lld offset=%zu ld32=%lld", kt->name, (long long)nrows,
           (long long)len, (long long)ld, off, (long long)ld32);
    obuf want = pairs_of(&v, nrows, len, ld32);
    obuf got = ob_alloc(want.bytes);
    kt->pack_pairs_bf16(nrows, len, sm_u(&v, 0), ld, got.p, ld32);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < (int64_t)(want.bytes / 4); i++)
        if (((uint32_t *)got.p)[i] != ((uint32_t *)want.p)[i] && bad++ == 0) first = i;
    CHECK(bad == 0, "%lld dwords differ from the pair layout (first at pair %lld, column %lld)", (long long)bad,
          first >= 0 ? (long long)(first / ld32) : -1LL, first >= 0 ? (long long)(first % ld32) : -1LL);
    CHECK(ob_guards_ok(&got), "writes outside ceil(nrows / 2) x ld32 dwords");
    CHECK(sm_unchanged(&v), "src changed");
    free(want.raw), free(got.raw);
    sm_free(&v);
}

static void case_pv_bf16(table_stats *ts, int64_t rows, int64_t cols, int64_t dv, int64_t ldv, size_t voff,
                         int64_t ldst, int64_t ldacc, int alpha_mode, int nan_rows) {
    const fa_kernels *kt = ts->k;
    pv_in in = pv_make(rows, cols, dv, ldst, ldacc, alpha_mode, nan_rows);
    smat v = sm_alloc(cols, dv, ldv, 2, voff);
    sm_fill(&v, &g_rng);
    ibuf alpha = {0};
    if (in.alpha) alpha = ib_dup(in.alpha, (size_t)rows * 4, 0);
    double *want = xmalloc(sizeof(double) * (size_t)(rows * dv));
    double *sum = xmalloc(sizeof(double) * (size_t)(rows * dv));
    pv_oracle(&in, &v, 1, want, sum);
    h_case("pv_bf16 isa=%s rows=%lld cols=%lld dv=%lld ldv=%lld v_offset=%zu ldst=%lld ldacc=%lld alpha=%s nan_rows=%d",
           kt->name, (long long)rows, (long long)cols, (long long)dv, (long long)ldv, voff, (long long)ldst,
           (long long)ldacc, in.alpha ? "given" : "NULL", nan_rows);
    obuf acc = ob_alloc((size_t)(rows * ldacc) * 4);
    memcpy(acc.p, in.acc0, (size_t)(rows * ldacc) * 4);
    /* V as the pairs the caller packs, at a row distance that varies with ldacc;
     * exactly the scratch kernels.h promises */
    const int64_t ldvp = ldacc == round16(dv) ? round16(dv) : fa_packed_ld(dv);
    obuf vp = pairs_of(&v, cols, dv, ldvp);
    obuf scratch = ob_alloc(4 * (size_t)FA_PV_BF16_SCRATCH(rows, cols, dv));
    tiles_begin(kt);
    kt->pv_bf16(rows, cols, dv, in.st.p, ldst, vp.p, ldvp, in.alpha ? alpha.p : NULL, obf(&acc), ldacc, scratch.p);
    tiles_end(kt);
    CHECK(ob_guards_ok(&vp), "pv_bf16 wrote into V");
    const double w = pv_check(&in, &acc, want, sum);
    if (w > ts->pv16) ts->pv16 = w;
    CHECK(ob_guards_ok(&scratch), "writes outside the promised scratch");
    CHECK(ib_unchanged(&in.st) && sm_unchanged(&v) && (!in.alpha || ib_unchanged(&alpha)), "st, v or alpha changed");
    free(acc.raw), free(scratch.raw), free(vp.raw), free(want), free(sum);
    if (in.alpha) ib_free(&alpha);
    sm_free(&v);
    pv_free(&in);
}

/* Every table has the bf16 pair kernels: the reference's scalar ones unless it has
 * native ones. Each set is tested on the table that brings it, not on its heirs. */
static int bf16_inherited(const fa_kernels *k) {
    for (int i = 0; k->parent && i < fa_kernels_count(); i++) {
        const fa_kernels *p = fa_kernels_at(i, NULL);
        if (strcmp(p->name, k->parent) == 0)
            return p->pack_qt_bf16 == k->pack_qt_bf16 && p->qk_bf16 == k->qk_bf16 && p->pv_bf16 == k->pv_bf16 &&
                   p->pack_pairs_bf16 == k->pack_pairs_bf16;
    }
    return 0;
}

static void test_bf16(table_stats *ts) {
    const int n = h_scaled(60);
    for (int i = 0; i < n; i++) {
        int64_t rows = pick_size(&g_rng, ROWS_EDGE, NELEM(ROWS_EDGE), 300);
        int64_t cols = pick_size(&g_rng, COLS_EDGE, NELEM(COLS_EDGE), 600);
        int64_t d = pick_size(&g_rng, DIM_EDGE, NELEM(DIM_EDGE), 512);
        fit_budget(&rows, 300, &cols, 600, &d, 512, 1.2e6);
        const int64_t ldqt = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        const int64_t ldst = round16(rows) + 16 * h_rng_int(&g_rng, 0, 2);
        /* one draw per statement: argument evaluation order is unspecified */
        const int64_t ldq = pick_ld(&g_rng, d);
        const size_t qoff = (size_t)h_rng_int(&g_rng, 0, 31) * 2;
        case_pack_qt_bf16(ts, rows, d, ldq, qoff, 2 * ldqt);
        static const float scales[] = {0.125f, 1.0f, -0.3f, 0.0441941738f};
        const int64_t ldk = pick_ld(&g_rng, d);
        const size_t koff = (size_t)h_rng_int(&g_rng, 0, 31) * 2;
        case_qk_bf16(ts, rows, cols, d, ldk, koff, ldqt, ldst, scales[i % 4], i % 4 == 3);
        const int64_t dv = d == 1 ? 1 : h_rng_int(&g_rng, 1, d); /* keep the budget */
        const int64_t ldv = pick_ld(&g_rng, dv);
        const size_t voff = (size_t)h_rng_int(&g_rng, 0, 31) * 2;
        const int64_t ldacc = round16(dv) + 16 * h_rng_int(&g_rng, 0, 1);
        case_pv_bf16(ts, rows, cols, dv, ldv, voff, ldst, ldacc, i % 3 != 0, i % 5 == 0);
        case_pack_pairs_bf16(ts, cols, dv, ldv, voff, i % 2 ? fa_packed_ld(dv) : round16(dv) + 16 * h_rng_int(&g_rng, 0, 1));
    }
    case_pack_pairs_bf16(ts, 1, 1, 1, 0, 16);
    case_pack_pairs_bf16(ts, 599, 512, -512, 6, fa_packed_ld(512));
    case_pack_pairs_bf16(ts, 64, 33, 0, 2, 48);
    case_pack_qt_bf16(ts, 300, 511, 511, 2, 2 * 304);
    case_qk_bf16(ts, 300, 600, 3, 3, 2, 304, 320, 0.5f, 0);
    case_qk_bf16(ts, 1, 600, 511, -513, 6, 16, 16, 0.125f, 1);
    case_qk_bf16(ts, 300, 1, 512, 0, 0, 304, 304, 1.0f, 0);
    case_pv_bf16(ts, 300, 600, 3, 3, 2, 304, 16, 1, 1);
    case_pv_bf16(ts, 1, 599, 512, -512, 6, 16, 512, 1, 0);
    case_pv_bf16(ts, 300, 1, 511, 0, 0, 320, 512, 0, 0);
}

/* ------------------------------------------------------------ fused forward */

/*
 * fwd_bf16 over ntiles tiles of cols keys each, from m = -inf, l = 0, acc = 0, then
 * o = acc / l and lse = m + log l, against the fp64 softmax of the same bf16 inputs
 * (kernels.h: l from the fp32 exps, p to bf16, the lazy rescale exact). The bounds: each
 * p within 2^-8 relative of exp(s - m) (bf16's rounding 2^-9 and the exp's error), so
 * |o - o_ref| <= 2^-7 max|v|; each term of l within 2^-21 relative (the exp's 2^-22 and
 * its argument's rounding), so |lse - lse_ref| <= 2^-20 max(1, |lse_ref|) plus the
 * scores' own fp32 error, d 2^-24 A with A = max over kept keys of |scale| sum |q k|.
 * Bands (causal-like diagonals, windows, empty rows), scores spread wide enough to move
 * the max many times (amp), and a scale of either sign.
 */
typedef struct {
    float *m, *l, *acc; /* rows, rows, rows x ldacc */
    int64_t ldacc;
} fwd_state;

static void fwd_state_free(fwd_state *st) { free(st->m), free(st->l), free(st->acc); }

/* fwd_i8's operands (kernels.h): Q codes (rows, d) with their scales and smoothing terms
 * (qc NULL: none), K codes (keys, d) with their scales */
typedef struct {
    const int8_t *q8, *k8;
    const float *qs, *qc, *ks;
} fwd_i8_in;

/* score (r, j) of fwd_i8 from its definition: the exact integer sum, then the f32 steps
 * as written */
static float fwd_i8_score(const fwd_i8_in *in, int64_t d, int64_t r, int64_t j) {
    int64_t a = 0;
    for (int64_t x = 0; x < d; x++) a += (int64_t)in->q8[r * d + x] * in->k8[j * d + x];
    const float s = (float)a * (in->qs[r] * in->ks[j]);
    return in->qc ? s + in->qc[r] : s;
}

/* a row's band over all keys: [blo, bhi] (absolute); NULL: every key. With i8, fwd_i8 on
 * its operands (q, k unread), else fwd_bf16. */
static fwd_state fwd_run(const fa_kernels *kt, int64_t rows, int64_t cols, int64_t ntiles, int64_t d, int64_t dv,
                         const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *vl,
                         const int32_t *blo, const int32_t *bhi, float scale, const fwd_i8_in *i8) {
    const int64_t ldq = (d + 31) / 32 * 32, ktn = FA_KT_DWORDS(cols, d), ldvp = fa_packed_ld(dv);
    const int64_t ldq8 = fa_q8_ld(d);
    fwd_state st = {xmalloc(4 * (size_t)rows), xmalloc(4 * (size_t)rows), NULL, round16(dv) + 16};
    st.acc = xmalloc(4 * (size_t)(rows * st.ldacc));
    for (int64_t r = 0; r < rows; r++) st.m[r] = -INFINITY, st.l[r] = 0.0f;
    memset(st.acc, 0, 4 * (size_t)(rows * st.ldacc));
    uint16_t *qa = xaligned(2 * (size_t)(round16(rows) * ldq));
    memset(qa, 0, 2 * (size_t)(round16(rows) * ldq));
    for (int64_t r = 0; !i8 && r < rows; r++) memcpy(qa + r * ldq, q + r * d, 2 * (size_t)d);
    int8_t *q8 = xaligned((size_t)(round16(rows) * ldq8));
    memset(q8, 0, (size_t)(round16(rows) * ldq8));
    for (int64_t r = 0; i8 && r < rows; r++) memcpy(q8 + r * ldq8, i8->q8 + r * d, (size_t)d);
    float *ks = xmalloc(4 * (size_t)round16(cols));
    uint32_t *ktb = xaligned(4 * (size_t)ktn), *vp = xaligned(4 * (size_t)((cols + 1) / 2 * ldvp));
    uint32_t *vlp = vl ? xaligned(4 * (size_t)((cols + 1) / 2 * ldvp)) : NULL;
    memset(ktb, 0x7f, 4 * (size_t)ktn); /* keys past cols: NaN-ish bits, masked */
    void *scratch = xaligned((size_t)FA_FWD_BF16_SCRATCH(cols, dv));
    int32_t *lo = xmalloc(4 * (size_t)rows), *hi = xmalloc(4 * (size_t)rows);
    tiles_begin(kt);
    for (int64_t t = 0; t < ntiles; t++) {
        const int64_t j0 = t * cols;
        if (i8) {
            fa_pack_kt_i8(cols, d, i8->k8 + j0 * d, d, ktb, 0);
            for (int64_t c = 0; c < round16(cols); c++) ks[c] = c < cols ? i8->ks[j0 + c] : NAN; /* masked */
        } else {
            fa_kernels_ref.pack_kt_bf16(cols, d, k + j0 * d, d, ktb, 0);
        }
        fa_kernels_ref.pack_pairs_bf16(cols, dv, v + j0 * dv, dv, vp, ldvp);
        if (vl) fa_kernels_ref.pack_pairs_bf16(cols, dv, vl + j0 * dv, dv, vlp, ldvp);
        for (int64_t r = 0; blo && r < rows; r++) {
            int64_t a = blo[r] - j0, z = bhi[r] - j0;
            a = a < 0 ? 0 : a > cols ? cols : a;
            z = z > cols - 1 ? cols - 1 : z < -1 ? -1 : z;
            lo[r] = (int32_t)a, hi[r] = (int32_t)z;
        }
        const fa_fwd_tile tile = {.rows = rows, .cols = cols, .d = d, .dv = dv,
                                  .bf16 = {.q = qa, .ldq = ldq, .scale = scale, .vlo = vlp}, .kt = ktb, .vp = vp,
                                  .ldvp = ldvp, .lo = blo ? lo : NULL, .hi = blo ? hi : NULL, .m = st.m, .l = st.l,
                                  .acc = st.acc, .ldacc = st.ldacc, .scratch = scratch,
                                  .i8 = {.q8 = q8, .ldq8 = ldq8, .qs = i8 ? i8->qs : NULL, .qc = i8 ? i8->qc : NULL,
                                         .ks = ks}};
        if (i8) kt->fwd_i8(&tile);
        else kt->fwd_bf16(&tile);
    }
    tiles_end(kt);
    free(qa), free(q8), free(ks), free(ktb), free(vp), free(vlp), free(scratch), free(lo), free(hi);
    return st;
}

static double g_fwd_o_err[2], g_fwd_lse_err; /* worst errors seen, relative to the bounds' units (o: plain, bf16x3) */

/* fwd_i8 operands: random codes (some rows all -127, the largest sums), scales that put
 * the scores near amp N(0, 1) (some 0), smoothing terms where smooth */
typedef struct {
    int8_t *q8, *k8;
    float *qs, *qc, *ks;
    fwd_i8_in in;
} fwd_i8_data;

static fwd_i8_data fwd_i8_make(int64_t rows, int64_t nk, int64_t d, double amp, int smooth) {
    fwd_i8_data g = {xmalloc((size_t)(rows * d)), xmalloc((size_t)(nk * d)), xmalloc(4 * (size_t)rows),
                     smooth ? xmalloc(4 * (size_t)rows) : NULL, xmalloc(4 * (size_t)nk), {0}};
    for (int64_t i = 0; i < rows * d; i++) g.q8[i] = (int8_t)h_rng_int(&g_rng, -127, 127);
    for (int64_t i = 0; i < nk * d; i++) g.k8[i] = (int8_t)h_rng_int(&g_rng, -127, 127);
    for (int64_t x = 0; rows > 0 && nk > 0 && x < d; x++) g.q8[x] = -127, g.k8[x] = -127;
    for (int64_t r = 0; r < rows; r++) {
        g.qs[r] = (float)(amp * h_rng_range(&g_rng, 0.5, 1.5) / (127.0 * 40.0 * sqrt((double)d)));
        if (smooth) g.qc[r] = (float)(amp * h_rng_normal(&g_rng));
    }
    for (int64_t j = 0; j < nk; j++) g.ks[j] = j % 11 == 3 ? 0.0f : (float)h_rng_range(&g_rng, 0.5, 1.5) / 127.0f;
    g.in = (fwd_i8_in){g.q8, g.k8, g.qs, g.qc, g.ks};
    return g;
}

static void fwd_i8_free(fwd_i8_data *g) { free(g->q8), free(g->k8), free(g->qs), free(g->qc), free(g->ks); }

/* i8: fwd_i8 on random codes (its scores exact from the definition, so A = 0 below),
 * smoothed where i8 == 2; else fwd_bf16. x3: its bf16x3 mode, V = f32 values as hi + lo
 * bf16 (util/convert.h's split) against the f32 V: p + pl and vh + vl each within 2^-17
 * relative, pl vl dropped (2^-18), so |o - o_ref| <= 2^-15 max|v| */
static void case_fwd(const fa_kernels *kt, int64_t rows, int64_t cols, int64_t ntiles, int64_t d, int64_t dv,
                     int band, double amp, float scale, int x3, int i8) {
    const int64_t nk = cols * ntiles;
    uint16_t *q = xmalloc(2 * (size_t)(rows * d)), *k = xmalloc(2 * (size_t)(nk * d)), *v = xmalloc(2 * (size_t)(nk * dv));
    uint16_t *vl = x3 ? xmalloc(2 * (size_t)(nk * dv)) : NULL;
    float *vf = xmalloc(4 * (size_t)(nk * dv));
    for (int64_t i = 0; i < rows * d; i++) q[i] = h_f32_to_bf16((float)(amp * h_rng_normal(&g_rng)));
    for (int64_t i = 0; i < nk * d; i++) k[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    for (int64_t i = 0; i < nk * dv; i++) {
        const float x = (float)h_rng_normal(&g_rng);
        v[i] = h_f32_to_bf16(x);
        vf[i] = x3 ? x : h_bf16_to_f32(v[i]);
        if (x3) vl[i] = h_f32_to_bf16(x - h_bf16_to_f32(v[i]));
    }
    const double o_unit = x3 ? 0x1p-15 : 0x1p-7;
    fwd_i8_data g = fwd_i8_make(i8 ? rows : 0, i8 ? nk : 0, d, amp, i8 == 2);
    int32_t *blo = NULL, *bhi = NULL;
    if (band) { /* a diagonal of slope one from a random start, a window of random width, some rows empty */
        blo = xmalloc(4 * (size_t)rows), bhi = xmalloc(4 * (size_t)rows);
        const int64_t off = h_rng_int(&g_rng, -rows, nk), width = band == 2 ? h_rng_int(&g_rng, 0, nk) : nk;
        for (int64_t r = 0; r < rows; r++) {
            bhi[r] = (int32_t)(r + off);
            blo[r] = (int32_t)(r + off - width);
            if (r % 7 == 5) blo[r] = bhi[r] + 1; /* empty */
        }
    }
    h_case("%s isa=%s rows=%lld cols=%lld tiles=%lld d=%lld dv=%lld band=%d amp=%g scale=%g%s",
           i8 ? i8 == 2 ? "fwd_i8 smoothed" : "fwd_i8" : "fwd_bf16", kt->name, (long long)rows, (long long)cols,
           (long long)ntiles, (long long)d, (long long)dv, band, amp, scale, x3 ? " bf16x3" : "");
    fwd_state st = fwd_run(kt, rows, cols, ntiles, d, dv, q, k, v, vl, blo, bhi, scale, i8 ? &g.in : NULL);
    double *s = xmalloc(sizeof(double) * (size_t)nk);
    int64_t bad_o = 0, bad_lse = 0, bad_empty = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, amax = 0.0;
        for (int64_t j = 0; j < nk; j++) {
            double acc = 0.0, aabs = 0.0;
            if (i8) { /* the score as given: exact, no fp32 error of its own */
                s[j] = fwd_i8_score(&g.in, d, r, j);
                if ((!blo || (j >= blo[r] && j <= bhi[r])) && s[j] > mx) mx = s[j];
                continue;
            }
            for (int64_t x = 0; x < d; x++) {
                const double qk = (double)h_bf16_to_f32(q[r * d + x]) * h_bf16_to_f32(k[j * d + x]);
                acc += qk, aabs += fabs(qk);
            }
            s[j] = (double)scale * acc;
            if (!blo || (j >= blo[r] && j <= bhi[r])) {
                if (s[j] > mx) mx = s[j];
                if (fabs((double)scale) * aabs > amax) amax = fabs((double)scale) * aabs;
            }
        }
        if (mx == -INFINITY) { /* empty: m stays -inf, l and acc 0 */
            bad_empty += st.m[r] != -INFINITY || st.l[r] != 0.0f;
            for (int64_t e = 0; e < dv; e++) bad_empty += st.acc[r * st.ldacc + e] != 0.0f;
            continue;
        }
        double sum = 0.0, vmax = 0.0;
        for (int64_t j = 0; j < nk; j++)
            if (!blo || (j >= blo[r] && j <= bhi[r])) sum += exp(s[j] - mx);
        const double lse_ref = mx + log(sum), lse = (double)st.m[r] + log((double)st.l[r]);
        const double lse_err = fabs(lse - lse_ref) / (0x1p-20 * fmax(1.0, fabs(lse_ref)) + (double)d * 0x1p-24 * amax);
        if (lse_err > g_fwd_lse_err) g_fwd_lse_err = lse_err;
        bad_lse += !(lse_err <= 1.0);
        for (int64_t e = 0; e < dv; e++) {
            double o_ref = 0.0;
            for (int64_t j = 0; j < nk; j++)
                if (!blo || (j >= blo[r] && j <= bhi[r])) {
                    const double vv = vf[j * dv + e];
                    o_ref += exp(s[j] - lse_ref) * vv;
                    if (fabs(vv) > vmax) vmax = fabs(vv);
                }
            const double o = (double)st.acc[r * st.ldacc + e] / (double)st.l[r];
            const double err = fabs(o - o_ref) / (o_unit * (vmax > 0 ? vmax : 1.0) + 1e-6);
            if (err > g_fwd_o_err[x3]) g_fwd_o_err[x3] = err;
            bad_o += !(err <= 1.0);
        }
    }
    CHECK(bad_o == 0, "%lld outputs beyond 2^%d max|v| of the fp64 softmax", (long long)bad_o, x3 ? -15 : -7);
    CHECK(bad_lse == 0, "%lld lse beyond 2^-20 max(1, |lse|) + d 2^-24 A", (long long)bad_lse);
    CHECK(bad_empty == 0, "%lld values of empty rows are not m = -inf, l = 0, acc = 0", (long long)bad_empty);
    fwd_state_free(&st);
    fwd_i8_free(&g);
    free(q), free(k), free(v), free(vl), free(vf), free(s), free(blo), free(bhi);
}

/* fwd_i8's scores bitwise: with each row's band one key, m after one tile is that key's
 * score exactly (the max of one kept score, scale 1), against the definition and against
 * qk_small_i8 (of this table and the reference: the contract's one score expression). */
static void case_fwd_i8_scores(const fa_kernels *kt, int64_t rows, int64_t cols, int64_t d, int smooth) {
    h_case("fwd_i8 scores isa=%s rows=%lld cols=%lld d=%lld smooth=%d", kt->name, (long long)rows, (long long)cols,
           (long long)d, smooth);
    fwd_i8_data g = fwd_i8_make(rows, cols, d, 4.0, smooth);
    const int64_t dv = 16, ldq8 = fa_q8_ld(d);
    uint16_t *v = xmalloc(2 * (size_t)(cols * dv));
    for (int64_t i = 0; i < cols * dv; i++) v[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    /* qk_small_i8's operands: q rows padded to fa_q8_ld(d), K row pointers */
    int8_t *q8 = xaligned((size_t)(FA_SMALL_ROWS * ldq8));
    const void **krow = xmalloc(sizeof(void *) * (size_t)cols);
    for (int64_t j = 0; j < cols; j++) krow[j] = g.k8 + j * d;
    const int64_t lds = round16(cols);
    float *ss[2] = {xaligned(4 * (size_t)(lds * FA_SMALL_ROWS)), xaligned(4 * (size_t)(lds * FA_SMALL_ROWS))};
    int32_t *blo = xmalloc(4 * (size_t)rows), *bhi = xmalloc(4 * (size_t)rows);
    int64_t bad_def = 0, bad_small = 0;
    for (int pass = 0; pass < 5; pass++) {
        for (int64_t r = 0; r < rows; r++) blo[r] = bhi[r] = (int32_t)((r * 7 + pass * 13) % cols);
        fwd_state st = fwd_run(kt, rows, cols, 1, d, dv, NULL, NULL, v, NULL, blo, bhi, 0.5f, &g.in);
        for (int64_t r0 = 0; r0 < rows; r0 += FA_SMALL_ROWS) {
            const int64_t nr = rows - r0 < FA_SMALL_ROWS ? rows - r0 : FA_SMALL_ROWS;
            memset(q8, 0, (size_t)(FA_SMALL_ROWS * ldq8));
            for (int64_t r = 0; r < nr; r++) memcpy(q8 + r * ldq8, g.q8 + (r0 + r) * d, (size_t)d);
            kt->qk_small_i8(nr, cols, d, 1, q8, ldq8, g.qs + r0, krow, g.ks, ss[0], lds);
            fa_kernels_ref.qk_small_i8(nr, cols, d, 1, q8, ldq8, g.qs + r0, krow, g.ks, ss[1], lds);
            for (int64_t r = r0; r < r0 + nr; r++) {
                const int64_t j = blo[r];
                bad_def += fbits(st.m[r]) != fbits(fwd_i8_score(&g.in, d, r, j));
                for (int w = 0; w < 2; w++) {
                    const float sm = ss[w][(r - r0) * lds + j];
                    bad_small += fbits(st.m[r]) != fbits(g.qc ? sm + g.qc[r] : sm);
                }
            }
        }
        fwd_state_free(&st);
    }
    CHECK(bad_def == 0, "%lld scores differ from the definition's bits", (long long)bad_def);
    CHECK(bad_small == 0, "%lld scores differ from qk_small_i8's bits", (long long)bad_small);
    fwd_i8_free(&g);
    free(v), free(q8), free(krow), free(ss[0]), free(ss[1]), free(blo), free(bhi);
}

/* fa_pack_kt_i8 bitwise against its definition, around the keys it must not touch. */
static void case_pack_kt_i8(int64_t cols, int64_t d, int64_t ldk8, int64_t j0) {
    h_case("fa_pack_kt_i8 cols=%lld d=%lld ldk8=%lld j0=%lld", (long long)cols, (long long)d, (long long)ldk8,
           (long long)j0);
    const int64_t nq = FA_KT_QUADS(d), n = ((j0 + cols + 31) / 16) * 16 * nq;
    int8_t *k = xmalloc((size_t)(cols * ldk8));
    for (int64_t i = 0; i < cols * ldk8; i++) k[i] = (int8_t)h_rng_int(&g_rng, -128, 127);
    uint32_t *out = xmalloc(4 * (size_t)n);
    memset(out, 0xab, 4 * (size_t)n);
    fa_pack_kt_i8(cols, d, k, ldk8, out, j0);
    int64_t bad = 0;
    for (int64_t j = 0; j < (j0 + cols + 31) / 16 * 16; j++)
        for (int64_t p = 0; p < nq; p++) {
            uint32_t want = 0xabababab;
            const int64_t c = j - j0;
            if (c >= 0 && c < cols) {
                want = 0;
                for (int b = 0; b < 4; b++)
                    if (4 * p + b < d) want |= (uint32_t)(uint8_t)k[c * ldk8 + 4 * p + b] << (8 * b);
            }
            bad += out[j / 16 * 16 * nq + 16 * p + j % 16] != want;
        }
    CHECK(bad == 0, "%lld dwords differ", (long long)bad);
    free(k), free(out);
}

static void test_fwd_i8(void) {
    case_pack_kt_i8(37, 33, 40, 0);
    case_pack_kt_i8(16, 128, 128, 16);
    case_pack_kt_i8(3, 1, 1, 31);
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        if (kt != &fa_kernels_ref && !(kt->flags & FA_KERNELS_FWD_I8)) continue; /* the reference's */
        const int quick = kt->flags & FA_KERNELS_EXPLICIT;
        case_fwd_i8_scores(kt, 37, 100, 128, 0);
        case_fwd_i8_scores(kt, 16, 64, 70, 1);
        if (!quick) case_fwd_i8_scores(kt, 64, 256, 256, 1);
        static const int64_t shapes[][6] = {/* rows cols tiles d dv band */
                                            {32, 64, 4, 128, 128, 0}, {1, 1, 1, 1, 1, 0},      {17, 33, 3, 31, 7, 1},
                                            {48, 100, 3, 64, 96, 2},  {5, 256, 2, 130, 64, 1}, {70, 64, 5, 32, 32, 2},
                                            {64, 512, 2, 128, 128, 1}, {100, 80, 2, 576, 72, 1}, {140, 48, 2, 320, 40, 2}};
        for (size_t i = 0; i < NELEM(shapes); i++) {
            if (quick && i % 2) continue;
            case_fwd(kt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], (int)shapes[i][5],
                     i % 3 == 0 ? 6.0 : 1.0, 0.0f, 0, 1 + (int)(i % 2));
        }
    }
    printf("fwd_i8: worst o error %.3f, lse error %.3f of the bound (with fwd_bf16's)\n", g_fwd_o_err[0], g_fwd_lse_err);
}

/* pack_kt_bf16 bitwise against its definition, around the keys it must not touch. */
static void case_pack_kt(const fa_kernels *kt, int64_t cols, int64_t d, int64_t ldk, int64_t j0) {
    h_case("pack_kt_bf16 isa=%s cols=%lld d=%lld ldk=%lld j0=%lld", kt->name, (long long)cols, (long long)d,
           (long long)ldk, (long long)j0);
    const int64_t np = FA_KT_PAIRS(d), n = FA_KT_DWORDS(j0 + cols + 16, d);
    uint16_t *k = xmalloc(2 * (size_t)(cols * ldk));
    for (int64_t i = 0; i < cols * ldk; i++) k[i] = (uint16_t)h_rng_int(&g_rng, 0, 65535);
    uint32_t *out = xmalloc(4 * (size_t)n);
    memset(out, 0xab, 4 * (size_t)n);
    kt->pack_kt_bf16(cols, d, k, ldk, out, j0);
    int64_t bad = 0;
    for (int64_t j = 0; j < (j0 + cols + 31) / 16 * 16; j++)
        for (int64_t p = 0; p < np; p++) {
            uint32_t want = 0xabababab;
            const int64_t c = j - j0;
            if (c >= 0 && c < cols)
                want = (2 * p < d ? k[c * ldk + 2 * p] : 0u) | (2 * p + 1 < d ? (uint32_t)k[c * ldk + 2 * p + 1] << 16 : 0u);
            bad += out[j / 16 * 16 * np + 16 * p + j % 16] != want;
        }
    CHECK(bad == 0, "%lld dwords differ", (long long)bad);
    free(k), free(out);
}

static void test_fwd_bf16(void) {
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        if (kt != &fa_kernels_ref && !(kt->flags & FA_KERNELS_FWD_BF16)) continue; /* the reference's */
        case_pack_kt(kt, 37, 33, 40, 0);
        case_pack_kt(kt, 16, 128, 128, 16);
        case_pack_kt(kt, 50, 64, 64, 6);
        case_pack_kt(kt, 3, 1, 1, 31);
        const int quick = kt->flags & FA_KERNELS_EXPLICIT; /* the model: fewer, smaller cases */
        static const int64_t shapes[][6] = {/* rows cols tiles d dv band */
                                            {32, 64, 4, 128, 128, 0}, {1, 1, 1, 1, 1, 0},     {17, 33, 3, 31, 7, 1},
                                            {48, 100, 3, 64, 96, 2},  {5, 256, 2, 130, 64, 1}, {70, 64, 5, 32, 32, 2},
                                            {33, 17, 6, 16, 130, 1},  {16, 96, 2, 256, 16, 0},
                                            /* a large d: strips of several 32-row sub-strips */
                                            {100, 80, 2, 576, 72, 1}, {140, 48, 3, 300, 40, 2}};
        for (size_t i = 0; i < NELEM(shapes); i++) {
            if (quick && i % 2) continue;
            const double amp = i % 3 == 0 ? 3.0 : i % 3 == 1 ? 1.0 : 0.3;
            for (int x3 = 0; x3 < 2; x3++)
                case_fwd(kt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], (int)shapes[i][5],
                         amp, i % 4 == 3 ? -0.2f : 1.0f / sqrtf((float)shapes[i][3]), x3, 0);
        }
    }
    printf("fwd_bf16: worst o error %.3f (bf16x3 mode %.3f), lse error %.3f of the bound (2^-7 (2^-15) max|v|, 2^-20 "
           "max(1, |lse|) + d 2^-24 A)\n",
           g_fwd_o_err[0], g_fwd_o_err[1], g_fwd_lse_err);
}

/* ------------------------------------------------------------ registry */

/*
 * The registry against the library's own choice: each table that runs here is the path
 * FLASHATTN_ARCH=<name> gives, each that does not makes fa_context_create fail with
 * FA_ERR_ISA_UNAVAILABLE (what the ISA matrix in ctest turns into "skipped"), and with no
 * FLASHATTN_ARCH the first table that runs (best first) is chosen.
 */
static void test_registry(void) {
    const int n = fa_kernels_count();
    h_case("registry");
    CHECK(n >= 1 && n <= MAX_TABLES, "fa_kernels_count() = %d", n);
    CHECK(fa_kernels_at(-1, NULL) == NULL && fa_kernels_at(n, NULL) == NULL, "fa_kernels_at out of range is not NULL");
    const char *saved_env = getenv("FLASHATTN_ARCH");
    char *saved = saved_env ? strcpy(xmalloc(strlen(saved_env) + 1), saved_env) : NULL;
    const char *best = NULL;
    int have_ref = 0;
    for (int i = 0; i < n && i < MAX_TABLES; i++) {
        int runs = -1;
        const fa_kernels *k = fa_kernels_at(i, &runs);
        h_case("registry entry %d (%s)", i, k && k->name ? k->name : "?");
        if (!CHECK(k && k->name && k->pack_qt && k->qk && k->softmax && k->pv && k->f16_to_f32 && k->bf16_to_f32 &&
                       k->pack_pairs_bf16 && k->pv_bf16 &&
                       (runs == 0 || runs == 1),
                   "a table with a NULL name or required kernel, or runs_here = %d", runs))
            continue;
        for (int j = 0; j < i; j++)
            CHECK(strcmp(fa_kernels_at(j, NULL)->name, k->name) != 0, "two tables are called %s", k->name);
        if (k == &fa_kernels_ref) have_ref = 1, CHECK(runs == 1, "the reference table does not run here");
        if (runs && !best && !(k->flags & FA_KERNELS_EXPLICIT)) best = k->name;
        setenv("FLASHATTN_ARCH", k->name, 1);
        fa_context *ctx = NULL;
        const fa_status st = fa_context_create(&ctx);
        CHECK(runs ? st == FA_OK && ctx && strcmp(fa_context_isa(ctx), k->name) == 0
                   : st == FA_ERR_ISA_UNAVAILABLE && ctx == NULL,
              "FLASHATTN_ARCH=%s: status %d (%s), isa %s; the registry says it %s here", k->name, (int)st,
              fa_status_string(st), ctx ? fa_context_isa(ctx) : "-", runs ? "runs" : "does not run");
        fa_context_free(ctx);
        if (runs) {
            g_tab[g_ntab].k = k;
            g_ntab++;
            printf("table %-11s runs here: tested\n", k->name);
        } else {
            const char *why = NULL;
            CHECK(fa_isa_info(i, NULL, &why) == 0 && why && *why, "fa_isa_info gives no reason for %s", k->name);
            printf("table %-11s SKIPPED: %s (CPU has: %s)\n", k->name, why ? why : "?", fa_cpu_features());
        }
    }
    h_case("registry");
    CHECK(have_ref, "the reference table is not in the registry");
    setenv("FLASHATTN_ARCH", "no-such-path", 1);
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx);
    CHECK(st == FA_ERR_ISA_UNAVAILABLE && ctx == NULL, "FLASHATTN_ARCH=no-such-path: status %d", (int)st);
    fa_context_free(ctx);
    unsetenv("FLASHATTN_ARCH");
    ctx = NULL;
    st = fa_context_create(&ctx);
    CHECK(st == FA_OK && ctx && best && strcmp(fa_context_isa(ctx), best) == 0,
          "default path %s, want the best table that runs here (%s)", ctx ? fa_context_isa(ctx) : "-",
          best ? best : "-");
    fa_context_free(ctx);
    if (saved) setenv("FLASHATTN_ARCH", saved, 1);
    free(saved);
}

/* ------------------------------------------------------------ inheritance */

/* ------------------------------------------------------------ fused backward */

/*
 * bwd_bf16 on one (query block, key tile) pair, from given dq, dK^T, dV^T (random: the
 * kernel accumulates), against the fp64 computation of kernels.h's contract on the same
 * bf16 inputs, lse and dvec (lse the fp64 one of the kept keys, so p <= 1; -inf for empty
 * rows). The bound of each output: P and dS are rounded to bf16 (2^-8 relative at most, the
 * exp's error far below), so |x - x_ref| <= 2^-7 sum|terms| plus fp32's sums (n 2^-24 of the
 * terms and of the start value for n terms); dS's terms also carry dp's fp32 sum, whose error
 * (dv 2^-23 sum_e |dO_e v_e| at most) the difference dp - dvec may not shrink.
 */
typedef struct {
    float *dq, *dkt, *dvt;
    int64_t lddq, lddt;
} bwd_out;

static void bwd_out_free(bwd_out *o) { free(o->dq), free(o->dkt), free(o->dvt); }

static bwd_out bwd_run(const fa_kernels *kt, int64_t rows, int64_t cols, int64_t d, int64_t dv, const uint16_t *q,
                       const uint16_t *k, const uint16_t *v, const uint16_t *dout, const float *lse,
                       const float *dvec, const int32_t *lo, const int32_t *hi, float scale, const float *dq0,
                       const float *dkt0, const float *dvt0) {
    const int64_t ldq = (d + 31) / 32 * 32, lddo = (dv + 31) / 32 * 32, ldt = (rows + 31) / 32 * 32;
    const int64_t ldkp = fa_packed_ld(d), kpn = (cols + 31) / 32 * 16 * ldkp;
    bwd_out o = {NULL, NULL, NULL, round16(d) + 16, round16(cols) + 16};
    const size_t dqb = 4 * (size_t)(rows * o.lddq), dkb = 4 * (size_t)(round16(d) * o.lddt),
                 dvb = 4 * (size_t)(round16(dv) * o.lddt);
    o.dq = xaligned(dqb), o.dkt = xaligned(dkb), o.dvt = xaligned(dvb);
    memcpy(o.dq, dq0, dqb), memcpy(o.dkt, dkt0, dkb), memcpy(o.dvt, dvt0, dvb);
    uint16_t *qa = xaligned(2 * (size_t)(round16(rows) * ldq)), *da = xaligned(2 * (size_t)(round16(rows) * lddo));
    memset(qa, 0, 2 * (size_t)(round16(rows) * ldq)), memset(da, 0, 2 * (size_t)(round16(rows) * lddo));
    for (int64_t r = 0; r < rows; r++)
        memcpy(qa + r * ldq, q + r * d, 2 * (size_t)d), memcpy(da + r * lddo, dout + r * dv, 2 * (size_t)dv);
    uint16_t *qt = xaligned(2 * (size_t)(round16(d) * ldt)), *dot = xaligned(2 * (size_t)(round16(dv) * ldt));
    memset(qt, 0x7f, 2 * (size_t)(round16(d) * ldt)), memset(dot, 0x7f, 2 * (size_t)(round16(dv) * ldt));
    fa_kernels_ref.pack_t_bf16(rows, d, q, d, qt, ldt);
    fa_kernels_ref.pack_t_bf16(rows, dv, dout, dv, dot, ldt);
    uint32_t *ktb = xaligned(4 * (size_t)FA_KT_DWORDS(cols, d)), *vtb = xaligned(4 * (size_t)FA_KT_DWORDS(cols, dv));
    uint32_t *kp = xaligned(4 * (size_t)kpn);
    memset(ktb, 0, 4 * (size_t)FA_KT_DWORDS(cols, d)), memset(vtb, 0, 4 * (size_t)FA_KT_DWORDS(cols, dv));
    memset(kp, 0, 4 * (size_t)kpn);
    fa_kernels_ref.pack_kt_bf16(cols, d, k, d, ktb, 0);
    fa_kernels_ref.pack_kt_bf16(cols, dv, v, dv, vtb, 0);
    fa_kernels_ref.pack_pairs_bf16(cols, d, k, d, kp, ldkp);
    void *scratch = xaligned((size_t)FA_BWD_BF16_SCRATCH(rows, cols, d));
    const fa_bwd_tile t = {.rows = rows, .cols = cols, .d = d, .dv = dv, .q = qa, .dout = da, .qt = qt, .dot = dot,
                           .ldq = ldq, .lddo = lddo, .ldqt = ldt, .lddot = ldt, .kt = ktb, .vt = vtb, .kp = kp,
                           .ldkp = ldkp, .scale = scale, .lse = lse, .dvec = dvec, .lo = lo, .hi = hi, .dq = o.dq,
                           .dkt = o.dkt, .dvt = o.dvt, .lddq = o.lddq, .lddkt = o.lddt, .lddvt = o.lddt,
                           .scratch = scratch};
    tiles_begin(kt);
    kt->bwd_bf16(&t);
    tiles_end(kt);
    free(qa), free(da), free(qt), free(dot), free(ktb), free(vtb), free(kp), free(scratch);
    return o;
}

/* The inputs of one case: bf16 q, k, v, dO, the lse of the kept keys, dvec, a band. */
typedef struct {
    uint16_t *q, *k, *v, *dout;
    float *lse, *dvec, *dq0, *dkt0, *dvt0;
    int32_t *lo, *hi;
} bwd_inputs;

static void bwd_inputs_free(bwd_inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->dout), free(in->lse), free(in->dvec);
    free(in->dq0), free(in->dkt0), free(in->dvt0), free(in->lo), free(in->hi);
}

static int bwd_kept(const bwd_inputs *in, int64_t r, int64_t c) { return !in->lo || (c >= in->lo[r] && c <= in->hi[r]); }

static double bwd_dot(const uint16_t *a, const uint16_t *b, int64_t n) {
    double s = 0.0;
    for (int64_t x = 0; x < n; x++) s += (double)h_bf16_to_f32(a[x]) * h_bf16_to_f32(b[x]);
    return s;
}

static bwd_inputs bwd_make(int64_t rows, int64_t cols, int64_t d, int64_t dv, int band, double amp, float scale) {
    bwd_inputs in = {xmalloc(2 * (size_t)(rows * d)), xmalloc(2 * (size_t)(cols * d)), xmalloc(2 * (size_t)(cols * dv)),
                     xmalloc(2 * (size_t)(rows * dv)), xmalloc(4 * (size_t)rows), xmalloc(4 * (size_t)rows),
                     NULL, NULL, NULL, NULL, NULL};
    for (int64_t i = 0; i < rows * d; i++) in.q[i] = h_f32_to_bf16((float)(amp * h_rng_normal(&g_rng)));
    for (int64_t i = 0; i < cols * d; i++) in.k[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    for (int64_t i = 0; i < cols * dv; i++) in.v[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    for (int64_t i = 0; i < rows * dv; i++) in.dout[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    if (band) { /* a diagonal from a random start, a window of random width, some rows empty */
        in.lo = xmalloc(4 * (size_t)rows), in.hi = xmalloc(4 * (size_t)rows);
        const int64_t off = h_rng_int(&g_rng, -rows / 2, cols), width = band == 2 ? h_rng_int(&g_rng, 0, cols) : cols;
        for (int64_t r = 0; r < rows; r++) {
            int64_t a = r + off - width, z = r + off;
            a = a < 0 ? 0 : a > cols ? cols : a;
            z = z > cols - 1 ? cols - 1 : z < -1 ? -1 : z;
            if (r % 7 == 5) a = z + 1; /* empty */
            in.lo[r] = (int32_t)a, in.hi[r] = (int32_t)z;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            if (bwd_kept(&in, r, c)) {
                const double z = scale * bwd_dot(in.q + r * d, in.k + c * d, d);
                mx = z > mx ? z : mx;
            }
        for (int64_t c = 0; mx != -INFINITY && c < cols; c++)
            if (bwd_kept(&in, r, c)) sum += exp(scale * bwd_dot(in.q + r * d, in.k + c * d, d) - mx);
        in.lse[r] = mx == -INFINITY ? -INFINITY : (float)(mx + log(sum));
        in.dvec[r] = (float)(0.5 * h_rng_normal(&g_rng));
    }
    const int64_t lddq = round16(d) + 16, lddt = round16(cols) + 16;
    in.dq0 = xmalloc(4 * (size_t)(rows * lddq));
    in.dkt0 = xmalloc(4 * (size_t)(round16(d) * lddt)), in.dvt0 = xmalloc(4 * (size_t)(round16(dv) * lddt));
    for (int64_t i = 0; i < rows * lddq; i++) in.dq0[i] = (float)h_rng_normal(&g_rng);
    for (int64_t i = 0; i < round16(d) * lddt; i++) in.dkt0[i] = (float)h_rng_normal(&g_rng);
    for (int64_t i = 0; i < round16(dv) * lddt; i++) in.dvt0[i] = (float)h_rng_normal(&g_rng);
    return in;
}

static double g_bwd_err; /* the worst error seen, of the bound */

/* |x - ref| against 2^-7 sum|terms| + n 2^-24 (sum|terms| + |start|), n terms added in
 * fp32 (each rounding once); counts the misses */
static int64_t bwd_check(double x, double ref, double terms, double start, int64_t n) {
    const double err = fabs(x - ref) / (0x1p-7 * terms + (double)(n + 1) * 0x1p-24 * (terms + fabs(start)) + 1e-30);
    if (err > g_bwd_err) g_bwd_err = err;
    return !(err <= 1.0);
}

/* out[i][j] (ldo apart) against start[i][j] + sum_{k < nk} w(i, j, k) x(i, j, k), each of
 * w (bounded by ew) and x at the strides {i, j, k} given; returns the misses. */
typedef struct {
    const float *out, *start;
    int64_t ldo, ni, nj, nk;
    const double *w, *ew;
    int64_t ws[3];
    const uint16_t *x;
    int64_t xs[3];
} bwd_sum;

static int64_t bwd_check_sum(const bwd_sum *b) {
    int64_t bad = 0;
    for (int64_t i = 0; i < b->ni; i++)
        for (int64_t j = 0; j < b->nj; j++) {
            double ref = b->start[i * b->ldo + j], terms = 0.0;
            for (int64_t k = 0; k < b->nk; k++) {
                const int64_t wi = i * b->ws[0] + j * b->ws[1] + k * b->ws[2];
                const double xv = h_bf16_to_f32(b->x[i * b->xs[0] + j * b->xs[1] + k * b->xs[2]]);
                ref += b->w[wi] * xv, terms += fabs(b->ew[wi] * xv);
            }
            bad += bwd_check(b->out[i * b->ldo + j], ref, terms, b->start[i * b->ldo + j], b->nk);
        }
    return bad;
}

static void case_bwd_bf16(const fa_kernels *kt, int64_t rows, int64_t cols, int64_t d, int64_t dv, int band,
                          double amp, float scale) {
    h_case("bwd_bf16 isa=%s rows=%lld cols=%lld d=%lld dv=%lld band=%d amp=%g scale=%g", kt->name, (long long)rows,
           (long long)cols, (long long)d, (long long)dv, band, amp, scale);
    bwd_inputs in = bwd_make(rows, cols, d, dv, band, amp, scale);
    bwd_out o = bwd_run(kt, rows, cols, d, dv, in.q, in.k, in.v, in.dout, in.lse, in.dvec, in.lo, in.hi, scale, in.dq0,
                        in.dkt0, in.dvt0);
    /* P and dS in fp64 */
    double *P = xmalloc(sizeof(double) * (size_t)(rows * cols)), *dS = xmalloc(sizeof(double) * (size_t)(rows * cols));
    double *eS = xmalloc(sizeof(double) * (size_t)(rows * cols)); /* |dS| plus its bound from dp's sum, over 2^-7 */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            P[r * cols + c] = dS[r * cols + c] = eS[r * cols + c] = 0.0;
            if (!bwd_kept(&in, r, c) || in.lse[r] == -INFINITY) continue;
            const double p = exp(scale * bwd_dot(in.q + r * d, in.k + c * d, d) - in.lse[r]);
            double dpabs = 0.0;
            for (int64_t e = 0; e < dv; e++) dpabs += fabs((double)h_bf16_to_f32(in.dout[r * dv + e]) * h_bf16_to_f32(in.v[c * dv + e]));
            P[r * cols + c] = p;
            dS[r * cols + c] = p * (bwd_dot(in.dout + r * dv, in.v + c * dv, dv) - in.dvec[r]);
            eS[r * cols + c] = fabs(dS[r * cols + c]) + p * (double)dv * 0x1p-23 * dpabs * 0x1p7;
        }
    /* dq[r][x] = sum_c dS[r][c] k[c][x]; dK^T[x][c] = sum_r dS[r][c] q[r][x]; dV^T[e][c] = sum_r P[r][c] dO[r][e] */
    const bwd_sum sums[3] = {
        {o.dq, in.dq0, o.lddq, rows, d, cols, dS, eS, {cols, 0, 1}, in.k, {0, 1, d}},
        {o.dkt, in.dkt0, o.lddt, d, cols, rows, dS, eS, {0, 1, cols}, in.q, {1, 0, d}},
        {o.dvt, in.dvt0, o.lddt, dv, cols, rows, P, P, {0, 1, cols}, in.dout, {1, 0, dv}},
    };
    int64_t bad = 0;
    for (int i = 0; i < 3; i++) bad += bwd_check_sum(&sums[i]);
    CHECK(bad == 0, "%lld of dq, dK^T, dV^T beyond 2^-7 of their terms from the fp64 backward", (long long)bad);
    free(P), free(dS), free(eS);
    bwd_out_free(&o);
    bwd_inputs_free(&in);
}

/* pack_t_bf16 bitwise against its definition, with the rows past it zero. */
static void case_pack_t(const fa_kernels *kt, int64_t rows, int64_t len, int64_t ld) {
    h_case("pack_t_bf16 isa=%s rows=%lld len=%lld ld=%lld", kt->name, (long long)rows, (long long)len, (long long)ld);
    const int64_t ldd = (rows + 31) / 32 * 32 + 16 * h_rng_int(&g_rng, 0, 2);
    uint16_t *src = xmalloc(2 * (size_t)(rows * ld)), *dst = xmalloc(2 * (size_t)(len * ldd));
    for (int64_t i = 0; i < rows * ld; i++) src[i] = (uint16_t)h_rng_int(&g_rng, 0, 65535);
    memset(dst, 0xab, 2 * (size_t)(len * ldd));
    kt->pack_t_bf16(rows, len, src, ld, dst, ldd);
    int64_t bad = 0;
    for (int64_t x = 0; x < len; x++)
        for (int64_t r = 0; r < ldd; r++) {
            const uint16_t want = r < rows ? src[r * ld + x] : r < (rows + 31) / 32 * 32 ? 0 : 0xabab;
            bad += dst[x * ldd + r] != want;
        }
    CHECK(bad == 0, "%lld elements differ", (long long)bad);
    free(src), free(dst);
}

static void test_bwd_bf16(void) {
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *kt = g_tab[t].k;
        if (kt != &fa_kernels_ref && !(kt->flags & FA_KERNELS_BWD_BF16)) continue; /* the reference's */
        case_pack_t(kt, 37, 33, 40);
        case_pack_t(kt, 128, 128, 128);
        case_pack_t(kt, 1, 1, 1);
        case_pack_t(kt, 64, 100, 4096);
        const int quick = kt->flags & FA_KERNELS_EXPLICIT;
        static const int64_t shapes[][5] = {/* rows cols d dv band */
                                            {32, 64, 128, 128, 0}, {1, 1, 1, 1, 0},      {17, 33, 31, 7, 1},
                                            {48, 100, 64, 96, 2},  {128, 128, 128, 128, 1}, {70, 64, 32, 32, 2},
                                            {33, 17, 16, 130, 1},  {16, 300, 72, 40, 0}};
        for (size_t i = 0; i < NELEM(shapes); i++) {
            if (quick && i % 2) continue;
            const double amp = i % 3 == 0 ? 3.0 : i % 3 == 1 ? 1.0 : 0.3;
            case_bwd_bf16(kt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], (int)shapes[i][4], amp,
                          i % 4 == 3 ? -0.2f : 1.0f / sqrtf((float)shapes[i][2]));
        }
    }
    printf("bwd_bf16: worst error %.3f of the bound (2^-7 of the terms, dp's fp32 sum in dS's)\n", g_bwd_err);
}

/* Every function entry of fa_kernels, in order (test_tables checks that the list is whole). */
#define KERNEL_ENTRY(f) {#f, offsetof(fa_kernels, f)}
static const struct {
    const char *name;
    size_t offset;
} KERNEL_ENTRIES[] = {
    KERNEL_ENTRY(pack_qt),       KERNEL_ENTRY(qk),        KERNEL_ENTRY(softmax),      KERNEL_ENTRY(pv),
    KERNEL_ENTRY(ds),            KERNEL_ENTRY(stx),
    KERNEL_ENTRY(f16_to_f32),    KERNEL_ENTRY(bf16_to_f32), KERNEL_ENTRY(f32_to_f16), KERNEL_ENTRY(f32_to_bf16),
    KERNEL_ENTRY(pack_qt_bf16), KERNEL_ENTRY(qk_bf16),
    KERNEL_ENTRY(pack_pairs_bf16), KERNEL_ENTRY(pv_bf16),  KERNEL_ENTRY(stx_bf16),
    KERNEL_ENTRY(pack_kt_bf16),  KERNEL_ENTRY(fwd_bf16),  KERNEL_ENTRY(fwd_i8),      KERNEL_ENTRY(qk_i8),
    KERNEL_ENTRY(pack_t_bf16),
    KERNEL_ENTRY(bwd_bf16),
    KERNEL_ENTRY(qk_small),      KERNEL_ENTRY(softmax_small), KERNEL_ENTRY(pv_small),
    KERNEL_ENTRY(qk_small_i8),   KERNEL_ENTRY(pv_small_i8), KERNEL_ENTRY(quant_row_i8),
    KERNEL_ENTRY(sum_rows_bf16), KERNEL_ENTRY(dot_rows_f64),
    KERNEL_ENTRY(probe_fma),     KERNEL_ENTRY(probe_bf16), KERNEL_ENTRY(probe_tile),
    KERNEL_ENTRY(thread_begin),  KERNEL_ENTRY(thread_end),
};

typedef void (*any_fn)(void);

static any_fn kernel_entry(const fa_kernels *k, int i) {
    any_fn f;
    memcpy(&f, (const char *)k + KERNEL_ENTRIES[i].offset, sizeof f);
    return f;
}

/* What each known table overrides of its parent's (kernels.h, the <isa>_table.c files);
 * every other entry must be its parent's, the very same function. */
#define TILE_KERNELS "qk_bf16 pv_bf16 stx_bf16 fwd_bf16 fwd_i8 bwd_bf16 probe_tile thread_begin thread_end"
#define TILE_FLAGS                                                                                                  \
    (FA_KERNELS_BF16_DOT | FA_KERNELS_BF16_DOT_FAST | FA_KERNELS_TILES | FA_KERNELS_FWD_BF16 | FA_KERNELS_BWD_BF16 | \
     FA_KERNELS_FWD_I8)
#define FP32_KERNELS "pack_qt qk softmax pv ds stx f16_to_f32 bf16_to_f32 qk_small softmax_small pv_small probe_fma"
static const struct {
    const char *table, *parent, *overrides;
    unsigned flags;
} KNOWN_TABLES[] = {
    {"ref", NULL, "", FA_KERNELS_SMALL_ROWS | FA_KERNELS_I8_DOT},
    {"avx2", "ref", FP32_KERNELS " f32_to_f16 f32_to_bf16", FA_KERNELS_SMALL_ROWS},
    {"avx2vnni", "avx2", "qk_small_i8 pv_small_i8", FA_KERNELS_SMALL_ROWS | FA_KERNELS_I8_DOT},
    {"avx512", "avx2", FP32_KERNELS " f32_to_f16 f32_to_bf16 sum_rows_bf16 dot_rows_f64", FA_KERNELS_SMALL_ROWS},
    {"avx512bf16", "avx512",
     "pack_qt_bf16 qk_bf16 pack_pairs_bf16 pv_bf16 stx_bf16 probe_bf16 qk_small_i8 pv_small_i8 quant_row_i8 qk_i8",
     FA_KERNELS_SMALL_ROWS | FA_KERNELS_BF16_DOT | FA_KERNELS_I8_DOT | FA_KERNELS_QK_I8},
    {"neon", "ref", FP32_KERNELS, FA_KERNELS_SMALL_ROWS},
    {"amx", "avx512bf16", TILE_KERNELS " pack_kt_bf16 pack_t_bf16", FA_KERNELS_SMALL_ROWS | TILE_FLAGS | FA_KERNELS_I8_DOT},
    {"amx-model", "ref", TILE_KERNELS, FA_KERNELS_SMALL_ROWS | TILE_FLAGS | FA_KERNELS_EXPLICIT | FA_KERNELS_I8_DOT},
};

static int word_in(const char *word, const char *list) {
    const size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

static int table_index(const char *name) {
    for (int i = 0; name && i < fa_kernels_count(); i++)
        if (strcmp(fa_kernels_at(i, NULL)->name, name) == 0) return i;
    return -1;
}

/*
 * Every table in the registry, whether it runs here or not (only pointers are compared):
 * no entry NULL; the parent named, in the registry after the child (best first), the
 * chain ending at ref; entries the table does not override are its parent's; an
 * override is a function no ancestor has there (not a grandparent's kept by mistake);
 * sane blocking and flags, and for the known tables exactly their overrides and flags.
 */
static void test_tables(void) {
    const int n = fa_kernels_count(), ne = (int)NELEM(KERNEL_ENTRIES);
    h_case("KERNEL_ENTRIES lists every function entry of fa_kernels");
    int whole = KERNEL_ENTRIES[ne - 1].offset + sizeof(any_fn) == sizeof(fa_kernels);
    for (int i = 1; i < ne; i++) whole &= KERNEL_ENTRIES[i].offset == KERNEL_ENTRIES[i - 1].offset + sizeof(any_fn);
    CHECK(whole, "the entries are not contiguous up to the end of fa_kernels: update KERNEL_ENTRIES");
    for (int t = 0; t < n; t++) {
        const fa_kernels *k = fa_kernels_at(t, NULL);
        h_case("table %s: no NULL entry", k->name);
        for (int i = 0; i < ne; i++) CHECK(kernel_entry(k, i) != NULL, "%s is NULL", KERNEL_ENTRIES[i].name);

        h_case("table %s: blocking and flags", k->name);
        CHECK(k->row_align >= 1 && FA_ROW_ALIGN % k->row_align == 0, "row_align %d does not divide FA_ROW_ALIGN %d",
              (int)k->row_align, FA_ROW_ALIGN);
        CHECK(k->qk_block.rows >= 1 && k->qk_block.cols >= 1 && k->pv_block.rows >= 1 && k->pv_block.cols >= 1,
              "register blocks qk %dx%d, pv %dx%d", (int)k->qk_block.rows, (int)k->qk_block.cols,
              (int)k->pv_block.rows, (int)k->pv_block.cols);
        CHECK((k->flags & ~(unsigned)(FA_KERNELS_BF16_DOT | FA_KERNELS_SMALL_ROWS | FA_KERNELS_BF16_DOT_FAST |
                                      FA_KERNELS_TILES | FA_KERNELS_EXPLICIT | FA_KERNELS_I8_DOT |
                                      FA_KERNELS_FWD_BF16 | FA_KERNELS_BWD_BF16 | FA_KERNELS_FWD_I8 |
                                      FA_KERNELS_QK_I8)) == 0,
              "unknown flags 0x%x", k->flags);
        CHECK(!(k->flags & (FA_KERNELS_BF16_DOT_FAST | FA_KERNELS_TILES)) || (k->flags & FA_KERNELS_BF16_DOT),
              "flags 0x%x: a fast bf16 dot product or a tile unit without FA_KERNELS_BF16_DOT", k->flags);
        CHECK(!(k->flags & FA_KERNELS_TILES) ||
                  (k->qk_block.rows % 16 == 0 && k->qk_block.cols % 16 == 0 && k->pv_block.rows % 16 == 0 &&
                   k->pv_block.cols % 16 == 0),
              "a tile table's blocks qk %dx%d, pv %dx%d are not whole tiles", (int)k->qk_block.rows,
              (int)k->qk_block.cols, (int)k->pv_block.rows, (int)k->pv_block.cols);

        h_case("table %s: inherits from %s", k->name, k->parent ? k->parent : "(root)");
        int depth = 0, ok = 1;
        for (int a = t; ok && fa_kernels_at(a, NULL)->parent; depth++) {
            const int up = table_index(fa_kernels_at(a, NULL)->parent);
            ok = up > a && depth < n;
            if (!CHECK(ok, "parent %s of %s is not in the registry after it", fa_kernels_at(a, NULL)->parent,
                       fa_kernels_at(a, NULL)->name))
                break;
            a = up;
        }
        if (!ok) continue;
        if (!k->parent) {
            CHECK(k == &fa_kernels_ref, "%s has no parent, but only ref is the root", k->name);
            continue;
        }
        const fa_kernels *parent = fa_kernels_at(table_index(k->parent), NULL);
        int known = -1;
        for (int i = 0; i < (int)NELEM(KNOWN_TABLES); i++)
            if (strcmp(KNOWN_TABLES[i].table, k->name) == 0) known = i;
        for (int i = 0; i < ne; i++) {
            const any_fn mine = kernel_entry(k, i);
            const int overridden = mine != kernel_entry(parent, i);
            if (known >= 0) {
                const int should = word_in(KERNEL_ENTRIES[i].name, KNOWN_TABLES[known].overrides);
                CHECK(overridden == should, "%s is %s, but %s %s it", KERNEL_ENTRIES[i].name,
                      overridden ? "not the parent's" : "the parent's", k->name, should ? "overrides" : "inherits");
            }
            if (!overridden) continue;
            for (const fa_kernels *a = parent; a->parent; a = fa_kernels_at(table_index(a->parent), NULL))
                CHECK(mine != kernel_entry(fa_kernels_at(table_index(a->parent), NULL), i),
                      "%s is %s's: the table skipped its parent", KERNEL_ENTRIES[i].name, a->parent);
        }
        if (known >= 0) {
            CHECK(strcmp(KNOWN_TABLES[known].parent, k->parent) == 0, "parent %s, want %s", k->parent,
                  KNOWN_TABLES[known].parent);
            CHECK(k->flags == KNOWN_TABLES[known].flags, "flags 0x%x, want 0x%x", k->flags, KNOWN_TABLES[known].flags);
        }
    }
}

/*
 * What the flags decide, through the public API: a path without a native bf16 dot
 * product reports FA_ERR_UNSUPPORTED for the bf16 peak (without running anything) and
 * never takes the bf16 path, even when FA_PARAM_BF16_DOT forces it.
 */
static void test_flags_in_use(void) {
    const char *saved_env = getenv("FLASHATTN_ARCH");
    char *saved = saved_env ? strcpy(xmalloc(strlen(saved_env) + 1), saved_env) : NULL;
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *k = g_tab[t].k;
        h_case("table %s: probe_tile", k->name);
        if (k->flags & FA_KERNELS_TILES) { /* a few products, not a measurement */
            tiles_begin(k);
            const double flops = k->probe_tile(3);
            tiles_end(k);
            CHECK(flops == 3 * 6 * 16384.0, "probe_tile(3) counts %g FLOPs", flops);
        } else {
            setenv("FLASHATTN_ARCH", k->name, 1);
            fa_context *ctx = NULL;
            double peak = -1.0;
            CHECK(fa_context_create(&ctx) == FA_OK && fa_probe(ctx, FA_PROBE_TILE_PEAK, &peak) == FA_ERR_UNSUPPORTED,
                  "FA_PROBE_TILE_PEAK without a tile unit is not FA_ERR_UNSUPPORTED");
            fa_context_free(ctx);
        }
        if (k->flags & FA_KERNELS_BF16_DOT) continue; /* its probe is a measurement: not run here */
        h_case("table %s without FA_KERNELS_BF16_DOT", k->name);
        setenv("FLASHATTN_ARCH", k->name, 1);
        fa_context *ctx = NULL;
        if (!CHECK(fa_context_create(&ctx) == FA_OK, "fa_context_create failed")) continue;
        double peak = -1.0;
        const fa_status st = fa_probe(ctx, FA_PROBE_BF16_PEAK, &peak);
        CHECK(st == FA_ERR_UNSUPPORTED, "FA_PROBE_BF16_PEAK: status %d (%s)", (int)st, fa_status_string(st));
        int64_t active = -1;
        CHECK(fa_context_set(ctx, FA_PARAM_BF16_DOT, 1) == FA_OK &&
                  fa_context_get(ctx, FA_PARAM_BF16_DOT_ACTIVE, &active) == FA_OK && active == 0,
              "FA_PARAM_BF16_DOT=1 turns the bf16 path on (active %lld)", (long long)active);
        fa_context_free(ctx);
    }
    if (saved) setenv("FLASHATTN_ARCH", saved, 1);
    else unsetenv("FLASHATTN_ARCH");
    free(saved);
}

/* ------------------------------------------------------------ tiles released */

/*
 * Through the public API, on every tile table that runs here: a bf16 forward and
 * backward on 2 threads leave the caller's thread without a tile configuration (the
 * pool's hooks release what they configured), and two contexts on two threads at once
 * each get the bits one context alone gets. B=1, S=45 (a partial 16-row and 32-key
 * block), H=3, D=40 (a partial 32-element chunk).
 */
enum { TR_S = 45, TR_H = 3, TR_D = 40, TR_N = TR_S * TR_H * TR_D };

typedef struct {
    const uint16_t *q, *k, *v;
    float o[TR_N];
    fa_status st;
    int tiles_after;     /* the thread held tiles after its calls */
    const fa_kernels *kt;
} tr_run;

static void *tr_forward(void *arg) {
    tr_run *r = arg;
    fa_context *ctx = NULL;
    r->st = fa_context_create(&ctx);
    if (r->st == FA_OK) r->st = fa_context_set(ctx, FA_PARAM_THREADS, 2);
    if (r->st == FA_OK) r->st = fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH);
    for (int rep = 0; rep < 3 && r->st == FA_OK; rep++) {
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = fa_tensor_make((void *)r->q, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.k = fa_tensor_make((void *)r->k, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.v = fa_tensor_make((void *)r->v, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.o = fa_tensor_make(r->o, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.causal = FA_CAUSAL_BOTTOM_RIGHT;
        r->st = fa_forward(ctx, &a);
    }
    r->tiles_after = tiles_held(r->kt);
    fa_context_free(ctx);
    return NULL;
}

static void test_tiles_released(void) {
    const char *saved_env = getenv("FLASHATTN_ARCH");
    char *saved = saved_env ? strcpy(xmalloc(strlen(saved_env) + 1), saved_env) : NULL;
    uint16_t *qkv = xmalloc(sizeof(uint16_t) * 3 * TR_N);
    for (int i = 0; i < 3 * TR_N; i++) qkv[i] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
    for (int t = 0; t < g_ntab; t++) {
        const fa_kernels *k = g_tab[t].k;
        if (!(k->flags & FA_KERNELS_TILES)) continue;
        setenv("FLASHATTN_ARCH", k->name, 1);
        h_case("table %s: the caller's thread holds no tiles after forward and backward", k->name);
        fa_context *ctx = NULL;
        if (!CHECK(fa_context_create(&ctx) == FA_OK && fa_context_set(ctx, FA_PARAM_THREADS, 2) == FA_OK &&
                       fa_context_set(ctx, FA_PARAM_ALGO, FA_ALGO_FLASH) == FA_OK,
                   "context on %s", k->name))
            continue;
        float *o = xmalloc(sizeof(float) * TR_N), *lse = xmalloc(sizeof(float) * TR_S * TR_H);
        uint16_t *dout = xmalloc(sizeof(uint16_t) * TR_N);
        float *grads = xmalloc(sizeof(float) * 3 * TR_N);
        for (int i = 0; i < TR_N; i++) dout[i] = qkv[(7 * i) % (3 * TR_N)];
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.q = fa_tensor_make(qkv, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.k = fa_tensor_make(qkv + TR_N, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.v = fa_tensor_make(qkv + 2 * TR_N, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.o = fa_tensor_make(o, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        a.lse = fa_tensor_contiguous(lse, FA_DTYPE_F32, 1, TR_H, TR_S, 1);
        fa_status st = fa_forward(ctx, &a);
        CHECK(st == FA_OK, "forward: %s: %s", fa_status_string(st), fa_context_error(ctx));
        CHECK(!tiles_held(k), "the caller's thread holds tiles after fa_forward");
        int64_t active = 0;
        CHECK(fa_context_get(ctx, FA_PARAM_BF16_DOT_ACTIVE, &active) == FA_OK && active == 1,
              "bf16 inputs do not take the tile kernels by default");
        fa_backward_args b = FA_BACKWARD_ARGS_INIT;
        b.fwd = &a;
        b.do_ = fa_tensor_make(dout, FA_DTYPE_BF16, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        b.dq = fa_tensor_make(grads, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        b.dk = fa_tensor_make(grads + TR_N, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        b.dv = fa_tensor_make(grads + 2 * TR_N, FA_DTYPE_F32, FA_LAYOUT_BSND, 1, TR_S, TR_H, TR_D);
        st = fa_backward(ctx, &b);
        CHECK(st == FA_OK, "backward: %s: %s", fa_status_string(st), fa_context_error(ctx));
        CHECK(!tiles_held(k), "the caller's thread holds tiles after fa_backward");
        double peak = 0;
        st = fa_probe(ctx, FA_PROBE_TILE_PEAK, &peak);
        CHECK(st == FA_OK && peak > 0, "FA_PROBE_TILE_PEAK: %s, %g GFLOP/s", fa_status_string(st), peak);
        CHECK(!tiles_held(k), "the caller's thread holds tiles after fa_probe");
        fa_context_free(ctx);
        free(o), free(lse), free(dout), free(grads);

        h_case("table %s: two contexts on two threads at once", k->name);
        tr_run *alone = xmalloc(sizeof *alone), *two = xmalloc(2 * sizeof *two);
        *alone = (tr_run){qkv, qkv + TR_N, qkv + 2 * TR_N, {0}, FA_OK, 0, k};
        tr_forward(alone);
        pthread_t th[2];
        int made[2] = {0, 0};
        for (int i = 0; i < 2; i++) {
            two[i] = (tr_run){qkv, qkv + TR_N, qkv + 2 * TR_N, {0}, FA_OK, 0, k};
            made[i] = pthread_create(&th[i], NULL, tr_forward, &two[i]) == 0;
        }
        for (int i = 0; i < 2; i++) {
            if (!CHECK(made[i], "pthread_create")) continue;
            pthread_join(th[i], NULL);
            CHECK(two[i].st == FA_OK && alone->st == FA_OK, "statuses %d, %d", (int)two[i].st, (int)alone->st);
            CHECK(memcmp(two[i].o, alone->o, sizeof alone->o) == 0, "thread %d's o differs from one context alone", i);
            CHECK(!two[i].tiles_after, "thread %d holds tiles after its calls", i);
        }
        free(alone), free(two);
    }
    free(qkv);
    if (saved) setenv("FLASHATTN_ARCH", saved, 1);
    else unsetenv("FLASHATTN_ARCH");
    free(saved);
}

/* ------------------------------------------------------------ pool hooks */

static atomic_int g_begins, g_ends, g_outside;
static _Thread_local int g_in_share; /* between this thread's begin and end hooks */

static void hook_begin(void) {
    g_outside += g_in_share; /* begin twice without an end */
    g_in_share = 1;
    g_begins++;
}

static void hook_end(void) {
    g_outside += !g_in_share;
    g_in_share = 0;
    g_ends++;
}

typedef struct {
    atomic_int ran, outside;
    atomic_int seen[4];
} hook_job;

static void hook_worker(void *arg, int ith, int nth) {
    hook_job *job = arg;
    job->ran++;
    job->outside += !g_in_share;
    if (ith >= 0 && ith < 4 && nth <= 4) job->seen[ith]++;
}

/* fa_pool_run calls the hooks around every thread's share, the caller's included,
 * also for a pool of 0 workers, and with both NULL runs plainly. */
static void test_pool_hooks(void) {
    static const struct {
        int workers, nth;
    } cases[] = {{0, 1}, {0, 3}, {2, 1}, {2, 2}, {2, 3}, {2, 5}};
    for (int i = 0; i < NELEM(cases); i++) {
        const int workers = cases[i].workers, want = cases[i].nth < workers + 1 ? cases[i].nth : workers + 1;
        h_case("pool hooks: %d workers, nth = %d", workers, cases[i].nth);
        fa_pool *pool = NULL;
        if (!CHECK(fa_pool_create(workers, hook_begin, hook_end, &pool) == FA_OK && pool, "fa_pool_create failed"))
            continue;
        g_begins = g_ends = g_outside = 0;
        for (int rep = 0; rep < 3; rep++) {
            hook_job job = {0};
            fa_pool_run(pool, cases[i].nth, hook_worker, &job);
            CHECK(job.ran == want, "the job ran on %d threads, want %d", (int)job.ran, want);
            CHECK(job.outside == 0, "%d shares ran outside the hooks", (int)job.outside);
            for (int t = 0; t < want; t++) CHECK(job.seen[t] == 1, "thread %d ran %d times", t, (int)job.seen[t]);
        }
        CHECK(!g_in_share, "the caller's thread was left between begin and end");
        fa_pool_free(pool);
        CHECK(g_begins == 3 * want && g_ends == 3 * want && g_outside == 0, "begins %d, ends %d (want %d), unpaired %d",
              (int)g_begins, (int)g_ends, 3 * want, (int)g_outside);
    }
    h_case("pool without hooks");
    fa_pool *pool = NULL;
    if (CHECK(fa_pool_create(1, NULL, NULL, &pool) == FA_OK && pool, "fa_pool_create failed")) {
        hook_job job = {0};
        fa_pool_run(pool, 2, hook_worker, &job);
        CHECK(job.ran == 2 && job.outside == 2, "ran %d, outside hooks %d", (int)job.ran, (int)job.outside);
        fa_pool_free(pool);
    }
}

/* ------------------------------------------------------- amx against its model */

/*
 * The same tile kernels on the hardware (amx) and on the software model of the tiles
 * (amx-model), on identical inputs: the model follows the SDM's TDPBF16PS bit for bit
 * (tests/test_amx_model.c checks it instruction by instruction against the hardware)
 * and the glue around the tiles is the same C source, so every output must agree
 * bitwise. Run where the CPU has AMX; elsewhere said and skipped, never counted.
 */
static const fa_kernels *table_named(const char *name) {
    for (int t = 0; t < g_ntab; t++)
        if (is_table(g_tab[t].k, name)) return g_tab[t].k;
    return NULL;
}

/* a bf16 value of wide range: most N(0, 1), some large, some tiny (denormal as bf16) */
static uint16_t agree_value(h_rng *r) {
    const double u = h_rng_uniform(r);
    double v = h_rng_normal(r);
    if (u < 0.05) v *= 1e30;
    else if (u < 0.10) v *= 1e-39;
    return h_f32_to_bf16((float)v);
}

typedef struct {
    int64_t elems, differ;
} agree_count;

static void agree_compare(agree_count *a, const float *x, const float *y, int64_t n, int64_t ld, int64_t len) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < len; j++) {
            a->elems++;
            a->differ += fbits(x[i * ld + j]) != fbits(y[i * ld + j]);
        }
}

/* One shape through qk_bf16, pv_bf16 and stx_bf16 on both tables. */
static void agree_case(const fa_kernels *hw, const fa_kernels *md, int64_t rows, int64_t cols, int64_t d,
                       agree_count *a) {
    const int64_t ldqt = round16(rows), ldst = round16(rows), ldk = d + 3, ldacc = round16(d), ldvp = round16(d);
    const int64_t dpad = d + (d & 1);
    uint16_t *qt2 = xaligned(sizeof(uint16_t) * (size_t)(dpad / 2 * 2 * ldqt));
    memset(qt2, 0, sizeof(uint16_t) * (size_t)(dpad / 2 * 2 * ldqt));
    for (int64_t x = 0; x < d; x++)
        for (int64_t r = 0; r < rows; r++) qt2[(x / 2) * 2 * ldqt + 2 * r + (x & 1)] = agree_value(&g_rng);
    uint16_t *k = xmalloc(sizeof(uint16_t) * (size_t)(cols * ldk));
    for (int64_t i = 0; i < cols * ldk; i++) k[i] = agree_value(&g_rng);
    float *st[2], *acc[2], *dk[2];
    const size_t st_bytes = 4 * (size_t)(cols * ldst), acc_bytes = 4 * (size_t)(rows * ldacc);
    const size_t dk_bytes = 4 * (size_t)(cols * ldacc);
    float *alpha = xmalloc(4 * (size_t)rows), *acc0 = xmalloc(acc_bytes), *dk0 = xmalloc(dk_bytes);
    for (int64_t r = 0; r < rows; r++) alpha[r] = (float)h_rng_uniform(&g_rng);
    for (int64_t i = 0; i < rows * ldacc; i++) acc0[i] = (float)h_rng_normal(&g_rng);
    for (int64_t i = 0; i < cols * ldacc; i++) dk0[i] = (float)h_rng_normal(&g_rng);
    uint32_t *vp = xaligned(4 * (size_t)((cols + 1) / 2 * ldvp));
    fa_kernels_ref.pack_pairs_bf16(cols, d, k, ldk, vp, ldvp);
    const size_t pv_scr = 4 * (size_t)FA_PV_BF16_SCRATCH(rows, cols, d);
    const size_t stx_scr = 2 * (size_t)FA_STX_BF16_SCRATCH(rows, cols, d, ldst);
    void *scratch = xaligned(pv_scr > stx_scr ? pv_scr : stx_scr);
    uint16_t *x = xmalloc(sizeof(uint16_t) * (size_t)(rows * ldk));
    for (int64_t i = 0; i < rows * ldk; i++) x[i] = agree_value(&g_rng);
    for (int w = 0; w < 2; w++) {
        const fa_kernels *kt = w ? md : hw;
        h_case("amx vs amx-model rows=%lld cols=%lld d=%lld on %s", (long long)rows, (long long)cols, (long long)d,
               kt->name);
        st[w] = xaligned(st_bytes), acc[w] = xaligned(acc_bytes), dk[w] = xaligned(dk_bytes);
        memcpy(acc[w], acc0, acc_bytes), memcpy(dk[w], dk0, dk_bytes);
        tiles_begin(kt);
        kt->qk_bf16(rows, cols, d, qt2, 2 * ldqt, k, ldk, 0.125f, st[w], ldst);
        /* P from the scores, finite and in [0, 1] as the softmax leaves it */
        for (int64_t i = 0; i < cols * ldst; i++) st[w][i] = isfinite(st[w][i]) ? 1.0f / (1.0f + fabsf(st[w][i])) : 0.0f;
        /* P's conversion on its edges (amx's pv_bf16 converts as vcvtne2ps2bf16 does, the
         * model follows): fp32 subnormals of both signs, the largest one (which nearest-even
         * rounding would lift to the smallest normal), the smallest normal, a -0 */
        static const uint32_t edge[] = {0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00400000u,
                                        0x00008000u, 0x00800000u, 0x00807fffu, 0x80000000u, 0x0000ffffu};
        for (int64_t i = 0; i < cols * ldst; i += 5) {
            const uint32_t u = edge[(i / 5) % (sizeof edge / sizeof edge[0])];
            memcpy(&st[w][i], &u, 4);
        }
        kt->pv_bf16(rows, cols, d, st[w], ldst, vp, ldvp, alpha, acc[w], ldacc, scratch);
        kt->stx_bf16(rows, cols, d, st[w], ldst, x, ldk, dk[w], ldacc, scratch);
        tiles_end(kt);
    }
    agree_compare(a, st[0], st[1], cols, ldst, rows);
    agree_compare(a, acc[0], acc[1], rows, ldacc, d);
    agree_compare(a, dk[0], dk[1], cols, ldacc, d);
    for (int w = 0; w < 2; w++) free(st[w]), free(acc[w]), free(dk[w]);
    free(qt2), free(k), free(alpha), free(acc0), free(dk0), free(vp), free(scratch), free(x);
}

static void test_amx_agreement(void) {
    const fa_kernels *hw = table_named("amx"), *md = table_named("amx-model");
    if (!hw || !md) {
        printf("amx vs amx-model: skipped (%s does not run here)\n", hw ? "amx-model" : "the amx table");
        return;
    }
    static const int64_t shapes[][3] = {{16, 32, 32}, {1, 1, 1}, {17, 33, 31}, {64, 128, 128}, {33, 70, 65},
                                        {128, 96, 64}, {5, 300, 7}, {48, 31, 256}};
    agree_count a = {0, 0};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) agree_case(hw, md, shapes[i][0], shapes[i][1], shapes[i][2], &a);
    /* the fused forward over several tiles: m, l and acc after each shape */
    static const int64_t fshapes[][6] = {{32, 64, 4, 128, 128, 0}, {17, 33, 3, 31, 7, 1}, {48, 100, 3, 64, 96, 2},
                                         {70, 256, 2, 32, 40, 1},  {1, 1, 1, 1, 1, 0},     {100, 80, 2, 576, 72, 1},
                                         {140, 48, 2, 300, 40, 2}};
    for (size_t i = 0; i < sizeof fshapes / sizeof fshapes[0]; i++) {
        const int64_t rows = fshapes[i][0], cols = fshapes[i][1], nt = fshapes[i][2], d = fshapes[i][3],
                      dv = fshapes[i][4], nk = cols * nt;
        uint16_t *q = xmalloc(2 * (size_t)(rows * d)), *k = xmalloc(2 * (size_t)(nk * d)), *v = xmalloc(2 * (size_t)(nk * dv));
        for (int64_t j = 0; j < rows * d; j++) q[j] = h_f32_to_bf16((float)(3.0 * h_rng_normal(&g_rng)));
        for (int64_t j = 0; j < nk * d; j++) k[j] = h_f32_to_bf16((float)h_rng_normal(&g_rng));
        for (int64_t j = 0; j < nk * dv; j++) v[j] = agree_value(&g_rng);
        int32_t *blo = xmalloc(4 * (size_t)rows), *bhi = xmalloc(4 * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) blo[r] = (int32_t)(r / 2), bhi[r] = (int32_t)(r + nk / 3);
        const int band = fshapes[i][5] != 0;
        h_case("amx vs amx-model fwd_bf16 rows=%lld cols=%lld tiles=%lld d=%lld dv=%lld", (long long)rows,
               (long long)cols, (long long)nt, (long long)d, (long long)dv);
        /* fwd_bf16, its bf16x3 mode (V's lo parts from the same generator), then fwd_i8
         * (smoothed on every other shape) */
        uint16_t *vl = xmalloc(2 * (size_t)(nk * dv));
        for (int64_t j = 0; j < nk * dv; j++) vl[j] = agree_value(&g_rng);
        fwd_i8_data g = fwd_i8_make(rows, nk, d, 3.0, (int)(i % 2));
        for (int w = 0; w < 3; w++) {
            const uint16_t *vlo = w == 1 ? vl : NULL;
            const fwd_i8_in *in = w == 2 ? &g.in : NULL;
            fwd_state x = fwd_run(hw, rows, cols, nt, d, dv, q, k, v, vlo, band ? blo : NULL, band ? bhi : NULL, 0.125f, in);
            fwd_state y = fwd_run(md, rows, cols, nt, d, dv, q, k, v, vlo, band ? blo : NULL, band ? bhi : NULL, 0.125f, in);
            agree_compare(&a, x.m, y.m, 1, rows, rows);
            agree_compare(&a, x.l, y.l, 1, rows, rows);
            agree_compare(&a, x.acc, y.acc, rows, x.ldacc, dv);
            fwd_state_free(&x), fwd_state_free(&y);
        }
        fwd_i8_free(&g);
        free(q), free(k), free(v), free(vl), free(blo), free(bhi);
    }
    /* the fused backward: dq, dK^T, dV^T of each shape */
    static const int64_t bshapes[][5] = {{32, 64, 128, 128, 0}, {17, 33, 31, 7, 1}, {48, 100, 64, 96, 2},
                                         {128, 128, 128, 128, 1}, {1, 1, 1, 1, 0}, {70, 300, 40, 72, 2}};
    for (size_t i = 0; i < sizeof bshapes / sizeof bshapes[0]; i++) {
        const int64_t rows = bshapes[i][0], cols = bshapes[i][1], d = bshapes[i][2], dv = bshapes[i][3];
        h_case("amx vs amx-model bwd_bf16 rows=%lld cols=%lld d=%lld dv=%lld", (long long)rows, (long long)cols,
               (long long)d, (long long)dv);
        const float scale = 1.0f / sqrtf((float)d);
        bwd_inputs in = bwd_make(rows, cols, d, dv, (int)bshapes[i][4], 2.0, scale);
        bwd_out x = bwd_run(hw, rows, cols, d, dv, in.q, in.k, in.v, in.dout, in.lse, in.dvec, in.lo, in.hi, scale,
                            in.dq0, in.dkt0, in.dvt0);
        bwd_out y = bwd_run(md, rows, cols, d, dv, in.q, in.k, in.v, in.dout, in.lse, in.dvec, in.lo, in.hi, scale,
                            in.dq0, in.dkt0, in.dvt0);
        agree_compare(&a, x.dq, y.dq, rows, x.lddq, d);
        agree_compare(&a, x.dkt, y.dkt, d, x.lddt, cols);
        agree_compare(&a, x.dvt, y.dvt, dv, x.lddt, cols);
        bwd_out_free(&x), bwd_out_free(&y);
        bwd_inputs_free(&in);
    }
    printf("amx vs amx-model: %lld of %lld outputs of qk_bf16, pv_bf16, stx_bf16, fwd_bf16, fwd_i8 and bwd_bf16 bitwise equal\n",
           (long long)(a.elems - a.differ), (long long)a.elems);
    CHECK(a.differ == 0, "%lld outputs differ between the hardware tiles and the model", (long long)a.differ);
}

int main(void) {
    h_rng_seed(&g_rng, h_env_u64("FA_TEST_SEED", 31337));
    printf("flashattn %s, kernel tables in this build: %d; FA_TEST_SCALE %g\n", fa_version_string(), fa_kernels_count(),
           h_test_scale());
    test_registry();
    test_tables();
    test_flags_in_use();
    test_pool_hooks();
    test_tiles_released();
    sweep_points();
    for (int t = 0; t < g_ntab; t++) {
        test_conversions(&g_tab[t]);
        test_fp8_codes(&g_tab[t]);
        test_narrowing(&g_tab[t]);
        sweep_table(&g_tab[t]);
        if (!bf16_inherited(g_tab[t].k)) test_bf16(&g_tab[t]);
    }
    test_pack_qt();
    test_qk();
    test_softmax();
    test_pv();
    test_ds();
    test_stx();
    test_stx_bf16();
    test_small();
    test_small_i8();
    test_qk_i8();
    test_fwd_bf16();
    test_fwd_i8();
    test_bwd_bf16();
    test_amx_agreement();
    free(g_sweep);

    printf("per table: max err / (FLT_EPSILON * sum|terms|) (limit %g + sqrt(terms)), exp error in ulps\n", DOT_ULPS);
    for (int t = 0; t < g_ntab; t++) {
        const table_stats *s = &g_tab[t];
        printf("  %-11s qk %.3f  pv %.3f", s->k->name, s->qk, s->pv);
        if (!bf16_inherited(s->k)) printf("  qk_bf16 %.3f  pv_bf16 %.3f", s->qk16, s->pv16);
        else printf("  bf16 pairs: %s's", s->k->parent);
        printf("  softmax p %.3f alpha %.3f ulp (stated %g)\n", s->p_ulps, s->alpha_ulps, stated_exp_ulps(s->k->name));
        printf("  %-11s ds %.3f  stx %.3f  stx_bf16 %.3f\n", s->k->name, s->ds, s->stx, s->stx16);
        printf("  %-11s qk_small %.3f  pv_small %.3f  softmax_small p %.3f alpha %.3f ulp  (%lld calls checked)\n",
                   s->k->name, s->qks, s->pvs, s->sp_ulps, s->salpha_ulps, (long long)s->small_cases);
        printf("  %-11s exp sweep: max %.3f ulp (at x = %.9g), alpha %.3f ulp, over %lld points of [-87.3, 0]; "
               "%lld f16 sNaNs quieted\n",
               s->k->name, s->sweep_ulps, s->sweep_worst_x, s->sweep_alpha_ulps, (long long)s->sweep_points,
               (long long)s->snan_quieted);
    }
    return h_summary();
}
