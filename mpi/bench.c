/*
 * bench.c: the `flashattn-mpi` program. `flashattn-mpi bench` times ring attention
 * (include/flashattn_mpi.h, public API only) across the ranks of MPI_COMM_WORLD:
 *
 *   mpirun -np 2 flashattn-mpi bench --s-local 4096 --heads 8 --dim 128
 *
 * Definitions (docs/scaling.md uses the same):
 *   compute      per ring step, the time in the core's calls (fa_ring_stats);
 *   exposed      per ring step, the time waiting in MPI_Wait after the step's
 *                compute: communication the compute did not hide; it also holds
 *                any skew between ranks (a rank with less work waits for others);
 *   testall      the time inside MPI_Testall between pieces: a shared-memory
 *                transport (Open MPI's vader, CMA) does the receiver's copy there,
 *                on this core, so it is not hidden either; reported apart;
 *   total comm   the time the same transfers take with no compute: a ring
 *                exchange of the same sizes (each rank sends one buffer to the next
 *                and receives one from the previous), timed alone, median of runs;
 *                forward: (P-1) k/v exchanges per call; backward: (P-1) exchanges of
 *                k/v plus the f32 dK/dV accumulators, plus one accumulator exchange
 *                (the return to the owner);
 *   overlap efficiency = 1 - exposed / total comm, per call, worst rank (the
 *                issue's definition); strict = 1 - (exposed + testall) / total comm.
 *   GFLOP/s      the core's FLOPs of a kept (i, j) pair (fa_forward_work of the
 *                rank's local call: its flops, or backward_flops for the backward,
 *                per pair) times the pairs the rank computed (the rule of
 *                `flashattn bench`, docs/semantics.md section 9).
 *   balance      kept pairs per rank, max / mean (causal: zig-zag vs contiguous).
 * Each mode runs once to warm up, then --iters times; figures are medians over the
 * iterations of each rank's per-call sums, and rank 0 prints a table.
 */
#include <mpi.h>

#include "flashattn_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
    int64_t B, S, Hq, Hk, D, Dv;
    fa_dtype dt;
    int iters, threads, pieces, backward, modes; /* modes: bit 0 full, 1 causal zig-zag, 2 causal contiguous */
} opts;

static int rank_, nranks;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np P flashattn-mpi bench [flags]\n"
            "  --s-local N     rows per rank (default 4096; zig-zag needs it even)\n"
            "  --batch B       (1)   --heads H (8)   --kv-heads Hk (= heads)   --dim D (128)   --dim-v Dv (= dim)\n"
            "  --dtype T       f32 | bf16 | f16 (f32)\n"
            "  --iters N       timed calls per mode after one warm-up (3)\n"
            "  --threads T     core threads per rank (1)\n"
            "  --pieces N      query-row pieces per step (0 = the library's default)\n"
            "  --modes LIST    comma list of full, zigzag, contiguous (full,zigzag): non-causal\n"
            "                  contiguous, causal zig-zag, causal contiguous\n"
            "  --no-backward   forward only\n");
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){1, 4096, 8, 0, 128, 0, FA_DTYPE_F32, 3, 1, 0, 1, 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NUM(flag, field)                                   \
    if (strcmp(a, flag) == 0 && v) {                       \
        o->field = strtoll(v, NULL, 10);                   \
        i++;                                               \
        continue;                                          \
    }
        NUM("--s-local", S)
        NUM("--batch", B)
        NUM("--heads", Hq)
        NUM("--kv-heads", Hk)
        NUM("--dim", D)
        NUM("--dim-v", Dv)
        NUM("--iters", iters)
        NUM("--threads", threads)
        NUM("--pieces", pieces)
#undef NUM
        if (strcmp(a, "--dtype") == 0 && v) {
            o->dt = strcmp(v, "bf16") == 0 ? FA_DTYPE_BF16 : strcmp(v, "f16") == 0 ? FA_DTYPE_F16 : FA_DTYPE_F32;
            if (strcmp(v, "f32") && o->dt == FA_DTYPE_F32) return 0;
            i++;
        } else if (strcmp(a, "--modes") == 0 && v) {
            o->modes = (strstr(v, "full") ? 1 : 0) | (strstr(v, "zigzag") ? 2 : 0) | (strstr(v, "contiguous") ? 4 : 0);
            i++;
        } else if (strcmp(a, "--no-backward") == 0) {
            o->backward = 0;
        } else return 0;
    }
    if (!o->Hk) o->Hk = o->Hq;
    if (!o->Dv) o->Dv = o->D;
    return o->B > 0 && o->S > 0 && o->Hq > 0 && o->Hk > 0 && o->Hq % o->Hk == 0 && o->D > 0 && o->iters > 0 &&
           o->modes != 0;
}

static double median(double *x, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: n is a handful */
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            const double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The time of one ring exchange of `bytes` with no compute: median of runs. */
static double ping(int64_t bytes, int runs)
{
    char *s = malloc((size_t)bytes + 1), *r = malloc((size_t)bytes + 1);
    memset(s, 1, (size_t)bytes + 1);
    memset(r, 0, (size_t)bytes + 1);
    double *t = malloc(sizeof(double) * (size_t)runs);
    const int next = (rank_ + 1) % nranks, prev = (rank_ + nranks - 1) % nranks;
    const int64_t chunk = (int64_t)1 << 30;
    for (int k = 0; k < runs; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        MPI_Request req[64];
        int n = 0;
        for (int64_t off = 0; off < bytes || (off == 0 && n == 0); off += chunk) {
            const int c = (int)(bytes - off < chunk ? bytes - off : chunk);
            MPI_Irecv(r + off, c, MPI_BYTE, prev, 7, MPI_COMM_WORLD, &req[n++]);
            MPI_Isend(s + off, c, MPI_BYTE, next, 7, MPI_COMM_WORLD, &req[n++]);
            if (bytes == 0) break;
        }
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        t[k] = MPI_Wtime() - t0;
    }
    const double m = median(t, runs);
    double worst = 0;
    MPI_Allreduce(&m, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(s), free(r), free(t);
    return nranks > 1 ? worst : 0.0;
}

static void fill(fa_tensor *t, uint64_t seed)
{
    const int64_t n = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t k = 0; k < n; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float f = (float)((double)(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        if (t->dtype == FA_DTYPE_F32) ((float *)t->data)[k] = f;
        else { /* bf16 by truncation, f16 via a crude but finite conversion: inputs only */
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)t->data)[k] = t->dtype == FA_DTYPE_BF16 ? (uint16_t)(u >> 16) : (uint16_t)(0x3800 | (x & 0x3ff));
        }
    }
}

static fa_tensor make(fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t X)
{
    void *p = calloc((size_t)(B * S * H * X) + 1, fa_dtype_size(dt));
    return fa_tensor_make(p, dt, FA_LAYOUT_BSND, B, S, H, X);
}

typedef struct figures {
    double compute, exposed, total; /* per call, this rank: medians; exposed = the waits */
    double tested;                  /* of which inside MPI_Testall between pieces */
    double step_compute_max;        /* the slowest step's compute in the last call */
    int64_t kept;
    double pair_flops;              /* FLOPs of one kept pair over the B x Hq (batch, head)s */
    double *steps_c, *steps_w;      /* last call's per-step split */
} figures;

static int run_mode(fa_context *ctx, const opts *o, fa_ring_sharding sh, fa_causal causal, int backward,
                    double comm_total, figures *fig)
{
    const int64_t B = o->B, S = o->S, Hq = o->Hq, Hk = o->Hk, D = o->D, Dv = o->Dv;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = make(o->dt, B, S, Hq, D), a.k = make(o->dt, B, S, Hk, D), a.v = make(o->dt, B, S, Hk, Dv);
    a.o = make(o->dt, B, S, Hq, Dv);
    a.lse = fa_tensor_contiguous(calloc((size_t)(B * Hq * S) + 1, 4), FA_DTYPE_F32, B, Hq, S, 1);
    a.causal = causal;
    fill(&a.q, 1 + (uint64_t)rank_), fill(&a.k, 100 + (uint64_t)rank_), fill(&a.v, 200 + (uint64_t)rank_);
    fa_backward_args g = FA_BACKWARD_ARGS_INIT;
    g.fwd = &a;
    g.do_ = make(o->dt, B, S, Hq, Dv), g.dq = make(o->dt, B, S, Hq, D);
    g.dk = make(o->dt, B, S, Hk, D), g.dv = make(o->dt, B, S, Hk, Dv);
    fill(&g.do_, 300 + (uint64_t)rank_);
    fa_ring_stats st = FA_RING_STATS_INIT;
    st.step_compute_seconds = fig->steps_c;
    st.step_wait_seconds = fig->steps_w;
    st.step_capacity = nranks;
    fa_ring_args ring = FA_RING_ARGS_INIT;
    ring.sharding = sh;
    ring.pieces = o->pieces;
    ring.stats = &st;
    double *c = malloc(sizeof(double) * (size_t)o->iters), *w = malloc(sizeof(double) * (size_t)o->iters);
    double *t = malloc(sizeof(double) * (size_t)o->iters);
    /* fa_ring_stats.kept_pairs counts pairs of one (batch, head); fa_forward_work
     * prices a pair of the same call, summed over all of them (a call it refuses, the
     * ring refuses too, and says why below). */
    fa_work work = FA_WORK_INIT;
    fig->pair_flops = fa_forward_work(ctx, &a, &work) == FA_OK && work.pairs > 0
                          ? (backward ? work.backward_flops : work.flops) / (double)work.pairs * (double)(B * Hq)
                          : 0.0;
    fa_status s = fa_ring_forward(ctx, MPI_COMM_WORLD, &ring, &a); /* warm-up, and o, lse for the backward */
    if (s == FA_OK && backward) s = fa_ring_backward(ctx, MPI_COMM_WORLD, &ring, &g);
    fig->kept = st.kept_pairs;
    for (int it = 0; it < o->iters && s == FA_OK; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        s = backward ? fa_ring_backward(ctx, MPI_COMM_WORLD, &ring, &g) : fa_ring_forward(ctx, MPI_COMM_WORLD, &ring, &a);
        c[it] = st.compute_seconds;
        w[it] = st.wait_seconds;
        t[it] = st.test_seconds;
    }
    if (s != FA_OK && rank_ == 0) fprintf(stderr, "flashattn-mpi: %s: %s\n", fa_status_string(s), fa_ring_error());
    if (s == FA_OK) {
        fig->compute = median(c, o->iters);
        fig->exposed = median(w, o->iters);
        fig->tested = median(t, o->iters);
        fig->total = comm_total;
        fig->step_compute_max = 0;
        for (int k = 0; k < nranks; k++) fig->step_compute_max = fmax(fig->step_compute_max, fig->steps_c[k]);
    }
    free(c), free(w), free(t);
    free(a.q.data), free(a.k.data), free(a.v.data), free(a.o.data), free(a.lse.data);
    free(g.do_.data), free(g.dq.data), free(g.dk.data), free(g.dv.data);
    return s == FA_OK;
}

/* Rank 0 prints one mode's rows: per rank, then per step of the worst rank. */
static void report(const char *mode, const char *pass, const figures *f)
{
    double *all = rank_ == 0 ? malloc(sizeof(double) * 5 * (size_t)nranks) : NULL;
    double *steps = rank_ == 0 ? malloc(sizeof(double) * 2 * (size_t)nranks * (size_t)nranks) : NULL;
    int64_t *kept = rank_ == 0 ? malloc(sizeof(int64_t) * (size_t)nranks) : NULL;
    const double mine[5] = {f->compute, f->exposed, f->total, f->step_compute_max, f->tested};
    MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&f->kept, 1, MPI_INT64_T, kept, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    double *both = malloc(sizeof(double) * 2 * (size_t)nranks);
    for (int k = 0; k < nranks; k++) both[k] = f->steps_c[k], both[nranks + k] = f->steps_w[k];
    MPI_Gather(both, 2 * nranks, MPI_DOUBLE, steps, 2 * nranks, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    free(both);
    if (rank_ == 0) {
        double kmax = 0, ksum = 0, worst_eff = 1.0, worst_strict = 1.0;
        for (int r = 0; r < nranks; r++) kmax = fmax(kmax, (double)kept[r]), ksum += (double)kept[r];
        for (int r = 0; r < nranks; r++) {
            const double *x = all + 5 * r;
            const double eff = x[2] > 0 ? 1.0 - x[1] / x[2] : NAN, strict = x[2] > 0 ? 1.0 - (x[1] + x[4]) / x[2] : NAN;
            if (eff < worst_eff) worst_eff = eff;
            if (strict < worst_strict) worst_strict = strict;
            const double flops = (double)kept[r] * f->pair_flops; /* every rank's call has the same shape */
            printf("%-18s %-4s %4d %11.2f %10.3f %11.3f %13.3f %8.1f%% %8.1f%% %9.1f %13lld\n", mode, pass, r,
                   x[0] * 1e3 / nranks, x[1] * 1e3 / nranks, x[4] * 1e3 / nranks, x[2] * 1e3 / nranks, 100.0 * eff,
                   100.0 * strict, x[0] > 0 ? flops / x[0] * 1e-9 : 0.0,
                   (long long)kept[r]);
        }
        printf("%-18s %-4s  per step (rank 0, last call, compute+wait):", mode, pass);
        for (int s = 0; s < nranks; s++) printf("  s%d %.1f+%.2f ms", s, steps[s] * 1e3, steps[nranks + s] * 1e3);
        printf("\n%-18s %-4s  overlap efficiency (worst rank) %.1f%% (strict %.1f%%), load balance max/mean %.3f\n",
               mode, pass, 100.0 * worst_eff, 100.0 * worst_strict, ksum > 0 ? kmax / (ksum / nranks) : 0.0);
    }
    free(all), free(steps), free(kept);
}

static int cmd_bench(int argc, char **argv)
{
    opts o;
    if (!parse(argc, argv, &o)) {
        if (rank_ == 0) usage(stderr);
        return 2;
    }
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx) != FA_OK || fa_context_set(ctx, FA_PARAM_THREADS, o.threads) != FA_OK) {
        if (rank_ == 0) fprintf(stderr, "flashattn-mpi: no context\n");
        return 1;
    }
    const int64_t es = (int64_t)fa_dtype_size(o.dt);
    const int64_t kv = o.B * o.S * o.Hk * (o.D + o.Dv) * es, acc = o.B * o.S * o.Hk * (o.D + o.Dv) * 4;
    const int runs = 7;
    const double t_kv = ping(kv, runs), t_kvacc = ping(kv + acc, runs), t_acc = ping(acc, runs);
    const double fwd_total = (nranks - 1) * t_kv, bwd_total = (nranks - 1) * t_kvacc + (nranks > 1 ? t_acc : 0.0);
    if (rank_ == 0) {
        printf("flashattn-mpi bench: %d ranks x %d thread(s), isa %s; B=%lld S_local=%lld (S=%lld) Hq=%lld Hk=%lld "
               "D=%lld Dv=%lld %s, pieces=%d, iters=%d\n",
               nranks, o.threads, fa_context_isa(ctx), (long long)o.B, (long long)o.S, (long long)(o.S * nranks),
               (long long)o.Hq, (long long)o.Hk, (long long)o.D, (long long)o.Dv, fa_dtype_name(o.dt),
               o.pieces ? o.pieces : 4, o.iters);
        printf("total communication (the same ring exchange timed alone, median of %d): k/v %.2f MiB %.3f ms "
               "(%.2f GB/s); k/v + f32 dK/dV %.2f MiB %.3f ms; dK/dV %.2f MiB %.3f ms\n",
               runs, kv / 1048576.0, t_kv * 1e3, t_kv > 0 ? kv / t_kv * 1e-9 : 0.0, (kv + acc) / 1048576.0,
               t_kvacc * 1e3, acc / 1048576.0, t_acc * 1e3);
        printf("per ring step (means over the P steps of one call). wait = MPI_Wait after compute (exposed\n"
               "communication); testall = MPI_Testall between pieces, where a shared-memory transport does its copy\n"
               "on this core; overlap = 1 - wait / total_comm; strict = 1 - (wait + testall) / total_comm:\n");
        printf("%-18s %-4s %4s %11s %10s %11s %13s %9s %9s %9s %13s\n", "mode", "pass", "rank", "compute_ms",
               "wait_ms", "testall_ms", "total_comm_ms", "overlap", "strict", "GFLOP/s", "kept_pairs");
    }
    figures f;
    f.steps_c = calloc((size_t)nranks, sizeof(double));
    f.steps_w = calloc((size_t)nranks, sizeof(double));
    static const struct {
        const char *name;
        fa_ring_sharding sh;
        fa_causal causal;
    } modes[3] = {{"non-causal contig", FA_RING_CONTIGUOUS, FA_CAUSAL_NONE},
                  {"causal zig-zag", FA_RING_ZIGZAG, FA_CAUSAL_TOP_LEFT},
                  {"causal contiguous", FA_RING_CONTIGUOUS, FA_CAUSAL_TOP_LEFT}};
    int ok = 1;
    for (int m = 0; m < 3 && ok; m++) {
        if (!(o.modes & (1 << m))) continue;
        ok = run_mode(ctx, &o, modes[m].sh, modes[m].causal, 0, fwd_total, &f);
        if (ok) report(modes[m].name, "fwd", &f);
        if (ok && o.backward) {
            ok = run_mode(ctx, &o, modes[m].sh, modes[m].causal, 1, bwd_total, &f);
            if (ok) report(modes[m].name, "bwd", &f);
        }
    }
    free(f.steps_c), free(f.steps_w);
    fa_context_free(ctx);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int rc = 2;
    if (argc >= 2 && strcmp(argv[1], "bench") == 0) rc = cmd_bench(argc - 1, argv + 1);
    else if (rank_ == 0) usage(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
    if (argc >= 2 && strcmp(argv[1], "--help") == 0) rc = 0;
    MPI_Finalize();
    return rc;
}
