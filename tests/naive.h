/*
 * naive.h: an independent naive attention, written straight from docs/semantics.md.
 *
 * It materialises one score row at a time and reads the same fa_forward_args the
 * library gets (any strides, broadcast bias and mask, ALiBi, both causal alignments,
 * windows, softcap), so the tests feed both the very same inputs. Two working
 * precisions:
 *   NAIVE_FP64            double everywhere: a second oracle, independent of the library's.
 *   NAIVE_SAME_PRECISION  fp32 arithmetic, with S rounded to the input dtype after each
 *                         stage (scores, softcap, bias, ALiBi), P rounded to the input
 *                         dtype and O to the output dtype: what eager PyTorch does on
 *                         f16/bf16. Its error against the fp64 result sets the tolerance.
 */
#ifndef FA_TEST_NAIVE_H
#define FA_TEST_NAIVE_H

#include "flashattn.h"

typedef enum naive_mode {
    NAIVE_FP64 = 0,
    NAIVE_SAME_PRECISION = 1
} naive_mode;

/*
 * o:   (B, Sq, Hq, Dv) row-major doubles; in NAIVE_SAME_PRECISION already rounded to
 *      args->o.dtype. Only o's shape and dtype are read from args->o, never its data.
 * lse: (B, Hq, Sq) row-major doubles (-inf for a row with nothing kept), or NULL.
 * max_abs_score: if not NULL, receives max |scale * dot(q_i, k_j)| over kept pairs (the
 *      tests need it to bound how much a float-rounded default scale can move the result).
 * args->sinks (Hq values) adds each row's sink logit to its softmax (docs/semantics.md, step 6).
 * args->struct_size is ignored: every field is used. Returns 0, or -1 on bad shapes.
 */
int naive_forward(const fa_forward_args *args, naive_mode mode, double *o, double *lse,
                  double *max_abs_score);

/* Whether (i, j) survives causal and window masking (not the boolean mask). */
int naive_kept_by_position(const fa_forward_args *args, int64_t Sq, int64_t Sk, int64_t i,
                           int64_t j);

#endif /* FA_TEST_NAIVE_H */
