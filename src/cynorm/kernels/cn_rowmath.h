/*
 * cn_rowmath.h -- the math of one row, shared by LayerNorm (center = 1) and
 * RMSNorm (center = 0): moments, normalizing, the rescue of rows beyond the
 * accumulator's range, and the backward's gradient terms. kernels/reference.c
 * says the same in plain scalar C on one screen.
 *
 * Arithmetic contract (what makes results independent of the thread count):
 *   - a row is cut into fixed CN_CHUNK-element chunks; the stats of a row are
 *     the chunk stats merged left to right; backward row sums likewise;
 *   - dweight/dbias partials of a row block are accumulated row by row;
 *   - every pass walks a row with CN_WALK, so its lanes and accumulators add
 *     the same elements in the same order whoever calls it.
 */

/* Steps of a 4-wide reduction walk: four full vectors into accumulators 0..3. */
#define CN_STEPS4(STEP, j)                                                          \
    STEP(j, VL, 1, 0); STEP((j) + VL, VL, 1, 1); STEP((j) + 2 * VL, VL, 1, 2);     \
    STEP((j) + 3 * VL, VL, 1, 3)

/* --------------------------------------------------------------- moments -- */

/* Whether one-pass sums about a pivot, s = sum (x - pc) and q = sum (x - pc)^2
 * over n elements, give m2 = q - s^2/n accurately: both finite and the pivot
 * within sqrt(1/2) std of the mean (3 s^2 <= n q), so the subtraction costs at
 * most a factor 1.5. (&, not &&: loops over a block vectorize.) */
CN_INLINE int cn_onepass_accepts(double s, double q, double n)
{
    return isfinite(s) & isfinite(q) & (3.0 * s * s <= n * q);
}

CN_INLINE double cn_rstd(double m2, double n, double eps)
{
    double var = m2 / n;
    if (var < 0.0) var = 0.0; /* rounding can leave -tiny; NaN passes through */
    return 1.0 / sqrt(var + eps);
}

/* Moments of a chunk from its one-pass sums about pivot pc (the mean of its
 * first VL elements, typically within a fraction of a std of the chunk mean).
 * Refused (0) where cn_onepass_accepts refuses; the caller then takes the
 * corrected two-pass. delta is relative to the row pivot. */
CN_INLINE int onepass_moments(double pc, double s, double q, double n, at pivot, cn_moments *m)
{
    if (!(isfinite(pc) && cn_onepass_accepts(s, q, n))) return 0;
    m->n = n;
    m->delta = (pc - (double)pivot) + s / n;
    m->m2 = q - s * s / n;
    return 1;
}

/* The mean of the first min(n, VL) elements: the one-pass pivot. */
CN_INLINE at head_mean(const xt *x, int64_t n)
{
    const int64_t np = n < VL ? n : VL;
    return (at)((double)VOP(hsum)(load_x_t(x, np, 0)) / (double)np);
}

/* x[j:j+t] - P, lanes past t zeroed */
CN_VEC_INLINE vec dev_vec(const xt *x, int64_t t, const int full, vec P)
{
    vec e = VOP(sub)(load_x_t(x, t, full), P);
    return full ? e : VOP(keepn)(e, t);
}

/* Lane-wise sum of x[0:n] - P (unreduced). */
CN_INLINE vec dev_sum_vec(const xt *x, int64_t n, vec P)
{
    const vec z = VOP(zero)();
    vec a[4] = {z, z, z, z};
#define STEP(j, t, full, s) a[s] = VOP(add)(a[s], dev_vec(x + (j), t, full, P))
#define STEP4(j) CN_STEPS4(STEP, j)
    CN_WALK(n, 0, 4, STEP4, STEP);
#undef STEP
#undef STEP4
    return VOP(add)(VOP(add)(a[0], a[1]), VOP(add)(a[2], a[3]));
}

/* Lane-wise one-pass sums of x[0:n] about P: *s = sum (x - P), *q = sum
 * (x - P)^2 (unreduced). prefetch: fetch what follows x[n] meanwhile (the
 * next chunk: keeps DRAM busy through the hsums). */
CN_INLINE void dev_moment_sums(const xt *x, int64_t n, vec P, const int prefetch, vec *s, vec *q)
{
    const vec z = VOP(zero)();
    vec sa[4] = {z, z, z, z}, qa[4] = {z, z, z, z};
#define STEP(j, t, full, k)                                         \
    {                                                               \
        const vec e_ = dev_vec(x + (j), t, full, P);                \
        sa[k] = VOP(add)(sa[k], e_);                                \
        qa[k] = VOP(mul_add)(e_, e_, qa[k]);                          \
    }
#define STEP4(j)                                                    \
    {                                                               \
        if (prefetch) { cn_prefetch(x + n + (j)); cn_prefetch(x + n + (j) + 2 * VL); } \
        CN_STEPS4(STEP, j);                                         \
    }
    CN_WALK(n, 0, 4, STEP4, STEP);
#undef STEP
#undef STEP4
    *s = VOP(add)(VOP(add)(sa[0], sa[1]), VOP(add)(sa[2], sa[3]));
    *q = VOP(add)(VOP(add)(qa[0], qa[1]), VOP(add)(qa[2], qa[3]));
}

/* Lane-wise sum of squares of x[0:n] (unreduced). */
CN_INLINE vec sumsq_vec(const xt *x, int64_t n)
{
    const vec z = VOP(zero)();
    vec q[4] = {z, z, z, z};
#define STEP(j, t, full, k) { const vec v_ = load_x_t(x + (j), t, full); q[k] = VOP(mul_add)(v_, v_, q[k]); }
#define STEP4(j) CN_STEPS4(STEP, j)
    CN_WALK(n, 0, 4, STEP4, STEP);
#undef STEP
#undef STEP4
    return VOP(add)(VOP(add)(q[0], q[1]), VOP(add)(q[2], q[3]));
}

/* Corrected two-pass moments of x[0:n] about pivot P, over data already in L1:
 * delta = mean - P, m2 = sum (x - mean)^2. */
CN_INLINE void twopass_moments(const xt *x, int64_t n, at pivot, cn_moments *m)
{
    const vec z = VOP(zero)(), P = VOP(set1)(pivot);
    const at d = (at)((double)VOP(hsum)(dev_sum_vec(x, n, P)) / (double)n);
    /* second pass: e = (x - P) - d; keep sum e^2 and the correction sum e */
    const vec D = VOP(set1)(d);
    vec q[4] = {z, z, z, z}, c[4] = {z, z, z, z};
#define STEP(j, t, full, k)                                                            \
    {                                                                                  \
        vec e_ = VOP(sub)(VOP(sub)(load_x_t(x + (j), t, full), P), D);                 \
        if (!(full)) e_ = VOP(keepn)(e_, t);                                           \
        q[k] = VOP(mul_add)(e_, e_, q[k]);                                               \
        c[k] = VOP(add)(c[k], e_);                                                     \
    }
    /* pass 2 runs from L1: meanwhile fetch what comes next in memory (the next
     * chunk or row), or DRAM would sit idle until the next pass 1 */
#define STEP4(j) { cn_prefetch(x + n + (j)); cn_prefetch(x + n + (j) + 2 * VL); CN_STEPS4(STEP, j); }
    CN_WALK(n, 0, 4, STEP4, STEP);
#undef STEP
#undef STEP4
    const double qs = (double)VOP(hsum)(VOP(add)(VOP(add)(q[0], q[1]), VOP(add)(q[2], q[3])));
    const double cs = (double)VOP(hsum)(VOP(add)(VOP(add)(c[0], c[1]), VOP(add)(c[2], c[3])));
    m->n = (double)n;
    /* the correction is NaN when the row holds an inf: keep mean = +-inf then */
    m->delta = isfinite(d) ? (double)d + cs / (double)n : (double)d;
    m->m2 = qs - cs * cs / (double)n;
}

/* Moments of x[0:n]. LayerNorm: delta = mean - pivot, m2 = sum (x - mean)^2,
 * in one pass where onepass_moments accepts it, else two. RMSNorm: delta = 0,
 * m2 = sum x^2. */
CN_INLINE void chunk_moments(const xt *x, int64_t n, at pivot, const int center, cn_moments *m)
{
    m->n = (double)n;
    if (!center) {
        m->delta = 0.0;
        m->m2 = (double)VOP(hsum)(sumsq_vec(x, n));
        return;
    }
    const at pc = head_mean(x, n);
    vec sv, qv;
    dev_moment_sums(x, n, VOP(set1)(pc), 1, &sv, &qv);
    if (onepass_moments((double)pc, (double)VOP(hsum)(sv), (double)VOP(hsum)(qv), (double)n, pivot, m)) return;
    twopass_moments(x, n, pivot, m);
}

/* ------------------------------------------------------------- normalize -- */

/* The mean (pivot + delta, in double) as two accumulator-type terms, hi + lo:
 * y near the mean comes from cancellation in x - hi, exact or rounded relative
 * to the deviation itself; lo carries what hi alone would lose (half an ulp of
 * the mean -- bf16 results would misround). */
CN_INLINE void split_mean(double pivot, double delta, at *hi, at *lo)
{
    double m = pivot + delta;
    double err = (pivot - (m - (m - pivot))) + (delta - (m - pivot));   /* TwoSum: m + err == pivot + delta */
    *hi = (at)m;
    *lo = (at)((m - (double)*hi) + err);
}

/* y[j:j+t] = ((x - mean_hi) * rstd + lr) * w + b, lr = -mean_lo * rstd (RMSNorm: x * rstd * w) */
CN_VEC_INLINE vec norm_vec(const xt *x, const pt *w, const pt *b, int64_t j, int64_t t, const int full, vec mh,
                       vec r, vec lr, const int center, const int has_w, const int has_b)
{
    vec v = load_x_t(x + j, t, full);
    v = center ? VOP(mul_add)(VOP(sub)(v, mh), r, lr) : VOP(mul)(v, r);
    if (has_w && has_b) v = VOP(mul_add)(v, load_p_t(w + j, t, full), load_p_t(b + j, t, full));
    else if (has_w) v = VOP(mul)(v, load_p_t(w + j, t, full));
    else if (has_b) v = VOP(add)(v, load_p_t(b + j, t, full));
    return v;
}

/* Normalize x[0:n] into y. stream: non-temporal stores after an aligning head.
 * Meanwhile npf elements from pf are prefetched (into L2 when pf_l2). */
CN_INLINE void normalize_impl(const xt *x, xt *y, const pt *w, const pt *b, int64_t n, at mean_hi, at lr,
                              at rstd, const int center, const int has_w, const int has_b, const int stream,
                              const xt *pf, int64_t npf, int pf_l2)
{
    const vec MH = VOP(set1)(mean_hi), R = VOP(set1)(rstd), LR = VOP(set1)(lr);
#define NORM(j, t, full) norm_vec(x, w, b, j, t, full, MH, R, LR, center, has_w, has_b)
#define STEP(j, t, full, s)                                                                 \
    {                                                                                       \
        if ((full) && (j) < npf) cn_prefetch_to(pf + (j), pf_l2);                           \
        store_x_t(y + (j), NORM(j, t, full), t, full, stream);                              \
    }
#define STEP2(j)                                                                            \
    {                                                                                       \
        if ((j) < npf) { cn_prefetch_to(pf + (j), pf_l2); cn_prefetch_to(pf + (j) + VL, pf_l2); } \
        const vec o0_ = NORM(j, VL, 1);   /* (in order: stores into a line from its start) */ \
        const vec o1_ = NORM((j) + VL, VL, 1);                                              \
        store_x2(y + (j), o0_, o1_, stream);                                                \
    }
    CN_WALK(n, stream ? stream_peel(y, n) : 0, 2, STEP2, STEP);
#undef NORM
#undef STEP
#undef STEP2
}

/* F(C, W, B) for the specialisations of the normalizing pass: LayerNorm (C) with
 * or without weight (W) and bias (B); RMSNorm with or without weight */
#define CN_NORM_DISPATCH(center, w, b, F)                                          \
    do {                                                                           \
        if (center) {                                                              \
            if ((w) && (b)) F(1, 1, 1);                                            \
            else if (w) F(1, 1, 0);                                                \
            else if (b) F(1, 0, 1);                                                \
            else F(1, 0, 0);                                                       \
        } else if (w) F(0, 1, 0);                                                  \
        else F(0, 0, 0);                                                           \
    } while (0)

/* normalize_impl for a mean split into hi and lr = -lo * rstd (split_mean),
 * specialised per (center, weight?, bias?, stream?): no branches in the hot loop */
static void normalize_lr(const xt *x, xt *y, const pt *w, const pt *b, int64_t n, at hi, at lr, at rstd,
                         int center, int stream, const xt *pf, int64_t npf, int pf_l2)
{
#define N_(C, W, B)                                                               \
    (stream ? normalize_impl(x, y, w, b, n, hi, lr, rstd, C, W, B, 1, pf, npf, pf_l2) \
            : normalize_impl(x, y, w, b, n, hi, lr, rstd, C, W, B, 0, pf, npf, pf_l2))
    CN_NORM_DISPATCH(center, w, b, N_);
#undef N_
}

static void normalize_row(const xt *x, xt *y, const pt *w, const pt *b, int64_t n, at pivot, double delta,
                          at rstd, int center, int stream, const xt *pf, int64_t npf, int pf_l2)
{
    at hi, lo;
    split_mean((double)pivot, delta, &hi, &lo);
    normalize_lr(x, y, w, b, n, hi, -lo * rstd, rstd, center, stream, pf, npf, pf_l2);
}

/* ---------------------------------------- rows beyond the accumulator's range -- */

/* Variances below this are not reliable in the accumulator type (squares of
 * the deviations underflow); see wants_rescue for when that matters. */
#define TINY_VAR (sizeof(at) == 4 ? 0x1p-100 : 0x1p-900)

/* Such a row, recomputed in double and scaled by a power of two (exact) so
 * that neither huge nor subnormal values lose range -- also for float64 rows.
 * Rare, so plain scalar code. The mean is pivoted on the first element, so a
 * constant row still gives exactly the bias. */
static void fwd_rescue(const cn_fwd_args *a, int64_t r)
{
    const int64_t N = a->N;
    const xt *x = (const xt *)a->x + r * N;
    xt *y = (xt *)a->y + r * N;
    const pt *w = (const pt *)a->w, *b = (const pt *)a->b;
    double amax = 0.0, p, mean = 0.0, m2 = 0.0, eps_s, rstd_s, rstd;
    int64_t j;
    int e;
    for (j = 0; j < N; j++) { double v = fabs((double)x_to_at(x[j])); if (v > amax) amax = v; }
    frexp(amax, &e);
    /* x * 2^-e lies in (-1, 1), exactly (ldexp: 2^-e itself overflows for float64 subnormals) */
#define SCALED(j) ldexp((double)x_to_at(x[j]), -e)
    p = a->center ? SCALED(0) : 0.0;
    if (a->center) {
        for (j = 0; j < N; j++) mean += SCALED(j) - p;
        mean = p + mean / (double)N;
    }
    for (j = 0; j < N; j++) { double d = SCALED(j) - mean; m2 += d * d; }
    eps_s = ldexp(a->eps, -2 * e);                              /* eps in scaled units */
    if (isfinite(eps_s)) {
        rstd_s = 1.0 / sqrt(m2 / (double)N + eps_s);            /* rstd of the scaled row */
        rstd = ldexp(rstd_s, -e);
    } else {                                                    /* eps dominates by far */
        rstd = 1.0 / sqrt(a->eps + ldexp(m2 / (double)N, 2 * e));
        rstd_s = ldexp(rstd, e);
    }
    for (j = 0; j < N; j++) {
        double v = (SCALED(j) - mean) * rstd_s;
        if (w) v *= (double)w[j];
        if (b) v += (double)b[j];
        y[j] = double_to_x(v);
    }
#undef SCALED
    if (a->mean) ((at *)a->mean)[r] = (at)ldexp(mean, e);
    ((at *)a->rstd)[r] = (at)rstd;
}

static int row_is_finite(const xt *x, int64_t n)
{
    for (int64_t j = 0; j < n; j++) if (!isfinite((double)x_to_at(x[j]))) return 0;
    return 1;
}

static int row_is_constant(const xt *x, int64_t n)
{
    const at first = x_to_at(x[0]);
    for (int64_t j = 1; j < n; j++) if (x_to_at(x[j]) != first) return 0;
    return 1;
}

/* Must this row be redone by fwd_rescue? Only if every input is finite, and
 * - its moments overflowed (values near the dtype's max), or
 * - its variance is below the accumulator's range (squares of the deviations
 *   underflow) and either eps is smaller still (rstd would be wrong) or, for
 *   LayerNorm, the row is not constant: deviations that small sit near the
 *   subnormals, where the mean has no relative precision left, so
 *   (x - mean) * rstd would be off. A constant row is exact as it is (y == b).
 * All rare; the common case costs two compares. */
CN_INLINE int may_need_rescue(double delta, double m2, double inv_n)
{
    /* (&, not &&: no branches, so that a loop over a block vectorizes) */
    return !(isfinite(delta) & isfinite(m2) & (m2 * inv_n >= TINY_VAR));
}

static int wants_rescue(const cn_fwd_args *a, const xt *x, double delta, double m2, double inv_n)
{
    if (!CN_UNLIKELY(may_need_rescue(delta, m2, inv_n))) return 0;
    if (CN_UNLIKELY(!(isfinite(delta) && isfinite(m2)))) return row_is_finite(x, a->N);
    if (a->eps >= TINY_VAR && (!a->center || row_is_constant(x, a->N))) return 0;
    return row_is_finite(x, a->N);
}

/* ------------------------------------------- blocks of short rows -- */

/* Short rows go CN_SMALL_BLOCK at a time (cn_order.h): per-row sums first
 * (independent dependency chains the CPU overlaps), then the per-row scalars as
 * loops over the block, then each row's output from L1. A row's arithmetic
 * never depends on the block it falls in. */

/* out[i] = the lane sum of a[i] for i < nrows (<= CN_SMALL_BLOCK), VL vectors per
 * transpose-and-add tree (cn_simd.h); a[nrows..] are zeroed first. out[i]
 * depends on a[i] alone, never on the other rows or on nrows. */
_Static_assert(CN_SMALL_BLOCK % VL == 0, "hsum_rows zeroes the block's arrays up to a multiple of VL");
CN_INLINE void hsum_rows(vec *a, int64_t nrows, at *out)
{
    for (int64_t g = 0; g < nrows; g += VL) {
        for (int64_t i = nrows; i < g + VL; i++) a[i] = VOP(zero)();
        VOP(hsum_lanes)(a + g, out + g);
    }
}

/* Prefetch the n elements from p, a cache line at a time (short rows: the
 * hardware prefetcher alone left DRAM idle during each block's compute) */
CN_INLINE void prefetch_span(const xt *p, int64_t n)
{
    for (int64_t off = 0; off < n * (int64_t)sizeof(xt); off += 64) cn_prefetch((const char *)p + off);
}

/* A small row's NV vectors from storage (the last one holds `tail` lanes). */
CN_INLINE void load_small_row(vec *v, const xt *x, const int NV, int64_t tail)
{
    CN_UNROLL for (int k = 0; k < NV; k++) v[k] = load_x_t(x + k * VL, tail, k < NV - 1 || tail == VL);
}

/* A small row's NV vectors to storage (the last one holds `tail` lanes), two
 * full vectors at a time (see cn_vf_store2_bf16). */
CN_INLINE void store_small_row(xt *y, const vec *o, const int NV, int64_t tail)
{
    CN_UNROLL for (int k = 0; k < NV; k += 2) {
        if (k + 1 < NV - 1 || (k + 1 == NV - 1 && tail == VL)) store_x2(y + k * VL, o[k], o[k + 1], 0);
        else if (k + 1 < NV) { store_x_t(y + k * VL, o[k], VL, 1, 0); store_x_t(y + (k + 1) * VL, o[k + 1], tail, 0, 0); }
        else if (tail == VL) store_x_t(y + k * VL, o[k], VL, 1, 0);
        else store_x_t(y + k * VL, o[k], tail, 0, 0);
    }
}


/* ------------------------------------------------------- gradient terms -- */

/* The backward's sweeps (grad_sums, dx_rows_impl) are specialised for 1, 2 and
 * CN_ROW_GROUP_MAX rows at once (cn_bwd.h's switches). */
_Static_assert(CN_ROW_GROUP_MAX == 4, "cn_bwd.h dispatches sweeps of 1, 2 or 4 rows");

/* The backward of a row: g = dy * w, xhat = (x - mean) * rstd;
 * dx = rstd * (g - c1 - xhat * c2), c1 = mean(g), c2 = mean(g * xhat)
 * (RMSNorm: no c1, xhat = x * rstd); dweight += dy * xhat, dbias += dy. */

CN_VEC_INLINE vec xhat_vec(vec xv, vec M, vec R, const int center)
{
    return center ? VOP(mul)(VOP(sub)(xv, M), R) : VOP(mul)(xv, R);
}

/* one row's partials at a vector: the first row of a block writes them (init),
 * the others add into them */
CN_VEC_INLINE void add_partials(vec *dw, vec *db, vec dyv, vec xh, const int init, const int has_db)
{
    if (init) { *dw = VOP(mul)(dyv, xh); if (has_db) *db = dyv; }
    else { *dw = VOP(mul_add)(dyv, xh, *dw); if (has_db) *db = VOP(add)(dyv, *db); }
}

/* Pass 1 over columns [0, n) of R consecutive rows (ld elements apart): per
 * row s1 = sum g and s2 = sum g * xhat, and (part) the rows' contributions to
 * the block partials dwp/dbp, added row after row (the first row writes
 * instead of adding when init). The partials are loaded and stored once per
 * R rows; each row's arithmetic is exactly that of R == 1, so R never changes
 * a bit. Meanwhile npf elements at pfo on from each row go into L2. */
CN_INLINE void grad_sums(const xt *dy, const xt *x, const pt *w, int64_t n, int64_t ld, const at *mean,
                         const at *rstd, at *dwp, at *dbp, const int R, const int center, const int has_w,
                         const int part, const int init, at *s1, at *s2, int64_t pfo, int64_t npf)
{
    const vec z = VOP(zero)();
    vec Mv[CN_ROW_GROUP_MAX], Rv[CN_ROW_GROUP_MAX], S1[2][CN_ROW_GROUP_MAX], S2[2][CN_ROW_GROUP_MAX];
    int i;
    CN_UNROLL for (i = 0; i < R; i++) {
        Mv[i] = VOP(set1)(center ? mean[i] : (at)0);
        Rv[i] = VOP(set1)(rstd[i]);
        S1[0][i] = S1[1][i] = S2[0][i] = S2[1][i] = z;
    }
#define STEP(j, t, full, s)                                                                  \
    {                                                                                        \
        const vec wv_ = has_w ? load_p_t(w + (j), t, full) : z;                              \
        vec dw_ = z, db_ = z;                                                                \
        CN_UNROLL for (i = 0; i < R; i++) {                                                  \
            const vec dyv_ = load_x_t(dy + i * ld + (j), t, full);                           \
            vec xh_ = xhat_vec(load_x_t(x + i * ld + (j), t, full), Mv[i], Rv[i], center);   \
            if (!(full)) xh_ = VOP(keepn)(xh_, t);                                           \
            const vec g_ = has_w ? VOP(mul)(dyv_, wv_) : dyv_;                               \
            if (center) S1[s][i] = VOP(add)(S1[s][i], g_);                                   \
            S2[s][i] = VOP(mul_add)(g_, xh_, S2[s][i]);                                        \
            if (part) {                                                                      \
                if (i == 0 && !init) { dw_ = load_a_t(dwp + (j), t, full); if (center) db_ = load_a_t(dbp + (j), t, full); } \
                add_partials(&dw_, &db_, dyv_, xh_, i == 0 && init, center);                 \
            }                                                                                \
        }                                                                                    \
        if (part) {                                                                          \
            store_a_t(dwp + (j), dw_, t, full);                                              \
            if (center) store_a_t(dbp + (j), db_, t, full);                                  \
        }                                                                                    \
    }
#define PF(j) { if ((j) < npf) { CN_UNROLL for (i = 0; i < R; i++) { cn_prefetch_l2(x + i * ld + pfo + (j)); cn_prefetch_l2(dy + i * ld + pfo + (j)); } } }
#define STEP2(j) { PF(j) PF((j) + VL) STEP(j, VL, 1, 0) STEP((j) + VL, VL, 1, 1) }
    CN_WALK(n, 0, 2, STEP2, STEP);
#undef PF
#undef STEP
#undef STEP2
    CN_UNROLL for (i = 0; i < R; i++) {
        s1[i] = VOP(hsum)(VOP(add)(S1[0][i], S1[1][i]));
        s2[i] = VOP(hsum)(VOP(add)(S2[0][i], S2[1][i]));
    }
}

/* The fused backward's residual gradient: dx + dh in the accumulator lanes,
 * rounded once when stored (dh NULL: dx as it is). */
CN_VEC_INLINE vec with_dh(vec dx, const xt *dh, int64_t j, int64_t t, const int full)
{
    return dh ? VOP(add)(dx, load_x_t(dh + j, t, full)) : dx;
}

/* dx[j:j+t] of one row (and with acc, the row added into the partials: acc 1
 * writes them, 2 adds -- the operations of grad_sums, so the partials come
 * out bit-identical) */
CN_VEC_INLINE vec dx_vec(const xt *dy, const xt *x, const pt *w, at *dwp, at *dbp, int64_t j, int64_t t,
                     const int full, vec M, vec R, vec C1, vec C2, const int center, const int has_w,
                     const int acc, const int has_db)
{
    const vec xv = load_x_t(x + j, t, full), dyv = load_x_t(dy + j, t, full);
    const vec xh = xhat_vec(xv, M, R, center);
    vec g = dyv;
    if (has_w) g = VOP(mul)(g, load_p_t(w + j, t, full));
    if (center) g = VOP(sub)(g, C1);
    if (acc) {
        vec dw = VOP(zero)(), db = VOP(zero)();
        if (acc != 1) { dw = load_a_t(dwp + j, t, full); if (has_db) db = load_a_t(dbp + j, t, full); }
        add_partials(&dw, &db, dyv, xh, acc == 1, has_db);
        store_a_t(dwp + j, dw, t, full);
        if (has_db) store_a_t(dbp + j, db, t, full);
    }
    return VOP(mul)(VOP(mul_sub_from)(xh, C2, g), R);
}

/* Pass 2 over one row: dx = rstd * (g - c1 - xhat * c2), c1 = k1, c2 = k2.
 * stream: non-temporal stores after an aligning head; meanwhile npf elements
 * pf elements on are prefetched (the walk from cache leaves DRAM idle). */
CN_INLINE void dx_row(const xt *dy, const xt *x, const pt *w, const xt *dh, xt *dx, int64_t n, at mean, at rstd,
                      at k1, at k2, const int center, const int has_w, const int stream, int64_t pf, int64_t npf,
                      at *dwp, at *dbp, const int acc, const int has_db)
{
    const vec M = VOP(set1)(mean), R = VOP(set1)(rstd), C1 = VOP(set1)(k1), C2 = VOP(set1)(k2);
#define DX(j, t, full) with_dh(dx_vec(dy, x, w, dwp, dbp, j, t, full, M, R, C1, C2, center, has_w, acc, has_db), dh, j, t, full)
#define PF(j) { if ((j) < npf) { cn_prefetch(x + pf + (j)); cn_prefetch(dy + pf + (j)); } }
#define STEP(j, t, full, s) { if (full) PF(j) store_x_t(dx + (j), DX(j, t, full), t, full, stream); }
#define STEP2(j)                                                                          \
    {                                                                                     \
        PF(j) PF((j) + VL)                                                                \
        const vec o0_ = DX(j, VL, 1), o1_ = DX((j) + VL, VL, 1);                          \
        store_x2(dx + (j), o0_, o1_, stream);                                             \
    }
    CN_WALK(n, stream ? stream_peel(dx, n) : 0, 2, STEP2, STEP);
#undef DX
#undef PF
#undef STEP
#undef STEP2
}

/* Row i's dx at columns j..j+t (returned), and the row added into the
 * partials dw/db (the first row of a block, init, writes them; the first row
 * of a sweep loads them) */
CN_VEC_INLINE vec dx_rows_term(const xt *x, const xt *dy, const at *dwp, const at *dbp, int64_t j, int64_t t,
                           const int full, vec wv, vec M, vec R, vec C1, vec C2, vec *dw, vec *db, const int first,
                           const int init, const int center, const int has_db)
{
    const vec xv = load_x_t(x + j, t, full), dyv = load_x_t(dy + j, t, full);
    const vec xh = xhat_vec(xv, M, R, center);
    vec g = VOP(mul)(dyv, wv);
    if (center) g = VOP(sub)(g, C1);
    if (first && !init) { *dw = load_a_t(dwp + j, t, full); if (has_db) *db = load_a_t(dbp + j, t, full); }
    add_partials(dw, db, dyv, xh, first && init, has_db);
    return VOP(mul)(VOP(mul_sub_from)(xh, C2, g), R);
}

/* Pass 2 over R rows at once (1..CN_ROW_GROUP_MAX, from r), columns [c0, c1): each row's dx,
 * and each row added in turn into the partials, which stay in registers
 * across the R rows -- the operations of R calls of dx_row, in the same
 * order, so the bits are those of one row at a time. */
CN_INLINE void dx_rows_impl(const cn_bwd_args *a, int64_t r, const int R, int64_t c0, int64_t c1,
                            const double *rowsums, at *dwp, at *dbp, const int init, const int center,
                            const int has_db, const int stream, int64_t pfo, int64_t npf)
{
    const int64_t N = a->N, n = c1 - c0;
    const xt *x[CN_ROW_GROUP_MAX], *dy[CN_ROW_GROUP_MAX], *dh[CN_ROW_GROUP_MAX];
    xt *dx[CN_ROW_GROUP_MAX];
    vec Mv[CN_ROW_GROUP_MAX], Rv[CN_ROW_GROUP_MAX], C1[CN_ROW_GROUP_MAX], C2[CN_ROW_GROUP_MAX];
    const pt *w = (const pt *)a->w + c0;
    int i;
    CN_UNROLL for (i = 0; i < R; i++) {
        x[i] = (const xt *)a->x + (r + i) * N + c0;
        dy[i] = (const xt *)a->dy + (r + i) * N + c0;
        dx[i] = (xt *)a->dx + (r + i) * N + c0;
        dh[i] = a->dh ? (const xt *)a->dh + (r + i) * N + c0 : NULL;
        Mv[i] = VOP(set1)(center ? ((const at *)a->mean)[r + i] : (at)0);
        Rv[i] = VOP(set1)(((const at *)a->rstd)[r + i]);
        C1[i] = VOP(set1)((at)(rowsums[2 * i] / (double)N));
        C2[i] = VOP(set1)((at)(rowsums[2 * i + 1] / (double)N));
    }
    dwp += c0;
    if (has_db) dbp += c0;
    /* non-temporal stores need the same alignment in every row, and several rows
     * at once only where the level's table row says multirow_stream (with AVX2
     * the half-filled write-combining buffers of four rows at once collapsed:
     * benchmarks/NOTES.md); only there do aligned 32-bit rows take the route
     * built on these sweeps (the policy's late_parts) */
    const int nt = stream && (R == 1 || (CN_MULTIROW_STREAM && (N * (int64_t)sizeof(xt)) % STREAM_ALIGN == 0));
    const int64_t head = nt ? stream_peel(dx[0], n) : 0;
#define TERM(j, t, full, wv, dw_, db_) \
    with_dh(dx_rows_term(x[i], dy[i], dwp, dbp, j, t, full, wv, Mv[i], Rv[i], C1[i], C2[i], &dw_, &db_, i == 0, init, \
                         center, has_db), dh[i], j, t, full)
#define PF(j) { if ((j) < npf) { CN_UNROLL for (i = 0; i < R; i++) { cn_prefetch(x[i] + pfo + (j)); cn_prefetch(dy[i] + pfo + (j)); } } }
#define STEP(j, t, full, s)                                                                  \
    {                                                                                        \
        if (full) PF(j)                                                                      \
        const vec wv_ = load_p_t(w + (j), t, full);                                          \
        vec dw_ = VOP(zero)(), db_ = VOP(zero)();                                            \
        CN_UNROLL for (i = 0; i < R; i++) store_x_t(dx[i] + (j), TERM(j, t, full, wv_, dw_, db_), t, full, nt); \
        store_a_t(dwp + (j), dw_, t, full);                                                  \
        if (has_db) store_a_t(dbp + (j), db_, t, full);                                      \
    }
#define STEP2(j)                                                                             \
    {                                                                                        \
        PF(j) PF((j) + VL)                                                                   \
        const vec wv0_ = load_p(w + (j)), wv1_ = load_p(w + (j) + VL);                       \
        vec dw0_ = VOP(zero)(), db0_ = VOP(zero)(), dw1_ = VOP(zero)(), db1_ = VOP(zero)();  \
        CN_UNROLL for (i = 0; i < R; i++) {                                                  \
            const vec o0_ = TERM(j, VL, 1, wv0_, dw0_, db0_);                                \
            const vec o1_ = TERM((j) + VL, VL, 1, wv1_, dw1_, db1_);                         \
            store_x2(dx[i] + (j), o0_, o1_, nt);                                             \
        }                                                                                    \
        store_a_t(dwp + (j), dw0_, VL, 1);                                                   \
        store_a_t(dwp + (j) + VL, dw1_, VL, 1);                                              \
        if (has_db) { store_a_t(dbp + (j), db0_, VL, 1); store_a_t(dbp + (j) + VL, db1_, VL, 1); } \
    }
    CN_WALK(n, head, 2, STEP2, STEP);
#undef TERM
#undef PF
#undef STEP
#undef STEP2
}
