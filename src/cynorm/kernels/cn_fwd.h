/*
 * cn_fwd.h -- the forward's drivers: which rows go through the row math of
 * cn_rowmath.h in which order. fwd_rows takes whole rows (short rows in
 * registers, medium rows in blocks, longer rows by chunks, long rows in
 * groups walked column chunk by column chunk); the team path in _drivers.pxi
 * splits long rows across threads with fwd_chunk, fwd_finish and fwd_apply,
 * which merge the same chunk moments in the same order, so both give the
 * same bits.
 */

/* ----------------------------------------- forward: chunk-level pieces -- */

static void fwd_chunk(const cn_fwd_args *a, int64_t r, int64_t c0, int64_t c1, cn_moments *m)
{
    const xt *row = (const xt *)a->x + r * a->N;
    at pivot = a->center ? (at)x_to_at(row[0]) : (at)0;
    if (a->center) chunk_moments(row + c0, c1 - c0, pivot, 1, m);
    else chunk_moments(row + c0, c1 - c0, pivot, 0, m);
}

/* Turn merged moments into (pivot, delta, rstd), write mean/rstd. st->ok == 0
 * means the row is already finished (rescued) and must not be normalized. */
static void fwd_finish(const cn_fwd_args *a, int64_t r, const cn_moments *tot, cn_row_stats *st)
{
    const xt *row = (const xt *)a->x + r * a->N;
    at pivot = a->center ? (at)x_to_at(row[0]) : (at)0;
    double rstd = cn_rstd(tot->m2, (double)a->N, a->eps);
    if (wants_rescue(a, row, tot->delta, tot->m2, 1.0 / (double)a->N)) {
        fwd_rescue(a, r);
        st->ok = 0;
        return;
    }
    st->ok = 1;
    st->pivot = (double)pivot;
    st->delta = tot->delta;
    st->rstd = (double)(at)rstd;
    if (a->mean) ((at *)a->mean)[r] = (at)((double)pivot + tot->delta);
    ((at *)a->rstd)[r] = (at)rstd;
}

/* Normalize rows r..r+nrows-1 over columns c0..c1, walking the rows in order:
 * the weight/bias piece stays in L1 across the rows (for chw-style shapes it
 * is as long as a row), and each row's next piece is prefetched because the
 * walk jumps between rows. */
static void fwd_apply(const cn_fwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                          const cn_row_stats *st)
{
    const int64_t N = a->N, n = c1 - c0;
    const pt *w = a->w ? (const pt *)a->w + c0 : NULL;
    const pt *b = a->b ? (const pt *)a->b + c0 : NULL;
    for (int64_t i = 0; i < nrows; i++) {
        const xt *x = (const xt *)a->x + (r + i) * N + c0;
        int64_t pf = i + 1 < nrows ? N : n - (nrows - 1) * N;  /* next row here, or back to the first, further on */
        if (!st[i].ok) continue;
        normalize_row(x, (xt *)a->y + (r + i) * N + c0, w, b, n, (at)st[i].pivot, st[i].delta, (at)st[i].rstd,
                      a->center, a->pol->stream, x + pf, c1 < N || i + 1 < nrows ? n : 0, 0);
    }
}

/* ------------------------------------------------ forward: small rows -- */

/* Rows of at most SMALL_MAX elements, taken CN_SMALL_BLOCK rows at a time in
 * three phases: per-row sums in one pass (independent dependency chains that
 * the CPU overlaps; see block_onepass), one vectorizable rstd loop for the
 * whole block, then the normalizing pass, which rereads the rows from L1. The
 * arithmetic of a row never depends on the block it falls in. */
/* rstd of a block's rows from their m2, one vectorizable loop. */
CN_INLINE void block_rstd(const cn_fwd_args *a, int64_t nrows, double inv_n, const double *m2, double *rstd)
{
    for (int64_t i = 0; i < nrows; i++) {
        double var = m2[i] * inv_n;
        var = var < 0.0 ? 0.0 : var;
        rstd[i] = 1.0 / sqrt(var + a->eps);
    }
}

/* The pivots of a block's rows (LayerNorm, small and medium rows): the mean of
 * each row's first min(N, VL) elements, from one lane-sum tree per VL rows. */
CN_INLINE void block_pivots(const xt *X, int64_t N, int64_t nrows, at *pv)
{
    vec hv[CN_SMALL_BLOCK];
    at h[CN_SMALL_BLOCK];
    const int64_t np = N < VL ? N : VL;
    const double inv_np = 1.0 / (double)np;
    int64_t i;
    if (np == VL) for (i = 0; i < nrows; i++) hv[i] = load_x(X + i * N);
    else for (i = 0; i < nrows; i++) hv[i] = load_x_t(X + i * N, np, 0);
    hsum_rows(hv, nrows, h);
    for (i = 0; i < nrows; i++) pv[i] = (at)((double)h[i] * inv_np);
}

/* A block's LayerNorm moments from one pass: sv, qv are each row's lane sums
 * of x - pv and (x - pv)^2. dd = mean - pv = s/n and m2 = q - s^2/n where
 * the pivot is close enough to the row mean for that to lose almost nothing
 * (onepass_moments' test: within sqrt(1/2) std); the other rows (a few
 * percent of Gaussian rows, and any row holding inf or NaN) are redone by the
 * corrected two-pass about their first element. Either way a row's result
 * depends on its own data alone. */
CN_INLINE void block_onepass(const xt *X, int64_t N, int64_t nrows, double inv_n, vec *sv, vec *qv, at *pv,
                                 double *dd, double *m2)
{
    at s[CN_SMALL_BLOCK], q[CN_SMALL_BLOCK];
    int refused[CN_SMALL_BLOCK], any = 0;
    const double n = (double)N;
    int64_t i;
    hsum_rows(sv, nrows, s);
    hsum_rows(qv, nrows, q);
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
            const xt *x = X + i * N;
            cn_moments m;
            pv[i] = (at)x_to_at(x[0]);
            twopass_moments(x, N, pv[i], &m);
            dd[i] = m.delta;
            m2[i] = m.m2;
        }
}

/* The per-row scalars of a block, as loops over the block: each row's mean
 * split into hi + lo (split_mean), -lo * rstd and rstd in the accumulator type;
 * mean and rstd written out. Returns whether any row may need fwd_rescue
 * (wants_rescue's cheap test), so the common block skips it row by row. */
CN_INLINE int block_scalars(const cn_fwd_args *a, int64_t r0, int64_t nrows, double inv_n, const at *pv,
                                const double *dd, const double *m2, const double *rstd, at *mh, at *lr, at *rs)
{
    int64_t i;
    int odd = 0;
    /* two loops: the compiler vectorizes each, not the two fused */
    for (i = 0; i < nrows; i++) {
        at lo;
        split_mean((double)pv[i], dd[i], &mh[i], &lo);
        rs[i] = (at)rstd[i];
        lr[i] = -lo * rs[i];
    }
    for (i = 0; i < nrows; i++) odd |= may_need_rescue(dd[i], m2[i], inv_n);
    if (a->mean) for (i = 0; i < nrows; i++) ((at *)a->mean)[r0 + i] = mh[i];
    for (i = 0; i < nrows; i++) ((at *)a->rstd)[r0 + i] = rs[i];
    return odd;
}

CN_INLINE void fwd_small_block(const cn_fwd_args *a, int64_t r0, const int64_t nrows, const int NV,
                                   const int center, const vec *wv, const vec *bv, double inv_n, xt *stage)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const xt *X = (const xt *)a->x + r0 * N;
    xt *Y = stage ? stage : (xt *)a->y + r0 * N;
    at pv[CN_SMALL_BLOCK];
    double dd[CN_SMALL_BLOCK], m2[CN_SMALL_BLOCK], rstd[CN_SMALL_BLOCK];
    /* LayerNorm's per-row sums, reduced a block at a time (cheaper than two
     * reductions per row; RMSNorm's single one per row is faster as it is) */
    vec sv[CN_SMALL_BLOCK], sqv[CN_SMALL_BLOCK];
    int64_t i;
    int k;
    /* 16-bit rows are widened once, in pass 1, into this L1 buffer */
    const int widen = sizeof(xt) != sizeof(at);
    vec wide[sizeof(xt) != sizeof(at) ? CN_SMALL_BLOCK : 1][8];   /* (a constant size: no VLA; SMALL_NV_MAX <= 8) */
    /* Short per-row loops (each row: loads, one reduction) whose iterations the
     * CPU overlaps, with the per-row scalar math done in between as loops over
     * the whole block, which the compiler vectorizes. */
    if (center) {
        block_pivots(X, N, nrows, pv);
        for (i = 0; i < nrows; i++) {                  /* one pass: sums of x - pv and (x - pv)^2 */
            const xt *x = X + i * N;
            vec v[8];
            load_small_row(v, x, NV, tail);
            if (widen) { CN_UNROLL for (k = 0; k < NV; k++) wide[i][k] = v[k]; }
            vec P = VOP(set1)(pv[i]);
            vec e = VOP(keepn)(VOP(sub)(v[NV - 1], P), tail);
            vec se = e, sq = VOP(mul)(e, e);
            CN_UNROLL for (k = 0; k < NV - 1; k++) {
                e = VOP(sub)(v[k], P);
                se = VOP(add)(se, e);
                sq = VOP(mul_add)(e, e, sq);
            }
            sv[i] = se;
            sqv[i] = sq;
        }
        block_onepass(X, N, nrows, inv_n, sv, sqv, pv, dd, m2);
    } else {
        for (i = 0; i < nrows; i++) {
            const xt *x = X + i * N;
            vec v[8];
            load_small_row(v, x, NV, tail);
            if (widen) { CN_UNROLL for (k = 0; k < NV; k++) wide[i][k] = v[k]; }
            vec sq = VOP(zero)();
            CN_UNROLL for (k = 0; k < NV; k++) sq = VOP(mul_add)(v[k], v[k], sq);
            m2[i] = (double)VOP(hsum)(sq);
            dd[i] = 0.0;
            pv[i] = 0;
        }
    }
    block_rstd(a, nrows, inv_n, m2, rstd);
    at mh[CN_SMALL_BLOCK], lr[CN_SMALL_BLOCK], rs[CN_SMALL_BLOCK];
    const int odd = block_scalars(a, r0, nrows, inv_n, pv, dd, m2, rstd, mh, lr, rs);
    const int64_t ahead = a->pol->prefetch_rows;
    for (i = 0; i < nrows; i++) {                      /* normalize, rereading from L1 */
        const xt *x = X + i * N;
        xt *y = Y + i * N;
        prefetch_span(x + ahead * N, N);           /* the same row some blocks ahead */
        if (CN_UNLIKELY(odd) && wants_rescue(a, x, dd[i], m2[i], inv_n)) {
            fwd_rescue(a, r0 + i);                 /* (writes its own mean and rstd) */
            if (stage) memcpy(y, (xt *)a->y + (r0 + i) * N, (size_t)N * sizeof(xt));
            continue;
        }
        vec MH = VOP(set1)(mh[i]), Rv = VOP(set1)(rs[i]), LR = VOP(set1)(lr[i]);
        vec v[8];
        if (widen) { CN_UNROLL for (k = 0; k < NV; k++) v[k] = wide[i][k]; }
        else load_small_row(v, x, NV, tail);
        vec o[8];
        CN_UNROLL for (k = 0; k < NV; k++) {
            vec e = center ? VOP(mul_add)(VOP(sub)(v[k], MH), Rv, LR) : VOP(mul)(v[k], Rv);
            o[k] = VOP(mul_add)(e, wv[k], bv[k]);
        }
        store_small_row(y, o, NV, tail);
    }
    if (stage) cn_copy_stream((xt *)a->y + r0 * N, stage, (size_t)(nrows * N) * sizeof(xt));
}

CN_INLINE void fwd_small_nv(const cn_fwd_args *a, int64_t r0, int64_t r1, const int NV, const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const double inv_n = 1.0 / (double)N;
    vec wv[8], bv[8];
    CN_UNROLL for (int k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? load_p_t((const pt *)a->w + k * VL, t, 0) : VOP(set1)((at)1);
        bv[k] = a->b ? load_p_t((const pt *)a->b + k * VL, t, 0) : VOP(zero)();
    }
    /* streamed output: each block's rows are staged here (L1) and leave as whole
     * lines with non-temporal stores; row ends never split a line between two
     * stores, and the lines are not read first (plain stores read each line) */
    CN_ALIGNED64 xt stage[CN_SMALL_BLOCK * SMALL_MAX];
    xt *st = a->pol->stream ? stage : NULL;
    for (int64_t r = r0; r < r1; r += CN_SMALL_BLOCK)
        fwd_small_block(a, r, r1 - r < CN_SMALL_BLOCK ? r1 - r : CN_SMALL_BLOCK, NV, center, wv, bv, inv_n, st);
    if (st) cn_stream_fence();
}

static void fwd_small(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
#define FWD_SMALL(K, C) fwd_small_nv(a, r0, r1, K, C)
    CN_SMALL_DISPATCH(a, FWD_SMALL)
#undef FWD_SMALL
}

/* ----------------------------------------------- forward: medium rows -- */

/* A block's normalizing passes, rereading its rows from cache: specialised per
 * (center, weight?, bias?, stream?) once a block, not row by row (a call and
 * four branches per row cost rows of 96-256 8-24%: benchmarks/README.md) */
CN_INLINE void fwd_med_normalize(const cn_fwd_args *a, int64_t r0, int64_t nrows, int odd, const double *dd,
                                 const double *m2, double inv_n, const at *mh, const at *lr, const at *rs,
                                 const int C, const int W, const int B, const int S)
{
    const int64_t N = a->N, ahead = a->pol->prefetch_rows;
    const xt *X = (const xt *)a->x + r0 * N;
    xt *Y = (xt *)a->y + r0 * N;
    for (int64_t i = 0; i < nrows; i++) {              /* normalize, rereading from cache */
        const xt *x = X + i * N;
        if (CN_UNLIKELY(odd) && wants_rescue(a, x, dd[i], m2[i], inv_n)) {
            fwd_rescue(a, r0 + i);                 /* (writes its own mean and rstd) */
            continue;
        }
        /* prefetch the same row some blocks ahead */
        const int64_t npf = r0 + i + ahead < a->M ? N : 0;
        normalize_impl(x, Y + i * N, (const pt *)a->w, (const pt *)a->b, N, mh[i], lr[i], rs[i], C, W, B, S,
                       x + ahead * N, npf, a->pol->prefetch_l2);
    }
}

/* Rows longer than SMALL_MAX, of at most CN_MED_ROW_BYTES, pol->group_rows
 * at a time in the small-row kernel's phases: per-row sums reduced a block at
 * a time, one vectorizable rstd loop, then the normalizing passes from L1/L2,
 * so that rows overlap their sum -> sqrt -> normalize chains. A row's
 * arithmetic never depends on its block. LayerNorm: one-pass moments where
 * block_onepass accepts them, as for small rows. */
CN_INLINE void fwd_med_block(const cn_fwd_args *a, int64_t r0, const int64_t nrows, const int center,
                                 double inv_n)
{
    const int64_t N = a->N;
    const xt *X = (const xt *)a->x + r0 * N;
    at pv[CN_SMALL_BLOCK], q[CN_SMALL_BLOCK];
    double dd[CN_SMALL_BLOCK], m2[CN_SMALL_BLOCK], rstd[CN_SMALL_BLOCK];
    vec sv[CN_SMALL_BLOCK], qv[CN_SMALL_BLOCK];
    int64_t i;
    if (center) {
        block_pivots(X, N, nrows, pv);
        for (i = 0; i < nrows; i++)                    /* one pass: sums of x - pv and (x - pv)^2 */
            dev_moment_sums(X + i * N, N, VOP(set1)(pv[i]), 0, &sv[i], &qv[i]);
        block_onepass(X, N, nrows, inv_n, sv, qv, pv, dd, m2);
    } else {
        for (i = 0; i < nrows; i++) qv[i] = sumsq_vec(X + i * N, N);   /* RMSNorm: sum of squares */
        hsum_rows(qv, nrows, q);
        for (i = 0; i < nrows; i++) { pv[i] = 0; dd[i] = 0.0; m2[i] = (double)q[i]; }
    }
    block_rstd(a, nrows, inv_n, m2, rstd);
    at mh[CN_SMALL_BLOCK], lr[CN_SMALL_BLOCK], rs[CN_SMALL_BLOCK];
    const int odd = block_scalars(a, r0, nrows, inv_n, pv, dd, m2, rstd, mh, lr, rs);
#define MED_(C, W, B, S) fwd_med_normalize(a, r0, nrows, odd, dd, m2, inv_n, mh, lr, rs, C, W, B, S)
#define MED_S(C, W, B) (a->pol->stream ? MED_(C, W, B, 1) : MED_(C, W, B, 0))
    CN_NORM_DISPATCH(center, a->w, a->b, MED_S);
#undef MED_S
#undef MED_
}

static void fwd_med(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t B = a->pol->group_rows;
    const double inv_n = 1.0 / (double)a->N;
    for (int64_t r = r0; r < r1; r += B) {
        const int64_t nb = r1 - r < B ? r1 - r : B;
        if (a->center) fwd_med_block(a, r, nb, 1, inv_n);
        else fwd_med_block(a, r, nb, 0, inv_n);
    }
    if (a->pol->stream) cn_stream_fence();
}

/* ------------------------------------------------------ forward: rows -- */

/* Stats of one whole row: chunk moments merged left to right (as the team path does). */
CN_INLINE void fwd_row_stats(const cn_fwd_args *a, int64_t r, cn_row_stats *st)
{
    const int64_t N = a->N;
    cn_moments tot, m;
    fwd_chunk(a, r, 0, N < CN_CHUNK ? N : CN_CHUNK, &tot);
    for (int64_t c0 = CN_CHUNK; c0 < N; c0 += CN_CHUNK) {
        fwd_chunk(a, r, c0, c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N, &m);
        cn_moments_merge(&tot, &m);
    }
    fwd_finish(a, r, &tot, st);
}

/* Long rows, a group at a time (pol->group_rows): the group's stats row by
 * row, then the normalizing passes column chunk by column chunk across the
 * group, so that each weight/bias chunk is read once per group. */
static void fwd_long(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t N = a->N, G = a->pol->group_rows, K = a->pol->apply_chunk;
    cn_row_stats st[CN_LONG_GROUP_MAX];   /* (group_rows <= CN_LONG_GROUP_MAX: the policy) */
    for (int64_t r = r0; r < r1; r += G) {
        const int64_t nb = r1 - r < G ? r1 - r : G;
        if (a->pol->populate == CN_POPULATE_AHEAD) cn_populate_write((xt *)a->y + r * N, (size_t)(nb * N) * sizeof(xt));
        for (int64_t i = 0; i < nb; i++) fwd_row_stats(a, r + i, &st[i]);
        for (int64_t c0 = 0; c0 < N; c0 += K) fwd_apply(a, r, nb, c0, c0 + K < N ? c0 + K : N, st);
    }
    if (a->pol->stream) cn_stream_fence();
}

/* Rows of a few chunks, pol->group_rows at a time: the stats of the group
 * first, then each row's normalizing pass from cache, prefetching the next. */
static void fwd_chunked(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    const int64_t N = a->N, RB = a->pol->group_rows;
    cn_row_stats st[CN_ROW_GROUP_MAX];    /* (group_rows <= CN_ROW_GROUP_MAX: the policy) */
    for (int64_t r = r0; r < r1; r += RB) {
        const int64_t nb = r1 - r < RB ? r1 - r : RB;
        for (int64_t i = 0; i < nb; i++) fwd_row_stats(a, r + i, &st[i]);
        for (int64_t i = 0; i < nb; i++) {
            const xt *x = (const xt *)a->x + (r + i) * N;
            const int64_t npf = r + i + RB < a->M ? a->pol->prefetch_elems : 0;
            if (!st[i].ok) continue;
            normalize_row(x, (xt *)a->y + (r + i) * N, (const pt *)a->w, (const pt *)a->b, N, (at)st[i].pivot,
                          st[i].delta, (at)st[i].rstd, a->center, a->pol->stream, x + RB * N, npf,
                          a->pol->prefetch_l2);
        }
    }
    if (a->pol->stream) cn_stream_fence();
}

static void fwd_path(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    switch (a->pol->path) {
    case CN_PATH_SMALL: fwd_small(a, r0, r1); break;
    case CN_PATH_MEDIUM: fwd_med(a, r0, r1); break;
    case CN_PATH_LONG: fwd_long(a, r0, r1); break;
    default: fwd_chunked(a, r0, r1); break;
    }
}

/* Rows [r0, r1) by the path the policy chose; a fresh output slab by slab,
 * each faulted in just before it is written (rows never depend on the slab). */
static void fwd_rows(const cn_fwd_args *a, int64_t r0, int64_t r1)
{
    if (a->pol->populate != CN_POPULATE_SLABS) { fwd_path(a, r0, r1); return; }
    const int64_t N = a->N, slab = a->pol->slab_rows;
    for (int64_t r = r0; r < r1; r += slab) {
        const int64_t e = r1 - r < slab ? r1 : r + slab;
        cn_populate_write((xt *)a->y + r * N, (size_t)((e - r) * N) * sizeof(xt));
        fwd_path(a, r, e);
    }
}
