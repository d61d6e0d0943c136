# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernel orchestration, compiled once at baseline flags.

The per-row math lives in kernels/ (compiled once per ISA level, each level
exporting one table of row operations; see include/cn_ops.h). This module
decides who computes what and in which order: threads, row blocks, column
chunks, and the fixed reduction order that makes every output bit-identical
for any thread count. It calls the level that cynorm._isa selected (after the
CPU check) through that level's table.

Arrays arrive as C-contiguous ndarrays already checked by cynorm._api; their
data pointers are read with the NumPy C API. (Typed memoryviews would cost
about 100 ns each to acquire, a large share of a tiny call, and bf16/f16
would need a uint16 view first.)
"""

from libc.stdint cimport int64_t, uint16_t, uintptr_t
from libc.stdlib cimport malloc, free
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from cynorm._openmp_helpers cimport (CN_OPENMP, omp_get_max_threads, omp_get_num_threads, omp_get_num_procs,
                                     omp_in_parallel)

cnp.import_array()

# Calls in flight in this process (all Python threads). Several concurrent
# callers share the cores instead of each starting its own full team.
cdef extern from *:
    """
    #if defined(_MSC_VER) && !defined(__clang__)
    #include <intrin.h>
    static volatile long cn_in_flight = 0;
    static int cn_enter_call(void) { return (int)_InterlockedIncrement(&cn_in_flight); }
    static void cn_leave_call(void) { _InterlockedDecrement(&cn_in_flight); }
    #else
    static int cn_in_flight = 0;
    static int cn_enter_call(void) { return __atomic_add_fetch(&cn_in_flight, 1, __ATOMIC_RELAXED); }
    static void cn_leave_call(void) { __atomic_sub_fetch(&cn_in_flight, 1, __ATOMIC_RELAXED); }
    #endif
    """
    int cn_enter_call() noexcept nogil
    void cn_leave_call() noexcept nogil


cdef extern from "cn_scratch.h" nogil:
    # per-thread buffers kept between calls (slot 0: widened params, 1: fp32
    # totals of 16-bit param grads, 2: block partials)
    void *cn_scratch_get(int slot, size_t nbytes)
    void cn_populate_write(void *dst, size_t nbytes)
    void cn_populate_share(void *dst, size_t nbytes, int64_t t, int64_t T)
    size_t cn_share_edge(size_t lo, size_t hi, int64_t t, int64_t T)
    void cn_scratch_put(int slot, void *p)


cdef extern from "cn_ops.h" nogil:
    const int CN_CHUNK
    const int CN_LONG_GROUP
    const int CN_LONG_GROUP_BIG
    const int64_t CN_LONG_ROW_BYTES
    const int CN_NUM_KERNELS

    ctypedef struct cn_fwd_args:
        const void *x
        void *y
        const void *w
        const void *b
        void *mean
        void *rstd
        int64_t M
        int64_t N
        double eps
        int center
        int stream
        int populate
        int long_group
        int prefetch_l2

    ctypedef struct cn_bwd_args:
        const void *dy
        const void *x
        const void *mean
        const void *rstd
        const void *w
        void *dx
        int64_t M
        int64_t N
        int center
        int stream
        int populate

    ctypedef struct cn_moments:
        double n
        double delta
        double m2

    ctypedef struct cn_row_stats:
        double pivot
        double delta
        double rstd
        int ok

    ctypedef struct cn_ops:
        int x_size
        int p_size
        int acc_size
        int64_t small_max
        void (*fwd_rows)(const cn_fwd_args *, int64_t, int64_t) noexcept nogil
        void (*fwd_chunk)(const cn_fwd_args *, int64_t, int64_t, int64_t, cn_moments *) noexcept nogil
        void (*fwd_finish)(const cn_fwd_args *, int64_t, const cn_moments *, cn_row_stats *) noexcept nogil
        void (*fwd_apply)(const cn_fwd_args *, int64_t, int64_t, int64_t, int64_t, const cn_row_stats *) noexcept nogil
        void (*bwd_rows)(const cn_bwd_args *, int64_t, int64_t, void *, void *) noexcept nogil
        void (*bwd_chunk)(const cn_bwd_args *, int64_t, int, int64_t, int64_t, double *, double *,
                          int64_t, void *, void *, int, int64_t, int64_t) noexcept nogil
        void (*bwd_apply)(const cn_bwd_args *, int64_t, int64_t, int64_t, int64_t, const double *, void *, void *,
                          int64_t) noexcept nogil
        void (*acc_add)(void *, const void *, int64_t, int64_t) noexcept nogil
        void (*acc_to_param)(void *, const void *, int64_t, int64_t) noexcept nogil

    ctypedef struct cn_level_ops:
        const char *name
        const cn_ops **kernels
        void (*f32_to_bf16)(const float *, uint16_t *, int64_t) noexcept nogil
        void (*f32_to_f16)(const float *, uint16_t *, int64_t) noexcept nogil
        void (*bf16_to_f32)(const uint16_t *, float *, int64_t) noexcept nogil
        void (*f16_to_f32)(const uint16_t *, float *, int64_t) noexcept nogil
        void (*stream_fence)() noexcept nogil

    void cn_moments_merge(cn_moments *a, const cn_moments *b)


# The levels this build holds (the build defines CN_HAVE_LEVEL_<name> for each).
cdef extern from *:
    """
    #include "cn_ops.h"
    static const cn_level_ops *const cn_built_levels[] = {
    #ifdef CN_HAVE_LEVEL_baseline
        &cn_level_baseline,
    #endif
    #ifdef CN_HAVE_LEVEL_avx2
        &cn_level_avx2,
    #endif
    #ifdef CN_HAVE_LEVEL_avx512
        &cn_level_avx512,
    #endif
    #ifdef CN_HAVE_LEVEL_avx512_bf16
        &cn_level_avx512_bf16,
    #endif
        NULL
    };
    /* kernel table of each pair (CN_PAIR_*), and how the caller stores its params:
     * 0 as the kernel, 1 bf16, 2 f16 (widened to float32 around the call) */
    static const int cn_kernel_of_pair[CN_NUM_PAIRS] = {0, 1, 2, 2, 3, 3};
    static const int cn_half_params[CN_NUM_PAIRS] = {0, 0, 1, 0, 2, 0};
    """
    const cn_level_ops *const *cn_built_levels
    const int *cn_kernel_of_pair
    const int *cn_half_params
    const int CN_NUM_PAIRS


#: the level in use: set by use_level() (cynorm._isa, after the CPU check)
cdef const cn_level_ops *LEVEL = NULL


cdef inline const cn_ops *cn_get_ops(int pair) noexcept nogil:
    if pair < 0 or pair >= CN_NUM_PAIRS or LEVEL == NULL:
        return NULL
    return LEVEL.kernels[cn_kernel_of_pair[pair]]


cdef inline void cn_stream_fence() noexcept nogil:
    LEVEL.stream_fence()


def compiled_levels():
    """Names of the ISA levels this build holds, lowest first."""
    names = []
    cdef int i = 0
    while cn_built_levels[i] != NULL:
        names.append(cn_built_levels[i].name.decode())
        i += 1
    return names


def use_level(str name):
    """Run every later call with this level's kernels. The caller (cynorm._isa)
    has checked that this CPU and OS support the level."""
    global LEVEL
    cdef int i = 0
    while cn_built_levels[i] != NULL:
        if cn_built_levels[i].name.decode() == name:
            LEVEL = cn_built_levels[i]
            return
        i += 1
    raise ValueError(f"ISA level {name!r} is not in this build (built: {', '.join(compiled_levels())})")


# ----------------------------------------------------------------- policy --
# Below this many elements per thread, another thread costs more than it saves
# (waking a pool thread is a few microseconds).
cdef int64_t MIN_ELEMS_PER_THREAD = 1 << 15
# More threads than cores never helps a memory-bound kernel, and a thread that
# is preempted (e.g. in a page fault on a fresh output) stalls the whole team
# at the next barrier (measured: 8-70 ms instead of 8 ms with 3 threads on 2
# cores). Requests are capped at the cores this process may use unless
# CYNORM_OVERSUBSCRIBE=1 (or the tests) allow it.
cdef bint OVERSUBSCRIBE = False
# Rows too long to take whole from L2 go a group at a time, of at most this
# many bytes (forward: x; backward team path: x and dy), so that the second
# pass over a group finds it in the last-level cache; more rows per group read
# each weight/bias (and block partial) piece fewer times. cynorm._isa sets it
# from the CPU's L3 size at import (long_group_bytes there); 8 MB was measured
# on Zen 3/5 (32 MB L3).
cdef int64_t LONG_GROUP_BYTES = 8 << 20
# The row path keeps one block's dweight/dbias partial in cache while it walks
# the block's rows; beyond this size the team path is used instead.
cdef int64_t PART_CACHE_BYTES = 256 << 10
# Outputs at least this large are written with non-temporal stores: they will
# not stay in cache anyway, and streaming skips reading every destination line.
cdef int64_t STREAM_MIN_BYTES = 8 << 20
# dweight/dbias are summed over fixed row blocks: at most MAX_BLOCKS blocks of
# at least MIN_BLOCK_ROWS rows, and few enough that all block partials hold at
# most BLOCK_PARTIAL_ELEMS numbers. Depends on M and N only -- never on threads.
cdef int64_t MAX_BLOCKS = 64
cdef int64_t MIN_BLOCK_ROWS = 8
cdef int64_t BLOCK_PARTIAL_ELEMS = 8 << 20
# Rows whose two partials take more than LONG_PART_BYTES always go through the
# team path, where every block costs one more pass over a row-sized partial
# (read and written through L3 and DRAM): their blocks hold at least
# LONG_MIN_BLOCK_ROWS rows. (A constant, not a policy: it sets the bits.)
cdef int64_t LONG_PART_BYTES = 256 << 10
cdef int64_t LONG_MIN_BLOCK_ROWS = 64
# With one thread, the backward team path adds the rows into the block
# partials in phase A, a pair of rows at a time (see _backward_team), while
# the partials take at most this many bytes and stay in cache from one pair
# to the next. Zen 5 (32 MB L3): rows of 401408 (3.2 MB of partials) gain;
# rows of 8.4M (67 MB, from DRAM twice per pair instead of once per four rows)
# lose, bf16 out= 248-258 -> 272 ms. cynorm._isa lowers it to the L2's size
# where the L3 is a large, slow mesh (see cache_policies there). Changes no bit.
cdef int64_t PARTS_IN_A_BYTES = 4 << 20
# Phase A by column chunk, each thread adding all of a group's rows into the
# partials of its chunks (see _backward_team): 1 with more threads, 2 also
# with one thread where the pair walk does not take the partials (set by
# cynorm._isa for a mesh L3), 0 never. Changes no bit.
cdef int BWD_A_BY_CHUNK = 1
# The column-chunk walk of phase A visits each row for one chunk and moves on:
# a 16-bit row's piece (2048 elements, 4 KB) is one page, and the hardware
# prefetcher does not cross pages, so each visit would start cold. 16-bit rows
# prefetch the next pair's piece into L2 meanwhile. Xeon (2 MB L2, 480 MB L3),
# out=, 3 alternating rounds, without -> with: (64,401408) bf16 1 thread
# 18.7 -> 17.2 ms, 2 threads 8.6 -> 7.6; mixed 17.7 -> 15.3, 7.9 -> 6.8;
# (512,100000) and (2048,40000) bf16/mixed, 2 threads, 12-14% less. fp32 (8 KB
# pieces) gained 1-4% on (64,401408) but lost 3% on (512,100000) and
# (2048,40000) at 2 threads, so it does without. Changes no bit.
cdef bint PREFETCH_PIECES = True
# A fresh output of rows of at most this many bytes is written with plain
# stores, each slab faulted in just before (the stores find the OS's freshly
# zeroed lines in cache; a non-temporal store has them written back first).
# 0 (never) as measured on Zen (the forward: fp32 rows of 1024 -4%, of 4096
# +3%, bf16 rows of 4096 +10%; the backward's own rule is in bwd_rows);
# cynorm._isa sets CN_LONG_ROW_BYTES for a mesh L3, where the Xeon measured,
# allocating, 1 thread, 3 alternating rounds, streamed -> plain: (4096,4096)
# fwd fp32 20.4 -> 12.6 ms, bf16 10.5 -> 5.1, bwd bf16 12.1 -> 8.0;
# (16384,1024) fwd fp32 19.4 -> 12.5, bf16 10.1 -> 5.3; rows of 56 and 256
# even; C,H,W rows (long) lost (fwd fp32 29.8 -> 32.9). The backward only
# from rows of FRESH_PLAIN_BWD_MIN_ROW_BYTES: (64,128,56,256), rows of 1 KB,
# fp32 125.7 -> 139.4 ms at 1 thread, 65.5 -> 74.4 at 2. Changes no bit.
cdef int64_t FRESH_PLAIN_ROW_BYTES = 0
# The forward row paths prefetch the next rows while they normalize this one
# from cache: into L1, or into L2 where this is set (cynorm._isa, for a mesh
# L3; measured there in cache_policies). The long-row walk and the backward
# keep L1. Changes no bit.
cdef bint PREFETCH_INTO_L2 = False
cdef int64_t FRESH_PLAIN_BWD_MIN_ROW_BYTES = 2 << 10


cdef inline bint _streams(const void *out, int64_t M, int64_t N, int x_size) noexcept nogil:
    """Write this output with non-temporal stores? Large ones, yes: they will
    not stay in cache. The partial vectors at the ends of unaligned rows then
    stream too, in 4-byte pieces (cn_stream_bytes in cn_simd.h). For 16-bit
    rows those pieces lost to plain stores throughout: bf16 rows of 256 at 4,
    8 and 12 bytes off a 16-byte boundary, C harness, 1 thread, cycles per 8
    elements, forward 15-19 streamed against 10-13 plain; and rows 2 bytes
    off a 4-byte boundary would need a plain 2-byte store beside the stream
    (a DRAM round trip per row: 2.2x slower). So 16-bit outputs stream only
    when every row starts on a 16-byte boundary (in NumPy's arrays: rows of
    a multiple of 8 elements), with AVX2 their vector width. Changes no bit."""
    if M * N * x_size < STREAM_MIN_BYTES:
        return False
    return x_size != 2 or (<uintptr_t>out % 16 == 0 and N % 8 == 0)


cdef inline int _long_group(int T) noexcept nogil:
    """Rows per group for rows too long for a group of CN_LONG_GROUP to fit in
    LONG_GROUP_BYTES, forward and backward team path.

    They come from DRAM twice anyway; bigger groups read the weight/bias (and
    the backward's block partials) once per group. 16 with one thread (rows of
    8.4M elements, 1 thread: bf16 backward 293-363 -> 231-279 ms, forward
    156-163 -> 135), 4 with more (with two threads 16 lost: bf16 backward
    157 -> 272 ms, fp32 forward 154 -> 192). Grouping never changes a bit."""
    return CN_LONG_GROUP_BIG if T == 1 else CN_LONG_GROUP


cdef inline int _fwd_long_group(int64_t row_bytes, int T) noexcept nogil:
    """Rows per group for the forward's rows over CN_LONG_ROW_BYTES (fwd_rows):
    as many as fit in LONG_GROUP_BYTES, at most CN_LONG_GROUP_BIG; rows too
    long for CN_LONG_GROUP of them to fit take _long_group(T). Measured on a
    Xeon with a 2 MB L2 and a 480 MB L3, 1 thread, (64,128,56,56) C,H,W into
    out=, groups of 4 -> 16 rows: bf16 7.56 -> 6.34 ms, mixed 7.47 -> 6.23,
    fp32 15.97 -> 12.51 (each group's reread comes from L3 either way; the
    weight and bias, as long as a row, are read 4x less often)."""
    cdef int64_t fit = LONG_GROUP_BYTES // row_bytes
    if fit < CN_LONG_GROUP:
        return _long_group(T)
    return <int>(fit if fit < CN_LONG_GROUP_BIG else CN_LONG_GROUP_BIG)


cdef inline int64_t _min(int64_t a, int64_t b) noexcept nogil:
    return a if a < b else b


cdef inline int _threads_for(int64_t elems, int requested, int in_flight) noexcept nogil:
    """Threads worth using for `elems` elements of work (at most `requested`).

    - small work stays on the calling thread (no parallel region at all);
    - no more threads than cores, unless oversubscription is allowed;
    - inside someone else's OpenMP region we do not nest a second team;
    - with several calls in flight, each gets a share of the cores, so that
      8 Python threads x num_threads=2 on 2 cores make ~2 busy threads, not 16.
    Results do not depend on the thread count, so none of this changes a bit."""
    if not CN_OPENMP or requested <= 1:
        return 1
    cdef int64_t cap = elems // MIN_ELEMS_PER_THREAD
    if cap <= 1 or omp_in_parallel():
        return 1
    cdef int procs = omp_get_num_procs()
    if not OVERSUBSCRIBE and requested > procs:
        requested = procs
    cdef int share
    if in_flight > 1:
        share = procs // in_flight
        requested = requested if requested < share else (share if share > 1 else 1)
    return <int>_min(requested, cap)


cdef inline int64_t block_rows(int64_t M, int64_t N, int acc_size) noexcept nogil:
    cdef int64_t B = (M + MAX_BLOCKS - 1) // MAX_BLOCKS
    cdef int64_t by_size = (M * N + BLOCK_PARTIAL_ELEMS - 1) // BLOCK_PARTIAL_ELEMS
    cdef int64_t least = LONG_MIN_BLOCK_ROWS if 2 * N * acc_size > LONG_PART_BYTES else MIN_BLOCK_ROWS
    if by_size > B:
        B = by_size
    return B if B > least else least


cdef inline void _populate_share(char *base, int64_t first, int64_t count, int x_size, int64_t t,
                                 int64_t T) noexcept nogil:
    """Thread t's share (1/T, split on huge-page boundaries) of elements [first, first + count)
    of a fresh output: fault it in."""
    cn_populate_share(base + first * x_size, count * x_size, t, T)


# ---------------------------------------------------------------- forward --

cdef int _forward_team(const cn_ops *ops, const cn_fwd_args *a, int T) noexcept nogil:
    """Few, long rows: all threads share each group of rows, split by column chunk.

    Phase 1 takes chunk moments, phase 2 merges them per row (left to right,
    exactly as fwd_rows does), phase 3 normalizes the chunks."""
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK
    cdef int64_t nc = (N + K - 1) // K
    cdef int64_t G = LONG_GROUP_BYTES // (N * ops.x_size)
    if G < 1:
        G = 1
    G = _min(G, M)
    cdef cn_moments *mom = <cn_moments *>malloc(G * nc * sizeof(cn_moments))
    cdef cn_row_stats *st = <cn_row_stats *>malloc(G * sizeof(cn_row_stats))
    if mom == NULL or st == NULL:
        free(mom)
        free(st)
        return -1
    cdef int64_t g0, g1, t, i, c
    cdef cn_moments total
    with parallel(num_threads=T):
        g0 = 0
        while g0 < M:
            g1 = _min(M, g0 + G)
            if a.populate:   # each thread faults in its share of the group's output first
                for t in prange(T, schedule='static'):
                    _populate_share(<char *>a.y, g0 * N, (g1 - g0) * N, ops.x_size, t, T)
            for t in prange((g1 - g0) * nc, schedule='static'):
                i = t // nc
                c = t - i * nc
                ops.fwd_chunk(a, g0 + i, c * K, _min(N, c * K + K), &mom[t])
            for i in prange(g1 - g0, schedule='static'):
                total = mom[i * nc]
                for c in range(1, nc):
                    cn_moments_merge(&total, &mom[i * nc + c])
                ops.fwd_finish(a, g0 + i, &total, &st[i])
            # each thread walks the group's rows for its column chunks (weight/bias reuse)
            for c in prange(nc, schedule='static'):
                ops.fwd_apply(a, g0, g1 - g0, c * K, _min(N, c * K + K), st)
            g0 = g1
        cn_stream_fence()   # make this thread's non-temporal stores visible
    free(mom)
    free(st)
    return 0


cdef int _forward(const cn_ops *ops, const cn_fwd_args *a, int T) noexcept nogil:
    cdef int64_t M = a.M, t
    if T > 1 and a.N > CN_CHUNK and M < 4 * T:
        # too few rows to balance: split columns too (same bits as fwd_rows,
        # which takes rows of one chunk with other kernels)
        if _forward_team(ops, a, T) == 0:
            return 0
    if T <= 1 or M < 2:
        ops.fwd_rows(a, 0, M)
        return 0
    T = <int>_min(T, M)
    for t in prange(T, schedule='static', num_threads=T):
        ops.fwd_rows(a, (M * t) // T, (M * (t + 1)) // T)
    return 0


# --------------------------------------------------------------- backward --

cdef int _backward_team(const cn_ops *ops, const cn_bwd_args *a, int T, int64_t B, int k,
                        char *tot_dw, char *tot_db) noexcept nogil:
    """Long rows: blocks in order, all threads on each block, a group of rows at a time.

    Phase A: each row's two sums, chunk by chunk, two rows at a time (more
    concurrent DRAM streams than that lose bandwidth). Phase B: the per-row
    totals, in chunk order. Phase C, with the group back from cache: each
    thread owns column chunks and walks the group's rows in order, writing dx
    and adding each row into the block partial -- the order bwd_rows uses, so
    the bits match the row path.

    With one thread and partials that stay in cache (PARTS_IN_A_BYTES), phase
    A adds the rows into the partial instead (pairs in row order, the same
    operations), and phase C rereads only x, dy and the weight:
    (64,128,56,56), out=, 5 alternating rounds, bf16 7.60 -> 7.23 ms, fp32
    13.28 -> 12.82. With more threads, phase A goes by column chunk instead
    (BWD_A_BY_CHUNK): each thread owns chunks and adds all the group's pairs
    into their partials, which stay in L1 from one pair to the next, and
    phase C only writes dx, one row at a time. (Phase C adding four rows at a
    time into the partials wrote dx with plain stores on AVX2, see
    CN_MULTIROW_STREAM.) On a mesh L3 (cynorm._isa's cache_policies) one
    thread goes by column chunk too whenever the pairs do not take the
    partials: Xeon, 2 MB L2, 480 MB L3, 1 thread, out=, 3 alternating rounds,
    pairs vs chunks, (64,401408) bf16 21.0 -> 19.3 ms, mixed 21.4 -> 18.4,
    fp32 35.4 -> 32.8; (64,8388608) bf16, against phase C, 535 -> 437."""
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK
    cdef int64_t nc = (N + K - 1) // K
    cdef int64_t nb = (M + B - 1) // B
    cdef size_t part_bytes = N * ops.acc_size
    cdef int64_t S = LONG_GROUP_BYTES // (N * 2 * ops.x_size)
    # rows that do not fit in cache anyway: a few at a time, for partial/weight reuse
    S = _min(S if S > 1 else _long_group(T), B)
    cdef double *sums = <double *>malloc(S * nc * 2 * sizeof(double))
    cdef double *rowsums = <double *>malloc(S * 2 * sizeof(double))
    cdef char *blk_part = NULL
    if k and nb > 1:
        blk_part = <char *>cn_scratch_get(2, k * part_bytes)
    if sums == NULL or rowsums == NULL or (k and nb > 1 and blk_part == NULL):
        free(sums)
        free(rowsums)
        cn_scratch_put(2, blk_part)
        return -1
    cdef int64_t blk, r0, r1, s0, s1, r, c, i, t, npairs, pfo, npf
    cdef char *dwp
    cdef char *dbp
    cdef double acc1, acc2
    cdef bint parts_in_a = T == 1 and k * part_bytes <= PARTS_IN_A_BYTES
    # otherwise phase A may go by column chunk, each thread adding the whole
    # group's rows into the partials of its chunks (in row order: the same bits)
    cdef bint a_by_chunk = k > 0 and not parts_in_a and (BWD_A_BY_CHUNK == 2 or (T > 1 and BWD_A_BY_CHUNK == 1))
    cdef bint prefetch_pieces = PREFETCH_PIECES and ops.x_size == 2
    with parallel(num_threads=T):
        for blk in range(nb):
            r0 = blk * B
            r1 = _min(M, r0 + B)
            dwp = NULL
            dbp = NULL
            if k:
                dwp = tot_dw if blk == 0 else blk_part
                if k == 2:
                    dbp = tot_db if blk == 0 else blk_part + part_bytes
            s0 = r0
            while s0 < r1:
                s1 = _min(r1, s0 + S)
                if a.populate:   # each thread faults in its share of the group's dx first
                    for t in prange(T, schedule='static'):
                        _populate_share(<char *>a.dx, s0 * N, (s1 - s0) * N, ops.x_size, t, T)
                npairs = (s1 - s0 + 1) // 2
                if a_by_chunk:
                    for c in prange(nc, schedule='static'):
                        for i in range(npairs):
                            r = s0 + 2 * i
                            # 16-bit rows: prefetch the next pair's piece (after the last pair,
                            # the first one's next chunk); see PREFETCH_PIECES
                            pfo = 2 * N if i + 1 < npairs else (s0 - r) * N + K
                            npf = K if i + 1 < npairs else _min(K, N - (c + 1) * K)
                            ops.bwd_chunk(a, r, <int>_min(2, s1 - r), c * K, _min(N, c * K + K),
                                          &sums[((r - s0) * nc + c) * 2], &sums[((r - s0) * nc + c) * 2 + 1],
                                          nc * 2, dwp, dbp, r == r0, pfo, npf if prefetch_pieces else 0)
                else:
                    for t in prange(npairs * nc, schedule='static'):
                        i = t // nc
                        c = t - i * nc
                        r = s0 + 2 * i
                        ops.bwd_chunk(a, r, <int>_min(2, s1 - r), c * K, _min(N, c * K + K),
                                      &sums[((r - s0) * nc + c) * 2], &sums[((r - s0) * nc + c) * 2 + 1], nc * 2,
                                      dwp if parts_in_a else NULL, dbp if parts_in_a else NULL, r == r0, 0, 0)
                for i in prange(s1 - s0, schedule='static'):
                    acc1 = 0.0
                    acc2 = 0.0
                    for c in range(nc):
                        acc1 = acc1 + sums[(i * nc + c) * 2]
                        acc2 = acc2 + sums[(i * nc + c) * 2 + 1]
                    rowsums[2 * i] = acc1
                    rowsums[2 * i + 1] = acc2
                for c in prange(nc, schedule='static'):
                    ops.bwd_apply(a, s0, s1 - s0, c * K, _min(N, c * K + K), rowsums,
                                  NULL if parts_in_a or a_by_chunk else dwp,
                                  NULL if parts_in_a or a_by_chunk else dbp, r0)
                s0 = s1
            if k and blk > 0:
                for c in prange(nc, schedule='static'):
                    ops.acc_add(tot_dw, blk_part, c * K, _min(N, c * K + K))
                    if k == 2:
                        ops.acc_add(tot_db, blk_part + part_bytes, c * K, _min(N, c * K + K))
        cn_stream_fence()   # make this thread's non-temporal stores visible
    free(sums)
    free(rowsums)
    cn_scratch_put(2, blk_part)
    return 0


cdef int _backward_blocks(const cn_ops *ops, const cn_bwd_args *a, int T, int64_t B, int k,
                          char *tot_dw, char *tot_db) noexcept nogil:
    """Many rows: threads take whole blocks; then the block partials are added
    in block order, column chunk by column chunk."""
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK
    cdef int64_t nb = (M + B - 1) // B
    cdef int64_t nc = (N + K - 1) // K
    cdef size_t part_bytes = N * ops.acc_size
    # block 0 accumulates straight into the totals; blocks 1.. get scratch
    cdef char *scratch = NULL
    if k and nb > 1:
        scratch = <char *>cn_scratch_get(2, (nb - 1) * k * part_bytes)
        if scratch == NULL:
            return -1
    cdef int64_t blk, c, j
    cdef char *dwp
    cdef char *dbp
    T = <int>_min(T, nb)
    for blk in prange(nb, schedule='static', num_threads=T):
        dwp = NULL
        dbp = NULL
        if k:
            dwp = tot_dw if blk == 0 else scratch + (blk - 1) * k * part_bytes
            if k == 2:
                dbp = tot_db if blk == 0 else scratch + ((blk - 1) * k + 1) * part_bytes
        ops.bwd_rows(a, blk * B, _min(M, blk * B + B), dwp, dbp)
    if k and nb > 1:
        T = <int>_min(T, nc)
        for c in prange(nc, schedule='static', num_threads=T):
            for j in range(nb - 1):
                ops.acc_add(tot_dw, scratch + j * k * part_bytes, c * K, _min(N, c * K + K))
                if k == 2:
                    ops.acc_add(tot_db, scratch + (j * k + 1) * part_bytes, c * K, _min(N, c * K + K))
    cn_scratch_put(2, scratch)
    return 0


cdef int _backward(const cn_ops *ops, const cn_bwd_args *a, int T, int k,
                   char *out_dw, char *out_db) noexcept nogil:
    """k = number of parameter grads (0, 1 = dweight, 2 = dweight and dbias)."""
    cdef int64_t M = a.M, N = a.N, c, K = CN_CHUNK
    cdef int64_t B = block_rows(M, N, ops.acc_size)
    cdef int64_t nb = (M + B - 1) // B
    cdef int64_t nc = (N + K - 1) // K
    cdef size_t part_bytes = N * ops.acc_size
    cdef bint direct = ops.acc_size == ops.p_size
    cdef char *tot_dw = out_dw
    cdef char *tot_db = out_db
    cdef char *tot = NULL
    cdef int rc
    if k and not direct:
        # bf16/f16 params: sum in fp32, round once at the end
        tot = <char *>cn_scratch_get(1, k * part_bytes)
        if tot == NULL:
            return -1
        tot_dw = tot
        tot_db = tot + part_bytes if k == 2 else NULL
    if N > ops.small_max and (nb < T or k * part_bytes > PART_CACHE_BYTES):
        rc = _backward_team(ops, a, T, B, k, tot_dw, tot_db)
    else:
        rc = _backward_blocks(ops, a, T, B, k, tot_dw, tot_db)
    if rc == 0 and tot != NULL:
        for c in prange(nc, schedule='static', num_threads=<int>_min(T, nc)):
            ops.acc_to_param(out_dw, tot_dw, c * K, _min(N, c * K + K))
            if k == 2:
                ops.acc_to_param(out_db, tot_db, c * K, _min(N, c * K + K))
    cn_scratch_put(1, tot)
    return rc


# ------------------------------------------------------------ Python entry --

cdef inline void *_data(object arr):
    return NULL if arr is None else cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline object _contig(object arr):
    """C-contiguous version of a parameter array (a copy only when needed)."""
    if arr is None or cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr):
        return arr
    return cnp.PyArray_GETCONTIGUOUS(<cnp.ndarray>arr)


cdef void _widen(int half, const void *src, float *dst, int64_t n) noexcept nogil:
    """16-bit params -> float32 (exact), so one kernel serves bf16/bf16 and bf16/f32."""
    if half == 1:
        LEVEL.bf16_to_f32(<const uint16_t *>src, dst, n)
    else:
        LEVEL.f16_to_f32(<const uint16_t *>src, dst, n)


cdef void _narrow(int half, const float *src, void *dst, int64_t n) noexcept nogil:
    """float32 sums -> 16-bit params dtype, rounded once (RNE)."""
    if half == 1:
        LEVEL.f32_to_bf16(src, <uint16_t *>dst, n)
    else:
        LEVEL.f32_to_f16(src, <uint16_t *>dst, n)


def forward(int pair, bint center, cnp.ndarray x, cnp.ndarray y, object weight, object bias,
            object mean, cnp.ndarray rstd, int64_t M, int64_t N, double eps, int num_threads,
            bint fresh=False):
    """Normalize the M rows of N elements of x into y; write mean (if given) and rstd.

    All arrays are C-contiguous with the dtypes of `pair` (checked by the caller).
    fresh: y was just allocated (its pages are not yet faulted in)."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    cdef int half = cn_half_params[pair]
    cdef cn_fwd_args a
    cdef float *wide = NULL
    weight = _contig(weight)
    bias = _contig(bias)
    a.x = cnp.PyArray_DATA(x)
    a.y = cnp.PyArray_DATA(y)
    a.w = _data(weight)
    a.b = _data(bias)
    a.mean = _data(mean)
    a.rstd = cnp.PyArray_DATA(rstd)
    a.M = M
    a.N = N
    a.eps = eps
    a.center = center
    a.stream = _streams(a.y, M, N, ops.x_size)
    a.populate = a.stream and fresh   # see cn_populate_write
    a.prefetch_l2 = PREFETCH_INTO_L2
    if a.populate and N * ops.x_size <= FRESH_PLAIN_ROW_BYTES:
        a.stream = 0   # (still populated slab by slab)
    cdef int rc = 0
    cdef int T
    with nogil:
        T = _threads_for(M * N, num_threads, cn_enter_call())
        if half and (a.w != NULL or a.b != NULL):
            wide = <float *>cn_scratch_get(0, 2 * N * sizeof(float))
            if wide == NULL:
                rc = -1
            else:
                if a.w != NULL:
                    _widen(half, a.w, wide, N)
                    a.w = wide
                if a.b != NULL:
                    _widen(half, a.b, wide + N, N)
                    a.b = wide + N
        a.long_group = _fwd_long_group(N * ops.x_size, T)
        if rc == 0:
            rc = _forward(ops, &a, T)
        cn_scratch_put(0, wide)
        cn_leave_call()
    if rc != 0:
        raise MemoryError("cynorm: could not allocate scratch memory")


# forward_small takes calls with fewer elements than this: there the Python-side
# checks cost more than the work. (Below cynorm._api's huge-page gate, so its
# outputs are plain np.empty ones either way.)
cdef int64_t SMALL_CALL_ELEMS = 1 << 16


cdef inline bint _plain_array(object a):
    """An exact ndarray, C-contiguous, in native byte order."""
    return (type(a) is cnp.ndarray and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))


cdef inline bint _shape_is(cnp.ndarray p, cnp.npy_intp *dims, int n):
    """p.shape == dims[:n]"""
    if cnp.PyArray_NDIM(p) != n:
        return False
    cdef cnp.npy_intp *pd = cnp.PyArray_DIMS(p)
    cdef int k
    for k in range(n):
        if pd[k] != dims[k]:
            return False
    return True


def forward_small(object x, object weight, object bias, object axis, object eps, object num_threads,
                  bint center, bint want_stats, dict pairs):
    """cynorm._api's fast path for the common small forward call, all in C.

    Takes only what needs no conversion and that the validating path would
    accept as it is: exact C-contiguous native ndarrays, weight/bias (or None)
    of shape x.shape[axis:] and a supported dtype pair (`pairs`: (x type
    number, param type number or -1) -> (pair code, stats type number)), an
    int axis in range, a finite float eps >= 0, num_threads None or an int in
    1..1024, and fewer than SMALL_CALL_ELEMS elements. Returns (y, mean, rstd)
    (mean None unless center and want_stats), or None for anything else; the
    caller then validates and runs the call the general way (and raises
    there). Measured: (1,8,16) fp32 layer_norm_forward 4.2 -> 1.25 us.
    Same kernels and thread choice (_threads_for) as the general path."""
    if not (_plain_array(x) and type(axis) is int and type(eps) is float):
        return None
    if num_threads is not None and not (type(num_threads) is int and 1 <= num_threads <= 1024):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(xa)
    if nd == 0 or nd > 32 or not (-nd <= axis < nd):
        return None
    cdef int ax = axis
    if ax < 0:
        ax += nd
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(xa)
    cdef cnp.npy_intp sdims[32]
    cdef int64_t M = 1, N = 1
    cdef int k
    for k in range(nd):
        if k < ax:
            M *= dims[k]
            sdims[k] = dims[k]
        else:
            N *= dims[k]
            sdims[k] = 1
    if M == 0 or N == 0 or M * N >= SMALL_CALL_ELEMS:
        return None
    cdef int pnum = -1
    if weight is not None:
        if not (_plain_array(weight) and _shape_is(<cnp.ndarray>weight, dims + ax, nd - ax)):
            return None
        pnum = cnp.PyArray_TYPE(<cnp.ndarray>weight)
    if bias is not None:
        if not (_plain_array(bias) and _shape_is(<cnp.ndarray>bias, dims + ax, nd - ax)):
            return None
        if pnum != -1 and cnp.PyArray_TYPE(<cnp.ndarray>bias) != pnum:
            return None
        pnum = cnp.PyArray_TYPE(<cnp.ndarray>bias)
    entry = pairs.get((cnp.PyArray_TYPE(xa), pnum))
    cdef double e = eps
    if entry is None or not (e >= 0.0 and e <= 1.7976931348623157e308):   # (NaN fails both)
        return None
    cdef int code = entry[0], stat_num = entry[1]
    y = cnp.PyArray_EMPTY(nd, dims, cnp.PyArray_TYPE(xa), 0)
    mean = cnp.PyArray_EMPTY(nd, sdims, stat_num, 0) if center and want_stats else None
    rstd = cnp.PyArray_EMPTY(nd, sdims, stat_num, 0)
    forward(code, center, xa, y, weight, bias, mean, rstd, M, N, e,
            omp_get_max_threads() if num_threads is None else num_threads, True)
    return y, mean, rstd


def backward(int pair, bint center, cnp.ndarray dy, cnp.ndarray x, object mean, object rstd,
             object weight, cnp.ndarray dx, object dweight, object dbias,
             int64_t M, int64_t N, int num_threads, bint fresh=False):
    """dx for M rows of N elements; dweight/dbias (param dtype) when given.
    fresh: dx was just allocated."""
    cdef const cn_ops *ops = cn_get_ops(pair)
    if ops == NULL:
        raise ValueError(f"unknown kernel pair {pair}")
    cdef int half = cn_half_params[pair]
    cdef cn_bwd_args a
    weight = _contig(weight)
    mean = _contig(mean)
    rstd = _contig(rstd)
    a.dy = cnp.PyArray_DATA(dy)
    a.x = cnp.PyArray_DATA(x)
    a.mean = _data(mean)
    a.rstd = _data(rstd)
    a.w = _data(weight)
    a.dx = cnp.PyArray_DATA(dx)
    a.M = M
    a.N = N
    a.center = center
    a.stream = _streams(a.dx, M, N, ops.x_size)
    a.populate = a.stream and fresh
    if a.populate and FRESH_PLAIN_BWD_MIN_ROW_BYTES <= N * ops.x_size <= FRESH_PLAIN_ROW_BYTES:
        a.stream = 0   # (still populated before it is written)
    cdef int k = 0
    if dweight is not None:
        k = 2 if dbias is not None else 1
    cdef char *out_dw = <char *>_data(dweight)
    cdef char *out_db = <char *>_data(dbias)
    cdef int rc = 0
    cdef int T
    cdef float *wide = NULL
    with nogil:
        T = _threads_for(M * N, num_threads, cn_enter_call())
        if half and a.w != NULL:
            # float32 copy of the weight, and float32 sums for dweight/dbias
            wide = <float *>cn_scratch_get(0, (1 + k) * N * sizeof(float))
            if wide == NULL:
                rc = -1
            else:
                _widen(half, a.w, wide, N)
                a.w = wide
        if rc == 0:
            if wide != NULL:
                rc = _backward(ops, &a, T, k, <char *>(wide + N), <char *>(wide + 2 * N) if k == 2 else NULL)
                if rc == 0:
                    _narrow(half, wide + N, out_dw, N)
                    if k == 2:
                        _narrow(half, wide + 2 * N, out_db, N)
            else:
                rc = _backward(ops, &a, T, k, out_dw, out_db)
        cn_scratch_put(0, wide)
        cn_leave_call()
    if rc != 0:
        raise MemoryError("cynorm: could not allocate scratch memory")


# ------------------------------------------------------------ introspection --

def _share_edges(size_t lo, size_t hi, int64_t T):
    """The T + 1 edges at which threads split a fresh output's page population (for the tests)."""
    return [cn_share_edge(lo, hi, t, T) for t in range(T + 1)]


def _policy(str name, int64_t value=-1):
    """Read (value < 0) or set one scheduling constant; returns the old value.

    For tests and tuning only -- e.g. ("min_elems_per_thread", 1) makes tiny
    inputs take the parallel paths. None of these changes a result bit."""
    global MIN_ELEMS_PER_THREAD, LONG_GROUP_BYTES, PART_CACHE_BYTES, STREAM_MIN_BYTES, OVERSUBSCRIBE, PARTS_IN_A_BYTES
    global BWD_A_BY_CHUNK, PREFETCH_PIECES, FRESH_PLAIN_ROW_BYTES, PREFETCH_INTO_L2
    cdef int64_t old
    if name == "oversubscribe":
        old = OVERSUBSCRIBE
        if value >= 0: OVERSUBSCRIBE = value != 0
    elif name == "min_elems_per_thread":
        old = MIN_ELEMS_PER_THREAD
        if value >= 0: MIN_ELEMS_PER_THREAD = max(value, 1)
    elif name == "long_group_bytes":
        old = LONG_GROUP_BYTES
        if value >= 0: LONG_GROUP_BYTES = max(value, 1)
    elif name == "part_cache_bytes":
        old = PART_CACHE_BYTES
        if value >= 0: PART_CACHE_BYTES = value
    elif name == "bwd_a_by_chunk":
        old = BWD_A_BY_CHUNK
        if value >= 0: BWD_A_BY_CHUNK = <int>value
    elif name == "fresh_plain_row_bytes":
        old = FRESH_PLAIN_ROW_BYTES
        if value >= 0: FRESH_PLAIN_ROW_BYTES = value
    elif name == "prefetch_pieces":
        old = PREFETCH_PIECES
        if value >= 0: PREFETCH_PIECES = value != 0
    elif name == "parts_in_a_bytes":
        old = PARTS_IN_A_BYTES
        if value >= 0: PARTS_IN_A_BYTES = value
    elif name == "prefetch_into_l2":
        old = PREFETCH_INTO_L2
        if value >= 0: PREFETCH_INTO_L2 = value != 0
    elif name == "stream_min_bytes":
        old = STREAM_MIN_BYTES
        if value >= 0: STREAM_MIN_BYTES = value
    else:
        raise KeyError(name)
    return old


def long_row_bytes():
    """Rows longer than this many bytes take the long-row paths (CN_LONG_ROW_BYTES)."""
    return CN_LONG_ROW_BYTES


def isa():
    """Name of the ISA level in use (None before use_level)."""
    return None if LEVEL == NULL else LEVEL.name.decode()


def openmp():
    """True when this module was built with OpenMP."""
    return bool(CN_OPENMP)


def max_threads():
    """omp_get_max_threads() for the calling thread (1 without OpenMP)."""
    return omp_get_max_threads()


def threads_for(int64_t elems, int requested, int in_flight=1):
    """The thread count a call with this much work would use (introspection, tests)."""
    return _threads_for(elems, requested, in_flight)


def small_row_limit(int pair):
    """Rows up to this length take the in-register kernels."""
    return cn_get_ops(pair).small_max


def omp_probe(int64_t n):
    """Threads a default-sized parallel region gets (as threadpoolctl's own test
    helper measures it): omp_get_num_threads() from inside a prange."""
    cdef int64_t i, total = 0
    cdef int nthreads = 1
    for i in prange(n, nogil=True, schedule='static'):
        nthreads = omp_get_num_threads()
        total += i
    if total != n * (n - 1) // 2:
        raise AssertionError("omp_probe: wrong sum")
    return nthreads


def f32_to_bf16(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float32 -> bfloat16 bits (uint16)."""
    LEVEL.f32_to_bf16(<const float *>cnp.PyArray_DATA(src), <uint16_t *>cnp.PyArray_DATA(dst), src.size)


def f32_to_f16(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float32 -> float16 bits (uint16)."""
    LEVEL.f32_to_f16(<const float *>cnp.PyArray_DATA(src), <uint16_t *>cnp.PyArray_DATA(dst), src.size)


def f16_to_f32(cnp.ndarray src, cnp.ndarray dst):
    """Vector-path conversion, for tests: float16 bits (uint16) -> float32."""
    LEVEL.f16_to_f32(<const uint16_t *>cnp.PyArray_DATA(src), <float *>cnp.PyArray_DATA(dst), src.size)
