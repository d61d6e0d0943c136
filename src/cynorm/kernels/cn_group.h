/*
 * cn_group.h -- what GroupNorm's forward (cn_gfwd.h) and backward (cn_gbwd.h)
 * share: channels-last passes walk the channels CN_GN_TILE vectors at a time,
 * each lane a channel, and add their lanes into double totals.
 */

/* dst[0:t] += the first t lanes of v, in double */
CN_INLINE void gn_add_lanes(double *dst, vec v, int64_t t, const int full)
{
    at lanes[VL];
    store_a_t(lanes, v, t, full);
    for (int64_t i = 0; i < t; i++) dst[i] += (double)lanes[i];
}

/* TILE(c0, NV, tail, tail_full) for each tile of C channels: NV vectors from
 * c0, at most NMAX (<= CN_GN_TILE), the last holding `tail` lanes (tail_full:
 * VL of them), NV and tail_full compile-time constants. */
#define CN_GN_FOR_TILES_OF(C, NMAX, TILE)                                                     \
    for (int64_t c0_ = 0; c0_ < (C); c0_ += (NMAX) * VL) {                                    \
        const int64_t left_ = (C) - c0_;                                                      \
        const int64_t nv_ = left_ >= (NMAX) * VL ? (NMAX) : (left_ + VL - 1) / VL;            \
        const int64_t tail_ = left_ - (nv_ - 1) * VL < VL ? left_ - (nv_ - 1) * VL : VL;      \
        switch (nv_) {                                                                        \
        case 1: if (tail_ == VL) TILE(c0_, 1, VL, 1); else TILE(c0_, 1, tail_, 0); break;     \
        case 2: if (tail_ == VL) TILE(c0_, 2, VL, 1); else TILE(c0_, 2, tail_, 0); break;     \
        case 3: if (tail_ == VL) TILE(c0_, 3, VL, 1); else TILE(c0_, 3, tail_, 0); break;     \
        default:                                                                              \
            if (tail_ == VL) TILE(c0_, CN_GN_TILE, VL, 1);                                    \
            else TILE(c0_, CN_GN_TILE, tail_, 0);                                             \
            break;                                                                            \
        }                                                                                     \
    }
#define CN_GN_FOR_TILES(C, TILE) CN_GN_FOR_TILES_OF(C, CN_GN_TILE, TILE)
_Static_assert(CN_GN_TILE == 4, "CN_GN_FOR_TILES dispatches tiles of 1 to 4 vectors");

/* The normalizing passes hold five per-channel scalars a vector in registers:
 * as many vectors a tile as leave a third of the registers free, and at least
 * two (with one, each position's piece is a single cache line: measured slower
 * at the AVX2 level than two vectors with some scalars spilled). A bound: no
 * bit changes. */
#define CN_GN_APPLY_FIT (CN_SIMD_REGS * 2 / 3 / (5 * CN_VEC_REGS))
#define CN_GN_APPLY_TILE (CN_GN_APPLY_FIT < 2 ? 2 : CN_GN_APPLY_FIT > CN_GN_TILE ? CN_GN_TILE : CN_GN_APPLY_FIT)
