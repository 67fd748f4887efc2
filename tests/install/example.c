/* The README's example: one causal attention call on BSND f32 tensors. */
#include <flashattn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const int64_t B = 1, S = 256, H = 8, D = 64;
    size_t n = (size_t)(B * S * H * D);
    float *q = calloc(n, 4), *k = calloc(n, 4), *v = calloc(n, 4), *o = calloc(n, 4);
    for (size_t i = 0; i < n; i++) { q[i] = k[i] = (float)(i % 13) / 13; v[i] = (float)(i % 7); }

    fa_context *ctx;
    if (fa_context_create(&ctx) != FA_OK) return 1;
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.q = fa_tensor_make(q, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, H, D);
    a.k = fa_tensor_make(k, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, H, D);
    a.v = fa_tensor_make(v, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, H, D);
    a.o = fa_tensor_make(o, FA_DTYPE_F32, FA_LAYOUT_BSND, B, S, H, D);
    a.causal = FA_CAUSAL_BOTTOM_RIGHT;
    fa_status st = fa_forward(ctx, &a);
    if (st != FA_OK) fprintf(stderr, "%s: %s\n", fa_status_string(st), fa_context_error(ctx));
    else printf("o[0] = %g (row 0 sees only key 0, whose v[0] is 0), isa %s\n", o[0], fa_context_isa(ctx));
    int ok = st == FA_OK && o[0] == 0.0f;
    fa_context_free(ctx);
    free(q); free(k); free(v); free(o);
    return ok ? 0 : 1;
}
