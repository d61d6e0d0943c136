/*
 * cn_order.h -- the constants that fix the order of the arithmetic, and so
 * every result bit, and the bounds that size the kernels' stack arrays.
 *
 * The order constants may change only with the golden hashes
 * (tests/golden_hashes.json). The policy (core/policy.c) reads the bounds and
 * never exceeds them; each array sized by one carries a _Static_assert where
 * its size is not the bound itself.
 */
#ifndef CN_ORDER_H
#define CN_ORDER_H

#include <stdint.h>

/* ----------------------------------------------------------- order -- */

/* Rows are cut into chunks of this many elements: a row's moments are its
 * chunks' merged left to right, whatever the thread count or cache size. */
#define CN_CHUNK 2048

/* Rows of up to this many elements live in registers (4 vectors of 16 float32
 * lanes, or 8 of 8 float64 lanes, at every level) and take their own kernels. */
#define CN_SMALL_ROW_MAX 64

/* Forward rows longer than CN_SMALL_ROW_MAX, of up to this many bytes and at
 * most CN_CHUNK elements, take the medium-row kernel (one-pass moments over a
 * block of rows); longer rows take chunk moments. */
#define CN_MED_ROW_BYTES 8192

/* Rows per dweight/dbias block: the backward adds a block's rows in order,
 * then the blocks in order. Depends on M and N alone: at most 64 blocks of at
 * least 8 rows (64 when a row's two partials exceed 256 KB), and at most 8M
 * numbers of partials in all. */
static inline int64_t cn_block_rows(int64_t M, int64_t N, int acc_size)
{
    int64_t B = (M + 63) / 64;
    const int64_t by_size = (M * N + (8 << 20) - 1) / (8 << 20);
    const int64_t least = 2 * N * acc_size > (256 << 10) ? 64 : 8;
    if (by_size > B) B = by_size;
    return B > least ? B : least;
}

/* GroupNorm, channels-last: a channel's pivot is the mean of its first
 * CN_GN_HEAD positions; its sums add CN_GN_POSITIONS positions in order, each
 * such run then added into double totals. */
#define CN_GN_HEAD 64
#define CN_GN_POSITIONS 64

/* ---------------------------------------------------------- bounds -- */
/* (None changes a bit: a row's arithmetic never depends on the group it is in.) */

/* Short and medium rows are taken this many at a time (per-row sums first,
 * then the per-row scalars as loops over the block). */
#define CN_SMALL_BLOCK 16

/* Rows of a group on the rows path: the forward's chunked rows and the
 * backward's pass 1 / pass 2 sweeps. */
#define CN_ROW_GROUP_MAX 4

/* Long rows per group (the forward's long-row path). */
#define CN_LONG_GROUP_MAX 16

/* Channel vectors a channels-last GroupNorm pass takes at once (a bound: it
 * changes no bit, each lane adding its own positions in order). */
#define CN_GN_TILE 4
/* ... and fetches the positions this far ahead meanwhile */
#define CN_GN_AHEAD 16

/* Doubles of scratch a GroupNorm channels-last sample takes (C channels):
 * 7 slots of C for its sums and scalars, then 3 for the forward's group
 * moments (at most C groups), and where its stores stream 5 in all there for
 * the scalars rotated, after the moments are done with (cn_group.h). */
#define CN_GN_SCRATCH(C, streamed) (((streamed) ? 12 : 10) * (C))

#endif /* CN_ORDER_H */
