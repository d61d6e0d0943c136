/*
 * cn_group.h -- what GroupNorm's forward (cn_gfwd.h) and backward (cn_gbwd.h)
 * share: channels-last passes walk the channels a tile of vectors at a time,
 * each lane a channel, with the tile's per-channel values in registers, and
 * add their lanes into double totals.
 */

/* Inside a tile of NV vectors whose last one holds `tail` lanes (tail_full:
 * all VL): whether vector k is full, and its lanes. */
#define GN_FULL(k) ((k) < NV - 1 || tail_full)
#define GN_LANES(k) (GN_FULL(k) ? VL : tail)

/* dst[0:t] += the first t lanes of v, in double */
CN_INLINE void gn_add_lanes(double *dst, vec v, int64_t t, const int full)
{
    at lanes[VL];
    store_a_t(lanes, v, t, full);
    for (int64_t i = 0; i < t; i++) dst[i] += (double)lanes[i];
}

/* A tile's per-channel values src[c0 : ...] into NV vectors (kept in registers
 * by the caller's loop over positions). */
CN_INLINE void gn_tile_load(vec *dst, const at *src, int64_t c0, const int NV, int64_t tail, const int tail_full)
{
    CN_UNROLL for (int k = 0; k < NV; k++) dst[k] = load_a_t(src + c0 + k * VL, GN_LANES(k), GN_FULL(k));
}

/* The same from a per-channel param (weight, bias); none (NULL): every lane `absent` */
CN_INLINE void gn_tile_load_p(vec *dst, const pt *src, int64_t c0, const int NV, int64_t tail, const int tail_full,
                              vec absent)
{
    CN_UNROLL for (int k = 0; k < NV; k++) dst[k] = src ? load_p_t(src + c0 + k * VL, GN_LANES(k), GN_FULL(k)) : absent;
}

/* TILE(c0, NV, tail, tail_full) for each tile of C channels: NV vectors from
 * c0, at most NMAX (a constant, <= CN_GN_TILE), the last holding `tail` lanes
 * (tail_full: VL of them), NV and tail_full compile-time constants; no tile
 * wider than NMAX is compiled. */
#define CN_GN_TILE_OF(TILE, c0, nv, tail)                                                     \
    do { if ((tail) == VL) TILE(c0, nv, VL, 1); else TILE(c0, nv, tail, 0); } while (0)
#define CN_GN_FOR_TILES_OF(C, NMAX, TILE)                                                     \
    for (int64_t c0_ = 0; c0_ < (C); c0_ += (NMAX) * VL) {                                    \
        const int64_t left_ = (C) - c0_;                                                      \
        const int64_t nv_ = left_ >= (NMAX) * VL ? (NMAX) : (left_ + VL - 1) / VL;            \
        const int64_t tail_ = left_ - (nv_ - 1) * VL < VL ? left_ - (nv_ - 1) * VL : VL;      \
        switch (nv_) {                                                                        \
        case 1: CN_GN_TILE_OF(TILE, c0_, 1, tail_); break;                                    \
        case 2: if ((NMAX) >= 2) CN_GN_TILE_OF(TILE, c0_, 2, tail_); break;                   \
        case 3: if ((NMAX) >= 3) CN_GN_TILE_OF(TILE, c0_, 3, tail_); break;                   \
        default: if ((NMAX) >= 4) CN_GN_TILE_OF(TILE, c0_, 4, tail_); break;                  \
        }                                                                                     \
    }
#define CN_GN_FOR_TILES(C, TILE) CN_GN_FOR_TILES_OF(C, CN_GN_TILE, TILE)
_Static_assert(CN_GN_TILE == 4, "CN_GN_FOR_TILES_OF dispatches tiles of 1 to 4 vectors");

/* The normalizing passes hold five per-channel scalars a vector in registers:
 * as many vectors a tile as leave a third of the registers free, and at least
 * two (with one, each position's piece is a single cache line: measured slower
 * at the AVX2 level than two vectors with some scalars spilled). A bound: no
 * bit changes. */
#define CN_GN_APPLY_FIT (CN_SIMD_REGS * 2 / 3 / (5 * CN_VEC_REGS))
#define CN_GN_APPLY_TILE (CN_GN_APPLY_FIT < 2 ? 2 : CN_GN_APPLY_FIT > CN_GN_TILE ? CN_GN_TILE : CN_GN_APPLY_FIT)

/* Streamed normalizing passes (cn_gn_streams: every position's channels then
 * start at the same place in a cache line, element-aligned) store each
 * position's outputs from its first cache line boundary on: gn_peel channels
 * into it (0: not streamed, or aligned), wrapping into the next position's
 * first h channels, with the per-channel values seen from channel h on
 * (gn_rotated). So every tile's vectors start a line or follow one another
 * within it, and each line is written whole by one tile at one position. */
CN_INLINE int64_t gn_peel(const void *sample_out, int64_t C, const int stream)
{
    return stream ? peel_to(sample_out, C, 64) : 0;
}

/* Slot k of the five C-double slots from `slots` (the scratch's rotated
 * scalars) as src rotated by h: slot[j] = src[(j + h) % C], C elements of
 * `size` bytes. Returns the slot, or NULL where src is NULL (no such param). */
CN_INLINE void *gn_rotated(double *slots, int k, const void *src, int64_t C, int64_t h, size_t size)
{
    if (!src) return NULL;
    char *dst = (char *)(slots + k * C);
    memcpy(dst, (const char *)src + h * size, (size_t)(C - h) * size);
    memcpy(dst + (C - h) * size, src, (size_t)h * size);
    return dst;
}

/* Positions [s0, s1) of a channels-last sample of S positions whose elements
 * start at flat index `base`, walked as WALK(rot, st, first, npos, nc): npos
 * positions from flat element `first`, C apart, channels [0, nc) of the
 * per-channel values (rot: rotated by h, gn_rotated), streamed if st (and
 * the call streams). With h = 0, the positions as they are; otherwise
 * position 0's first h channels (plain stores: they start off a line), then
 * the positions shifted by h (the last, S - 1, only its C - h channels). */
#define CN_GN_WALK_POSITIONS(S, C, h, s0, s1, base, WALK)                                      \
    do {                                                                                       \
        if (!(h)) { WALK(0, 1, (base) + (s0) * (C), (s1) - (s0), C); break; }                 \
        if ((s0) == 0) WALK(0, 0, base, 1, h);                                                 \
        const int64_t end_ = (s1) < (S) ? (s1) : (S) - 1;                                      \
        if (end_ > (s0)) WALK(1, 1, (base) + (s0) * (C) + (h), end_ - (s0), C);                \
        if ((s1) == (S)) WALK(1, 1, (base) + ((S) - 1) * (C) + (h), 1, (C) - (h));             \
    } while (0)
