/*
 * cn_residual.h -- the fused residual add: h = x + residual over a run of
 * elements, added in the accumulator lanes and rounded once to h's storage
 * (what NumPy's x + r gives when the dtypes are equal). r_wide / h_wide: that
 * array is float32 (the accumulator type), not x's storage: the fp32 residual
 * stream of 16-bit activations.
 */
#ifndef CN_RESIDUAL_H
#define CN_RESIDUAL_H

CN_INLINE void add_run(const xt *x, const void *r, const int r_wide, void *h, const int h_wide, int64_t n)
{
#define R(j, t, full) (r_wide ? load_a_t((const at *)r + (j), t, full) : load_x_t((const xt *)r + (j), t, full))
#define STEP(j, t, full, s)                                                   \
    {                                                                         \
        const vec v_ = VOP(add)(load_x_t(x + (j), t, full), R(j, t, full));   \
        if (h_wide) store_a_t((at *)h + (j), v_, t, full);                    \
        else store_x_t((xt *)h + (j), v_, t, full, 0);                        \
    }
#define STEP1(j) STEP(j, VL, 1, 0)
    CN_WALK(n, 0, 1, STEP1, STEP);
#undef R
#undef STEP
#undef STEP1
}

static void add_residual(const void *x, const void *r, int r_wide, void *h, int h_wide, int64_t n)
{
    if (r_wide) {
        if (h_wide) add_run((const xt *)x, r, 1, h, 1, n);
        else add_run((const xt *)x, r, 1, h, 0, n);
    } else {
        if (h_wide) add_run((const xt *)x, r, 0, h, 1, n);
        else add_run((const xt *)x, r, 0, h, 0, n);
    }
}

#endif /* CN_RESIDUAL_H */
