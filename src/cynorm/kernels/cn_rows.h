/*
 * cn_rows.h -- the per-row math of LayerNorm and RMSNorm, written once.
 *
 * cn_kernels.h includes this file once per (x storage, param storage) pair,
 * after defining:
 *   CN_SFX     name suffix, e.g. bf16_f32
 *   CN_XT/CN_XS  storage type / suffix of x, y, dy, dx  (float f32, double f64, cn_bf16 bf16, cn_f16 f16)
 *   CN_PT/CN_PS  storage type / suffix of weight, bias, dweight, dbias
 *   CN_LANE    vf (fp32 lanes) or vd (fp64 lanes); CN_AT is the matching scalar
 * Everything here goes through cn_simd.h; there are no intrinsics in this file.
 *
 * Arithmetic contract (what makes results independent of the thread count):
 *   - a row is cut into fixed CN_CHUNK-element chunks; the stats of a row are
 *     the chunk stats merged left to right; backward row sums likewise.
 *   - dweight/dbias partials of a row block are accumulated row by row.
 * The team path in _kernels.pxi calls the same chunk functions in the same
 * order, so both paths give the same bits.
 */

#define CN_CAT_(a, b) a##b
#define CN_CAT(a, b) CN_CAT_(a, b)
#define CN_CAT3(a, b, c) CN_CAT(CN_CAT(a, b), c)

#define FN(name) CN_CAT3(name, _, CN_SFX)
#define V CN_CAT(cn_, CN_LANE)
#define VOP(op) CN_CAT3(cn_, CN_LANE, _##op)
#define XLD(p) CN_CAT3(V, _load_, CN_XS)(p)
#define XLDN(p, n) CN_CAT3(V, _loadn_, CN_XS)(p, n)
#define XST(p, v) CN_CAT3(V, _store_, CN_XS)(p, v)
#define XSTN(p, v, n) CN_CAT3(V, _storen_, CN_XS)(p, v, n)
#define XSTREAM(p, v) CN_CAT3(V, _stream_, CN_XS)(p, v)
#define XST2(p, a, b) CN_CAT3(V, _store2_, CN_XS)(p, a, b)
#define XSTREAM2(p, a, b) CN_CAT3(V, _stream2_, CN_XS)(p, a, b)
#define XSTREAMN(p, v, n) CN_CAT3(V, _streamn_, CN_XS)(p, v, n)
/* the partial vector at a row's end: non-temporal too when the row streams,
 * so that no cache line gets both kinds of store (see cn_stream_bytes) */
#define XSTN_ROW(p, v, n, stream) ((stream) ? XSTREAMN(p, v, n) : XSTN(p, v, n))
#define PLD(p) CN_CAT3(V, _load_, CN_PS)(p)
#define PLDN(p, n) CN_CAT3(V, _loadn_, CN_PS)(p, n)
#define PST(p, v) CN_CAT3(V, _store_, CN_PS)(p, v)
#define PSTN(p, v, n) CN_CAT3(V, _storen_, CN_PS)(p, v, n)
#define ALD(p) CN_CAT3(V, _load_, CN_AS)(p)
#define ALDN(p, n) CN_CAT3(V, _loadn_, CN_AS)(p, n)
#define AST(p, v) CN_CAT3(V, _store_, CN_AS)(p, v)
#define ASTN(p, v, n) CN_CAT3(V, _storen_, CN_AS)(p, v, n)
#define X2A(v) CN_CAT(cn_scalar_, CN_XS)(v)
#define P2A(v) CN_CAT(cn_scalar_, CN_PS)(v)
#define A2X(v) CN_CAT(cn_unscalar_, CN_XS)(v)
#define A2P(v) CN_CAT(cn_unscalar_, CN_PS)(v)

#if CN_LANE_IS_VD
#  define VL CN_VD_LANES
#  define CN_AS f64
#else
#  define VL CN_VF_LANES
#  define CN_AS f32
#endif
/* Rows of at most SMALL_MAX elements live in registers: up to 4 vectors of 16
 * lanes or 8 of 8 (64 elements), or 8 of 4 (32). The portable fallback keeps
 * it to 4 vectors so that its build stays small. */
#if defined(CN_GENERIC)
#  define SMALL_NV_MAX 4
#else
#  define SMALL_NV_MAX (VL >= 16 ? 4 : 8)
#endif
#define SMALL_MAX (SMALL_NV_MAX * VL)

/* Calls CALL(K, C) with K = the row's vector count and C = center as compile-
 * time constants, so each small-row kernel is specialised for its shape. */
#define CN_SMALL_CASE(a, CALL, K)                                              \
    case K:                                                                    \
        if (K <= SMALL_NV_MAX) {                                               \
            if ((a)->center) CALL(K, 1);                                       \
            else CALL(K, 0);                                                   \
        }                                                                      \
        break;
#define CN_SMALL_DISPATCH(a, CALL)                                             \
    switch ((int)(((a)->N + VL - 1) / VL)) {                                   \
        CN_SMALL_CASE(a, CALL, 1) CN_SMALL_CASE(a, CALL, 2)                    \
        CN_SMALL_CASE(a, CALL, 3) CN_SMALL_CASE(a, CALL, 4)                    \
        CN_SMALL_CASE(a, CALL, 5) CN_SMALL_CASE(a, CALL, 6)                    \
        CN_SMALL_CASE(a, CALL, 7) CN_SMALL_CASE(a, CALL, 8)                    \
    }

/* Elements to store normally before x-typed pointer p is aligned for a
 * full-vector non-temporal store (at most n). */
#define STREAM_ALIGN ((int64_t)(VL * sizeof(CN_XT)))
CN_INLINE int64_t FN(stream_peel)(const void *p, int64_t n)
{
    int64_t mis = (int64_t)((uintptr_t)p % (uintptr_t)STREAM_ALIGN);
    int64_t k = mis ? (STREAM_ALIGN - mis) / (int64_t)sizeof(CN_XT) : 0;
    if (mis % (int64_t)sizeof(CN_XT)) k = n;  /* not even element-aligned: never stream */
    return k < n ? k : n;
}

typedef CN_XT FN(xt);
typedef CN_PT FN(pt);
typedef CN_AT FN(at);
#define XT FN(xt)
#define PT FN(pt)
#define AT FN(at)

/* -------------------------------------------------------- forward: stats -- */

/* Moments of a chunk from its one-pass sums about pivot pc, s = sum (x - pc)
 * and q = sum (x - pc)^2: m2 = q - s^2/n. pc is the mean of the chunk's first
 * VL elements, which typically lies within a fraction of a standard deviation
 * of the chunk mean, so the subtraction loses almost nothing. Refused (0) when
 * pc is further than sqrt(1/2) std from the mean (3 s^2 > n q: cancellation
 * could cost more than a factor 1.5) or anything is not finite; the caller
 * then uses the corrected two-pass. Which way a chunk goes depends only on
 * its own data. delta is relative to the row pivot P. */
CN_INLINE int FN(onepass_moments)(double pc, double s, double q, double n, AT pivot, cn_moments *m)
{
    if (!(isfinite(pc) && cn_onepass_accepts(s, q, n))) return 0;
    m->n = n;
    m->delta = (pc - (double)pivot) + s / n;
    m->m2 = q - s * s / n;
    return 1;
}

/* The mean of the first min(n, VL) elements: the one-pass pivot (see above). */
CN_INLINE AT FN(head_mean)(const XT *x, int64_t n)
{
    const int64_t np = n < VL ? n : VL;
    return (AT)((double)VOP(hsum)(XLDN(x, np)) / (double)np);
}

/* Lane-wise sum of x[0:n] - P (unreduced; lanes past n are 0). */
CN_INLINE V FN(dev_sum_vec)(const XT *x, int64_t n, V P)
{
    const V z = VOP(zero)();
    V a0 = z, a1 = z, a2 = z, a3 = z;
    int64_t j;
    for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
        a0 = VOP(add)(a0, VOP(sub)(XLD(x + j), P));
        a1 = VOP(add)(a1, VOP(sub)(XLD(x + j + VL), P));
        a2 = VOP(add)(a2, VOP(sub)(XLD(x + j + 2 * VL), P));
        a3 = VOP(add)(a3, VOP(sub)(XLD(x + j + 3 * VL), P));
    }
    for (; j + VL <= n; j += VL) a0 = VOP(add)(a0, VOP(sub)(XLD(x + j), P));
    if (j < n) a1 = VOP(add)(a1, VOP(keepn)(VOP(sub)(XLDN(x + j, n - j), P), n - j));
    return VOP(add)(VOP(add)(a0, a1), VOP(add)(a2, a3));
}

/* Lane-wise one-pass sums of x[0:n] about P: *s = sum (x - P), *q = sum
 * (x - P)^2 (unreduced; lanes past n add 0). prefetch: fetch what follows
 * x[n] meanwhile (the next chunk: keeps DRAM busy through the hsums). */
CN_INLINE void FN(dev_moment_sums)(const XT *x, int64_t n, V P, const int prefetch, V *s, V *q)
{
    const V z = VOP(zero)();
    V s0 = z, s1 = z, s2 = z, s3 = z, q0 = z, q1 = z, q2 = z, q3 = z;
    int64_t j;
    for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
        if (prefetch) {
            cn_prefetch(x + n + j);
            cn_prefetch(x + n + j + 2 * VL);
        }
        V e0 = VOP(sub)(XLD(x + j), P), e1 = VOP(sub)(XLD(x + j + VL), P);
        V e2 = VOP(sub)(XLD(x + j + 2 * VL), P), e3 = VOP(sub)(XLD(x + j + 3 * VL), P);
        s0 = VOP(add)(s0, e0); s1 = VOP(add)(s1, e1); s2 = VOP(add)(s2, e2); s3 = VOP(add)(s3, e3);
        q0 = VOP(fmadd)(e0, e0, q0); q1 = VOP(fmadd)(e1, e1, q1);
        q2 = VOP(fmadd)(e2, e2, q2); q3 = VOP(fmadd)(e3, e3, q3);
    }
    for (; j + VL <= n; j += VL) {
        V e = VOP(sub)(XLD(x + j), P);
        s0 = VOP(add)(s0, e); q0 = VOP(fmadd)(e, e, q0);
    }
    if (j < n) {
        V e = VOP(keepn)(VOP(sub)(XLDN(x + j, n - j), P), n - j);
        s1 = VOP(add)(s1, e); q1 = VOP(fmadd)(e, e, q1);
    }
    *s = VOP(add)(VOP(add)(s0, s1), VOP(add)(s2, s3));
    *q = VOP(add)(VOP(add)(q0, q1), VOP(add)(q2, q3));
}

/* Lane-wise sum of squares of x[0:n] (unreduced). */
CN_INLINE V FN(sumsq_vec)(const XT *x, int64_t n)
{
    const V z = VOP(zero)();
    V q0 = z, q1 = z, q2 = z, q3 = z;
    int64_t j;
    for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
        V v0 = XLD(x + j), v1 = XLD(x + j + VL), v2 = XLD(x + j + 2 * VL), v3 = XLD(x + j + 3 * VL);
        q0 = VOP(fmadd)(v0, v0, q0); q1 = VOP(fmadd)(v1, v1, q1);
        q2 = VOP(fmadd)(v2, v2, q2); q3 = VOP(fmadd)(v3, v3, q3);
    }
    for (; j + VL <= n; j += VL) { V v = XLD(x + j); q0 = VOP(fmadd)(v, v, q0); }
    if (j < n) { V v = XLDN(x + j, n - j); q1 = VOP(fmadd)(v, v, q1); }
    return VOP(add)(VOP(add)(q0, q1), VOP(add)(q2, q3));
}

/* Corrected two-pass moments of x[0:n] about pivot P, over data already in L1:
 * delta = mean - P, m2 = sum (x - mean)^2. */
CN_INLINE void FN(twopass_moments)(const XT *x, int64_t n, AT pivot, cn_moments *m)
{
    int64_t j;
    V z = VOP(zero)();
    m->n = (double)n;
    {
        V P = VOP(set1)(pivot);
        AT d = (AT)((double)VOP(hsum)(FN(dev_sum_vec)(x, n, P)) / (double)n);

        /* second pass: e = (x - P) - d; keep sum e^2 and the correction sum e */
        V D = VOP(set1)(d);
        V q0 = z, q1 = z, q2 = z, q3 = z, c0 = z, c1 = z, c2 = z, c3 = z;
        /* pass 2 runs from L1: meanwhile fetch what comes next in memory (the
         * next chunk or row), or DRAM would sit idle until the next pass 1 */
        for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
            cn_prefetch(x + n + j);
            cn_prefetch(x + n + j + 2 * VL);
            V e0 = VOP(sub)(VOP(sub)(XLD(x + j), P), D);
            V e1 = VOP(sub)(VOP(sub)(XLD(x + j + VL), P), D);
            V e2 = VOP(sub)(VOP(sub)(XLD(x + j + 2 * VL), P), D);
            V e3 = VOP(sub)(VOP(sub)(XLD(x + j + 3 * VL), P), D);
            q0 = VOP(fmadd)(e0, e0, q0); q1 = VOP(fmadd)(e1, e1, q1);
            q2 = VOP(fmadd)(e2, e2, q2); q3 = VOP(fmadd)(e3, e3, q3);
            c0 = VOP(add)(c0, e0); c1 = VOP(add)(c1, e1); c2 = VOP(add)(c2, e2); c3 = VOP(add)(c3, e3);
        }
        for (; j + VL <= n; j += VL) {
            V e = VOP(sub)(VOP(sub)(XLD(x + j), P), D);
            q0 = VOP(fmadd)(e, e, q0); c0 = VOP(add)(c0, e);
        }
        if (j < n) {
            V e = VOP(keepn)(VOP(sub)(VOP(sub)(XLDN(x + j, n - j), P), D), n - j);
            q1 = VOP(fmadd)(e, e, q1); c1 = VOP(add)(c1, e);
        }
        double qs = (double)VOP(hsum)(VOP(add)(VOP(add)(q0, q1), VOP(add)(q2, q3)));
        double cs = (double)VOP(hsum)(VOP(add)(VOP(add)(c0, c1), VOP(add)(c2, c3)));
        /* the correction is NaN when the row holds an inf: keep mean = +-inf then */
        m->delta = isfinite(d) ? (double)d + cs / (double)n : (double)d;
        m->m2 = qs - cs * cs / (double)n;
    }
}

/* Moments of x[0:n]. LayerNorm: delta = mean - P, m2 = sum (x - mean)^2, in
 * one pass where onepass_moments accepts it, else two. RMSNorm: delta = 0,
 * m2 = sum x^2. */
CN_INLINE void FN(chunk_moments)(const XT *x, int64_t n, AT pivot, const int center, cn_moments *m)
{
    m->n = (double)n;
    if (!center) {
        m->delta = 0.0;
        m->m2 = (double)VOP(hsum)(FN(sumsq_vec)(x, n));
        return;
    }
    {
        const AT pc = FN(head_mean)(x, n);
        V sv, qv;
        FN(dev_moment_sums)(x, n, VOP(set1)(pc), 1, &sv, &qv);
        double ss = (double)VOP(hsum)(sv);
        double qs = (double)VOP(hsum)(qv);
        if (FN(onepass_moments)((double)pc, ss, qs, (double)n, pivot, m)) return;
    }
    FN(twopass_moments)(x, n, pivot, m);
}

/* ---------------------------------------------------- forward: normalize -- */

/* The mean (pivot + delta, in double) as two accumulator-type terms, hi + lo:
 * y near the mean comes from cancellation in x - hi, exact or rounded relative
 * to the deviation itself; lo carries what hi alone would lose (half an ulp of
 * the mean -- bf16 results would misround). */
CN_INLINE void FN(split_mean)(double pivot, double delta, AT *hi, AT *lo)
{
    double m = pivot + delta;
    double err = (pivot - (m - (m - pivot))) + (delta - (m - pivot));   /* TwoSum: m + err == pivot + delta */
    *hi = (AT)m;
    *lo = (AT)((m - (double)*hi) + err);
}

/* y = ((x - mean_hi) * rstd + lr) * w + b, lr = -mean_lo * rstd  (one fma; RMSNorm: y = x * rstd * w).
 * stream: write the aligned middle with non-temporal stores. Meanwhile npf
 * elements from pf are prefetched, into L2 only when pf_l2 (a->prefetch_l2). */
CN_INLINE void FN(apply_impl)(const XT *x, XT *y, const PT *w, const PT *b, int64_t n, AT mean_hi, AT lr,
                              AT rstd, const int center, const int has_w, const int has_b, const int stream,
                              const XT *pf, int64_t npf, int pf_l2)
{
    V MH = VOP(set1)(mean_hi), R = VOP(set1)(rstd), LR = VOP(set1)(lr);
    int64_t j = 0, head = stream ? FN(stream_peel)(y, n) : 0;
#define CN_NORM(out, J, T, LDX, LDP)                                                     \
    {                                                                                    \
        V v = LDX(x + (J), T);                                                           \
        v = center ? VOP(fmadd)(VOP(sub)(v, MH), R, LR) : VOP(mul)(v, R);                \
        if (has_w && has_b) v = VOP(fmadd)(v, LDP(w + (J), T), LDP(b + (J), T));         \
        else if (has_w) v = VOP(mul)(v, LDP(w + (J), T));                                \
        else if (has_b) v = VOP(add)(v, LDP(b + (J), T));                                \
        out = v;                                                                         \
    }
#define CN_APPLY(J, T, LDX, LDP, STORE) { V o_; CN_NORM(o_, J, T, LDX, LDP) STORE(y + (J), o_, T); }
    /* two vectors a step, stored as a pair (see cn_vf_store2_bf16) */
#define CN_APPLY2(J, STORE2)                                                             \
    {                                                                                    \
        V o0_, o1_;                                                                      \
        CN_NORM(o0_, J, VL, CN_LDX_FULL, CN_LDP_FULL)                                    \
        CN_NORM(o1_, (J) + VL, VL, CN_LDX_FULL, CN_LDP_FULL)                             \
        STORE2(y + (J), o0_, o1_);                                                       \
    }
#define CN_LDX_FULL(p, t) XLD(p)
#define CN_LDP_FULL(p, t) PLD(p)
#define CN_ST_FULL(p, v, t) XST(p, v)
#define CN_ST_STREAM(p, v, t) XSTREAM(p, v)
#define CN_LDX_PART(p, t) XLDN(p, t)
#define CN_LDP_PART(p, t) PLDN(p, t)
#define CN_ST_PART(p, v, t) XSTN_ROW(p, v, t, stream)
    if (head) CN_APPLY(0, head, CN_LDX_PART, CN_LDP_PART, CN_ST_PART)   /* head < VL when streaming */
    j = head;
    if (stream) {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            if (j < npf) { cn_prefetch_to(pf + j, pf_l2); cn_prefetch_to(pf + j + VL, pf_l2); }
            CN_APPLY2(j, XSTREAM2)
        }
        if (j + VL <= n) { if (j < npf) cn_prefetch_to(pf + j, pf_l2); CN_APPLY(j, VL, CN_LDX_FULL, CN_LDP_FULL, CN_ST_STREAM) j += VL; }
    } else {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            if (j < npf) { cn_prefetch_to(pf + j, pf_l2); cn_prefetch_to(pf + j + VL, pf_l2); }
            CN_APPLY2(j, XST2)
        }
        if (j + VL <= n) { if (j < npf) cn_prefetch_to(pf + j, pf_l2); CN_APPLY(j, VL, CN_LDX_FULL, CN_LDP_FULL, CN_ST_FULL) j += VL; }
    }
    if (j < n) CN_APPLY(j, n - j, CN_LDX_PART, CN_LDP_PART, CN_ST_PART)
#undef CN_NORM
#undef CN_APPLY
#undef CN_APPLY2
#undef CN_LDX_FULL
#undef CN_LDP_FULL
#undef CN_ST_FULL
#undef CN_ST_STREAM
#undef CN_LDX_PART
#undef CN_LDP_PART
#undef CN_ST_PART
}

/* apply_impl for a mean already split into hi and lr = -lo * rstd (split_mean) */
static void FN(apply_lr)(const XT *x, XT *y, const PT *w, const PT *b, int64_t n, AT hi, AT lr, AT rstd,
                            int center, int stream, const XT *pf, int64_t npf, int pf_l2)
{
    /* one specialised loop per (center, weight?, bias?, stream?): no branches in the hot loop */
#define CN_A(C, W, B) \
    (stream ? FN(apply_impl)(x, y, w, b, n, hi, lr, rstd, C, W, B, 1, pf, npf, pf_l2) \
            : FN(apply_impl)(x, y, w, b, n, hi, lr, rstd, C, W, B, 0, pf, npf, pf_l2))
    if (center) {
        if (w && b) CN_A(1, 1, 1);
        else if (w) CN_A(1, 1, 0);
        else if (b) CN_A(1, 0, 1);
        else CN_A(1, 0, 0);
    } else {
        if (w) CN_A(0, 1, 0);
        else CN_A(0, 0, 0);
    }
#undef CN_A
}

static void FN(apply)(const XT *x, XT *y, const PT *w, const PT *b, int64_t n, AT pivot, double delta, AT rstd,
                      int center, int stream, const XT *pf, int64_t npf, int pf_l2)
{
    AT hi, lo;
    FN(split_mean)((double)pivot, delta, &hi, &lo);
    FN(apply_lr)(x, y, w, b, n, hi, -lo * rstd, rstd, center, stream, pf, npf, pf_l2);
}

/* ------------------------- forward: rows beyond the accumulator's range -- */

/* Variances below this are not reliable in the accumulator type (squares of
 * the deviations underflow); see wants_rescue for when that matters. */
#define TINY_VAR (sizeof(AT) == 4 ? 0x1p-100 : 0x1p-900)

/* Such a row, recomputed in double and scaled by a power of two (exact) so
 * that neither huge nor subnormal values lose range -- also for float64 rows.
 * Rare, so plain scalar code. The mean is pivoted on the first element, so a
 * constant row still gives exactly the bias. */
static void FN(fwd_rescue)(const cn_fwd_args *a, int64_t r)
{
    const int64_t N = a->N;
    const XT *x = (const XT *)a->x + r * N;
    XT *y = (XT *)a->y + r * N;
    const PT *w = (const PT *)a->w, *b = (const PT *)a->b;
    double amax = 0.0, p, mean = 0.0, m2 = 0.0, eps_s, rstd_s, rstd;
    int64_t j;
    int e;
    for (j = 0; j < N; j++) { double v = fabs((double)X2A(x[j])); if (v > amax) amax = v; }
    frexp(amax, &e);
    /* x * 2^-e lies in (-1, 1), exactly (ldexp: 2^-e itself overflows for float64 subnormals) */
#define CN_SCALED(j) ldexp((double)X2A(x[j]), -e)
    p = a->center ? CN_SCALED(0) : 0.0;
    if (a->center) {
        for (j = 0; j < N; j++) mean += CN_SCALED(j) - p;
        mean = p + mean / (double)N;
    }
    for (j = 0; j < N; j++) { double d = CN_SCALED(j) - mean; m2 += d * d; }
    eps_s = ldexp(a->eps, -2 * e);                              /* eps in scaled units */
    if (isfinite(eps_s)) {
        rstd_s = 1.0 / sqrt(m2 / (double)N + eps_s);            /* rstd of the scaled row */
        rstd = ldexp(rstd_s, -e);
    } else {                                                    /* eps dominates by far */
        rstd = 1.0 / sqrt(a->eps + ldexp(m2 / (double)N, 2 * e));
        rstd_s = ldexp(rstd, e);
    }
    for (j = 0; j < N; j++) {
        double v = (CN_SCALED(j) - mean) * rstd_s;
        if (w) v *= (double)P2A(w[j]);
        if (b) v += (double)P2A(b[j]);
        y[j] = A2X(v);
    }
#undef CN_SCALED
    if (a->mean) ((AT *)a->mean)[r] = (AT)ldexp(mean, e);
    ((AT *)a->rstd)[r] = (AT)rstd;
}

static int FN(row_is_finite)(const XT *x, int64_t n)
{
    for (int64_t j = 0; j < n; j++) if (!isfinite((double)X2A(x[j]))) return 0;
    return 1;
}

static int FN(row_is_constant)(const XT *x, int64_t n)
{
    const AT first = (AT)X2A(x[0]);
    for (int64_t j = 1; j < n; j++) if ((AT)X2A(x[j]) != first) return 0;
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
CN_INLINE int FN(may_need_rescue)(double delta, double m2, double inv_n)
{
    /* (&, not &&: no branches, so that a loop over a block vectorizes) */
    return !(isfinite(delta) & isfinite(m2) & (m2 * inv_n >= TINY_VAR));
}

static int FN(wants_rescue)(const cn_fwd_args *a, const XT *x, double delta, double m2, double inv_n)
{
    if (!CN_UNLIKELY(FN(may_need_rescue)(delta, m2, inv_n))) return 0;
    if (CN_UNLIKELY(!(isfinite(delta) && isfinite(m2)))) return FN(row_is_finite)(x, a->N);
    if (a->eps >= TINY_VAR && (!a->center || FN(row_is_constant)(x, a->N))) return 0;
    return FN(row_is_finite)(x, a->N);
}

/* ----------------------------------------- forward: chunk-level pieces -- */

static void FN(fwd_chunk)(const cn_fwd_args *a, int64_t r, int64_t c0, int64_t c1, cn_moments *m)
{
    const XT *row = (const XT *)a->x + r * a->N;
    AT pivot = a->center ? (AT)X2A(row[0]) : (AT)0;
    if (a->center) FN(chunk_moments)(row + c0, c1 - c0, pivot, 1, m);
    else FN(chunk_moments)(row + c0, c1 - c0, pivot, 0, m);
}

/* Turn merged moments into (pivot, delta, rstd), write mean/rstd. st->ok == 0
 * means the row is already finished (rescued) and must not be normalized. */
static void FN(fwd_finish)(const cn_fwd_args *a, int64_t r, const cn_moments *tot, cn_row_stats *st)
{
    const XT *row = (const XT *)a->x + r * a->N;
    AT pivot = a->center ? (AT)X2A(row[0]) : (AT)0;
    double rstd = cn_rstd(tot->m2, (double)a->N, a->eps);
    if (FN(wants_rescue)(a, row, tot->delta, tot->m2, 1.0 / (double)a->N)) {
        FN(fwd_rescue)(a, r);
        st->ok = 0;
        return;
    }
    st->ok = 1;
    st->pivot = (double)pivot;
    st->delta = tot->delta;
    st->rstd = (double)(AT)rstd;
    if (a->mean) ((AT *)a->mean)[r] = (AT)((double)pivot + tot->delta);
    ((AT *)a->rstd)[r] = (AT)rstd;
}

/* Normalize rows r..r+nrows-1 over columns c0..c1, walking the rows in order:
 * the weight/bias piece stays in L1 across the rows (for chw-style shapes it
 * is as long as a row), and each row's next piece is prefetched because the
 * walk jumps between rows. */
static void FN(fwd_apply)(const cn_fwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                          const cn_row_stats *st)
{
    const int64_t N = a->N, n = c1 - c0;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    const PT *b = a->b ? (const PT *)a->b + c0 : NULL;
    for (int64_t i = 0; i < nrows; i++) {
        const XT *x = (const XT *)a->x + (r + i) * N + c0;
        int64_t pf = i + 1 < nrows ? N : n - (nrows - 1) * N;  /* next row here, or back to the first, further on */
        if (!st[i].ok) continue;
        FN(apply)(x, (XT *)a->y + (r + i) * N + c0, w, b, n, (AT)st[i].pivot, st[i].delta, (AT)st[i].rstd,
                  a->center, a->stream, x + pf, c1 < N || i + 1 < nrows ? n : 0, 0);
    }
}

/* ------------------------------------------------ forward: small rows -- */

/* Rows of at most SMALL_MAX elements, taken SMALL_BLOCK rows at a time in
 * three phases: per-row sums in one pass (independent dependency chains that
 * the CPU overlaps; see block_onepass), one vectorizable rstd loop for the
 * whole block, then the normalizing pass, which rereads the rows from L1. The
 * arithmetic of a row never depends on the block it falls in. */
#define SMALL_BLOCK 16

/* out[i] = the lane sum of a[i] for i < nrows (<= SMALL_BLOCK), VL vectors per
 * transpose-and-add tree (cn_simd.h); a[nrows..] are zeroed first. out[i]
 * depends on a[i] alone, never on the other rows or on nrows. */
CN_INLINE void FN(hsum_rows)(V *a, int64_t nrows, AT *out)
{
    for (int64_t g = 0; g < nrows; g += VL) {
        for (int64_t i = nrows; i < g + VL; i++) a[i] = VOP(zero)();
        VOP(hsum_lanes)(a + g, out + g);
    }
}

/* rstd of a block's rows from their m2, one vectorizable loop. */
CN_INLINE void FN(block_rstd)(const cn_fwd_args *a, int64_t nrows, double inv_n, const double *m2, double *rstd)
{
    for (int64_t i = 0; i < nrows; i++) {
        double var = m2[i] * inv_n;
        var = var < 0.0 ? 0.0 : var;
        rstd[i] = 1.0 / sqrt(var + a->eps);
    }
}

/* The pivots of a block's rows (LayerNorm, small and medium rows): the mean of
 * each row's first min(N, VL) elements, from one lane-sum tree per VL rows. */
CN_INLINE void FN(block_pivots)(const XT *X, int64_t N, int64_t nrows, AT *pv)
{
    V hv[SMALL_BLOCK];
    AT h[SMALL_BLOCK];
    const int64_t np = N < VL ? N : VL;
    const double inv_np = 1.0 / (double)np;
    int64_t i;
    if (np == VL) for (i = 0; i < nrows; i++) hv[i] = XLD(X + i * N);
    else for (i = 0; i < nrows; i++) hv[i] = XLDN(X + i * N, np);
    FN(hsum_rows)(hv, nrows, h);
    for (i = 0; i < nrows; i++) pv[i] = (AT)((double)h[i] * inv_np);
}

/* A block's LayerNorm moments from one pass: sv, qv are each row's lane sums
 * of x - pv and (x - pv)^2. dd = mean - pv = s/n and m2 = q - s^2/n where
 * the pivot is close enough to the row mean for that to lose almost nothing
 * (onepass_moments' test: within sqrt(1/2) std); the other rows (a few
 * percent of Gaussian rows, and any row holding inf or NaN) are redone by the
 * corrected two-pass about their first element. Either way a row's result
 * depends on its own data alone. */
CN_INLINE void FN(block_onepass)(const XT *X, int64_t N, int64_t nrows, double inv_n, V *sv, V *qv, AT *pv,
                                 double *dd, double *m2)
{
    AT s[SMALL_BLOCK], q[SMALL_BLOCK];
    int refused[SMALL_BLOCK], any = 0;
    const double n = (double)N;
    int64_t i;
    FN(hsum_rows)(sv, nrows, s);
    FN(hsum_rows)(qv, nrows, q);
    for (i = 0; i < nrows; i++) {
        double ss = (double)s[i], qs = (double)q[i];
        refused[i] = !cn_onepass_accepts(ss, qs, n);
        any |= refused[i];
        dd[i] = ss * inv_n;
        m2[i] = qs - ss * dd[i];
    }
    if (CN_UNLIKELY(any))
        for (i = 0; i < nrows; i++) {
            if (!refused[i]) continue;
            const XT *x = X + i * N;
            cn_moments m;
            pv[i] = (AT)X2A(x[0]);
            FN(twopass_moments)(x, N, pv[i], &m);
            dd[i] = m.delta;
            m2[i] = m.m2;
        }
}

/* The per-row scalars of a block, as loops over the block: each row's mean
 * split into hi + lo (split_mean), -lo * rstd and rstd in the accumulator type;
 * mean and rstd written out. Returns whether any row may need fwd_rescue
 * (wants_rescue's cheap test), so the common block skips it row by row. */
CN_INLINE int FN(block_scalars)(const cn_fwd_args *a, int64_t r0, int64_t nrows, double inv_n, const AT *pv,
                                const double *dd, const double *m2, const double *rstd, AT *mh, AT *lr, AT *rs)
{
    int64_t i;
    int odd = 0;
    /* two loops: the compiler vectorizes each, not the two fused (measured:
     * rows of 56, 1 thread, from L2: 47.5 -> 42 cycles a row for bf16) */
    for (i = 0; i < nrows; i++) {
        AT lo;
        FN(split_mean)((double)pv[i], dd[i], &mh[i], &lo);
        rs[i] = (AT)rstd[i];
        lr[i] = -lo * rs[i];
    }
    for (i = 0; i < nrows; i++) odd |= FN(may_need_rescue)(dd[i], m2[i], inv_n);
    if (a->mean) for (i = 0; i < nrows; i++) ((AT *)a->mean)[r0 + i] = mh[i];
    for (i = 0; i < nrows; i++) ((AT *)a->rstd)[r0 + i] = rs[i];
    return odd;
}

/* Prefetch the n elements from p, a cache line at a time (short rows: the
 * hardware prefetcher alone left DRAM idle during each block's compute) */
CN_INLINE void FN(prefetch_span)(const XT *p, int64_t n)
{
    for (int64_t off = 0; off < n * (int64_t)sizeof(XT); off += 64) cn_prefetch((const char *)p + off);
}

/* A small row's NV vectors to storage (the last one holds `tail` lanes), two
 * full vectors at a time (see cn_vf_store2_bf16). */
CN_INLINE void FN(store_small_row)(XT *y, const V *o, const int NV, int64_t tail)
{
    CN_UNROLL for (int k = 0; k < NV; k += 2) {
        if (k + 1 < NV - 1 || (k + 1 == NV - 1 && tail == VL)) XST2(y + k * VL, o[k], o[k + 1]);
        else if (k + 1 < NV) { XST(y + k * VL, o[k]); XSTN(y + (k + 1) * VL, o[k + 1], tail); }
        else if (tail == VL) XST(y + k * VL, o[k]);
        else XSTN(y + k * VL, o[k], tail);
    }
}

CN_INLINE void FN(fwd_small_block)(const cn_fwd_args *a, int64_t r0, const int64_t nrows, const int NV,
                                   const int center, const V *wv, const V *bv, double inv_n)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const XT *X = (const XT *)a->x + r0 * N;
    XT *Y = (XT *)a->y + r0 * N;
    AT pv[SMALL_BLOCK];
    double dd[SMALL_BLOCK], m2[SMALL_BLOCK], rstd[SMALL_BLOCK];
    /* LayerNorm's per-row sums, reduced a block at a time (cheaper than two
     * reductions per row; RMSNorm's single one per row is faster as it is) */
    V sv[SMALL_BLOCK], sqv[SMALL_BLOCK];
    int64_t i;
    int k;
    /* 16-bit rows are widened once, in pass 1, into this L1 buffer */
    const int widen = sizeof(XT) != sizeof(AT);
    V wide[sizeof(XT) != sizeof(AT) ? SMALL_BLOCK : 1][8];   /* (a constant size: no VLA) */
#define CN_ROW_LOAD(v, x)                                                                   \
    CN_UNROLL for (k = 0; k < NV - 1; k++) v[k] = XLD((x) + k * VL);                        \
    v[NV - 1] = tail == VL ? XLD((x) + (NV - 1) * VL) : XLDN((x) + (NV - 1) * VL, tail)
#define CN_ROW_RELOAD(v, x, i)                                                              \
    if (widen) { CN_UNROLL for (k = 0; k < NV; k++) v[k] = wide[(i)][k]; }                  \
    else { CN_ROW_LOAD(v, x); }
    /* Short per-row loops (each row: loads, one reduction) whose iterations the
     * CPU overlaps, with the per-row scalar math done in between as loops over
     * the whole block, which the compiler vectorizes. */
    if (center) {
        FN(block_pivots)(X, N, nrows, pv);
        for (i = 0; i < nrows; i++) {                  /* one pass: sums of x - pv and (x - pv)^2 */
            const XT *x = X + i * N;
            V v[8];
            CN_ROW_LOAD(v, x);
            if (widen) { CN_UNROLL for (k = 0; k < NV; k++) wide[i][k] = v[k]; }
            V P = VOP(set1)(pv[i]);
            V e = VOP(keepn)(VOP(sub)(v[NV - 1], P), tail);
            V se = e, sq = VOP(mul)(e, e);
            CN_UNROLL for (k = 0; k < NV - 1; k++) {
                e = VOP(sub)(v[k], P);
                se = VOP(add)(se, e);
                sq = VOP(fmadd)(e, e, sq);
            }
            sv[i] = se;
            sqv[i] = sq;
        }
        FN(block_onepass)(X, N, nrows, inv_n, sv, sqv, pv, dd, m2);
    } else {
        for (i = 0; i < nrows; i++) {
            const XT *x = X + i * N;
            V v[8];
            CN_ROW_LOAD(v, x);
            if (widen) { CN_UNROLL for (k = 0; k < NV; k++) wide[i][k] = v[k]; }
            V sq = VOP(zero)();
            CN_UNROLL for (k = 0; k < NV; k++) sq = VOP(fmadd)(v[k], v[k], sq);
            m2[i] = (double)VOP(hsum)(sq);
            dd[i] = 0.0;
            pv[i] = 0;
        }
    }
    FN(block_rstd)(a, nrows, inv_n, m2, rstd);
    AT mh[SMALL_BLOCK], lr[SMALL_BLOCK], rs[SMALL_BLOCK];
    const int odd = FN(block_scalars)(a, r0, nrows, inv_n, pv, dd, m2, rstd, mh, lr, rs);
    for (i = 0; i < nrows; i++) {                      /* normalize, rereading from L1 */
        const XT *x = X + i * N;
        XT *y = Y + i * N;
        FN(prefetch_span)(x + nrows * N, N);           /* the same row of the next block */
        if (CN_UNLIKELY(odd) && FN(wants_rescue)(a, x, dd[i], m2[i], inv_n)) {
            FN(fwd_rescue)(a, r0 + i);                 /* (writes its own mean and rstd) */
            continue;
        }
        V MH = VOP(set1)(mh[i]), Rv = VOP(set1)(rs[i]), LR = VOP(set1)(lr[i]);
        V v[8];
        CN_ROW_RELOAD(v, x, i);
        V o[8];
        CN_UNROLL for (k = 0; k < NV; k++) {
            V e = center ? VOP(fmadd)(VOP(sub)(v[k], MH), Rv, LR) : VOP(mul)(v[k], Rv);
            o[k] = VOP(fmadd)(e, wv[k], bv[k]);
        }
        FN(store_small_row)(y, o, NV, tail);
    }
#undef CN_ROW_LOAD
#undef CN_ROW_RELOAD
}

CN_INLINE void FN(fwd_small_nv)(const cn_fwd_args *a, int64_t r0, int64_t r1, const int NV, const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const double inv_n = 1.0 / (double)N;
    V wv[8], bv[8];
    CN_UNROLL for (int k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? PLDN((const PT *)a->w + k * VL, t) : VOP(set1)((AT)1);
        bv[k] = a->b ? PLDN((const PT *)a->b + k * VL, t) : VOP(zero)();
    }
    for (int64_t r = r0; r < r1; r += SMALL_BLOCK)
        FN(fwd_small_block)(a, r, r1 - r < SMALL_BLOCK ? r1 - r : SMALL_BLOCK, NV, center, wv, bv, inv_n);
}

static void FN(fwd_small)(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
#define CN_FWD_SMALL(K, C) FN(fwd_small_nv)(a, r0, r1, K, C)
    CN_SMALL_DISPATCH(a, CN_FWD_SMALL)
#undef CN_FWD_SMALL
}

/* ----------------------------------------------- forward: medium rows -- */

/* Rows longer than SMALL_MAX, of at most CN_MED_ROW_BYTES, a block of up to
 * SMALL_BLOCK rows (their data within CN_MED_BLOCK_BYTES) at a time,
 * in the small-row kernel's phases: per-row sums reduced a block at a time,
 * one vectorizable rstd loop, then the normalizing passes, rereading the rows
 * from L1/L2. Row by row, each row waited on its own sum -> sqrt -> normalize
 * chain (~200 cycles, measured); here rows overlap. A row's arithmetic never
 * depends on its block. LayerNorm: one-pass moments where block_onepass
 * accepts them, as for small rows. (With a two-pass there, rows beyond
 * 1.5-2 KB lost more to the extra pass than they gained; with one pass,
 * harness, fp32/bf16, from DRAM: rows of 1024 -2/-5%, of 2048 -2/-2%.) */
CN_INLINE void FN(fwd_med_block)(const cn_fwd_args *a, int64_t r0, const int64_t nrows, const int center,
                                 double inv_n)
{
    const int64_t N = a->N;
    const XT *X = (const XT *)a->x + r0 * N;
    XT *Y = (XT *)a->y + r0 * N;
    AT pv[SMALL_BLOCK], q[SMALL_BLOCK];
    double dd[SMALL_BLOCK], m2[SMALL_BLOCK], rstd[SMALL_BLOCK];
    V sv[SMALL_BLOCK], qv[SMALL_BLOCK];
    int64_t i;
    if (center) {
        FN(block_pivots)(X, N, nrows, pv);
        for (i = 0; i < nrows; i++)                    /* one pass: sums of x - pv and (x - pv)^2 */
            FN(dev_moment_sums)(X + i * N, N, VOP(set1)(pv[i]), 0, &sv[i], &qv[i]);
        FN(block_onepass)(X, N, nrows, inv_n, sv, qv, pv, dd, m2);
    } else {
        for (i = 0; i < nrows; i++) qv[i] = FN(sumsq_vec)(X + i * N, N);   /* RMSNorm: sum of squares */
        FN(hsum_rows)(qv, nrows, q);
        for (i = 0; i < nrows; i++) { pv[i] = 0; dd[i] = 0.0; m2[i] = (double)q[i]; }
    }
    FN(block_rstd)(a, nrows, inv_n, m2, rstd);
    AT mh[SMALL_BLOCK], lr[SMALL_BLOCK], rs[SMALL_BLOCK];
    const int odd = FN(block_scalars)(a, r0, nrows, inv_n, pv, dd, m2, rstd, mh, lr, rs);
    for (i = 0; i < nrows; i++) {                      /* normalize, rereading from cache */
        const XT *x = X + i * N;
        if (CN_UNLIKELY(odd) && FN(wants_rescue)(a, x, dd[i], m2[i], inv_n)) {
            FN(fwd_rescue)(a, r0 + i);                 /* (writes its own mean and rstd) */
            continue;
        }
        /* prefetch the same row of the next block */
        int64_t npf = r0 + i + nrows < a->M ? N : 0;
        FN(apply_lr)(x, Y + i * N, (const PT *)a->w, (const PT *)a->b, N, mh[i], lr[i], rs[i], center,
                     a->stream, x + nrows * N, npf, a->prefetch_l2);
    }
}

static void FN(fwd_med)(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t row_bytes = a->N * (int64_t)sizeof(XT);
    const int64_t B = row_bytes * SMALL_BLOCK <= CN_MED_BLOCK_BYTES ? SMALL_BLOCK
                      : (CN_MED_BLOCK_BYTES / row_bytes > 1 ? CN_MED_BLOCK_BYTES / row_bytes : 1);
    const double inv_n = 1.0 / (double)a->N;
    for (int64_t r = r0; r < r1; r += B) {
        const int64_t nb = r1 - r < B ? r1 - r : B;
        if (a->center) FN(fwd_med_block)(a, r, nb, 1, inv_n);
        else FN(fwd_med_block)(a, r, nb, 0, inv_n);
    }
    if (a->stream) cn_stream_fence();
}

/* ------------------------------------------------------ forward: rows -- */

/* Stats of one whole row: chunk moments merged left to right (as the team path does). */
CN_INLINE void FN(fwd_row_stats)(const cn_fwd_args *a, int64_t r, cn_row_stats *st)
{
    const int64_t N = a->N;
    cn_moments tot, m;
    for (int64_t c0 = 0; c0 < N; c0 += CN_CHUNK) {
        int64_t c1 = c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N;
        FN(fwd_chunk)(a, r, c0, c1, &m);
        if (c0 == 0) tot = m;
        else cn_moments_merge(&tot, &m);
    }
    FN(fwd_finish)(a, r, &tot, st);
}

/* Whole rows, a few at a time. Short rows: the stats of the whole group
 * first, so one row's sqrt/divide chain overlaps the next row's pass 1, then
 * each row's normalizing pass from cache, prefetching the next group. Long
 * rows (weight and bias no longer fit in L1): stats row by row, then the
 * normalizing passes column chunk by column chunk across the group, so each
 * weight/bias chunk is read once per group instead of once per row. */
static void FN(fwd_rows)(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t N = a->N;
    const int64_t row_bytes = N * (int64_t)sizeof(XT);
    if (a->populate && row_bytes <= CN_LONG_ROW_BYTES) {
        /* fresh output: fault in ~1 MB slabs just before they are written
         * (long rows do it per group, below); rows never depend on the slab */
        const int64_t slab = cn_populate_slab_rows(row_bytes, 1);
        cn_fwd_args b = *a;
        b.populate = 0;
        for (int64_t r = r0; r < r1; r += slab) {
            const int64_t e = r1 - r < slab ? r1 : r + slab;
            cn_populate_write((XT *)a->y + r * N, (size_t)((e - r) * N) * sizeof(XT));
            FN(fwd_rows)(&b, r, e);
        }
        return;
    }
    if (N <= SMALL_MAX) { FN(fwd_small)(a, r0, r1); return; }   /* (plain stores: no fence) */
    if (row_bytes <= CN_MED_ROW_BYTES && N <= CN_CHUNK) { FN(fwd_med)(a, r0, r1); return; }
    const PT *W = (const PT *)a->w, *B = (const PT *)a->b;
    cn_row_stats st[CN_LONG_GROUP_BIG > 4 ? CN_LONG_GROUP_BIG : 4];   /* short rows: groups of up to 4 */
    if (row_bytes > CN_LONG_ROW_BYTES) {
        const int64_t G = a->long_group;   /* 1..CN_LONG_GROUP_BIG: the driver's _fwd_long_group */
        for (int64_t r = r0; r < r1; r += G) {
            const int64_t nb = r1 - r < G ? r1 - r : G;
            if (a->populate) cn_populate_write((XT *)a->y + r * N, (size_t)(nb * N) * sizeof(XT));
            for (int64_t i = 0; i < nb; i++) FN(fwd_row_stats)(a, r + i, &st[i]);
            for (int64_t c0 = 0; c0 < N; c0 += CN_APPLY_CHUNK)
                FN(fwd_apply)(a, r, nb, c0, c0 + CN_APPLY_CHUNK < N ? c0 + CN_APPLY_CHUNK : N, st);
        }
    } else {
        const int64_t RB = row_bytes * 4 <= CN_FWD_GROUP_BYTES ? 4 : row_bytes * 2 <= CN_FWD_GROUP_BYTES ? 2 : 1;
        for (int64_t r = r0; r < r1; r += RB) {
            const int64_t nb = r1 - r < RB ? r1 - r : RB;
            for (int64_t i = 0; i < nb; i++) FN(fwd_row_stats)(a, r + i, &st[i]);
            for (int64_t i = 0; i < nb; i++) {
                const XT *x = (const XT *)a->x + (r + i) * N;
                int64_t npf = r + i + RB < a->M ? (N < CN_PREFETCH_MAX ? N : CN_PREFETCH_MAX) : 0;
                if (!st[i].ok) continue;
                FN(apply)(x, (XT *)a->y + (r + i) * N, W, B, N, (AT)st[i].pivot, st[i].delta,
                          (AT)st[i].rstd, a->center, a->stream, x + RB * N, npf, a->prefetch_l2);
            }
        }
    }
    if (a->stream) cn_stream_fence();
}

/* ------------------------------------------------ backward: chunk pieces -- */

/* Pass 1 over one chunk of R consecutive rows: per row s1 = sum g and
 * s2 = sum g*xhat (g = dy*w, xhat = (x - mean)*rstd), and the rows'
 * contributions to the block partials, dwp += dy*xhat and dbp += dy, added
 * row after row (the first row writes instead of adding when init).
 * Taking R rows together loads and stores the partials once per R rows; each
 * row's arithmetic is exactly that of R == 1, so R never changes a bit.
 * Meanwhile npf elements at pfo on from each row are prefetched into L2 (the
 * team path's next piece, see _backward_team). */
CN_INLINE void FN(bwd_sums_impl)(const XT *dy, const XT *x, const PT *w, int64_t n, int64_t ld, const AT *mean,
                                 const AT *rstd, AT *dwp, AT *dbp, const int R, const int center, const int has_w,
                                 const int part, const int init, AT *s1, AT *s2, int64_t pfo, int64_t npf)
{
    V Mv[4], Rv[4], s1a[4], s1b[4], s2a[4], s2b[4], z = VOP(zero)();
    int64_t j = 0;
    int i;
    CN_UNROLL for (i = 0; i < R; i++) {
        Mv[i] = VOP(set1)(center ? mean[i] : (AT)0);
        Rv[i] = VOP(set1)(rstd[i]);
        s1a[i] = s1b[i] = s2a[i] = s2b[i] = z;
    }
#define CN_BWD_STEP(J, LDX, LDP, LDA, STA, KEEP, S1, S2)                                         \
    {                                                                                            \
        V wv = has_w ? LDP(w + (J)) : z, dw_acc = z, db_acc = z;                                 \
        CN_UNROLL for (i = 0; i < R; i++) {                                                      \
            V xv = LDX(x + i * ld + (J)), dyv = LDX(dy + i * ld + (J));                          \
            V xh = center ? VOP(mul)(VOP(sub)(xv, Mv[i]), Rv[i]) : VOP(mul)(xv, Rv[i]);          \
            xh = KEEP(xh);                                                                       \
            V g = has_w ? VOP(mul)(dyv, wv) : dyv;                                               \
            if (center) S1[i] = VOP(add)(S1[i], g);                                              \
            S2[i] = VOP(fmadd)(g, xh, S2[i]);                                                    \
            if (part) {                                                                          \
                if (i == 0 && init) { dw_acc = VOP(mul)(dyv, xh); db_acc = dyv; }                \
                else {                                                                           \
                    if (i == 0) { dw_acc = LDA(dwp + (J)); if (center) db_acc = LDA(dbp + (J)); } \
                    dw_acc = VOP(fmadd)(dyv, xh, dw_acc);                                        \
                    if (center) db_acc = VOP(add)(dyv, db_acc);                                  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        if (part) {                                                                              \
            STA(dwp + (J), dw_acc);                                                              \
            if (center) STA(dbp + (J), db_acc);                                                  \
        }                                                                                        \
    }
#define CN_ID(v) (v)
#define CN_SUMS_PF(J) if ((J) < npf) { CN_UNROLL for (i = 0; i < R; i++) { cn_prefetch_l2(x + i * ld + pfo + (J)); cn_prefetch_l2(dy + i * ld + pfo + (J)); } }
    for (; j + 2 * VL <= n; j += 2 * VL) {
        CN_SUMS_PF(j) CN_SUMS_PF(j + VL)
        CN_BWD_STEP(j, XLD, PLD, ALD, AST, CN_ID, s1a, s2a)
        CN_BWD_STEP(j + VL, XLD, PLD, ALD, AST, CN_ID, s1b, s2b)
    }
    for (; j + VL <= n; j += VL) CN_BWD_STEP(j, XLD, PLD, ALD, AST, CN_ID, s1a, s2a)
    if (j < n) {
        const int64_t t = n - j;
#define CN_LDX_T(p) XLDN(p, t)
#define CN_LDP_T(p) PLDN(p, t)
#define CN_LDA_T(p) ALDN(p, t)
#define CN_STA_T(p, v) ASTN(p, v, t)
#define CN_KEEP_T(v) VOP(keepn)(v, t)
        CN_BWD_STEP(j, CN_LDX_T, CN_LDP_T, CN_LDA_T, CN_STA_T, CN_KEEP_T, s1b, s2b)
#undef CN_LDX_T
#undef CN_LDP_T
#undef CN_LDA_T
#undef CN_STA_T
#undef CN_KEEP_T
    }
#undef CN_ID
#undef CN_SUMS_PF
#undef CN_BWD_STEP
    CN_UNROLL for (i = 0; i < R; i++) {
        s1[i] = VOP(hsum)(VOP(add)(s1a[i], s1b[i]));
        s2[i] = VOP(hsum)(VOP(add)(s2a[i], s2b[i]));
    }
}

/* rows r .. r+R-1, columns c0..c1 (R = 1..4) */
static void FN(bwd_chunk_rows)(const cn_bwd_args *a, int64_t r, int R, int64_t c0, int64_t c1, void *dwp_,
                               void *dbp_, int init, AT *s1, AT *s2, int64_t pfo, int64_t npf)
{
    const int64_t N = a->N, n = c1 - c0;
    const XT *dy = (const XT *)a->dy + r * N + c0, *x = (const XT *)a->x + r * N + c0;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    /* partials only with a weight, dbias only for LayerNorm: checked here for both callers */
    AT *dwp = dwp_ && w ? (AT *)dwp_ + c0 : NULL, *dbp = dbp_ && dwp && a->center ? (AT *)dbp_ + c0 : NULL;
    const AT *mean = a->center ? (const AT *)a->mean + r : NULL, *rstd = (const AT *)a->rstd + r;
#define CN_CALL(RR, C, W, P, I) FN(bwd_sums_impl)(dy, x, w, n, N, mean, rstd, dwp, dbp, RR, C, W, P, I, s1, s2, pfo, npf)
#define CN_BY_R(C, W, P, I)                                                                       \
    switch (R) {                                                                                  \
    case 1: CN_CALL(1, C, W, P, I); break;                                                        \
    case 2: CN_CALL(2, C, W, P, I); break;                                                        \
    case 3: CN_CALL(3, C, W, P, I); break;                                                        \
    default: CN_CALL(4, C, W, P, I); break;                                                       \
    }
    /* partials (dwp) only come with a weight; sums alone may still use one */
    if (a->center) {
        if (dwp) { if (init) CN_BY_R(1, 1, 1, 1) else CN_BY_R(1, 1, 1, 0) }
        else if (w) CN_BY_R(1, 1, 0, 0)
        else CN_BY_R(1, 0, 0, 0)
    } else {
        if (dwp) { if (init) CN_BY_R(0, 1, 1, 1) else CN_BY_R(0, 1, 1, 0) }
        else if (w) CN_BY_R(0, 1, 0, 0)
        else CN_BY_R(0, 0, 0, 0)
    }
#undef CN_BY_R
#undef CN_CALL
}

/* Team path, phase A: the sums of R rows (1..4) from r over one chunk; row
 * i's sums go to s1[i*stride], s2[i*stride]. With dwp, the rows are also
 * added into the block partials (init: row r is the block's first). */
static void FN(bwd_chunk)(const cn_bwd_args *a, int64_t r, int R, int64_t c0, int64_t c1, double *s1, double *s2,
                          int64_t stride, void *dwp, void *dbp, int init, int64_t pfo, int64_t npf)
{
    AT t1[4], t2[4];
    FN(bwd_chunk_rows)(a, r, R, c0, c1, dwp, dbp, init, t1, t2, pfo, npf);
    for (int i = 0; i < R; i++) {
        s1[i * stride] = (double)t1[i];
        s2[i * stride] = (double)t2[i];
    }
}

/* Pass 2: dx = rstd * (g - c1 - xhat * c2), c1 = mean(g), c2 = mean(g * xhat).
 * stream: non-temporal stores for the aligned middle; pf/npf: prefetch the
 * row that far on while this one is computed from cache.
 * acc (team path): also add the row into the partials dwp (+ dbp when
 * has_db), writing instead of adding when acc == 1 -- the same operations as
 * in bwd_sums_impl, so the partials come out bit-identical. */
CN_INLINE void FN(bwd_dx_impl)(const XT *dy, const XT *x, const PT *w, XT *dx, int64_t n, AT mean, AT rstd, AT c1,
                               AT c2, const int center, const int has_w, const int stream, int64_t pf, int64_t npf,
                               AT *dwp, AT *dbp, const int acc, const int has_db)
{
    V Mv = VOP(set1)(mean), R = VOP(set1)(rstd), C1 = VOP(set1)(c1), C2 = VOP(set1)(c2);
    int64_t j = 0, head = stream ? FN(stream_peel)(dx, n) : 0;
#define CN_DXV(out, J, T, LDX, LDP, LDA, STA)                                             \
    {                                                                                     \
        V xv = LDX(x + (J), T), dyv = LDX(dy + (J), T), g = dyv;                          \
        V xh = center ? VOP(mul)(VOP(sub)(xv, Mv), R) : VOP(mul)(xv, R);                  \
        if (has_w) g = VOP(mul)(g, LDP(w + (J), T));                                      \
        if (center) g = VOP(sub)(g, C1);                                                  \
        out = VOP(mul)(VOP(fnmadd)(xh, C2, g), R);                                        \
        if (acc) {                                                                        \
            STA(dwp + (J), acc == 1 ? VOP(mul)(dyv, xh) : VOP(fmadd)(dyv, xh, LDA(dwp + (J), T)), T); \
            if (has_db) STA(dbp + (J), acc == 1 ? dyv : VOP(add)(dyv, LDA(dbp + (J), T)), T); \
        }                                                                                 \
    }
#define CN_DX(J, T, LDX, LDP, LDA, STA, STORE) { V o_; CN_DXV(o_, J, T, LDX, LDP, LDA, STA) STORE(dx + (J), o_, T); }
    /* two vectors a step, stored as a pair (see cn_vf_store2_bf16) */
#define CN_DX2(J, STORE2)                                                                 \
    {                                                                                     \
        V o0_, o1_;                                                                       \
        CN_DXV(o0_, J, VL, CN_LDX_FULL, CN_LDP_FULL, CN_LDA_FULL, CN_STA_FULL)            \
        CN_DXV(o1_, (J) + VL, VL, CN_LDX_FULL, CN_LDP_FULL, CN_LDA_FULL, CN_STA_FULL)     \
        STORE2(dx + (J), o0_, o1_);                                                       \
    }
#define CN_LDX_FULL(p, t) XLD(p)
#define CN_LDP_FULL(p, t) PLD(p)
#define CN_LDA_FULL(p, t) ALD(p)
#define CN_STA_FULL(p, v, t) AST(p, v)
#define CN_ST_FULL(p, v, t) XST(p, v)
#define CN_ST_STREAM(p, v, t) XSTREAM(p, v)
#define CN_LDX_PART(p, t) XLDN(p, t)
#define CN_LDP_PART(p, t) PLDN(p, t)
#define CN_LDA_PART(p, t) ALDN(p, t)
#define CN_STA_PART(p, v, t) ASTN(p, v, t)
#define CN_ST_PART(p, v, t) XSTN_ROW(p, v, t, stream)
    if (head) CN_DX(0, head, CN_LDX_PART, CN_LDP_PART, CN_LDA_PART, CN_STA_PART, CN_ST_PART)
    j = head;
#define CN_DX_PF(J) if ((J) < npf) { cn_prefetch(x + pf + (J)); cn_prefetch(dy + pf + (J)); }
    if (stream) {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            CN_DX_PF(j) CN_DX_PF(j + VL)
            CN_DX2(j, XSTREAM2)
        }
        if (j + VL <= n) { CN_DX_PF(j) CN_DX(j, VL, CN_LDX_FULL, CN_LDP_FULL, CN_LDA_FULL, CN_STA_FULL, CN_ST_STREAM) j += VL; }
    } else {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            CN_DX_PF(j) CN_DX_PF(j + VL)
            CN_DX2(j, XST2)
        }
        if (j + VL <= n) { CN_DX_PF(j) CN_DX(j, VL, CN_LDX_FULL, CN_LDP_FULL, CN_LDA_FULL, CN_STA_FULL, CN_ST_FULL) j += VL; }
    }
    if (j < n) CN_DX(j, n - j, CN_LDX_PART, CN_LDP_PART, CN_LDA_PART, CN_STA_PART, CN_ST_PART)
#undef CN_DX_PF
#undef CN_DXV
#undef CN_DX
#undef CN_DX2
#undef CN_LDX_FULL
#undef CN_LDP_FULL
#undef CN_LDA_FULL
#undef CN_STA_FULL
#undef CN_ST_FULL
#undef CN_ST_STREAM
#undef CN_LDX_PART
#undef CN_LDP_PART
#undef CN_LDA_PART
#undef CN_STA_PART
#undef CN_ST_PART
}

/* dx of row r, columns c0..c1; with dwp (team path) also the partials (acc 1: write, 2: add) */
CN_INLINE void FN(bwd_dx_range)(const cn_bwd_args *a, int64_t r, int64_t c0, int64_t c1, double s1, double s2,
                                int64_t pf, int64_t npf, AT *dwp, AT *dbp, int acc)
{
    const int64_t N = a->N, n = c1 - c0;
    const XT *dy = (const XT *)a->dy + r * N + c0, *x = (const XT *)a->x + r * N + c0;
    XT *dx = (XT *)a->dx + r * N + c0;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    AT mean = a->center ? ((const AT *)a->mean)[r] : (AT)0, rstd = ((const AT *)a->rstd)[r];
    AT k1 = (AT)(s1 / (double)N), k2 = (AT)(s2 / (double)N);
    if (dwp) { dwp += c0; if (dbp) dbp += c0; }
#define CN_B(C, W, ACC, DB) \
    (a->stream ? FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, C, W, 1, pf, npf, dwp, dbp, ACC, DB) \
               : FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, C, W, 0, pf, npf, dwp, dbp, ACC, DB))
    if (!dwp || !w) {
        if (a->center) { if (w) CN_B(1, 1, 0, 0); else CN_B(1, 0, 0, 0); }
        else { if (w) CN_B(0, 1, 0, 0); else CN_B(0, 0, 0, 0); }
    } else if (a->center) {
        if (acc == 1) CN_B(1, 1, 1, 1); else CN_B(1, 1, 2, 1);
    } else {
        if (acc == 1) CN_B(0, 1, 1, 0); else CN_B(0, 1, 2, 0);
    }
#undef CN_B
}

/* dx of a whole row from cache, prefetching the row pf_rows further on */
static void FN(bwd_row_dx)(const cn_bwd_args *a, int64_t r, int64_t pf_rows, double s1, double s2)
{
    const int64_t N = a->N;
    int64_t npf = r + pf_rows < a->M ? (N < CN_PREFETCH_MAX ? N : CN_PREFETCH_MAX) : 0;
    FN(bwd_dx_range)(a, r, 0, N, s1, s2, pf_rows * N, npf, NULL, NULL, 0);
}

/* dx of R rows (1..4) from r, columns c0..c1, adding each row in turn into
 * the partials (init: row r writes them). The partials stay in registers
 * across the R rows -- the same operations, in the same order, as R calls of
 * bwd_dx_impl, so the bits are those of one row at a time. */
CN_INLINE void FN(bwd_dx_rows_impl)(const cn_bwd_args *a, int64_t r, const int R, int64_t c0, int64_t c1,
                                    const double *rowsums, AT *dwp, AT *dbp, const int init, const int center,
                                    const int has_db, const int stream, int64_t pfo, int64_t npf)
{
    const int64_t N = a->N, n = c1 - c0;
    const XT *x[4], *dy[4];
    XT *dx[4];
    V Mv[4], Rv[4], C1[4], C2[4];
    const PT *w = (const PT *)a->w + c0;
    int i;
    CN_UNROLL for (i = 0; i < R; i++) {
        x[i] = (const XT *)a->x + (r + i) * N + c0;
        dy[i] = (const XT *)a->dy + (r + i) * N + c0;
        dx[i] = (XT *)a->dx + (r + i) * N + c0;
        Mv[i] = VOP(set1)(center ? ((const AT *)a->mean)[r + i] : (AT)0);
        Rv[i] = VOP(set1)(((const AT *)a->rstd)[r + i]);
        C1[i] = VOP(set1)((AT)(rowsums[2 * i] / (double)N));
        C2[i] = VOP(set1)((AT)(rowsums[2 * i + 1] / (double)N));
    }
    dwp += c0;
    if (has_db) dbp += c0;
    /* non-temporal stores need the same alignment in every row, and several
     * rows at once only where that was measured to pay (CN_MULTIROW_STREAM) */
    int64_t head = stream ? FN(stream_peel)(dx[0], n) : 0;
    const int nt = stream && (R == 1 || (CN_MULTIROW_STREAM && (N * (int64_t)sizeof(XT)) % STREAM_ALIGN == 0));
    if (!nt) head = 0;
    /* row i, columns J..: dx into out, the row added into the partials dwa/dba */
#define CN_DXR_TERM(J, LDX, LDA, wv, dwa, dba, out)                                            \
    {                                                                                          \
        V xv = LDX(x[i] + (J)), dyv = LDX(dy[i] + (J));                                        \
        V xh = center ? VOP(mul)(VOP(sub)(xv, Mv[i]), Rv[i]) : VOP(mul)(xv, Rv[i]);            \
        V g = VOP(mul)(dyv, wv);                                                               \
        if (center) g = VOP(sub)(g, C1[i]);                                                    \
        out = VOP(mul)(VOP(fnmadd)(xh, C2[i], g), Rv[i]);                                      \
        if (i == 0 && init) { dwa = VOP(mul)(dyv, xh); if (has_db) dba = dyv; }                \
        else {                                                                                 \
            if (i == 0) { dwa = LDA(dwp + (J)); if (has_db) dba = LDA(dbp + (J)); }             \
            dwa = VOP(fmadd)(dyv, xh, dwa);                                                    \
            if (has_db) dba = VOP(add)(dyv, dba);                                              \
        }                                                                                      \
    }
#define CN_DXR(J, LDX, LDP, LDA, STA, STORE)                                                   \
    {                                                                                          \
        V wv = LDP(w + (J)), dwa = VOP(zero)(), dba = VOP(zero)();                             \
        CN_UNROLL for (i = 0; i < R; i++) {                                                    \
            V o_;                                                                              \
            CN_DXR_TERM(J, LDX, LDA, wv, dwa, dba, o_)                                         \
            STORE(dx[i] + (J), o_);                                                            \
        }                                                                                      \
        STA(dwp + (J), dwa);                                                                   \
        if (has_db) STA(dbp + (J), dba);                                                       \
    }
    /* two vectors a step, each row's stored as a pair (see cn_vf_store2_bf16) */
#define CN_DXR2(J, STORE2)                                                                     \
    {                                                                                          \
        V wv0 = PLD(w + (J)), wv1 = PLD(w + (J) + VL), z_ = VOP(zero)();                       \
        V dwa0 = z_, dba0 = z_, dwa1 = z_, dba1 = z_;                                          \
        CN_UNROLL for (i = 0; i < R; i++) {                                                    \
            V o0_, o1_;                                                                        \
            CN_DXR_TERM(J, CN_ID_LDX, CN_ID_LDA, wv0, dwa0, dba0, o0_)                         \
            CN_DXR_TERM((J) + VL, CN_ID_LDX, CN_ID_LDA, wv1, dwa1, dba1, o1_)                  \
            STORE2(dx[i] + (J), o0_, o1_);                                                     \
        }                                                                                      \
        AST(dwp + (J), dwa0);                                                                  \
        AST(dwp + (J) + VL, dwa1);                                                             \
        if (has_db) { AST(dbp + (J), dba0); AST(dbp + (J) + VL, dba1); }                       \
    }
    int64_t j = 0;
    if (head) {
        const int64_t t = head;
#define CN_LDX_T(p) XLDN(p, t)
#define CN_LDP_T(p) PLDN(p, t)
#define CN_LDA_T(p) ALDN(p, t)
#define CN_STA_T(p, v) ASTN(p, v, t)
#define CN_ST_T(p, v) XSTN_ROW(p, v, t, nt)
        CN_DXR(0, CN_LDX_T, CN_LDP_T, CN_LDA_T, CN_STA_T, CN_ST_T)
        j = head;
    }
#define CN_ID_LDX(p) XLD(p)
#define CN_ID_LDP(p) PLD(p)
#define CN_ID_LDA(p) ALD(p)
#define CN_ID_STA(p, v) AST(p, v)
#define CN_ID_ST(p, v) XST(p, v)
#define CN_ID_STREAM(p, v) XSTREAM(p, v)
#define CN_DXR_PF(J) if ((J) < npf) { CN_UNROLL for (i = 0; i < R; i++) { cn_prefetch(x[i] + pfo + (J)); cn_prefetch(dy[i] + pfo + (J)); } }
    if (nt) {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            CN_DXR_PF(j) CN_DXR_PF(j + VL)
            CN_DXR2(j, XSTREAM2)
        }
        if (j + VL <= n) { CN_DXR_PF(j) CN_DXR(j, CN_ID_LDX, CN_ID_LDP, CN_ID_LDA, CN_ID_STA, CN_ID_STREAM) j += VL; }
    } else {
        for (; j + 2 * VL <= n; j += 2 * VL) {
            CN_DXR_PF(j) CN_DXR_PF(j + VL)
            CN_DXR2(j, XST2)
        }
        if (j + VL <= n) { CN_DXR_PF(j) CN_DXR(j, CN_ID_LDX, CN_ID_LDP, CN_ID_LDA, CN_ID_STA, CN_ID_ST) j += VL; }
    }
    if (j < n) {
        const int64_t t = n - j;
        CN_DXR(j, CN_LDX_T, CN_LDP_T, CN_LDA_T, CN_STA_T, CN_ST_T)
    }
#undef CN_LDX_T
#undef CN_LDP_T
#undef CN_LDA_T
#undef CN_STA_T
#undef CN_ST_T
#undef CN_ID_LDX
#undef CN_ID_LDP
#undef CN_ID_LDA
#undef CN_ID_STA
#undef CN_ID_ST
#undef CN_ID_STREAM
#undef CN_DXR
#undef CN_DXR2
#undef CN_DXR_TERM
#undef CN_DXR_PF
}

/* dx of rows r..r+nrows-1 (in order), columns c0..c1, each row added into
 * the partials dw (and db) -- the block's first row, r == first, writes them.
 * Up to 4 rows per sweep, the partials kept in registers. While it sweeps,
 * it prefetches npf elements at pfo elements on from each row. */
static void FN(bwd_dx_rows_acc)(const cn_bwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                                const double *rowsums, AT *dw, AT *db, int64_t first, int64_t pfo, int64_t npf)
{
    for (int64_t i = 0, R = 0; i < nrows; i += R) {
        R = nrows - i < 4 ? nrows - i : 4;
        if (first > r + i && first < r + i + R) R = first - (r + i);   /* a block starts inside */
        const int init = r + i == first;
#define CN_R(RR, C, DB, ST) FN(bwd_dx_rows_impl)(a, r + i, RR, c0, c1, rowsums + 2 * i, dw, db, init, C, DB, ST, pfo, npf)
#define CN_RS(RR, C, DB) if (a->stream) CN_R(RR, C, DB, 1); else CN_R(RR, C, DB, 0);
#define CN_RC(RR) if (a->center) { CN_RS(RR, 1, 1) } else { CN_RS(RR, 0, 0) }
        switch ((int)R) {
        case 1: CN_RC(1) break;
        case 2: CN_RC(2) break;
        case 3: CN_RC(3) break;
        default: CN_RC(4) break;
        }
#undef CN_RC
#undef CN_RS
#undef CN_R
    }
}

/* Team path, phase C: rows r..r+nrows-1 (in order), columns c0..c1: dx, and
 * each row added into the block partials (the block's first row, r == first,
 * writes them). rowsums holds (s1, s2) per row. With partials, rows go four
 * at a time (bwd_dx_rows_acc), prefetching each row's next chunk; without,
 * one at a time, each prefetching the next row's piece (the walk jumps
 * between rows, which the hardware prefetcher does not follow). */
static void FN(bwd_apply)(const cn_bwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                          const double *rowsums, void *dwp, void *dbp, int64_t first)
{
    AT *dw = a->w ? (AT *)dwp : NULL, *db = (a->w && a->center) ? (AT *)dbp : NULL;
    const int64_t N = a->N, n = c1 - c0;
    if (dw != NULL) {
        const int64_t next = c1 < N ? (c1 + CN_CHUNK <= N ? CN_CHUNK : N - c1) : 0;
        FN(bwd_dx_rows_acc)(a, r, nrows, c0, c1, rowsums, dw, db, first, n, next);
        return;
    }
    for (int64_t i = 0; i < nrows; i++) {
        /* next row, same columns; after the last row, the first row's next columns */
        int64_t pf = i + 1 < nrows ? N : n - (nrows - 1) * N;
        FN(bwd_dx_range)(a, r + i, c0, c1, rowsums[2 * i], rowsums[2 * i + 1], pf, n, dw, db,
                         r + i == first ? 1 : 2);
    }
}

/* ----------------------------------- backward: small rows in registers -- */

/* Small rows, SMALL_BLOCK at a time: first each row's two sums (overlapping
 * chains), then dx and the block partials, rereading the rows from L1. The
 * partials add the rows in order, so blocks never change a bit. */
CN_INLINE void FN(bwd_small_block)(const cn_bwd_args *a, int64_t r0, const int64_t nrows, const int NV,
                                   const int center, const V *wv, V *dwacc, V *dbacc, double inv_n)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const AT *MEAN = (const AT *)a->mean, *RSTD = (const AT *)a->rstd;
    const XT *X = (const XT *)a->x + r0 * N, *DY = (const XT *)a->dy + r0 * N;
    XT *DX = (XT *)a->dx + r0 * N;
    AT c1[SMALL_BLOCK], c2[SMALL_BLOCK];
    int64_t i;
    int k;
#define CN_SMALL_LOAD(v, p, k) v = (k < NV - 1 || tail == VL) ? XLD((p) + k * VL) : XLDN((p) + k * VL, tail)
#define CN_SMALL_XHAT(h, xv, k)                                                                 \
    h = center ? VOP(mul)(VOP(sub)(xv, Mv), Rv) : VOP(mul)(xv, Rv);                            \
    if (k == NV - 1) h = VOP(keepn)(h, tail)
    /* row i, vector k: x, dy, xhat and g = dy * w (both passes recompute them from L1) */
#define CN_SMALL_TERMS(k)                                                                       \
    V xv, dyv, h;                                                                               \
    CN_SMALL_LOAD(xv, X + i * N, k);                                                            \
    CN_SMALL_LOAD(dyv, DY + i * N, k);                                                          \
    CN_SMALL_XHAT(h, xv, k);                                                                    \
    V g = VOP(mul)(dyv, wv[k])
    V acc1[SMALL_BLOCK], acc2[SMALL_BLOCK];
    for (i = 0; i < nrows; i++) {
        V Mv = VOP(set1)(center ? MEAN[r0 + i] : (AT)0), Rv = VOP(set1)(RSTD[r0 + i]);
        V s1 = VOP(zero)(), s2 = VOP(zero)();
        CN_UNROLL for (k = 0; k < NV; k++) {
            CN_SMALL_TERMS(k);
            s1 = VOP(add)(s1, g);
            s2 = VOP(fmadd)(g, h, s2);
        }
        acc1[i] = s1;
        acc2[i] = s2;
    }
    if (center) FN(hsum_rows)(acc1, nrows, c1);
    FN(hsum_rows)(acc2, nrows, c2);
    for (i = 0; i < nrows; i++) {
        c1[i] = center ? (AT)((double)c1[i] * inv_n) : (AT)0;
        c2[i] = (AT)((double)c2[i] * inv_n);
    }
    for (i = 0; i < nrows; i++) {
        V Mv = VOP(set1)(center ? MEAN[r0 + i] : (AT)0), Rv = VOP(set1)(RSTD[r0 + i]);
        V C1 = VOP(set1)(c1[i]), C2 = VOP(set1)(c2[i]), o[8];
        FN(prefetch_span)(X + (nrows + i) * N, N);     /* the same row of the next block */
        FN(prefetch_span)(DY + (nrows + i) * N, N);
        CN_UNROLL for (k = 0; k < NV; k++) {
            CN_SMALL_TERMS(k);
            V t = center ? VOP(sub)(g, C1) : g;
            o[k] = VOP(mul)(VOP(fnmadd)(h, C2, t), Rv);
            dwacc[k] = VOP(fmadd)(dyv, h, dwacc[k]);
            dbacc[k] = VOP(add)(dbacc[k], dyv);
        }
        FN(store_small_row)(DX + i * N, o, NV, tail);
    }
#undef CN_SMALL_LOAD
#undef CN_SMALL_XHAT
#undef CN_SMALL_TERMS
}

CN_INLINE void FN(bwd_small_nv)(const cn_bwd_args *a, int64_t r0, int64_t r1, AT *dwp, AT *dbp, const int NV,
                                const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const double inv_n = 1.0 / (double)N;
    V wv[8], dwacc[8], dbacc[8];
    int k;
    CN_UNROLL for (k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? PLDN((const PT *)a->w + k * VL, t) : VOP(set1)((AT)1);
        dwacc[k] = VOP(zero)();
        dbacc[k] = VOP(zero)();
    }
    for (int64_t r = r0; r < r1; r += SMALL_BLOCK)
        FN(bwd_small_block)(a, r, r1 - r < SMALL_BLOCK ? r1 - r : SMALL_BLOCK, NV, center, wv, dwacc, dbacc, inv_n);
    if (dwp) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            int64_t t = k < NV - 1 ? VL : tail;
            ASTN(dwp + k * VL, dwacc[k], t);
            if (dbp) ASTN(dbp + k * VL, dbacc[k], t);
        }
    }
}

static void FN(bwd_small)(const cn_bwd_args *a, int64_t r0, int64_t r1, AT *dwp, AT *dbp)
{
#define CN_BWD_SMALL(K, C) FN(bwd_small_nv)(a, r0, r1, dwp, dbp, K, C)
    CN_SMALL_DISPATCH(a, CN_BWD_SMALL)
#undef CN_BWD_SMALL
}

/* ----------------------------------------------------- backward: rows -- */

/* Rows [r0, r1) of one block; dwp/dbp (N values each, or NULL) receive the
 * block's partial sums of dy*xhat and dy. Rows go R at a time through pass 1
 * (see bwd_sums_impl), then each gets its dx pass from cache. */
static void FN(bwd_rows)(const cn_bwd_args *a, int64_t r0, int64_t r1, void *dwp, void *dbp)
{
    const int64_t N = a->N;
    if (!a->center) dbp = NULL;
    if (!a->w) dwp = dbp = NULL;
    if (N <= SMALL_MAX) {
        /* fresh dx: fault in the block's pages before its rows are read (see cn_populate_write) */
        if (a->populate) cn_populate_write((XT *)a->dx + r0 * N, (size_t)((r1 - r0) * N) * sizeof(XT));
        FN(bwd_small)(a, r0, r1, (AT *)dwp, (AT *)dbp);
        return;
    }
    const int64_t pair_bytes = 2 * N * (int64_t)sizeof(XT);   /* x and dy of one row */
    const int RB = pair_bytes * 4 <= CN_BWD_GROUP_BYTES ? 4 : pair_bytes * 2 <= CN_BWD_GROUP_BYTES ? 2 : 1;
    /* short rows: up to 16 rows (their x and dy within CN_BWD_SHORT_BYTES) take
     * pass 1, four at a time, before any takes pass 2, so that one row's
     * reduction latency overlaps other rows' work */
    const int GR = RB < 4 ? RB : pair_bytes * 16 <= CN_BWD_SHORT_BYTES ? 16 : pair_bytes * 8 <= CN_BWD_SHORT_BYTES ? 8 : 4;
    /* Pass 2 prefetches the group after next when one group of 32-bit (or wider)
     * rows takes DRAM longer to deliver than pass 2 takes to compute (twice the
     * bytes of 16-bit rows for the same arithmetic), else the next group (see
     * CN_BWD_FAR_BYTES) */
    const int64_t pf_rows = sizeof(XT) >= 4 && pair_bytes * GR >= CN_BWD_FAR_BYTES ? 2 * GR : GR;
    /* 32-bit and wider rows with partials, all rows vector-aligned (64 bytes
     * with AVX-512; AVX2 keeps the route below, see CN_MULTIROW_STREAM): pass 1 only sums, one
     * row at a time, and pass 2 adds the rows into the partials from cache,
     * 4 at a time (bwd_dx_rows_acc). Pass 1 waits on DRAM, and the
     * partials' stores among its loads keep fewer loads in flight. Measured,
     * 1 thread, out=, aligned arrays, medians of 6 alternating rounds: fp32
     * (16384,1024) 6.97 -> 5.82 ms, (4096,4096) 6.85 -> 5.86, (8192,2048)
     * 6.99 -> 5.63; rows of 256 unchanged;
     * standalone C, ns a row: (800,20000) fp32 9212-9694 -> 6564-6608,
     * (4096,4096) fp64 2143-2204 -> 1746-1775. Kept as before: rows off
     * 64-byte alignment (as NumPy's own large arrays are, 16 bytes past):
     * (131072,256) fp32 lost, 12.7 -> 16.2 ms; and 16-bit rows ((16384,1024)
     * bf16 145 -> 163-173 ns a row). Same additions in the same row order
     * either way: the same bits. */
    const int late_parts = CN_MULTIROW_STREAM && sizeof(XT) >= 4 && dwp != NULL &&
                           ((uintptr_t)a->x | (uintptr_t)a->dy | (uintptr_t)a->dx) % STREAM_ALIGN == 0 &&
                           (N * (int64_t)sizeof(XT)) % STREAM_ALIGN == 0;
    const int P1 = late_parts ? 1 : RB;
    /* Fresh dx, 32-bit or wider rows of CN_FRESH_PLAIN_ROW_BYTES or more, off
     * the aligned route: fault it in slabs of whole groups just before they
     * are written (cn_populate_slab_rows), and write it with plain stores,
     * which find the OS's freshly zeroed lines in cache (a non-temporal store
     * evicts such a line first). Measured, fp32, 1 thread, allocating, A/B
     * runs of 4-12 alternating rounds: (4096,4096) 9.62-10.38 -> 9.07-9.92 ms
     * (nine runs, two even), (16384,1024) 9.45-10.44 -> 9.04-9.76 (eight
     * runs, all gained). Not for: rows of 256 (17.8-19.0 -> 19.8-20.6), the
     * aligned route ((4096,4096) 8.73 -> 9.80, (16384,1024) 8.71 -> 10.27),
     * the forward (fp32 rows of 1024 -4%, of 4096 +3%; bf16 rows of 4096
     * +10%); bf16 rows and 2 threads changed nothing. Other fresh dx: the
     * block's pages are faulted in before its rows are read (see
     * cn_populate_write). Neither changes a bit. */
    const int fresh_plain = a->populate && !late_parts && sizeof(XT) >= 4 &&
                            N * (int64_t)sizeof(XT) >= CN_FRESH_PLAIN_ROW_BYTES;
    cn_bwd_args plain;
    if (fresh_plain) {
        plain = *a;
        plain.stream = 0;
        plain.populate = 0;
        a = &plain;
    } else if (a->populate) {
        cn_populate_write((XT *)a->dx + r0 * N, (size_t)((r1 - r0) * N) * sizeof(XT));
    }
    const int64_t slab = cn_populate_slab_rows(N * (int64_t)sizeof(XT), GR);
    for (int64_t r = r0; r < r1; r += GR) {
        const int ng = r1 - r < GR ? (int)(r1 - r) : GR;
        if (fresh_plain && (r - r0) % slab == 0)
            cn_populate_write((XT *)a->dx + r * N, (size_t)((r1 - r < slab ? r1 - r : slab) * N) * sizeof(XT));
        double sums[32];   /* (s1, s2) per row */
        for (int sg = 0; sg < ng; sg += P1) {
            const int nb = ng - sg < P1 ? ng - sg : P1;
            for (int i = 0; i < 2 * nb; i++) sums[2 * sg + i] = 0;
            for (int64_t c0 = 0; c0 < N; c0 += CN_CHUNK) {
                int64_t c1 = c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N;
                AT t1[4], t2[4];
                FN(bwd_chunk_rows)(a, r + sg, nb, c0, c1, late_parts ? NULL : dwp, dbp, r + sg == r0, t1, t2, 0, 0);
                for (int i = 0; i < nb; i++) { sums[2 * (sg + i)] += (double)t1[i]; sums[2 * (sg + i) + 1] += (double)t2[i]; }
            }
        }
        if (late_parts)
            FN(bwd_dx_rows_acc)(a, r, ng, 0, N, sums, (AT *)dwp, (AT *)dbp, r0, 0, 0);
        else
            for (int i = 0; i < ng; i++) FN(bwd_row_dx)(a, r + i, pf_rows, sums[2 * i], sums[2 * i + 1]);
    }
    if (a->stream) cn_stream_fence();
}

/* --------------------------------------------- partial-sum bookkeeping -- */

/* dst[c0:c1] += src[c0:c1]  (accumulator dtype) */
static void FN(acc_add)(void *dst_, const void *src_, int64_t c0, int64_t c1)
{
    AT *dst = (AT *)dst_ + c0;
    const AT *src = (const AT *)src_ + c0;
    int64_t j = 0, n = c1 - c0;
    for (; j + VL <= n; j += VL) AST(dst + j, VOP(add)(ALD(dst + j), ALD(src + j)));
    if (j < n) ASTN(dst + j, VOP(add)(ALDN(dst + j, n - j), ALDN(src + j, n - j)), n - j);
}

/* out[c0:c1] = src[c0:c1] rounded once to the param dtype */
static void FN(acc_to_param)(void *out_, const void *src_, int64_t c0, int64_t c1)
{
    PT *out = (PT *)out_ + c0;
    const AT *src = (const AT *)src_ + c0;
    int64_t j = 0, n = c1 - c0;
    for (; j + VL <= n; j += VL) PST(out + j, ALD(src + j));
    if (j < n) PSTN(out + j, ALDN(src + j, n - j), n - j);
}
