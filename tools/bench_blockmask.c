/*
 * bench_blockmask.c: `flashattn bench --block-mask SPEC`: a block mask (fa_block_mask,
 * docs/semantics.md, "Block mask") against the same mask as a dense boolean tensor,
 * and against the call that needs no mask for it where there is one (full: no mask;
 * causal: causal top-left; doc: the varlen call over the documents). The calls are
 * timed in interleaved rounds (one warm-up each, then --runs rounds of one call each),
 * so a machine shared with other work disturbs them alike. Every row is credited the
 * same work, the block mask's kept pairs (fa_forward_work), so GFLOP/s compare as
 * speeds. The mask broadcasts over batch and heads; the shape's causal and window
 * flags apply to every call on top of it.
 *   full        every block kept, none with an element mask
 *   causal      key j <= query i: blocks below the diagonal full, the diagonal partial
 *   random:F    each block kept (full) with probability F
 *   doc:N       N documents of equal length (the last takes the rest), each attending
 *               to itself only; blocks across a boundary partial
 *   prefix:P    prefix-LM: every query sees keys < P, and causal beyond
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_blockmask.h"
#include "measure.h"

enum { BM_RANDOM, BM_FULL, BM_CAUSAL, BM_DOC, BM_PREFIX };

typedef struct {
    int kind;
    double density; /* random */
    int64_t n;      /* doc: documents; prefix: its length */
} bm_spec;

static int parse_spec(const char *text, bm_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!text) return -1;
    if (strcmp(text, "full") == 0) return sp->kind = BM_FULL, 0;
    if (strcmp(text, "causal") == 0) return sp->kind = BM_CAUSAL, 0;
    if (strncmp(text, "random:", 7) == 0) {
        char *end;
        sp->kind = BM_RANDOM;
        sp->density = strtod(text + 7, &end);
        return *end == '\0' && sp->density > 0.0 && sp->density <= 1.0 ? 0 : -1;
    }
    if (strncmp(text, "doc:", 4) == 0) return sp->kind = BM_DOC, cli_parse_i64(text + 4, &sp->n) == 0 && sp->n >= 1 ? 0 : -1;
    if (strncmp(text, "prefix:", 7) == 0)
        return sp->kind = BM_PREFIX, cli_parse_i64(text + 7, &sp->n) == 0 && sp->n >= 0 ? 0 : -1;
    return -1;
}

/* Document of row or key x of len (doc:N). */
static int64_t doc_of(const bm_spec *sp, int64_t x, int64_t len)
{
    const int64_t per = len / sp->n > 0 ? len / sp->n : 1, d = x / per;
    return d < sp->n - 1 ? d : sp->n - 1;
}

/* The mask's rule for pair (i, j); random masks decide per block (rnd[qb * nkb + kb]). */
static int keeps(const bm_spec *sp, const unsigned char *rnd, int64_t nkb, int64_t bs, int64_t i, int64_t j,
                 int64_t sq, int64_t sk)
{
    switch (sp->kind) {
    case BM_FULL: return 1;
    case BM_CAUSAL: return j <= i;
    case BM_DOC: return doc_of(sp, i, sq) == doc_of(sp, j, sk);
    case BM_PREFIX: return j < sp->n || j <= i;
    default: return rnd[(i / bs) * nkb + j / bs];
    }
}

/* The block mask of the rule, built block by block; element masks identical to the
 * one made last are shared (a causal diagonal). */
typedef struct {
    fa_block_mask m;
    int64_t *offsets, *partial;
    int32_t *idx;
    uint8_t *bits;
    int64_t entries, n_partial;
} bm_built;

static void built_free(bm_built *b)
{
    free(b->offsets), free(b->partial), free(b->idx), free(b->bits);
    memset(b, 0, sizeof *b);
}

static int build_mask(const bm_spec *sp, const unsigned char *rnd, int64_t bs, int64_t sq, int64_t sk, bm_built *b)
{
    memset(b, 0, sizeof *b);
    const int64_t nqb = (sq + bs - 1) / bs, nkb = (sk + bs - 1) / bs, rb = (bs + 7) / 8, blk = bs * rb;
    b->offsets = calloc((size_t)nqb + 1, sizeof *b->offsets);
    b->idx = malloc((size_t)(nqb * nkb + 1) * sizeof *b->idx);
    b->partial = malloc((size_t)(nqb * nkb + 1) * sizeof *b->partial);
    uint8_t *cur = malloc((size_t)blk);
    int64_t cap = 16;
    b->bits = malloc((size_t)(cap * blk));
    if (!b->offsets || !b->idx || !b->partial || !cur || !b->bits) {
        free(cur);
        built_free(b);
        return -1;
    }
    for (int64_t qb = 0; qb < nqb; qb++) {
        for (int64_t kb = 0; kb < nkb; kb++) {
            int64_t kept = 0, total = 0;
            memset(cur, 0, (size_t)blk);
            for (int64_t r = 0; r < bs && qb * bs + r < sq; r++)
                for (int64_t c = 0; c < bs && kb * bs + c < sk; c++) {
                    const int k = keeps(sp, rnd, nkb, bs, qb * bs + r, kb * bs + c, sq, sk);
                    kept += k, total++;
                    if (k) cur[r * rb + c / 8] |= (uint8_t)(1u << (c % 8));
                }
            if (kept == 0) continue;
            int64_t id = -1;
            if (kept < total) {
                if (b->n_partial > 0 && memcmp(b->bits + (b->n_partial - 1) * blk, cur, (size_t)blk) == 0) {
                    id = b->n_partial - 1;
                } else {
                    if (b->n_partial == cap) {
                        uint8_t *more = realloc(b->bits, (size_t)(2 * cap * blk));
                        if (!more) {
                            free(cur);
                            built_free(b);
                            return -1;
                        }
                        b->bits = more, cap *= 2;
                    }
                    memcpy(b->bits + b->n_partial * blk, cur, (size_t)blk);
                    id = b->n_partial++;
                }
            }
            b->idx[b->entries] = (int32_t)kb;
            b->partial[b->entries++] = id;
        }
        b->offsets[qb + 1] = b->entries;
    }
    free(cur);
    fa_block_mask_init(&b->m);
    b->m.block_q = b->m.block_k = bs;
    b->m.batch = b->m.heads = 1;
    b->m.q_blocks = nqb;
    b->m.offsets = b->offsets, b->m.kv_blocks = b->idx, b->m.partial = b->partial, b->m.bits = b->bits;
    b->m.n_partial = b->n_partial;
    return 0;
}

enum { BM_MAX_ROWS = 4 };

typedef struct {
    const char *name;
    fa_forward_args args;
    double *times, *cpu;               /* per round: wall seconds, the process's CPU seconds */
    double median_s;
    double vs_dense, vs_none, vs_twin; /* medians of the per-round ratios of wall time */
    double cpu_vs_none, cpu_vs_twin;   /* and of CPU time (cli_cpu_seconds) */
    int64_t extra_bytes, tile_q, tile_kv;
} bm_row;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median over the rounds of a's time over b's in the same round: a round's two calls
 * share the machine's load of that moment, so their ratio moves less than either time. */
static double median_round_ratio(const double *a, const double *b, int64_t runs, double *scratch)
{
    if (runs <= 0) return NAN;
    for (int64_t r = 0; r < runs; r++) scratch[r] = a[r] / b[r];
    qsort(scratch, (size_t)runs, sizeof(double), cmp_double);
    return scratch[runs / 2];
}

int bench_block_mask(fa_context *ctx, const cli_shape *s, const char *spec, int64_t block, int json, int no_probe)
{
    bm_spec sp;
    if (parse_spec(spec, &sp) != 0) {
        fprintf(stderr, "flashattn bench: bad --block-mask '%s' (want full, causal, random:F with 0 < F <= 1, "
                        "doc:N or prefix:P)\n", spec ? spec : "");
        return CLI_EXIT_USAGE;
    }
    const int64_t sq = s->seq, sk = s->seq_kv, bs = block;
    const int64_t nqb = (sq + bs - 1) / bs, nkb = (sk + bs - 1) / bs;
    unsigned char *rnd = calloc((size_t)(nqb * nkb + 1), 1);
    unsigned char *dense = malloc((size_t)(sq * sk + 1)); /* the dense twin: O(Sq * Sk), the tool's only */
    int32_t *cu = calloc((size_t)sp.n + 2, sizeof *cu);
    cli_inputs in;
    memset(&in, 0, sizeof in);
    void *o = NULL;
    bm_built bm;
    memset(&bm, 0, sizeof bm);
    bm_row rows[BM_MAX_ROWS];
    memset(rows, 0, sizeof rows);
    int status = CLI_EXIT_FAIL, n_rows = 0;
    if (!rnd || !dense || !cu || cli_inputs_make(s, &in) != 0 || !(o = cli_alloc(in.o_elems, fa_dtype_size(s->dtype)))) {
        fprintf(stderr, "flashattn bench: out of memory for the block mask's inputs\n");
        goto done;
    }
    uint64_t x = (uint64_t)s->seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t qb = 0; qb < nqb; qb++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            rnd[qb * nkb + kb] = (double)(x >> 11) * 0x1.0p-53 < sp.density;
        }
    if (build_mask(&sp, rnd, bs, sq, sk, &bm) != 0) {
        fprintf(stderr, "flashattn bench: out of memory building the block mask\n");
        goto done;
    }
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++) dense[i * sk + j] = (unsigned char)keeps(&sp, rnd, nkb, bs, i, j, sq, sk);

    const fa_forward_args base = cli_forward_args(s, &in, o, s->dtype, NULL);
    rows[0].name = "block mask";
    rows[0].args = base;
    rows[0].args.block_mask = &bm.m;
    rows[1].name = "dense mask";
    rows[1].args = base;
    rows[1].args.mask = fa_tensor_contiguous(dense, FA_DTYPE_BOOL, 1, 1, sq, sk);
    rows[1].args.mask.shape[0] = s->batch, rows[1].args.mask.shape[1] = s->heads; /* broadcast: stride 0 */
    rows[1].args.mask.stride[0] = rows[1].args.mask.stride[1] = 0;
    n_rows = 2;
    if (sp.kind == BM_FULL || (sp.kind == BM_CAUSAL && s->causal == FA_CAUSAL_NONE)) {
        rows[2].name = sp.kind == BM_FULL ? "no mask" : "causal";
        rows[2].args = base;
        if (sp.kind == BM_CAUSAL) rows[2].args.causal = FA_CAUSAL_TOP_LEFT;
        n_rows = 3;
    } else if (sp.kind == BM_DOC && s->batch == 1 && sq == sk && sp.n <= sq) {
        for (int64_t d = 0, at = 0; d < sp.n; d++) { /* the documents' boundaries */
            while (at < sq && doc_of(&sp, at, sq) == d) at++;
            cu[d + 1] = (int32_t)at;
        }
        rows[2].name = "varlen";
        rows[2].args = base;
        rows[2].args.cu_seqlens_q = rows[2].args.cu_seqlens_k = cu;
        rows[2].args.num_seqs = sp.n;
        n_rows = 3;
    }
    if (sp.kind != BM_FULL) { /* the whole work, for scale */
        rows[n_rows].name = "no mask";
        rows[n_rows++].args = base;
    }
    const int none = n_rows - 1;
    fa_work w = FA_WORK_INIT;
    fa_status st = fa_forward_work(ctx, &rows[0].args, &w);
    for (int r = 0; r < n_rows && st == FA_OK; r++) {
        rows[r].times = calloc((size_t)(s->runs > 0 ? s->runs : 1), sizeof(double));
        rows[r].cpu = calloc((size_t)(s->runs > 0 ? s->runs : 1), sizeof(double));
        st = fa_context_set(ctx, FA_PARAM_ALGO, s->algo_given ? s->algo : FA_ALGO_FLASH);
        if (st == FA_OK && (!rows[r].times || !rows[r].cpu)) {
            fprintf(stderr, "flashattn bench: out of memory\n");
            goto done;
        }
        if (st == FA_OK) st = fa_forward(ctx, &rows[r].args); /* the warm-up */
    }
    for (int64_t run = 0; run < s->runs && st == FA_OK; run++)
        for (int r = 0; r < n_rows && st == FA_OK; r++) {
            const double c0 = cli_cpu_seconds(), t0 = cli_now();
            st = fa_forward(ctx, &rows[r].args);
            rows[r].times[run] = cli_now() - t0;
            rows[r].cpu[run] = cli_cpu_seconds() - c0;
            int64_t v = 0;
            fa_context_get(ctx, FA_PARAM_LAST_EXTRA_BYTES, &v);
            rows[r].extra_bytes = v > rows[r].extra_bytes ? v : rows[r].extra_bytes;
            fa_context_get(ctx, FA_PARAM_LAST_TILE_Q, &rows[r].tile_q);
            fa_context_get(ctx, FA_PARAM_LAST_TILE_KV, &rows[r].tile_kv);
        }
    if (st != FA_OK) {
        fprintf(stderr, "flashattn bench --block-mask: %s: %s\n", fa_status_string(st), fa_context_error(ctx));
        goto done;
    }
    const int twin = n_rows == 4 ? 2 : none; /* the call that needs no mask for it, else no mask */
    double *scratch = calloc((size_t)(s->runs > 0 ? s->runs : 1), sizeof(double));
    if (!scratch) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        goto done;
    }
    for (int r = 0; r < n_rows; r++) {
        rows[r].vs_dense = median_round_ratio(rows[r].times, rows[1].times, s->runs, scratch);
        rows[r].vs_none = median_round_ratio(rows[r].times, rows[none].times, s->runs, scratch);
        rows[r].vs_twin = median_round_ratio(rows[r].times, rows[twin].times, s->runs, scratch);
        rows[r].cpu_vs_none = median_round_ratio(rows[r].cpu, rows[none].cpu, s->runs, scratch);
        rows[r].cpu_vs_twin = median_round_ratio(rows[r].cpu, rows[twin].cpu, s->runs, scratch);
    }
    free(scratch);
    for (int r = 0; r < n_rows; r++) {
        qsort(rows[r].times, (size_t)s->runs, sizeof(double), cmp_double);
        rows[r].median_s = s->runs > 0 ? rows[r].times[s->runs / 2] : NAN;
    }
    cli_peak peak;
    cli_measure_peak(ctx, s->dtype, no_probe, &peak);
    const char *isa = fa_context_isa(ctx);
    const double kept = (double)w.pairs / ((double)s->batch * (double)s->heads * (double)sq * (double)sk);
    if (json) {
        for (int r = 0; r < n_rows; r++) {
            const double gf = w.flops / rows[r].median_s * 1e-9;
            printf("{\"mode\":\"block_mask\",\"spec\":");
            cli_json_string(stdout, spec);
            printf(",\"variant\":");
            cli_json_string(stdout, rows[r].name);
            printf(",\"isa\":\"%s\",\"dtype\":\"%s\",\"B\":%lld,\"Hq\":%lld,\"Hk\":%lld,\"Sq\":%lld,\"Sk\":%lld,"
                   "\"D\":%lld,\"Dv\":%lld,\"block\":%lld,\"threads\":%lld,\"kept\":%.6f,\"entries\":%lld,"
                   "\"partial\":%lld,\"median_ms\":",
                   isa, fa_dtype_name(s->dtype), (long long)s->batch, (long long)s->heads, (long long)s->kv_heads,
                   (long long)sq, (long long)sk, (long long)s->dim, (long long)s->dim_v, (long long)bs,
                   (long long)cli_resolved_threads(s->threads), kept, (long long)bm.entries, (long long)bm.n_partial);
            cli_json_number(stdout, rows[r].median_s * 1e3);
            printf(",\"vs_twin\":");
            cli_json_string(stdout, rows[twin].name);
            const struct {
                const char *key;
                double value;
            } nums[] = {{"gflops", gf},
                        {"vs_dense", rows[r].vs_dense},
                        {"vs_no_mask", rows[r].vs_none},
                        {"vs_twin_ratio", rows[r].vs_twin},
                        {"cpu_vs_no_mask", rows[r].cpu_vs_none},
                        {"cpu_vs_twin", rows[r].cpu_vs_twin}};
            for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
                printf(",\"%s\":", nums[k].key);
                cli_json_number(stdout, nums[k].value);
            }
            printf(",\"extra_bytes\":%lld,\"tile_q\":%lld,\"tile_kv\":%lld", (long long)rows[r].extra_bytes,
                   (long long)rows[r].tile_q, (long long)rows[r].tile_kv);
            cli_json_peak(stdout, &peak, cli_pct_peak(gf, &peak));
            printf("}\n");
        }
        status = CLI_EXIT_OK;
        goto done;
    }
    char shape[160];
    cli_shape_describe(s, shape, sizeof shape);
    printf("# flashattn %s bench --block-mask %s: %s %s, %lldx%lld blocks, median of %lld interleaved rounds after 1 "
           "warm-up each\n",
           fa_version_string(), spec, fa_dtype_name(s->dtype), shape, (long long)bs, (long long)bs, (long long)s->runs);
    printf("# the mask keeps %.4f of the pairs: %lld of %lld blocks listed, %lld element masks; every row is credited "
           "the mask's kept pairs (\"no mask\" too, which computes them all): GFLOP/s = 2*(D+Dv)*kept(i,j)/time\n",
           kept, (long long)bm.entries, (long long)(nqb * nkb), (long long)bm.n_partial);
    cli_print_peak_line(&peak, isa, cli_resolved_threads(s->threads));
    enum { COLS = 10 };
    char twin_head[48], cpu_twin_head[48];
    snprintf(twin_head, sizeof twin_head, "time / %s", rows[twin].name);
    snprintf(cpu_twin_head, sizeof cpu_twin_head, "cpu / %s", rows[twin].name);
    const char *const head[COLS] = {"call", "median ms", "GFLOP/s", "% peak", "time / dense", "time / no mask",
                                    twin_head, "cpu / no mask", cpu_twin_head, "tiles"};
    static const int right[COLS] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    char cells[BM_MAX_ROWS * COLS * CLI_CELL];
    for (int r = 0; r < n_rows; r++) {
        const double gf = w.flops / rows[r].median_s * 1e-9, pct = cli_pct_peak(gf, &peak);
        snprintf(cli_cell(cells, COLS, r, 0), CLI_CELL, "%s", rows[r].name);
        snprintf(cli_cell(cells, COLS, r, 1), CLI_CELL, "%.3f", rows[r].median_s * 1e3);
        snprintf(cli_cell(cells, COLS, r, 2), CLI_CELL, "%.1f", gf);
        snprintf(cli_cell(cells, COLS, r, 3), CLI_CELL, isfinite(pct) ? "%.1f" : "-", pct);
        snprintf(cli_cell(cells, COLS, r, 4), CLI_CELL, "%.3f", rows[r].vs_dense);
        snprintf(cli_cell(cells, COLS, r, 5), CLI_CELL, "%.3f", rows[r].vs_none);
        snprintf(cli_cell(cells, COLS, r, 6), CLI_CELL, "%.3f", rows[r].vs_twin);
        snprintf(cli_cell(cells, COLS, r, 7), CLI_CELL, "%.3f", rows[r].cpu_vs_none);
        snprintf(cli_cell(cells, COLS, r, 8), CLI_CELL, "%.3f", rows[r].cpu_vs_twin);
        snprintf(cli_cell(cells, COLS, r, 9), CLI_CELL, "%lldx%lld", (long long)rows[r].tile_q, (long long)rows[r].tile_kv);
    }
    cli_print_table(stdout, COLS, head, right, n_rows, cells);
    status = CLI_EXIT_OK;
done:
    for (int r = 0; r < BM_MAX_ROWS; r++) free(rows[r].times), free(rows[r].cpu);
    built_free(&bm);
    cli_free(o);
    cli_inputs_free(&in);
    free(rnd), free(dense), free(cu);
    return status;
}
