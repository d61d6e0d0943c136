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
 * lanes, 8 of 8, or 8 of 4. */
#define SMALL_NV_MAX (VL >= 16 ? 4 : 8)
#define SMALL_MAX (SMALL_NV_MAX * VL)

typedef CN_XT FN(xt);
typedef CN_PT FN(pt);
typedef CN_AT FN(at);
#define XT FN(xt)
#define PT FN(pt)
#define AT FN(at)

/* -------------------------------------------------------- forward: stats -- */

/* Moments of x[0:n] relative to pivot P, two passes over data already in L1.
 * LayerNorm: delta = mean - P (corrected two-pass), m2 = sum (x - mean)^2.
 * RMSNorm:   delta = 0, m2 = sum x^2. */
CN_INLINE void FN(chunk_moments)(const XT *x, int64_t n, AT pivot, const int center, cn_moments *m)
{
    int64_t j;
    V z = VOP(zero)();
    m->n = (double)n;
    if (!center) {
        V q0 = z, q1 = z, q2 = z, q3 = z;
        for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
            V v0 = XLD(x + j), v1 = XLD(x + j + VL), v2 = XLD(x + j + 2 * VL), v3 = XLD(x + j + 3 * VL);
            q0 = VOP(fmadd)(v0, v0, q0); q1 = VOP(fmadd)(v1, v1, q1);
            q2 = VOP(fmadd)(v2, v2, q2); q3 = VOP(fmadd)(v3, v3, q3);
        }
        for (; j + VL <= n; j += VL) { V v = XLD(x + j); q0 = VOP(fmadd)(v, v, q0); }
        if (j < n) { V v = XLDN(x + j, n - j); q1 = VOP(fmadd)(v, v, q1); }
        m->delta = 0.0;
        m->m2 = (double)VOP(hsum)(VOP(add)(VOP(add)(q0, q1), VOP(add)(q2, q3)));
        return;
    }
    {
        V P = VOP(set1)(pivot);
        V a0 = z, a1 = z, a2 = z, a3 = z;
        for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
            a0 = VOP(add)(a0, VOP(sub)(XLD(x + j), P));
            a1 = VOP(add)(a1, VOP(sub)(XLD(x + j + VL), P));
            a2 = VOP(add)(a2, VOP(sub)(XLD(x + j + 2 * VL), P));
            a3 = VOP(add)(a3, VOP(sub)(XLD(x + j + 3 * VL), P));
        }
        for (; j + VL <= n; j += VL) a0 = VOP(add)(a0, VOP(sub)(XLD(x + j), P));
        if (j < n) a1 = VOP(add)(a1, VOP(keepn)(VOP(sub)(XLDN(x + j, n - j), P), n - j));
        AT d = (AT)((double)VOP(hsum)(VOP(add)(VOP(add)(a0, a1), VOP(add)(a2, a3))) / (double)n);

        /* second pass: e = (x - P) - d; keep sum e^2 and the correction sum e */
        V D = VOP(set1)(d);
        V q0 = z, q1 = z, q2 = z, q3 = z, c0 = z, c1 = z, c2 = z, c3 = z;
        for (j = 0; j + 4 * VL <= n; j += 4 * VL) {
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
        m->delta = (double)d + cs / (double)n;
        m->m2 = qs - cs * cs / (double)n;
    }
}

/* ---------------------------------------------------- forward: normalize -- */

/* y = ((x - P) - delta) * rstd * w + b   (RMSNorm: y = x * rstd * w) */
CN_INLINE void FN(apply_impl)(const XT *x, XT *y, const PT *w, const PT *b, int64_t n, AT pivot, AT delta,
                              AT rstd, const int center, const int has_w, const int has_b)
{
    V P = VOP(set1)(pivot), D = VOP(set1)(delta), R = VOP(set1)(rstd);
    int64_t j = 0;
    for (; j + VL <= n; j += VL) {
        V v = XLD(x + j);
        if (center) v = VOP(sub)(VOP(sub)(v, P), D);
        v = VOP(mul)(v, R);
        if (has_w && has_b) v = VOP(fmadd)(v, PLD(w + j), PLD(b + j));
        else if (has_w) v = VOP(mul)(v, PLD(w + j));
        else if (has_b) v = VOP(add)(v, PLD(b + j));
        XST(y + j, v);
    }
    if (j < n) {
        int64_t t = n - j;
        V v = XLDN(x + j, t);
        if (center) v = VOP(sub)(VOP(sub)(v, P), D);
        v = VOP(mul)(v, R);
        if (has_w && has_b) v = VOP(fmadd)(v, PLDN(w + j, t), PLDN(b + j, t));
        else if (has_w) v = VOP(mul)(v, PLDN(w + j, t));
        else if (has_b) v = VOP(add)(v, PLDN(b + j, t));
        XSTN(y + j, v, t);
    }
}

static void FN(apply)(const XT *x, XT *y, const PT *w, const PT *b, int64_t n, AT pivot, AT delta, AT rstd,
                      int center)
{
    /* one specialised loop per (center, weight?, bias?) so the hot loop has no branches */
    if (center) {
        if (w && b) FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 1, 1, 1);
        else if (w) FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 1, 1, 0);
        else if (b) FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 1, 0, 1);
        else FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 1, 0, 0);
    } else {
        if (w) FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 0, 1, 0);
        else FN(apply_impl)(x, y, w, b, n, pivot, delta, rstd, 0, 0, 0);
    }
}

/* ------------------------------------- forward: rows that overflow fp32 -- */

/* Row whose fp32 moments overflowed although every input is finite (values
 * near the dtype's max): recompute it in double, scaled by a power of two so
 * that even float64 rows cannot overflow. Rare, so plain scalar code. */
static void FN(fwd_rescue)(const cn_fwd_args *a, int64_t r)
{
    const int64_t N = a->N;
    const XT *x = (const XT *)a->x + r * N;
    XT *y = (XT *)a->y + r * N;
    const PT *w = (const PT *)a->w, *b = (const PT *)a->b;
    double amax = 0.0, s, mean = 0.0, m2 = 0.0, rstd_s;
    int64_t j;
    int e;
    for (j = 0; j < N; j++) { double v = fabs((double)X2A(x[j])); if (v > amax) amax = v; }
    frexp(amax, &e);
    s = ldexp(1.0, -e);                     /* x * s lies in (-1, 1), exactly */
    if (a->center) {
        for (j = 0; j < N; j++) mean += (double)X2A(x[j]) * s;
        mean /= (double)N;
    }
    for (j = 0; j < N; j++) { double d = (double)X2A(x[j]) * s - mean; m2 += d * d; }
    rstd_s = 1.0 / sqrt(m2 / (double)N + a->eps * s * s);   /* rstd of the scaled row */
    for (j = 0; j < N; j++) {
        double v = ((double)X2A(x[j]) * s - mean) * rstd_s;
        if (w) v *= (double)P2A(w[j]);
        if (b) v += (double)P2A(b[j]);
        y[j] = A2X(v);
    }
    if (a->mean) ((AT *)a->mean)[r] = (AT)(mean / s);
    ((AT *)a->rstd)[r] = (AT)(rstd_s * s);
}

static int FN(row_is_finite)(const XT *x, int64_t n)
{
    for (int64_t j = 0; j < n; j++) if (!isfinite((double)X2A(x[j]))) return 0;
    return 1;
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
    if (!(isfinite(tot->delta) && isfinite(tot->m2)) && FN(row_is_finite)(row, a->N)) {
        FN(fwd_rescue)(a, r);
        st->ok = 0;
        return;
    }
    st->ok = 1;
    st->pivot = (double)pivot;
    st->delta = (double)(AT)tot->delta;
    st->rstd = (double)(AT)rstd;
    if (a->mean) ((AT *)a->mean)[r] = (AT)((double)pivot + tot->delta);
    ((AT *)a->rstd)[r] = (AT)rstd;
}

static void FN(fwd_apply)(const cn_fwd_args *a, int64_t r, int64_t c0, int64_t c1, const cn_row_stats *st)
{
    const int64_t N = a->N;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    const PT *b = a->b ? (const PT *)a->b + c0 : NULL;
    if (!st->ok) return;
    FN(apply)((const XT *)a->x + r * N + c0, (XT *)a->y + r * N + c0, w, b, c1 - c0,
              (AT)st->pivot, (AT)st->delta, (AT)st->rstd, a->center);
}

/* ------------------------------------- forward: small rows in registers -- */

/* R rows of NV vectors each, interleaved so their reductions overlap.
 * Per row the operations are the same for any R, so the grouping of rows
 * (which depends on how rows are split among threads) never changes a bit. */
CN_INLINE void FN(fwd_small_group)(const cn_fwd_args *a, int64_t r, const int R, const int NV, const int center,
                                   const V *wv, const V *bv)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const XT *x = (const XT *)a->x + r * N;
    XT *y = (XT *)a->y + r * N;
    V v[4][8];
    AT pv[4], dl[4], rs[4];
    double dd[4], m2[4];
    int i, k;
    for (i = 0; i < R; i++) {
        for (k = 0; k < NV - 1; k++) v[i][k] = XLD(x + i * N + k * VL);
        v[i][NV - 1] = tail == VL ? XLD(x + i * N + (NV - 1) * VL) : XLDN(x + i * N + (NV - 1) * VL, tail);
    }
    if (center) {
        V P[4], D[4];
        AT s[4];
        for (i = 0; i < R; i++) {
            pv[i] = (AT)X2A(x[i * N]);
            P[i] = VOP(set1)(pv[i]);
            V acc = VOP(keepn)(VOP(sub)(v[i][NV - 1], P[i]), tail);
            for (k = 0; k < NV - 1; k++) acc = VOP(add)(acc, VOP(sub)(v[i][k], P[i]));
            s[i] = VOP(hsum)(acc);
        }
        for (i = 0; i < R; i++) {
            AT d = (AT)((double)s[i] / (double)N);
            D[i] = VOP(set1)(d);
            V q = VOP(zero)(), c = VOP(zero)();
            for (k = 0; k < NV; k++) {
                V e = VOP(sub)(VOP(sub)(v[i][k], P[i]), D[i]);
                if (k == NV - 1) e = VOP(keepn)(e, tail);
                v[i][k] = e;
                q = VOP(fmadd)(e, e, q);
                c = VOP(add)(c, e);
            }
            double cs = (double)VOP(hsum)(c);
            dd[i] = (double)d + cs / (double)N;
            m2[i] = (double)VOP(hsum)(q) - cs * cs / (double)N;
            dl[i] = (AT)(cs / (double)N);        /* what is left to subtract from e */
        }
    } else {
        for (i = 0; i < R; i++) {
            V q = VOP(zero)();
            for (k = 0; k < NV; k++) q = VOP(fmadd)(v[i][k], v[i][k], q);
            pv[i] = 0; dd[i] = 0.0; dl[i] = 0;
            m2[i] = (double)VOP(hsum)(q);
        }
    }
    for (i = 0; i < R; i++) {
        if (!(isfinite(dd[i]) && isfinite(m2[i])) && FN(row_is_finite)(x + i * N, N)) {
            FN(fwd_rescue)(a, r + i);
            continue;
        }
        double rstd = cn_rstd(m2[i], (double)N, a->eps);
        rs[i] = (AT)rstd;
        if (a->mean) ((AT *)a->mean)[r + i] = (AT)((double)pv[i] + dd[i]);
        ((AT *)a->rstd)[r + i] = rs[i];
        V Rv = VOP(set1)(rs[i]), C = VOP(set1)(dl[i]);
        for (k = 0; k < NV; k++) {
            V e = center ? VOP(sub)(v[i][k], C) : v[i][k];
            V o = VOP(fmadd)(VOP(mul)(e, Rv), wv[k], bv[k]);
            if (k < NV - 1) XST(y + i * N + k * VL, o);
            else if (tail == VL) XST(y + i * N + k * VL, o);
            else XSTN(y + i * N + k * VL, o, tail);
        }
    }
}

CN_INLINE void FN(fwd_small_nv)(const cn_fwd_args *a, int64_t r0, int64_t r1, const int NV, const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const int R = NV <= 2 ? 4 : 2;
    V wv[8], bv[8];
    int64_t r;
    for (int k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? PLDN((const PT *)a->w + k * VL, t) : VOP(set1)((AT)1);
        bv[k] = a->b ? PLDN((const PT *)a->b + k * VL, t) : VOP(zero)();
    }
    for (r = r0; r + R <= r1; r += R) FN(fwd_small_group)(a, r, R, NV, center, wv, bv);
    for (; r < r1; r++) FN(fwd_small_group)(a, r, 1, NV, center, wv, bv);
}

static void FN(fwd_small)(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int nv = (int)((a->N + VL - 1) / VL);
#define CN_SMALL_CASE(K)                                                       \
    case K:                                                                    \
        if (K <= SMALL_NV_MAX) {                                               \
            if (a->center) FN(fwd_small_nv)(a, r0, r1, K, 1);                  \
            else FN(fwd_small_nv)(a, r0, r1, K, 0);                            \
        }                                                                      \
        break;
    switch (nv) {
        CN_SMALL_CASE(1) CN_SMALL_CASE(2) CN_SMALL_CASE(3) CN_SMALL_CASE(4)
        CN_SMALL_CASE(5) CN_SMALL_CASE(6) CN_SMALL_CASE(7) CN_SMALL_CASE(8)
    }
#undef CN_SMALL_CASE
}

/* ------------------------------------------------------ forward: rows -- */

static void FN(fwd_rows)(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t N = a->N;
    if (N <= SMALL_MAX) { FN(fwd_small)(a, r0, r1); return; }
    for (int64_t r = r0; r < r1; r++) {
        cn_moments tot, m;
        cn_row_stats st;
        for (int64_t c0 = 0; c0 < N; c0 += CN_CHUNK) {
            int64_t c1 = c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N;
            FN(fwd_chunk)(a, r, c0, c1, &m);
            if (c0 == 0) tot = m;
            else cn_moments_merge(&tot, &m);
        }
        FN(fwd_finish)(a, r, &tot, &st);
        FN(fwd_apply)(a, r, 0, N, &st);
    }
}

/* ------------------------------------------------ backward: chunk pieces -- */

/* Pass 1 over one chunk of one row: s1 = sum g, s2 = sum g*xhat, with
 * g = dy*w and xhat = (x - mean)*rstd; and the row's contribution to the
 * block partials dwp += dy*xhat, dbp += dy (written, not added, when init). */
CN_INLINE void FN(bwd_sums_impl)(const XT *dy, const XT *x, const PT *w, int64_t n, AT mean, AT rstd, AT *dwp,
                                 AT *dbp, const int center, const int has_w, const int init, AT *s1, AT *s2)
{
    V Mv = VOP(set1)(mean), R = VOP(set1)(rstd), z = VOP(zero)();
    V s1a = z, s1b = z, s2a = z, s2b = z;
    int64_t j = 0;
#define CN_BWD_STEP(J, LDX, LDP, LDA, STA, KEEP, S1, S2)                                         \
    {                                                                                            \
        V xv = LDX(x + (J)), dyv = LDX(dy + (J));                                                \
        V xh = center ? VOP(mul)(VOP(sub)(xv, Mv), R) : VOP(mul)(xv, R);                         \
        xh = KEEP(xh);                                                                           \
        V g = has_w ? VOP(mul)(dyv, LDP(w + (J))) : dyv;                                         \
        if (center) S1 = VOP(add)(S1, g);                                                        \
        S2 = VOP(fmadd)(g, xh, S2);                                                              \
        if (has_w) {                                                                             \
            STA(dwp + (J), init ? VOP(mul)(dyv, xh) : VOP(fmadd)(dyv, xh, LDA(dwp + (J))));      \
            if (center) STA(dbp + (J), init ? dyv : VOP(add)(dyv, LDA(dbp + (J))));              \
        }                                                                                        \
    }
#define CN_ID(v) (v)
    for (; j + 2 * VL <= n; j += 2 * VL) {
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
#undef CN_BWD_STEP
    *s1 = VOP(hsum)(VOP(add)(s1a, s1b));
    *s2 = VOP(hsum)(VOP(add)(s2a, s2b));
}

static void FN(bwd_chunk)(const cn_bwd_args *a, int64_t r, int64_t c0, int64_t c1, void *dwp_, void *dbp_,
                          int init, double *s1, double *s2)
{
    const int64_t N = a->N, n = c1 - c0;
    const XT *dy = (const XT *)a->dy + r * N + c0, *x = (const XT *)a->x + r * N + c0;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    AT *dwp = dwp_ ? (AT *)dwp_ + c0 : NULL, *dbp = dbp_ ? (AT *)dbp_ + c0 : NULL;
    AT mean = a->center ? ((const AT *)a->mean)[r] : (AT)0, rstd = ((const AT *)a->rstd)[r];
    AT t1 = 0, t2 = 0;
#define CN_CALL(C, W, I) FN(bwd_sums_impl)(dy, x, w, n, mean, rstd, dwp, dbp, C, W, I, &t1, &t2)
    if (a->center) {
        if (w) { if (init) CN_CALL(1, 1, 1); else CN_CALL(1, 1, 0); }
        else CN_CALL(1, 0, 0);
    } else {
        if (w) { if (init) CN_CALL(0, 1, 1); else CN_CALL(0, 1, 0); }
        else CN_CALL(0, 0, 0);
    }
#undef CN_CALL
    *s1 = (double)t1;
    *s2 = (double)t2;
}

/* Pass 2: dx = rstd * (g - c1 - xhat * c2), c1 = mean(g), c2 = mean(g * xhat). */
CN_INLINE void FN(bwd_dx_impl)(const XT *dy, const XT *x, const PT *w, XT *dx, int64_t n, AT mean, AT rstd, AT c1,
                               AT c2, const int center, const int has_w)
{
    V Mv = VOP(set1)(mean), R = VOP(set1)(rstd), C1 = VOP(set1)(c1), C2 = VOP(set1)(c2);
    int64_t j = 0;
    for (; j + VL <= n; j += VL) {
        V xv = XLD(x + j), g = XLD(dy + j);
        V xh = center ? VOP(mul)(VOP(sub)(xv, Mv), R) : VOP(mul)(xv, R);
        if (has_w) g = VOP(mul)(g, PLD(w + j));
        if (center) g = VOP(sub)(g, C1);
        XST(dx + j, VOP(mul)(VOP(fnmadd)(xh, C2, g), R));
    }
    if (j < n) {
        const int64_t t = n - j;
        V xv = XLDN(x + j, t), g = XLDN(dy + j, t);
        V xh = center ? VOP(mul)(VOP(sub)(xv, Mv), R) : VOP(mul)(xv, R);
        if (has_w) g = VOP(mul)(g, PLDN(w + j, t));
        if (center) g = VOP(sub)(g, C1);
        XSTN(dx + j, VOP(mul)(VOP(fnmadd)(xh, C2, g), R), t);
    }
}

static void FN(bwd_apply)(const cn_bwd_args *a, int64_t r, int64_t c0, int64_t c1, double s1, double s2)
{
    const int64_t N = a->N, n = c1 - c0;
    const XT *dy = (const XT *)a->dy + r * N + c0, *x = (const XT *)a->x + r * N + c0;
    XT *dx = (XT *)a->dx + r * N + c0;
    const PT *w = a->w ? (const PT *)a->w + c0 : NULL;
    AT mean = a->center ? ((const AT *)a->mean)[r] : (AT)0, rstd = ((const AT *)a->rstd)[r];
    AT k1 = (AT)(s1 / (double)N), k2 = (AT)(s2 / (double)N);
    if (a->center) {
        if (w) FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, 1, 1);
        else FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, 1, 0);
    } else {
        if (w) FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, 0, 1);
        else FN(bwd_dx_impl)(dy, x, w, dx, n, mean, rstd, k1, k2, 0, 0);
    }
}

/* ----------------------------------- backward: small rows in registers -- */

CN_INLINE void FN(bwd_small_nv)(const cn_bwd_args *a, int64_t r0, int64_t r1, AT *dwp, AT *dbp, const int NV,
                                const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const int R = NV == 1 ? 4 : NV == 2 ? 2 : 1;
    const XT *X = (const XT *)a->x, *DY = (const XT *)a->dy;
    XT *DX = (XT *)a->dx;
    const AT *MEAN = (const AT *)a->mean, *RSTD = (const AT *)a->rstd;
    V wv[8], dwacc[8], dbacc[8];
    int64_t r;
    int i, k;
    for (k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? PLDN((const PT *)a->w + k * VL, t) : VOP(set1)((AT)1);
        dwacc[k] = VOP(zero)();
        dbacc[k] = VOP(zero)();
    }
    for (r = r0; r < r1;) {
        const int G = r + R <= r1 ? R : 1;   /* rows in this step */
        V xh[4][8], dy[4][8], g[4][8];
        AT c1[4], c2[4], rs[4];
        for (i = 0; i < G; i++) {
            const XT *x = X + (r + i) * N, *d = DY + (r + i) * N;
            V Mv = VOP(set1)(center ? MEAN[r + i] : (AT)0);
            V Rv = VOP(set1)(rs[i] = RSTD[r + i]);
            V s1 = VOP(zero)(), s2 = VOP(zero)();
            for (k = 0; k < NV; k++) {
                int full = k < NV - 1 || tail == VL;
                V xv = full ? XLD(x + k * VL) : XLDN(x + k * VL, tail);
                dy[i][k] = full ? XLD(d + k * VL) : XLDN(d + k * VL, tail);
                V h = center ? VOP(mul)(VOP(sub)(xv, Mv), Rv) : VOP(mul)(xv, Rv);
                xh[i][k] = full ? h : VOP(keepn)(h, tail);
                g[i][k] = VOP(mul)(dy[i][k], wv[k]);
                s1 = VOP(add)(s1, g[i][k]);
                s2 = VOP(fmadd)(g[i][k], xh[i][k], s2);
            }
            c1[i] = center ? (AT)((double)VOP(hsum)(s1) / (double)N) : (AT)0;
            c2[i] = (AT)((double)VOP(hsum)(s2) / (double)N);
        }
        for (i = 0; i < G; i++) {
            V C1 = VOP(set1)(c1[i]), C2 = VOP(set1)(c2[i]), Rv = VOP(set1)(rs[i]);
            XT *o = DX + (r + i) * N;
            for (k = 0; k < NV; k++) {
                V t = center ? VOP(sub)(g[i][k], C1) : g[i][k];
                t = VOP(mul)(VOP(fnmadd)(xh[i][k], C2, t), Rv);
                if (k < NV - 1 || tail == VL) XST(o + k * VL, t);
                else XSTN(o + k * VL, t, tail);
                dwacc[k] = VOP(fmadd)(dy[i][k], xh[i][k], dwacc[k]);
                dbacc[k] = VOP(add)(dbacc[k], dy[i][k]);
            }
        }
        r += G;
    }
    if (dwp) {
        for (k = 0; k < NV; k++) {
            int64_t t = k < NV - 1 ? VL : tail;
            ASTN(dwp + k * VL, dwacc[k], t);
            if (dbp) ASTN(dbp + k * VL, dbacc[k], t);
        }
    }
}

static void FN(bwd_small)(const cn_bwd_args *a, int64_t r0, int64_t r1, AT *dwp, AT *dbp)
{
    const int nv = (int)((a->N + VL - 1) / VL);
#define CN_SMALL_CASE(K)                                                       \
    case K:                                                                    \
        if (K <= SMALL_NV_MAX) {                                               \
            if (a->center) FN(bwd_small_nv)(a, r0, r1, dwp, dbp, K, 1);        \
            else FN(bwd_small_nv)(a, r0, r1, dwp, dbp, K, 0);                  \
        }                                                                      \
        break;
    switch (nv) {
        CN_SMALL_CASE(1) CN_SMALL_CASE(2) CN_SMALL_CASE(3) CN_SMALL_CASE(4)
        CN_SMALL_CASE(5) CN_SMALL_CASE(6) CN_SMALL_CASE(7) CN_SMALL_CASE(8)
    }
#undef CN_SMALL_CASE
}

/* ----------------------------------------------------- backward: rows -- */

/* Rows [r0, r1) of one block; dwp/dbp (N values each, or NULL) receive the
 * block's partial sums of dy*xhat and dy. */
static void FN(bwd_rows)(const cn_bwd_args *a, int64_t r0, int64_t r1, void *dwp, void *dbp)
{
    const int64_t N = a->N;
    if (!a->center) dbp = NULL;
    if (!a->w) dwp = dbp = NULL;
    if (N <= SMALL_MAX) { FN(bwd_small)(a, r0, r1, (AT *)dwp, (AT *)dbp); return; }
    for (int64_t r = r0; r < r1; r++) {
        double s1 = 0.0, s2 = 0.0;
        for (int64_t c0 = 0; c0 < N; c0 += CN_CHUNK) {
            int64_t c1 = c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N;
            double t1, t2;
            FN(bwd_chunk)(a, r, c0, c1, dwp, dbp, r == r0, &t1, &t2);
            s1 += t1;
            s2 += t2;
        }
        FN(bwd_apply)(a, r, 0, N, s1, s2);
    }
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

static const cn_ops FN(cn_ops) = {
    (int)sizeof(XT), (int)sizeof(PT), (int)sizeof(AT), SMALL_MAX,
    FN(fwd_rows), FN(fwd_chunk), FN(fwd_finish), FN(fwd_apply),
    FN(bwd_rows), FN(bwd_chunk), FN(bwd_apply),
    FN(acc_add), FN(acc_to_param),
};

#undef FN
#undef V
#undef VOP
#undef XLD
#undef XLDN
#undef XST
#undef XSTN
#undef PLD
#undef PLDN
#undef PST
#undef PSTN
#undef ALD
#undef ALDN
#undef AST
#undef ASTN
#undef X2A
#undef P2A
#undef A2X
#undef A2P
#undef VL
#undef CN_AS
#undef SMALL_NV_MAX
#undef SMALL_MAX
#undef XT
#undef PT
#undef AT
