/*
 * i8_rows.h: the dispatch of the int8 decode kernels' qk_small_i8 (kernels.h), shared by
 * the ISA files that implement it (avx512vnni_kernels.c, avx2vnni_kernels.c, each built
 * with its own flags): one function per row count 1..FA_SMALL_ROWS and digit count, each
 * an instance of the file's always-inline body(R, T, cols, d, q8, ldq8, qscale, krow,
 * kscale, s, lds) with R and T constants, so its accumulator arrays live in registers.
 */
#ifndef FA_KERNELS_I8_ROWS_H
#define FA_KERNELS_I8_ROWS_H

#define FA_I8_QK_ROW(body, R)                                                                                          \
    static void body##_##R(int digits, int64_t cols, int64_t d, const int8_t *q8, int64_t ldq8, const float *qscale,   \
                           const void *const *krow, const float *kscale, float *s, int64_t lds)                        \
    {                                                                                                                  \
        if (digits == 2)                                                                                               \
            body(R, 2, cols, d, q8, ldq8, qscale, krow, kscale, s, lds);                                               \
        else                                                                                                           \
            body(R, 1, cols, d, q8, ldq8, qscale, krow, kscale, s, lds);                                               \
    }

/* The row functions of body and the table entry `entry` (kernels.h's qk_small_i8) over them. */
#define FA_I8_QK_ENTRY(body, entry)                                                                                    \
    FA_I8_QK_ROW(body, 1)                                                                                              \
    FA_I8_QK_ROW(body, 2)                                                                                              \
    FA_I8_QK_ROW(body, 3)                                                                                              \
    FA_I8_QK_ROW(body, 4)                                                                                              \
    FA_I8_QK_ROW(body, 5)                                                                                              \
    FA_I8_QK_ROW(body, 6)                                                                                              \
    FA_I8_QK_ROW(body, 7)                                                                                              \
    FA_I8_QK_ROW(body, 8)                                                                                              \
    void entry(int64_t rows, int64_t cols, int64_t d, int digits, const int8_t *q8, int64_t ldq8,                      \
               const float *qscale, const void *const *krow, const float *kscale, float *s, int64_t lds)               \
    {                                                                                                                  \
        static void (*const fn[9])(int, int64_t, int64_t, const int8_t *, int64_t, const float *,                      \
                                   const void *const *, const float *, float *, int64_t) = {                           \
            NULL, body##_1, body##_2, body##_3, body##_4, body##_5, body##_6, body##_7, body##_8};                     \
        fn[rows](digits, cols, d, q8, ldq8, qscale, krow, kscale, s, lds);                                             \
    }

#endif
