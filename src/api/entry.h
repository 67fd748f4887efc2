/*
 * entry.h: what the public calls that run attention share (src/api/entry.c): the table of
 * algorithms, the choice of a call's entry, the record of what ran, and the guard
 * every call on a context goes through. The calls are src/api/forward.c (fa_forward,
 * fa_forward_check, fa_forward_work) and src/api/backward.c (fa_backward, fa_backward_check).
 */
#ifndef FA_ENTRY_H
#define FA_ENTRY_H

#include "algos.h"

typedef struct fa_algo_entry {
    fa_algo algo;
    /* NULL when the algorithm runs every valid call; else says why it cannot. */
    const char *(*cannot_run)(const fa_problem *p);
    fa_status (*run)(fa_context *ctx, const fa_problem *p, fa_run_info *info);
    /* The backward pass of the same algorithm: each algorithm differentiates its
     * own forward. */
    fa_status (*run_backward)(fa_context *ctx, const fa_problem *p, const fa_grads *g, fa_run_info *info);
} fa_algo_entry;

/* The table's entry that runs this call: the context's algorithm, or for auto,
 * flash whenever flash supports the call (there is no head-dim list), else
 * standard, with *fallback saying why. NULL and *st on failure. */
const fa_algo_entry *fa_algo_choose(fa_context *ctx, const fa_problem *p, const char **fallback, fa_status *st);

/* What a successful call ran, for FA_PARAM_LAST_* and the verbose trace (t0: its start). */
void fa_run_record(fa_context *ctx, const fa_problem *p, const fa_algo_entry *e, const char *fallback,
                   const fa_run_info *info, double t0);

/* A public call's body on an entered context; args and out are the call's own. */
typedef fa_status (*fa_entry_call)(fa_context *ctx, const void *args, void *out);

/* Runs call as a public call on ctx: the NULL check, the one-call-at-a-time guard
 * around it, and (with trace, for the calls that run) the verbose line of a failure. */
fa_status fa_guarded_call(fa_context *ctx, fa_entry_call call, const void *args, void *out, int trace);

/* fa_forward on a context the caller has entered (fa_tune's runs). */
fa_status fa_forward_entered(fa_context *ctx, const fa_forward_args *args);

#endif
