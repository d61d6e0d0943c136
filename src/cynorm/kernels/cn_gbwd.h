/*
 * cn_gbwd.h -- GroupNorm's backward (rows, channels and samples as in cn_gfwd.h).
 *
 * For a row (sample n, group g), with xhat = (x - mean) * rstd, per channel c:
 *   A_c = sum dy * xhat,  B_c = sum dy   (over the channel's S positions)
 *   c1 = sum_c w_c B_c / L,  c2 = sum_c w_c A_c / L   (double, in channel order)
 *   dx = rstd * (dy * w_c - c1 - xhat * c2)
 * A_c and B_c are sample n's contributions to dweight[c] and dbias[c]: they are
 * written to part[n] (2*C doubles: A, then B), and the caller adds the samples
 * in order. So dweight/dbias depend on nothing but the data: not on threads,
 * levels or how a Dask array's batch is chunked.
 *
 * Channels-first: A_c, B_c are lane sums over the channel's run by the row
 * walker, then the lane-sum tree; dx by the row walker, streamed where the
 * policy says (cn_gn_streams). Channels-last: per channel lanes, position
 * by position, CN_GN_POSITIONS positions in order, each such run added into
 * double totals (as the forward's moments); dx the same way, CN_GN_APPLY_TILE
 * vectors of channels with their scalars in registers, streamed where the
 * policy says (cn_gn_streams).
 */

/* dx of one vector: rstd * (dy * w - c1 - xhat * c2) */
CN_INLINE vec gn_dx_vec(vec dyv, vec xv, vec M, vec R, vec W, vec C1, vec C2, const int has_w)
{
    const vec xh = VOP(mul)(VOP(sub)(xv, M), R);
    vec g = has_w ? VOP(mul)(dyv, W) : dyv;
    g = VOP(sub)(g, C1);
    return VOP(mul)(VOP(mul_sub_from)(xh, C2, g), R);
}

/* ---------------------------------------------- channels-first rows -- */

/* A channel's run: its sums A (dy * xhat) and B (dy), lane sums then the tree */
CN_INLINE void gn_run_sums(const xt *dy, const xt *x, int64_t S, vec M, vec R, at *A, at *B)
{
    const vec z = VOP(zero)();
    vec av[2] = {z, z}, bv[2] = {z, z};
#define STEP(j, t, full, s)                                                          \
    {                                                                                \
        const vec dyv_ = load_x_t(dy + (j), t, full);                                \
        vec xh_ = VOP(mul)(VOP(sub)(load_x_t(x + (j), t, full), M), R);              \
        if (!(full)) xh_ = VOP(keepn)(xh_, t);                                       \
        av[s] = VOP(mul_add)(dyv_, xh_, av[s]);                                      \
        bv[s] = VOP(add)(bv[s], dyv_);                                               \
    }
#define STEP2(j) { STEP(j, VL, 1, 0) STEP((j) + VL, VL, 1, 1) }
    CN_WALK(S, 0, 2, STEP2, STEP);
#undef STEP
#undef STEP2
    *A = VOP(hsum)(VOP(add)(av[0], av[1]));
    *B = VOP(hsum)(VOP(add)(bv[0], bv[1]));
}

CN_INLINE void gn_bwd_rows_impl(const cn_gn_bwd_args *a, int64_t r0, int64_t r1, double *part, const int has_w)
{
    const int64_t C = a->C, S = a->S, Cg = C / a->G, L = Cg * S;
    const pt *w = (const pt *)a->w;
    const vec one = VOP(set1)((at)1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t n = r / a->G, g = r - n * a->G;
        const xt *x = (const xt *)a->x + r * L, *dy = (const xt *)a->dy + r * L;
        xt *dx = (xt *)a->dx + r * L;
        const vec M = VOP(set1)(((const at *)a->mean)[r]), R = VOP(set1)(((const at *)a->rstd)[r]);
        double s1 = 0.0, s2 = 0.0;
        int64_t k;
        for (k = 0; k < Cg; k++) {
            const int64_t c = g * Cg + k;
            at A, B;
            gn_run_sums(dy + k * S, x + k * S, S, M, R, &A, &B);
            part[n * 2 * C + c] = (double)A;
            part[n * 2 * C + C + c] = (double)B;
            const double wc = has_w ? (double)w[c] : 1.0;
            s1 += wc * (double)B;
            s2 += wc * (double)A;
        }
        const vec C1 = VOP(set1)((at)(s1 / (double)L)), C2 = VOP(set1)((at)(s2 / (double)L));
        /* dx from cache; streamed (outputs bound for DRAM), the next row's x and dy go into
         * L2 meanwhile, as in the forward's gn_run (unstreamed, from L3, that lost 15%) */
        const int next = a->stream && r + 1 < r1;
        for (k = 0; k < Cg; k++) {
            const xt *xk = x + k * S, *dyk = dy + k * S;
            xt *dxk = dx + k * S;
            const vec W = has_w ? VOP(set1)(w[g * Cg + k]) : one;
#define DX(j, t, full) gn_dx_vec(load_x_t(dyk + (j), t, full), load_x_t(xk + (j), t, full), M, R, W, C1, C2, has_w)
#define STEP(j, t, full, s) store_x_t(dxk + (j), DX(j, t, full), t, full, a->stream)
#define STEP2(j)                                                                                        \
    {                                                                                                   \
        if (next) {                                                                                     \
            cn_prefetch_l2(xk + L + (j)); cn_prefetch_l2(xk + L + (j) + VL);                            \
            cn_prefetch_l2(dyk + L + (j)); cn_prefetch_l2(dyk + L + (j) + VL);                          \
        }                                                                                               \
        const vec o0_ = DX(j, VL, 1), o1_ = DX((j) + VL, VL, 1);                                        \
        store_x2(dxk + (j), o0_, o1_, a->stream);                                                       \
    }
            CN_WALK(S, a->stream ? stream_peel(dxk, S) : 0, 2, STEP2, STEP);
#undef DX
#undef STEP
#undef STEP2
        }
    }
}

/* Channels-first rows [r0, r1): dx, and their samples' part (2*C doubles per sample). */
static void gn_bwd_rows(const cn_gn_bwd_args *a, int64_t r0, int64_t r1, double *part)
{
    if (a->w) gn_bwd_rows_impl(a, r0, r1, part, 1);
    else gn_bwd_rows_impl(a, r0, r1, part, 0);
}

/* ----------------------------------------- channels-last samples -- */

/* Per-channel A (dy * xhat) and B (dy) over positions [s0, s1) for NV channel
 * vectors from c0 (the last `tail` lanes), added into the double totals; each
 * lane adds its positions in order (the tile's width changes no bit). */
CN_INLINE void gn_tile_grads(const cn_gn_bwd_args *a, int64_t n, int64_t s0, int64_t s1, int64_t c0, const int NV,
                             int64_t tail, const int tail_full, const at *mv, const at *rv, double *A, double *B)
{
    vec M[CN_GN_TILE], R[CN_GN_TILE], aa[CN_GN_TILE], ba[CN_GN_TILE];
    int k;
    gn_tile_load(M, mv, c0, NV, tail, tail_full);
    gn_tile_load(R, rv, c0, NV, tail, tail_full);
    CN_UNROLL for (k = 0; k < NV; k++) aa[k] = ba[k] = VOP(zero)();
    const int64_t off = (n * a->S + s0) * a->C + c0;
    const xt *x = (const xt *)a->x + off, *dy = (const xt *)a->dy + off;
    for (int64_t s = s0; s < s1; s++, x += a->C, dy += a->C) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            cn_prefetch(x + CN_GN_AHEAD * a->C + k * VL);   /* (the strided walk outruns the prefetchers) */
            cn_prefetch(dy + CN_GN_AHEAD * a->C + k * VL);
            const vec dyv = load_x_t(dy + k * VL, GN_LANES(k), GN_FULL(k));
            const vec xh = VOP(mul)(VOP(sub)(load_x_t(x + k * VL, GN_LANES(k), GN_FULL(k)), M[k]), R[k]);
            aa[k] = VOP(mul_add)(dyv, xh, aa[k]);
            ba[k] = VOP(add)(ba[k], dyv);
        }
    }
    CN_UNROLL for (k = 0; k < NV; k++) {
        gn_add_lanes(A + c0 + k * VL, aa[k], GN_LANES(k), GN_FULL(k));
        gn_add_lanes(B + c0 + k * VL, ba[k], GN_LANES(k), GN_FULL(k));
    }
}

static void gn_grads(const cn_gn_bwd_args *a, int64_t n, int64_t s0, int64_t s1, const at *mv, const at *rv,
                     double *A, double *B)
{
#define TILE(c0, NV, tail, tail_full) gn_tile_grads(a, n, s0, s1, c0, NV, tail, tail_full, mv, rv, A, B)
    CN_GN_FOR_TILES(a->C, TILE)
#undef TILE
}

/* A channels-last sample's per-channel scalars for the dx pass */
typedef struct { const at *m, *r, *c1, *c2; const pt *w; } gn_bwd_scalars;

/* dx at npos positions from flat element `first` (C apart), NV channel
 * vectors from c0 (the last `tail` lanes), sc's scalars for them held in
 * registers across the positions. */
CN_INLINE void gn_tile_dx(const cn_gn_bwd_args *a, const gn_bwd_scalars *sc, int64_t first, int64_t npos, int64_t c0,
                          const int NV, int64_t tail, const int tail_full, const int stream, const int has_w)
{
    vec M[CN_GN_TILE], R[CN_GN_TILE], W[CN_GN_TILE], C1[CN_GN_TILE], C2[CN_GN_TILE];
    int k;
    gn_tile_load(M, sc->m, c0, NV, tail, tail_full);
    gn_tile_load(R, sc->r, c0, NV, tail, tail_full);
    gn_tile_load_p(W, has_w ? sc->w : NULL, c0, NV, tail, tail_full, VOP(set1)((at)1));
    gn_tile_load(C1, sc->c1, c0, NV, tail, tail_full);
    gn_tile_load(C2, sc->c2, c0, NV, tail, tail_full);
    const xt *x = (const xt *)a->x + first + c0, *dy = (const xt *)a->dy + first + c0;
    xt *dx = (xt *)a->dx + first + c0;
    for (int64_t s = 0; s < npos; s++, x += a->C, dy += a->C, dx += a->C) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            const vec v = gn_dx_vec(load_x_t(dy + k * VL, GN_LANES(k), GN_FULL(k)),
                                    load_x_t(x + k * VL, GN_LANES(k), GN_FULL(k)), M[k], R[k], W[k], C1[k], C2[k], has_w);
            store_x_t(dx + k * VL, v, GN_LANES(k), GN_FULL(k), stream);
        }
    }
}

/* gn_tile_dx over channels [0, nc), CN_GN_APPLY_TILE vectors at a time: one
 * function with a weight and one without, each compiled once */
#define GN_DX_TILE(c0, NV, tail, tail_full) gn_tile_dx(a, sc, first, npos, c0, NV, tail, tail_full, stream, has_w)
#define GN_DX_TILES(NAME, HAS_W)                                                                          \
    CN_OUTLINE void NAME(const cn_gn_bwd_args *a, const gn_bwd_scalars *sc, int64_t first, int64_t npos,     \
                         int64_t nc, const int stream)                                                     \
    {                                                                                                      \
        const int has_w = HAS_W;                                                                           \
        CN_GN_FOR_TILES_OF(nc, CN_GN_APPLY_TILE, GN_DX_TILE)                                               \
    }
GN_DX_TILES(gn_dx_tiles_w, 1)
GN_DX_TILES(gn_dx_tiles_, 0)
#undef GN_DX_TILES
#undef GN_DX_TILE
CN_INLINE void gn_dx_tiles(const cn_gn_bwd_args *a, const gn_bwd_scalars *sc, int64_t first, int64_t npos, int64_t nc,
                           const int stream, const int has_w)
{
    if (has_w) gn_dx_tiles_w(a, sc, first, npos, nc, stream);
    else gn_dx_tiles_(a, sc, first, npos, nc, stream);
}

/* dx at positions [s0, s1) of sample n, streamed from each position's first
 * line boundary where h > 0 (rot: sc rotated by h; CN_GN_WALK_POSITIONS) */
static void gn_dx(const cn_gn_bwd_args *a, int64_t n, int64_t s0, int64_t s1, const gn_bwd_scalars *sc,
                  const gn_bwd_scalars *rot, int64_t h, const int has_w)
{
#define WALK(r, st, first, npos, nc) gn_dx_tiles(a, (r) ? rot : sc, first, npos, nc, (st) && a->stream, has_w)
    CN_GN_WALK_POSITIONS(a->S, a->C, h, s0, s1, n * a->S * a->C, WALK);
#undef WALK
}

/* Channels-last sample n: its part (2*C doubles) and dx. scratch: CN_GN_SCRATCH(C, a->stream) doubles. */
CN_INLINE void gn_bwd_sample_impl(const cn_gn_bwd_args *a, int64_t n, double *part, double *scratch, const int has_w)
{
    const int64_t C = a->C, S = a->S, G = a->G, Cg = C / G, L = Cg * S;
    const pt *w = (const pt *)a->w;
    at *mv = (at *)scratch, *rv = mv + C, *c1v = mv + 2 * C, *c2v = mv + 3 * C;   /* per channel */
    double *A = part + n * 2 * C, *B = A + C;
    int64_t c, s0, k, g;
    for (g = 0; g < G; g++) {   /* (no division per channel) */
        const at mg = ((const at *)a->mean)[n * G + g], rg = ((const at *)a->rstd)[n * G + g];
        for (c = g * Cg; c < (g + 1) * Cg; c++) { mv[c] = mg; rv[c] = rg; }
    }
    for (c = 0; c < C; c++) A[c] = B[c] = 0.0;
    for (s0 = 0; s0 < S; s0 += CN_GN_POSITIONS)
        gn_grads(a, n, s0, s0 + CN_GN_POSITIONS < S ? s0 + CN_GN_POSITIONS : S, mv, rv, A, B);
    for (g = 0; g < G; g++) {
        double s1 = 0.0, s2 = 0.0;
        for (k = 0; k < Cg; k++) {
            c = g * Cg + k;
            const double wc = has_w ? (double)w[c] : 1.0;
            s1 += wc * B[c];
            s2 += wc * A[c];
        }
        for (k = 0; k < Cg; k++) {
            c1v[g * Cg + k] = (at)(s1 / (double)L);
            c2v[g * Cg + k] = (at)(s2 / (double)L);
        }
    }
    /* dx, CN_GN_POSITIONS positions by a tile of channels at a time */
    const gn_bwd_scalars sc = {mv, rv, c1v, c2v, w};
    gn_bwd_scalars rot = sc;
    const int64_t h = gn_peel((const xt *)a->dx + n * S * C, C, a->stream);
    double *slots = scratch + 7 * C;   /* five slots of C doubles */
    if (h)
        rot = (gn_bwd_scalars){gn_rotated(slots, 0, mv, C, h, sizeof(at)), gn_rotated(slots, 1, rv, C, h, sizeof(at)),
                               gn_rotated(slots, 2, c1v, C, h, sizeof(at)), gn_rotated(slots, 3, c2v, C, h, sizeof(at)),
                               gn_rotated(slots, 4, has_w ? w : NULL, C, h, sizeof(pt))};
    for (s0 = 0; s0 < S; s0 += CN_GN_POSITIONS)
        gn_dx(a, n, s0, s0 + CN_GN_POSITIONS < S ? s0 + CN_GN_POSITIONS : S, &sc, &rot, h, has_w);
}

/* Channels-last samples [n0, n1): dx and part. scratch: CN_GN_SCRATCH(C, a->stream) doubles. */
static void gn_bwd_samples(const cn_gn_bwd_args *a, int64_t n0, int64_t n1, double *part, double *scratch)
{
    for (int64_t n = n0; n < n1; n++) {
        if (a->w) gn_bwd_sample_impl(a, n, part, scratch, 1);
        else gn_bwd_sample_impl(a, n, part, scratch, 0);
    }
}
