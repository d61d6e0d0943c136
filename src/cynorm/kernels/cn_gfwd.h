/*
 * cn_gfwd.h -- GroupNorm's forward (InstanceNorm: one channel per group).
 *
 * x is (N, C, S) channels-first or (N, S, C) channels-last, S the product of
 * the spatial dims; the C channels fall into G groups of Cg = C/G. Group g of
 * sample n is a "row" r = n*G + g of L = Cg*S elements; mean and rstd hold one
 * value per row; weight and bias one per channel.
 *
 * Channels-first: a row is contiguous, so its moments are exactly LayerNorm's
 * (chunk moments of CN_CHUNK elements merged left to right, cn_rowmath.h), and
 * it is normalized channel run by channel run (S elements, one weight and bias)
 * with the row walker, from cache, while the next row is fetched into L2 (y
 * streamed where the policy says, cn_gn_streams).
 *
 * Channels-last: a sample's block is walked position by position, the lanes
 * being channels (CN_GN_TILE vectors of them at a time): per channel, one-pass
 * sums about a pivot (the mean of its first CN_GN_HEAD positions), over
 * CN_GN_POSITIONS positions in order, each such run then added into double
 * totals. A
 * channel whose pivot is too far from its mean for that (cn_onepass_accepts)
 * is redone by a two-pass in double. Channel moments merge into their group's
 * in channel order. The normalizing pass walks the same way, CN_GN_APPLY_TILE
 * vectors of channels with their scalars in registers, streaming y where the
 * policy says (cn_gn_streams), from each position's first cache line boundary
 * (CN_GN_WALK_POSITIONS); groups to be rescued are left alone there and
 * redone from x after (y may be x). A lane's arithmetic never depends on the
 * other lanes, so the bits do not depend on the vector width, the level, the
 * tile or the thread count.
 *
 * Rows beyond the accumulator's range are redone in double (gn_rescue), as
 * LayerNorm's rows are.
 */

/* -------------------------------------------------------- shared -- */

/* Element k of row (n, g), k = (channel in group) * S + position. */
CN_INLINE int64_t gn_index(const cn_gn_fwd_args *a, int64_t n, int64_t g, int64_t k)
{
    const int64_t C = a->C, S = a->S, Cg = C / a->G;
    if (!a->channels_last) return (n * a->G + g) * Cg * S + k;
    return (n * S + k % S) * C + g * Cg + k / S;
}

/* y = ((x - mean_hi) * rstd + lr) * w + b, the LayerNorm forward's formula */
CN_INLINE vec gn_vec(vec v, vec MH, vec R, vec LR, vec W, vec B, const int has_w, const int has_b)
{
    v = VOP(mul_add)(VOP(sub)(v, MH), R, LR);
    if (has_w && has_b) v = VOP(mul_add)(v, W, B);
    else if (has_w) v = VOP(mul)(v, W);
    else if (has_b) v = VOP(add)(v, B);
    return v;
}

/* A row redone in double, scaled by a power of two (as fwd_rescue). */
static void gn_rescue(const cn_gn_fwd_args *a, int64_t n, int64_t g)
{
    const int64_t S = a->S, Cg = a->C / a->G, L = Cg * S, r = n * a->G + g;
    const xt *x = (const xt *)a->x;
    xt *y = (xt *)a->y;
    const pt *w = (const pt *)a->w, *b = (const pt *)a->b;
    double amax = 0.0, p, mean = 0.0, m2 = 0.0, eps_s, rstd_s, rstd;
    int64_t k;
    int e;
    for (k = 0; k < L; k++) { double v = fabs((double)x_to_at(x[gn_index(a, n, g, k)])); if (v > amax) amax = v; }
    frexp(amax, &e);
#define SCALED(k) ldexp((double)x_to_at(x[gn_index(a, n, g, k)]), -e)
    p = SCALED(0);
    for (k = 0; k < L; k++) mean += SCALED(k) - p;
    mean = p + mean / (double)L;
    for (k = 0; k < L; k++) { double d = SCALED(k) - mean; m2 += d * d; }
    eps_s = ldexp(a->eps, -2 * e);
    if (isfinite(eps_s)) {
        rstd_s = 1.0 / sqrt(m2 / (double)L + eps_s);
        rstd = ldexp(rstd_s, -e);
    } else {
        rstd = 1.0 / sqrt(a->eps + ldexp(m2 / (double)L, 2 * e));
        rstd_s = ldexp(rstd, e);
    }
    for (k = 0; k < L; k++) {
        const int64_t c = g * Cg + k / S;
        double v = (SCALED(k) - mean) * rstd_s;
        if (w) v *= (double)w[c];
        if (b) v += (double)b[c];
        y[gn_index(a, n, g, k)] = double_to_x(v);
    }
#undef SCALED
    ((at *)a->mean)[r] = (at)ldexp(mean, e);
    ((at *)a->rstd)[r] = (at)rstd;
}

/* wants_rescue for a row of GroupNorm (always centered). */
static int gn_wants_rescue(const cn_gn_fwd_args *a, int64_t n, int64_t g, double delta, double m2, double inv_n)
{
    const int64_t L = a->C / a->G * a->S;
    int64_t k;
    if (!CN_UNLIKELY(may_need_rescue(delta, m2, inv_n))) return 0;
    const xt *x = (const xt *)a->x;
    int finite = 1, constant = 1;
    const at first = x_to_at(x[gn_index(a, n, g, 0)]);
    for (k = 0; k < L; k++) {
        const at v = x_to_at(x[gn_index(a, n, g, k)]);
        finite &= isfinite((double)v) != 0;
        constant &= v == first;
    }
    if (!(isfinite(delta) && isfinite(m2))) return finite;
    if (a->eps >= TINY_VAR && constant) return 0;
    return finite;
}

/* A row's mean/rstd from its moments about pivot: written out, and returned as
 * the normalizing pass takes them (mean_hi, lr = -mean_lo * rstd, rstd).
 * Returns 0 where the row must be redone by gn_rescue instead (the caller's job). */
static int gn_finish(const cn_gn_fwd_args *a, int64_t n, int64_t g, at pivot, const cn_moments *m, at *mh,
                     at *lr, at *rs)
{
    const double L = (double)(a->C / a->G * a->S);
    const double rstd = cn_rstd(m->m2, L, a->eps);
    if (gn_wants_rescue(a, n, g, m->delta, m->m2, 1.0 / L)) return 0;
    at lo;
    split_mean((double)pivot, m->delta, mh, &lo);
    *rs = (at)rstd;
    *lr = -lo * *rs;
    ((at *)a->mean)[n * a->G + g] = (at)((double)pivot + m->delta);
    ((at *)a->rstd)[n * a->G + g] = *rs;
    return 1;
}

/* ---------------------------------------------- channels-first rows -- */

/* One channel's run of S elements: y from x with scalar weight/bias, while
 * the same stretch of pf (the next row) goes into L2 (NULL: none); stream:
 * non-temporal stores, after a partial vector up to y's first aligned one
 * (the row walker's head). */
CN_INLINE void gn_run(const xt *x, xt *y, int64_t S, vec MH, vec R, vec LR, vec W, vec B, const int has_w,
                      const int has_b, const xt *pf, const int stream)
{
#define GV(j, t, full) gn_vec(load_x_t(x + (j), t, full), MH, R, LR, W, B, has_w, has_b)
#define STEP(j, t, full, s) store_x_t(y + (j), GV(j, t, full), t, full, stream)
#define STEP2(j)                                                                                \
    {                                                                                           \
        if (pf) { cn_prefetch_l2(pf + (j)); cn_prefetch_l2(pf + (j) + VL); }                    \
        const vec o0_ = GV(j, VL, 1), o1_ = GV((j) + VL, VL, 1);                                \
        store_x2(y + (j), o0_, o1_, stream);                                                    \
    }
    CN_WALK(S, stream ? stream_peel(y, S) : 0, 2, STEP2, STEP);
#undef GV
#undef STEP
#undef STEP2
}

CN_INLINE void gn_rows_impl(const cn_gn_fwd_args *a, int64_t r0, int64_t r1, const int has_w, const int has_b)
{
    const int64_t S = a->S, Cg = a->C / a->G, L = Cg * S;
    const pt *w = (const pt *)a->w, *b = (const pt *)a->b;
    const vec one = VOP(set1)((at)1), zero = VOP(zero)();
    for (int64_t r = r0; r < r1; r++) {
        const int64_t n = r / a->G, g = r - n * a->G;
        const xt *x = (const xt *)a->x + r * L;
        xt *y = (xt *)a->y + r * L;
        const at pivot = x_to_at(x[0]);
        cn_moments tot, m;
        chunk_moments(x, L < CN_CHUNK ? L : CN_CHUNK, pivot, 1, &tot);
        for (int64_t c0 = CN_CHUNK; c0 < L; c0 += CN_CHUNK) {
            chunk_moments(x + c0, c0 + CN_CHUNK < L ? CN_CHUNK : L - c0, pivot, 1, &m);
            cn_moments_merge(&tot, &m);
        }
        at mh, lr, rs;
        if (!gn_finish(a, n, g, pivot, &tot, &mh, &lr, &rs)) { gn_rescue(a, n, g); continue; }
        const vec MH = VOP(set1)(mh), R = VOP(set1)(rs), LR = VOP(set1)(lr);
        for (int64_t k = 0; k < Cg; k++) {
            const int64_t c = g * Cg + k;
            gn_run(x + k * S, y + k * S, S, MH, R, LR, has_w ? VOP(set1)(w[c]) : one, has_b ? VOP(set1)(b[c]) : zero,
                   has_w, has_b, r + 1 < r1 ? x + L + k * S : NULL, a->stream);
        }
    }
}

/* Channels-first rows [r0, r1): moments, then each channel's run normalized. */
static void gn_fwd_rows(const cn_gn_fwd_args *a, int64_t r0, int64_t r1)
{
    if (a->w && a->b) gn_rows_impl(a, r0, r1, 1, 1);
    else if (a->w) gn_rows_impl(a, r0, r1, 1, 0);
    else if (a->b) gn_rows_impl(a, r0, r1, 0, 1);
    else gn_rows_impl(a, r0, r1, 0, 0);
}

/* ----------------------------------------- channels-last samples -- */

/* Per-channel sums of x - P and of (x - P)^2 over positions [s0, s1), for NV
 * channel vectors from c0 at once (the last one `tail` lanes; tail_full: it is
 * full), added into the double totals. Each lane adds its positions in order,
 * so the tile's width changes no bit. */
CN_INLINE void gn_tile_sums(const cn_gn_fwd_args *a, int64_t n, int64_t s0, int64_t s1, int64_t c0, const int NV,
                            int64_t tail, const int tail_full, const at *piv, double *ssum, double *qsum)
{
    vec P[CN_GN_TILE], sa[CN_GN_TILE], qa[CN_GN_TILE];
    int k;
    gn_tile_load(P, piv, c0, NV, tail, tail_full);
    CN_UNROLL for (k = 0; k < NV; k++) sa[k] = qa[k] = VOP(zero)();
    const xt *row = (const xt *)a->x + (n * a->S + s0) * a->C + c0;
    for (int64_t s = s0; s < s1; s++, row += a->C) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            cn_prefetch(row + CN_GN_AHEAD * a->C + k * VL);   /* (the strided walk outruns the prefetchers) */
            const vec e = VOP(sub)(load_x_t(row + k * VL, GN_LANES(k), GN_FULL(k)), P[k]);
            sa[k] = VOP(add)(sa[k], e);
            qa[k] = VOP(mul_add)(e, e, qa[k]);
        }
    }
    CN_UNROLL for (k = 0; k < NV; k++) {
        gn_add_lanes(ssum + c0 + k * VL, sa[k], GN_LANES(k), GN_FULL(k));
        gn_add_lanes(qsum + c0 + k * VL, qa[k], GN_LANES(k), GN_FULL(k));
    }
}

/* gn_tile_sums over all channels, CN_GN_TILE vectors at a time */
static void gn_sums(const cn_gn_fwd_args *a, int64_t n, int64_t s0, int64_t s1, const at *piv, double *ssum,
                    double *qsum)
{
#define TILE(c0, NV, tail, tail_full) gn_tile_sums(a, n, s0, s1, c0, NV, tail, tail_full, piv, ssum, qsum)
    CN_GN_FOR_TILES(a->C, TILE)
#undef TILE
}

/* Moments of channel c of sample n about its pivot pc, in double: the
 * fallback where the one-pass sums are refused. */
static void gn_channel_twopass(const cn_gn_fwd_args *a, int64_t n, int64_t c, double *mean, double *m2)
{
    const xt *x = (const xt *)a->x + n * a->S * a->C + c;
    const double p = (double)x_to_at(x[0]);
    double s = 0.0, q = 0.0;
    int64_t i;
    for (i = 0; i < a->S; i++) s += (double)x_to_at(x[i * a->C]) - p;
    *mean = p + s / (double)a->S;
    for (i = 0; i < a->S; i++) { const double d = (double)x_to_at(x[i * a->C]) - *mean; q += d * d; }
    *m2 = q;
}

/* A channels-last sample's per-channel scalars for the normalizing pass */
typedef struct { const at *mh, *rs, *lr; const pt *w, *b; } gn_fwd_scalars;

/* y at npos positions from flat element `first` (C apart), NV channel vectors
 * from c0 (the last one `tail` lanes; tail_full: it is full), sc's scalars
 * for them held in registers across the positions. */
CN_INLINE void gn_tile_apply(const cn_gn_fwd_args *a, const gn_fwd_scalars *sc, int64_t first, int64_t npos,
                             int64_t c0, const int NV, int64_t tail, const int tail_full, const int stream,
                             const int has_w, const int has_b)
{
    vec MH[CN_GN_TILE], R[CN_GN_TILE], LR[CN_GN_TILE], W[CN_GN_TILE], B[CN_GN_TILE];
    int k;
    gn_tile_load(MH, sc->mh, c0, NV, tail, tail_full);
    gn_tile_load(R, sc->rs, c0, NV, tail, tail_full);
    gn_tile_load(LR, sc->lr, c0, NV, tail, tail_full);
    gn_tile_load_p(W, has_w ? sc->w : NULL, c0, NV, tail, tail_full, VOP(set1)((at)1));
    gn_tile_load_p(B, has_b ? sc->b : NULL, c0, NV, tail, tail_full, VOP(zero)());
    const xt *xr = (const xt *)a->x + first + c0;
    xt *yr = (xt *)a->y + first + c0;
    for (int64_t s = 0; s < npos; s++, xr += a->C, yr += a->C) {
        CN_UNROLL for (k = 0; k < NV; k++) {
            const vec v = load_x_t(xr + k * VL, GN_LANES(k), GN_FULL(k));
            store_x_t(yr + k * VL, gn_vec(v, MH[k], R[k], LR[k], W[k], B[k], has_w, has_b), GN_LANES(k), GN_FULL(k),
                      stream);
        }
    }
}

/* gn_tile_apply over channels [0, nc), CN_GN_APPLY_TILE vectors at a time:
 * one function per (weight, bias) presence, each compiled once */
#define GN_APPLY_TILE(c0, NV, tail, tail_full) \
    gn_tile_apply(a, sc, first, npos, c0, NV, tail, tail_full, stream, has_w, has_b)
#define GN_APPLY_TILES(NAME, HAS_W, HAS_B)                                                                \
    CN_OUTLINE void NAME(const cn_gn_fwd_args *a, const gn_fwd_scalars *sc, int64_t first, int64_t npos,     \
                         int64_t nc, const int stream)                                                     \
    {                                                                                                      \
        const int has_w = HAS_W, has_b = HAS_B;                                                            \
        CN_GN_FOR_TILES_OF(nc, CN_GN_APPLY_TILE, GN_APPLY_TILE)                                            \
    }
GN_APPLY_TILES(gn_apply_tiles_wb, 1, 1)
GN_APPLY_TILES(gn_apply_tiles_w, 1, 0)
GN_APPLY_TILES(gn_apply_tiles_b, 0, 1)
GN_APPLY_TILES(gn_apply_tiles_, 0, 0)
#undef GN_APPLY_TILES
#undef GN_APPLY_TILE
CN_INLINE void gn_apply_tiles(const cn_gn_fwd_args *a, const gn_fwd_scalars *sc, int64_t first, int64_t npos,
                              int64_t nc, const int stream, const int has_w, const int has_b)
{
    if (has_w && has_b) gn_apply_tiles_wb(a, sc, first, npos, nc, stream);
    else if (has_w) gn_apply_tiles_w(a, sc, first, npos, nc, stream);
    else if (has_b) gn_apply_tiles_b(a, sc, first, npos, nc, stream);
    else gn_apply_tiles_(a, sc, first, npos, nc, stream);
}

/* y at positions [s0, s1) of sample n. rescue NULL: every group, streamed
 * from each position's first line boundary where h > 0 (rot: sc rotated by
 * h; CN_GN_WALK_POSITIONS). Otherwise only the runs of groups not to be
 * rescued, with plain stores (a rescued group's x stays as it was, for
 * gn_rescue: y may be x). */
CN_INLINE void gn_apply(const cn_gn_fwd_args *a, int64_t n, int64_t s0, int64_t s1, const unsigned char *rescue,
                        const gn_fwd_scalars *sc, const gn_fwd_scalars *rot, int64_t h, const int stream,
                        const int has_w, const int has_b)
{
    const int64_t C = a->C, G = a->G, Cg = C / G, base = n * a->S * C;
    if (!rescue) {
#define WALK(r, st, first, npos, nc) gn_apply_tiles(a, (r) ? rot : sc, first, npos, nc, (st) && stream, has_w, has_b)
        CN_GN_WALK_POSITIONS(a->S, C, h, s0, s1, base, WALK);
#undef WALK
        return;
    }
    for (int64_t ga = 0, gb; ga < G; ga = gb) {
        for (; ga < G && rescue[ga]; ga++) {}
        for (gb = ga; gb < G && !rescue[gb]; gb++) {}
        const int64_t ca = ga * Cg;
        const gn_fwd_scalars from = {sc->mh + ca, sc->rs + ca, sc->lr + ca, has_w ? sc->w + ca : NULL,
                                     has_b ? sc->b + ca : NULL};
        gn_apply_tiles(a, &from, base + s0 * C + ca, s1 - s0, (gb - ga) * Cg, 0, has_w, has_b);
    }
}

/* Pivots of NV channel vectors from c0: the mean of each channel's first
 * `head` positions (each lane adds its positions in order). */
CN_INLINE void gn_tile_pivots(const cn_gn_fwd_args *a, int64_t n, int64_t head, int64_t c0, const int NV,
                              int64_t tail, const int tail_full, at *piv)
{
    vec acc[CN_GN_TILE];
    at lanes[VL];
    int k;
    CN_UNROLL for (k = 0; k < NV; k++) acc[k] = VOP(zero)();
    const xt *row = (const xt *)a->x + n * a->S * a->C + c0;
    for (int64_t s = 0; s < head; s++, row += a->C)
        CN_UNROLL for (k = 0; k < NV; k++) acc[k] = VOP(add)(acc[k], load_x_t(row + k * VL, GN_LANES(k), GN_FULL(k)));
    CN_UNROLL for (k = 0; k < NV; k++) {
        store_a_t(lanes, acc[k], GN_LANES(k), GN_FULL(k));
        for (int64_t i = 0; i < GN_LANES(k); i++) piv[c0 + k * VL + i] = (at)((double)lanes[i] / (double)head);
    }
}

/* Moments of channel c of sample n about the group's pivot gp, from its
 * one-pass sums about its own pivot, or redone in double where refused. */
CN_INLINE void gn_channel_moments(const cn_gn_fwd_args *a, int64_t n, int64_t c, const at *piv, const double *ssum,
                                  const double *qsum, at gp, cn_moments *m)
{
    m->n = (double)a->S;
    if (!onepass_moments((double)piv[c], ssum[c], qsum[c], (double)a->S, gp, m)) {
        double mean, m2;
        gn_channel_twopass(a, n, c, &mean, &m2);
        m->delta = mean - (double)gp;
        m->m2 = m2;
    }
}

/* Channels-last sample n, whole. scratch: CN_GN_SCRATCH(C, a->stream) doubles. */
CN_INLINE void gn_sample_impl(const cn_gn_fwd_args *a, int64_t n, double *scratch, const int has_w, const int has_b)
{
    const int64_t C = a->C, S = a->S, Cg = C / a->G;
    const int64_t head = S < CN_GN_HEAD ? S : CN_GN_HEAD;
    double *ssum = scratch, *qsum = scratch + C;
    at *piv = (at *)(scratch + 2 * C);                  /* per channel: pivot, then mean_hi, lr, rstd */
    at *mh = piv + C, *lr = piv + 2 * C, *rs = piv + 3 * C;
    unsigned char *rescue = (unsigned char *)(scratch + 6 * C);   /* per group */
    int64_t s0, c, k;
    int any_rescued = 0;
    /* pivots: the mean of each channel's first `head` positions */
#define TILE(c0, NV, tail, tail_full) gn_tile_pivots(a, n, head, c0, NV, tail, tail_full, piv)
    CN_GN_FOR_TILES(C, TILE)
#undef TILE
    for (c = 0; c < C; c++) ssum[c] = qsum[c] = 0.0;
    /* one pass: per channel, sums about the pivot, CN_GN_POSITIONS positions at a time */
    for (s0 = 0; s0 < S; s0 += CN_GN_POSITIONS)
        gn_sums(a, n, s0, s0 + CN_GN_POSITIONS < S ? s0 + CN_GN_POSITIONS : S, piv, ssum, qsum);
    /* per group: channel moments about the group's pivot (its first
     * channel's), merged in channel order. The groups go side by side (the
     * k-th channel of each, then the next), so that their merge chains
     * overlap; each group's own sequence, so every bit, is unchanged. Then
     * the row's scalars, spread over its channels. */
    cn_moments *tots = (cn_moments *)(scratch + 7 * C);   /* G of them, where the slots go later */
    for (k = 0; k < Cg; k++)
        for (int64_t g = 0; g < a->G; g++) {
            cn_moments m;
            gn_channel_moments(a, n, g * Cg + k, piv, ssum, qsum, piv[g * Cg], &m);
            if (k == 0) tots[g] = m;
            else cn_moments_merge(&tots[g], &m);
        }
    for (int64_t g = 0; g < a->G; g++) {
        const at gp = piv[g * Cg];
        at h = 0, l = 0, r = 0;
        rescue[g] = !gn_finish(a, n, g, gp, &tots[g], &h, &l, &r);
        any_rescued |= rescue[g];
        for (k = 0; k < Cg; k++) { mh[g * Cg + k] = h; lr[g * Cg + k] = l; rs[g * Cg + k] = r; }
    }
    /* normalize, CN_GN_POSITIONS positions by a tile of channels at a time;
     * rescued groups are redone after */
    const int stream = a->stream && !any_rescued;
    const gn_fwd_scalars sc = {mh, rs, lr, (const pt *)a->w, (const pt *)a->b};
    gn_fwd_scalars rot = sc;
    const int64_t h = gn_peel((const xt *)a->y + n * S * C, C, stream);
    double *slots = scratch + 7 * C;   /* five slots of C doubles */
    if (h)
        rot = (gn_fwd_scalars){gn_rotated(slots, 0, mh, C, h, sizeof(at)), gn_rotated(slots, 1, rs, C, h, sizeof(at)),
                               gn_rotated(slots, 2, lr, C, h, sizeof(at)), gn_rotated(slots, 3, sc.w, C, h, sizeof(pt)),
                               gn_rotated(slots, 4, sc.b, C, h, sizeof(pt))};
    for (s0 = 0; s0 < S; s0 += CN_GN_POSITIONS)
        gn_apply(a, n, s0, s0 + CN_GN_POSITIONS < S ? s0 + CN_GN_POSITIONS : S, any_rescued ? rescue : NULL, &sc,
                 &rot, h, stream, has_w, has_b);
    if (CN_UNLIKELY(any_rescued))
        for (int64_t g = 0; g < a->G; g++)
            if (rescue[g]) gn_rescue(a, n, g);
}

/* Channels-last samples [n0, n1). scratch: CN_GN_SCRATCH(C, a->stream) doubles. */
static void gn_fwd_samples(const cn_gn_fwd_args *a, int64_t n0, int64_t n1, double *scratch)
{
    for (int64_t n = n0; n < n1; n++) {
        if (a->w && a->b) gn_sample_impl(a, n, scratch, 1, 1);
        else if (a->w) gn_sample_impl(a, n, scratch, 1, 0);
        else if (a->b) gn_sample_impl(a, n, scratch, 0, 1);
        else gn_sample_impl(a, n, scratch, 0, 0);
    }
}
