/*
 * cn_bwd.h -- the backward's drivers: which rows and columns go through the
 * gradient terms of cn_rowmath.h in which order. bwd_rows takes whole rows of
 * one block (short rows in registers, longer ones in two passes); the team
 * path in _drivers.pxi splits long rows across threads with bwd_chunk and
 * bwd_apply, in the same order, so both give the same bits.
 */

/* ------------------------------------------------------------ chunk pieces -- */

/* Pass 1 over rows r .. r+R-1 (R = 1, 2 or 4), columns c0..c1: row sums into
 * s1/s2, and with dwp the rows added into the block partials (init: row r is
 * the block's first). Meanwhile npf elements pfo on from each row go to L2. */
static void bwd_chunk_rows(const cn_bwd_args *a, int64_t r, int R, int64_t c0, int64_t c1, void *dwp_,
                           void *dbp_, int init, at *s1, at *s2, int64_t pfo, int64_t npf)
{
    const int64_t N = a->N, n = c1 - c0;
    if (R == 3) {   /* as 2 + 1: the partials are stored and reloaded exactly in between */
        bwd_chunk_rows(a, r, 2, c0, c1, dwp_, dbp_, init, s1, s2, pfo, npf);
        bwd_chunk_rows(a, r + 2, 1, c0, c1, dwp_, dbp_, 0, s1 + 2, s2 + 2, pfo, npf);
        return;
    }
    const xt *dy = (const xt *)a->dy + r * N + c0, *x = (const xt *)a->x + r * N + c0;
    const pt *w = a->w ? (const pt *)a->w + c0 : NULL;
    /* partials only with a weight, dbias only for LayerNorm: checked here for both callers */
    at *dwp = dwp_ && w ? (at *)dwp_ + c0 : NULL, *dbp = dbp_ && dwp && a->center ? (at *)dbp_ + c0 : NULL;
    const at *mean = a->center ? (const at *)a->mean + r : NULL, *rstd = (const at *)a->rstd + r;
#define SUMS(RR, C, W, P, I) grad_sums(dy, x, w, n, N, mean, rstd, dwp, dbp, RR, C, W, P, I, s1, s2, pfo, npf)
#define BY_R(C, W, P, I)                                                              \
    switch (R) {                                                                      \
    case 1: SUMS(1, C, W, P, I); break;                                               \
    case 2: SUMS(2, C, W, P, I); break;                                               \
    default: SUMS(4, C, W, P, I); break;                                              \
    }
    if (a->center) {
        if (dwp) { if (init) BY_R(1, 1, 1, 1) else BY_R(1, 1, 1, 0) }
        else if (w) BY_R(1, 1, 0, 0)
        else BY_R(1, 0, 0, 0)
    } else {
        if (dwp) { if (init) BY_R(0, 1, 1, 1) else BY_R(0, 1, 1, 0) }
        else if (w) BY_R(0, 1, 0, 0)
        else BY_R(0, 0, 0, 0)
    }
#undef BY_R
#undef SUMS
}

/* Team path, phase A: the sums of R rows (1 or 2) from r over one chunk; row
 * i's sums go to s1[i*stride], s2[i*stride]. With dwp, the rows are also
 * added into the block partials (init: row r is the block's first). */
static void bwd_chunk(const cn_bwd_args *a, int64_t r, int R, int64_t c0, int64_t c1, double *s1, double *s2,
                      int64_t stride, void *dwp, void *dbp, int init, int64_t pfo, int64_t npf)
{
    at t1[CN_ROW_GROUP_MAX], t2[CN_ROW_GROUP_MAX];
    bwd_chunk_rows(a, r, R, c0, c1, dwp, dbp, init, t1, t2, pfo, npf);
    for (int i = 0; i < R; i++) {
        s1[i * stride] = (double)t1[i];
        s2[i * stride] = (double)t2[i];
    }
}

/* dx of row r, columns c0..c1 from its sums, specialised: C center, W weight,
 * S stream, ACC partials (1: write, 2: add; with DB also dbias) */
CN_INLINE void bwd_dx_row(const cn_bwd_args *a, int64_t r, int64_t c0, int64_t c1, double s1, double s2,
                          int64_t pf, int64_t npf, at *dwp, at *dbp, const int C, const int W, const int S,
                          const int ACC, const int DB)
{
    const int64_t N = a->N;
    const xt *dh = a->dh ? (const xt *)a->dh + r * N + c0 : NULL;
    const at mean = C ? ((const at *)a->mean)[r] : (at)0, rstd = ((const at *)a->rstd)[r];
    const at k1 = (at)(s1 / (double)N), k2 = (at)(s2 / (double)N);
    dx_row((const xt *)a->dy + r * N + c0, (const xt *)a->x + r * N + c0, W ? (const pt *)a->w + c0 : NULL, dh,
           (xt *)a->dx + r * N + c0, c1 - c0, mean, rstd, k1, k2, C, W, S, pf, npf, ACC ? dwp + c0 : NULL,
           ACC && DB ? dbp + c0 : NULL, ACC, DB);
}

/* bwd_dx_row for any call; with dwp (team path) also the partials (acc 1:
 * write, 2: add). Prefetches npf elements pf on. */
static void bwd_dx_range(const cn_bwd_args *a, int64_t r, int64_t c0, int64_t c1, double s1, double s2,
                         int64_t pf, int64_t npf, at *dwp, at *dbp, int acc)
{
#define DX(C, W, ACC, DB) \
    (a->pol->stream ? bwd_dx_row(a, r, c0, c1, s1, s2, pf, npf, dwp, dbp, C, W, 1, ACC, DB) \
                    : bwd_dx_row(a, r, c0, c1, s1, s2, pf, npf, dwp, dbp, C, W, 0, ACC, DB))
    if (!dwp || !a->w) {
        if (a->center) { if (a->w) DX(1, 1, 0, 0); else DX(1, 0, 0, 0); }
        else { if (a->w) DX(0, 1, 0, 0); else DX(0, 0, 0, 0); }
    } else if (a->center) {
        if (acc == 1) DX(1, 1, 1, 1); else DX(1, 1, 2, 1);
    } else {
        if (acc == 1) DX(0, 1, 1, 0); else DX(0, 1, 2, 0);
    }
#undef DX
}

/* dx of rows r..r+nrows-1 (in order), columns c0..c1, each row added into
 * the partials dw (and db) -- the block's first row, r == first, writes them.
 * Up to 4 rows per sweep (dx_rows_impl), the partials kept in registers;
 * prefetching npf elements at pfo elements on from each row. */
static void bwd_dx_rows_acc(const cn_bwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                            const double *rowsums, at *dw, at *db, int64_t first, int64_t pfo, int64_t npf)
{
    for (int64_t i = 0, R = 0; i < nrows; i += R) {
        R = nrows - i < CN_ROW_GROUP_MAX ? nrows - i : CN_ROW_GROUP_MAX;
        if (first > r + i && first < r + i + R) R = first - (r + i);   /* a block starts inside */
        if (R == 3) R = 2;   /* (then 1: same bits, the partials pass through memory exactly) */
        const int init = r + i == first;
#define ROWS(RR, C, DB, ST) dx_rows_impl(a, r + i, RR, c0, c1, rowsums + 2 * i, dw, db, init, C, DB, ST, pfo, npf)
#define BY_STREAM(RR, C, DB) if (a->pol->stream) ROWS(RR, C, DB, 1); else ROWS(RR, C, DB, 0);
#define BY_CENTER(RR) if (a->center) { BY_STREAM(RR, 1, 1) } else { BY_STREAM(RR, 0, 0) }
        switch ((int)R) {
        case 1: BY_CENTER(1) break;
        case 2: BY_CENTER(2) break;
        default: BY_CENTER(4) break;
        }
#undef BY_CENTER
#undef BY_STREAM
#undef ROWS
    }
}

/* Team path, phase C: rows r..r+nrows-1 (in order), columns c0..c1: dx, and
 * each row added into the block partials (the block's first row, r == first,
 * writes them). rowsums holds (s1, s2) per row. With partials, rows go four
 * at a time (bwd_dx_rows_acc), prefetching each row's next chunk; without,
 * one at a time, each prefetching the next row's piece (the walk jumps
 * between rows, which the hardware prefetcher does not follow). */
static void bwd_apply(const cn_bwd_args *a, int64_t r, int64_t nrows, int64_t c0, int64_t c1,
                      const double *rowsums, void *dwp, void *dbp, int64_t first)
{
    at *dw = a->w ? (at *)dwp : NULL, *db = (a->w && a->center) ? (at *)dbp : NULL;
    const int64_t N = a->N, n = c1 - c0;
    if (dw != NULL) {
        const int64_t next = c1 < N ? (c1 + CN_CHUNK <= N ? CN_CHUNK : N - c1) : 0;
        bwd_dx_rows_acc(a, r, nrows, c0, c1, rowsums, dw, db, first, n, next);
        return;
    }
    for (int64_t i = 0; i < nrows; i++) {
        /* next row, same columns; after the last row, the first row's next columns */
        int64_t pf = i + 1 < nrows ? N : n - (nrows - 1) * N;
        bwd_dx_range(a, r + i, c0, c1, rowsums[2 * i], rowsums[2 * i + 1], pf, n, dw, db, r + i == first ? 1 : 2);
    }
}

/* ---------------------------------------------------- short rows in registers -- */

/* Small rows, CN_SMALL_BLOCK at a time: first each row's two sums (overlapping
 * chains), then dx and the block partials, rereading the rows from L1. The
 * partials add the rows in order, so blocks never change a bit. */
CN_INLINE void bwd_small_block(const cn_bwd_args *a, int64_t r0, const int64_t nrows, const int NV,
                               const int center, const vec *wv, vec *dwacc, vec *dbacc, double inv_n, xt *stage)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const at *MEAN = (const at *)a->mean, *RSTD = (const at *)a->rstd;
    const xt *X = (const xt *)a->x + r0 * N, *DY = (const xt *)a->dy + r0 * N;
    xt *DX = stage ? stage : (xt *)a->dx + r0 * N;
    const xt *DH = a->dh ? (const xt *)a->dh + r0 * N : NULL;
    at c1[CN_SMALL_BLOCK], c2[CN_SMALL_BLOCK];
    vec acc1[CN_SMALL_BLOCK], acc2[CN_SMALL_BLOCK];
    int64_t i;
    int k;
    /* row i, vector k: x, dy, xhat and g = dy * w (both passes recompute them from L1) */
#define TERMS(k)                                                                                 \
    const int full_ = k < NV - 1 || tail == VL;                                                  \
    const vec xv = load_x_t(X + i * N + k * VL, tail, full_), dyv = load_x_t(DY + i * N + k * VL, tail, full_); \
    vec h = xhat_vec(xv, Mv, Rv, center);                                                        \
    if (k == NV - 1) h = VOP(keepn)(h, tail);                                                    \
    const vec g = VOP(mul)(dyv, wv[k])
    for (i = 0; i < nrows; i++) {
        const vec Mv = VOP(set1)(center ? MEAN[r0 + i] : (at)0), Rv = VOP(set1)(RSTD[r0 + i]);
        vec s1 = VOP(zero)(), s2 = VOP(zero)();
        CN_UNROLL for (k = 0; k < NV; k++) {
            TERMS(k);
            s1 = VOP(add)(s1, g);
            s2 = VOP(mul_add)(g, h, s2);
        }
        acc1[i] = s1;
        acc2[i] = s2;
    }
    if (center) hsum_rows(acc1, nrows, c1);
    hsum_rows(acc2, nrows, c2);
    for (i = 0; i < nrows; i++) {
        c1[i] = center ? (at)((double)c1[i] * inv_n) : (at)0;
        c2[i] = (at)((double)c2[i] * inv_n);
    }
    for (i = 0; i < nrows; i++) {
        const vec Mv = VOP(set1)(center ? MEAN[r0 + i] : (at)0), Rv = VOP(set1)(RSTD[r0 + i]);
        const vec C1 = VOP(set1)(c1[i]), C2 = VOP(set1)(c2[i]);
        vec o[8];
        prefetch_span(X + (a->pol->prefetch_rows + i) * N, N);     /* the same row some blocks ahead */
        prefetch_span(DY + (a->pol->prefetch_rows + i) * N, N);
        CN_UNROLL for (k = 0; k < NV; k++) {
            TERMS(k);
            const vec t = center ? VOP(sub)(g, C1) : g;
            o[k] = VOP(mul)(VOP(mul_sub_from)(h, C2, t), Rv);
            dwacc[k] = VOP(mul_add)(dyv, h, dwacc[k]);
            dbacc[k] = VOP(add)(dbacc[k], dyv);
            if (DH) o[k] = with_dh(o[k], DH + i * N + k * VL, 0, k < NV - 1 ? VL : tail, full_);
        }
        store_small_row(DX + i * N, o, NV, tail);
    }
    /* (after the block's last read: dx may be x, dy or dh in place) */
    if (stage) cn_copy_stream((xt *)a->dx + r0 * N, stage, (size_t)(nrows * N) * sizeof(xt));
#undef TERMS
}

CN_INLINE void bwd_small_nv(const cn_bwd_args *a, int64_t r0, int64_t r1, at *dwp, at *dbp, const int NV,
                            const int center)
{
    const int64_t N = a->N, tail = N - (int64_t)(NV - 1) * VL;
    const double inv_n = 1.0 / (double)N;
    vec wv[8], dwacc[8], dbacc[8];
    int k;
    CN_UNROLL for (k = 0; k < NV; k++) {
        int64_t t = k < NV - 1 ? VL : tail;
        wv[k] = a->w ? load_p_t((const pt *)a->w + k * VL, t, 0) : VOP(set1)((at)1);
        dwacc[k] = VOP(zero)();
        dbacc[k] = VOP(zero)();
    }
    CN_ALIGNED64 xt stage[CN_SMALL_BLOCK * SMALL_MAX];   /* streamed dx: as fwd_small_nv's */
    xt *st = a->pol->stream ? stage : NULL;
    for (int64_t r = r0; r < r1; r += CN_SMALL_BLOCK)
        bwd_small_block(a, r, r1 - r < CN_SMALL_BLOCK ? r1 - r : CN_SMALL_BLOCK, NV, center, wv, dwacc, dbacc, inv_n, st);
    if (st) cn_stream_fence();
    if (dwp) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            int64_t t = k < NV - 1 ? VL : tail;
            store_a_t(dwp + k * VL, dwacc[k], t, 0);
            if (dbp) store_a_t(dbp + k * VL, dbacc[k], t, 0);
        }
    }
}

static void bwd_small(const cn_bwd_args *a, int64_t r0, int64_t r1, at *dwp, at *dbp)
{
#define BWD_SMALL(K, C) bwd_small_nv(a, r0, r1, dwp, dbp, K, C)
    CN_SMALL_DISPATCH(a, BWD_SMALL)
#undef BWD_SMALL
}

/* Pass 2 of a group of rows without partials: bwd_dx_row for each, specialised
 * per (center, weight?, stream?) once a group, not row by row (rows of 96-128:
 * 3-10%, benchmarks/README.md) */
CN_INLINE void bwd_dx_group_impl(const cn_bwd_args *a, int64_t r, int ng, const double *sums, const int C,
                                 const int W, const int S)
{
    const int64_t ahead = a->pol->prefetch_rows;
    for (int i = 0; i < ng; i++) {
        const int64_t npf = r + i + ahead < a->M ? a->pol->prefetch_elems : 0;
        bwd_dx_row(a, r + i, 0, a->N, sums[2 * i], sums[2 * i + 1], ahead * a->N, npf, NULL, NULL,
                   C, W, S, 0, 0);
    }
}

static void bwd_dx_group(const cn_bwd_args *a, int64_t r, int ng, const double *sums)
{
#define G_(C, W, B) (a->pol->stream ? bwd_dx_group_impl(a, r, ng, sums, C, W, 1) \
                                    : bwd_dx_group_impl(a, r, ng, sums, C, W, 0))
    CN_NORM_DISPATCH(a->center, a->w, 0, G_);   /* (no bias in the backward's dx) */
#undef G_
}

/* ----------------------------------------------------------------- rows -- */

/* Rows [r0, r1) of one block; dwp/dbp (N values each, or NULL) receive the
 * block's partial sums of dy*xhat and dy. The policy (cn_policy_for) says how:
 * short rows in registers; longer rows pass1_rows at a time through pass 1
 * (grad_sums), group_rows of them before any takes pass 2 from cache. */
static void bwd_rows(const cn_bwd_args *a, int64_t r0, int64_t r1, void *dwp, void *dbp)
{
    const cn_policy *pol = a->pol;
    const int64_t N = a->N;
    if (!a->center) dbp = NULL;
    if (!a->w) dwp = dbp = NULL;
    /* fresh dx: the block's pages before its rows are read, or slab by slab */
    if (pol->populate == CN_POPULATE_AHEAD)
        cn_populate_write((xt *)a->dx + r0 * N, (size_t)((r1 - r0) * N) * sizeof(xt));
    if (pol->path == CN_PATH_SMALL) {
        bwd_small(a, r0, r1, (at *)dwp, (at *)dbp);
        return;
    }
    const int GR = (int)pol->group_rows, P1 = (int)pol->pass1_rows, late_parts = pol->late_parts;
    for (int64_t r = r0; r < r1; r += GR) {
        const int ng = r1 - r < GR ? (int)(r1 - r) : GR;
        if (pol->populate == CN_POPULATE_SLABS && (r - r0) % pol->slab_rows == 0) {
            const int64_t rows = r1 - r < pol->slab_rows ? r1 - r : pol->slab_rows;
            cn_populate_write((xt *)a->dx + r * N, (size_t)(rows * N) * sizeof(xt));
        }
        double sums[2 * CN_ROW_GROUP_MAX];   /* (s1, s2) per row (group_rows <= CN_ROW_GROUP_MAX: the policy) */
        for (int sg = 0; sg < ng; sg += P1) {
            const int nb = ng - sg < P1 ? ng - sg : P1;
            for (int i = 0; i < 2 * nb; i++) sums[2 * sg + i] = 0;
            for (int64_t c0 = 0; c0 < N; c0 += CN_CHUNK) {
                int64_t c1 = c0 + CN_CHUNK < N ? c0 + CN_CHUNK : N;
                at t1[CN_ROW_GROUP_MAX], t2[CN_ROW_GROUP_MAX];
                bwd_chunk_rows(a, r + sg, nb, c0, c1, late_parts ? NULL : dwp, dbp, r + sg == r0, t1, t2, 0, 0);
                for (int i = 0; i < nb; i++) { sums[2 * (sg + i)] += (double)t1[i]; sums[2 * (sg + i) + 1] += (double)t2[i]; }
            }
        }
        if (late_parts) {
            bwd_dx_rows_acc(a, r, ng, 0, N, sums, (at *)dwp, (at *)dbp, r0, 0, 0);
        } else {
            bwd_dx_group(a, r, ng, sums);
        }
    }
    if (pol->stream) cn_stream_fence();
}

/* ----------------------------------------------------- partial sums -- */

/* dst[c0:c1] += src[c0:c1]  (accumulator dtype) */
static void acc_add(void *dst_, const void *src_, int64_t c0, int64_t c1)
{
    at *dst = (at *)dst_ + c0;
    const at *src = (const at *)src_ + c0;
#define STEP(j, t, full, s) store_a_t(dst + (j), VOP(add)(load_a_t(dst + (j), t, full), load_a_t(src + (j), t, full)), t, full)
#define STEP1(j) STEP(j, VL, 1, 0)
    CN_WALK(c1 - c0, 0, 1, STEP1, STEP);
#undef STEP
#undef STEP1
}
