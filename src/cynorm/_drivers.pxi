# The drivers (included by _core.pyx): who computes what, in which order. They
# follow the call's policy (include/cn_policy.h) and call the level's row
# kernels through its table. The order of every reduction is fixed -- chunk
# moments merged left to right, row blocks added in block order -- so every
# output is bit-identical for any thread count and any path.

cdef inline int64_t _min(int64_t a, int64_t b) noexcept nogil:
    return a if a < b else b


cdef inline void _populate_share(char *base, int64_t first, int64_t count, int x_size, int64_t t,
                                 int64_t T) noexcept nogil:
    """Thread t's share (1/T, split on huge-page boundaries) of elements [first, first + count)
    of a fresh output: fault it in."""
    cn_populate_share(base + first * x_size, count * x_size, t, T)


# ---------------------------------------------------------------- forward --

cdef int _forward_team(const cn_ops *ops, const cn_fwd_args *a) noexcept nogil:
    """Few, long rows: all threads share each group of rows, split by column chunk.

    Phase 1 takes chunk moments, phase 2 merges them per row (left to right,
    exactly as fwd_rows does), phase 3 normalizes the chunks."""
    cdef int T = a.pol.threads
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK, G = a.pol.group_rows
    cdef int64_t nc = (N + K - 1) // K
    cdef cn_moments *mom = <cn_moments *>malloc(G * nc * sizeof(cn_moments))
    cdef cn_row_stats *st = <cn_row_stats *>malloc(G * sizeof(cn_row_stats))
    if mom == NULL or st == NULL:
        free(mom)
        free(st)
        return -1
    cdef int64_t g0, g1, t, i, c
    cdef cn_moments total
    cdef bint populate = a.pol.populate == CN_POPULATE_AHEAD
    with parallel(num_threads=T):
        g0 = 0
        while g0 < M:
            g1 = _min(M, g0 + G)
            if populate:   # each thread faults in its share of the group's output first
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


cdef int _forward(const cn_ops *ops, const cn_fwd_args *a) noexcept nogil:
    cdef int64_t M = a.M, t
    cdef int T = a.pol.threads
    if a.pol.path == CN_PATH_TEAM:
        return _forward_team(ops, a)
    if T <= 1:
        ops.fwd_rows(a, 0, M)
        return 0
    for t in prange(T, schedule='static', num_threads=T):
        ops.fwd_rows(a, (M * t) // T, (M * (t + 1)) // T)
    return 0


# --------------------------------------------------------------- backward --

cdef int _backward_team(const cn_ops *ops, const cn_bwd_args *a, int k, char *tot_dw, char *tot_db,
                        char *blocks_dw, char *blocks_db) noexcept nogil:
    """Long rows: blocks in order, all threads on each block, a group of rows at a time.

    Phase A: each row's two sums, chunk by chunk, two rows at a time (more
    concurrent DRAM streams than that lose bandwidth). Phase B: the per-row
    totals, in chunk order. Phase C, with the group back from cache: each
    thread owns column chunks and walks the group's rows in order, writing dx
    and adding each row into the block partial -- the order bwd_rows uses, so
    the bits match the row path. Where the rows are added into the partials
    (pol.team_parts): in phase C; in phase A by pairs of rows (one thread, while
    the partials stay in cache), rereading only x, dy and the weight in phase
    C; or in phase A by column chunk, each thread adding all of a group's pairs
    into the partials of its chunks. Same operations in the same row order:
    the same bits. With blocks_dw (and blocks_db), block j's partials are
    written there, j rows on, and not added up."""
    cdef int T = a.pol.threads
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK, B = a.pol.block_rows, S = a.pol.group_rows
    cdef int64_t nc = (N + K - 1) // K
    cdef int64_t nb = (M + B - 1) // B
    cdef size_t part_bytes = N * ops.acc_size
    cdef double *sums = <double *>malloc(S * nc * 2 * sizeof(double))
    cdef double *rowsums = <double *>malloc(S * 2 * sizeof(double))
    cdef char *blk_part = NULL
    if k and nb > 1 and blocks_dw == NULL:
        blk_part = <char *>cn_scratch_get(2, k * part_bytes)
    if sums == NULL or rowsums == NULL or (k and nb > 1 and blocks_dw == NULL and blk_part == NULL):
        free(sums)
        free(rowsums)
        cn_scratch_put(2, blk_part)
        return -1
    cdef int64_t blk, r0, r1, s0, s1, r, c, i, t, npairs, pfo, npf
    cdef char *dwp
    cdef char *dbp
    cdef double acc1, acc2
    cdef bint in_pairs = k > 0 and a.pol.team_parts == CN_PARTS_BY_PAIRS
    cdef bint by_chunk = k > 0 and a.pol.team_parts == CN_PARTS_BY_CHUNK
    cdef bint prefetch_pieces = a.pol.prefetch_pieces
    cdef bint populate = a.pol.populate == CN_POPULATE_AHEAD
    with parallel(num_threads=T):
        for blk in range(nb):
            r0 = blk * B
            r1 = _min(M, r0 + B)
            dwp = NULL
            dbp = NULL
            if k and blocks_dw != NULL:
                dwp = blocks_dw + blk * part_bytes
                if k == 2:
                    dbp = blocks_db + blk * part_bytes
            elif k:
                dwp = tot_dw if blk == 0 else blk_part
                if k == 2:
                    dbp = tot_db if blk == 0 else blk_part + part_bytes
            s0 = r0
            while s0 < r1:
                s1 = _min(r1, s0 + S)
                if populate:   # each thread faults in its share of the group's dx first
                    for t in prange(T, schedule='static'):
                        _populate_share(<char *>a.dx, s0 * N, (s1 - s0) * N, ops.x_size, t, T)
                npairs = (s1 - s0 + 1) // 2
                if by_chunk:
                    for c in prange(nc, schedule='static'):
                        for i in range(npairs):
                            r = s0 + 2 * i
                            # 16-bit rows: prefetch the next pair's piece (after the last pair,
                            # the first one's next chunk): a piece is one page, where the
                            # hardware prefetcher stops
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
                                      dwp if in_pairs else NULL, dbp if in_pairs else NULL, r == r0, 0, 0)
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
                                  NULL if in_pairs or by_chunk else dwp,
                                  NULL if in_pairs or by_chunk else dbp, r0)
                s0 = s1
            if k and blk > 0 and blocks_dw == NULL:
                for c in prange(nc, schedule='static'):
                    ops.acc_add(tot_dw, blk_part, c * K, _min(N, c * K + K))
                    if k == 2:
                        ops.acc_add(tot_db, blk_part + part_bytes, c * K, _min(N, c * K + K))
        cn_stream_fence()   # make this thread's non-temporal stores visible
    free(sums)
    free(rowsums)
    cn_scratch_put(2, blk_part)
    return 0


cdef inline void _backward_block(const cn_ops *ops, const cn_bwd_args *a, int k, int64_t blk, char *tot_dw,
                                 char *tot_db, char *blocks_dw, char *blocks_db, char *scratch) noexcept nogil:
    """Block blk's rows, its partials into the totals (block 0), scratch or blocks_dw."""
    cdef int64_t B = a.pol.block_rows
    cdef size_t part_bytes = a.N * ops.acc_size
    cdef char *dwp = NULL
    cdef char *dbp = NULL
    if k and blocks_dw != NULL:
        dwp = blocks_dw + blk * part_bytes
        if k == 2:
            dbp = blocks_db + blk * part_bytes
    elif k:
        dwp = tot_dw if blk == 0 else scratch + (blk - 1) * k * part_bytes
        if k == 2:
            dbp = tot_db if blk == 0 else scratch + ((blk - 1) * k + 1) * part_bytes
    ops.bwd_rows(a, blk * B, _min(a.M, blk * B + B), dwp, dbp)


cdef int _backward_blocks(const cn_ops *ops, const cn_bwd_args *a, int k, char *tot_dw, char *tot_db,
                          char *blocks_dw, char *blocks_db) noexcept nogil:
    """Many rows: threads take whole blocks; then the block partials are added
    in block order, column chunk by column chunk (or, with blocks_dw, left
    there: block j's j rows on)."""
    cdef int T = a.pol.threads
    cdef int64_t M = a.M, N = a.N, K = CN_CHUNK, B = a.pol.block_rows
    cdef int64_t nb = (M + B - 1) // B
    cdef int64_t nc = (N + K - 1) // K
    cdef size_t part_bytes = N * ops.acc_size
    # block 0 accumulates straight into the totals; blocks 1.. get scratch
    cdef char *scratch = NULL
    if k and nb > 1 and blocks_dw == NULL:
        scratch = <char *>cn_scratch_get(2, (nb - 1) * k * part_bytes)
        if scratch == NULL:
            return -1
    cdef int64_t blk, c, j
    if T == 1:   # (no parallel region: it costs more than a tiny call's work)
        for blk in range(nb):
            _backward_block(ops, a, k, blk, tot_dw, tot_db, blocks_dw, blocks_db, scratch)
    else:
        for blk in prange(nb, schedule='static', num_threads=T):
            _backward_block(ops, a, k, blk, tot_dw, tot_db, blocks_dw, blocks_db, scratch)
    if k and nb > 1 and blocks_dw == NULL:
        T = <int>_min(T, nc)
        if T == 1:
            for j in range(nb - 1):
                ops.acc_add(tot_dw, scratch + j * k * part_bytes, 0, N)
                if k == 2:
                    ops.acc_add(tot_db, scratch + (j * k + 1) * part_bytes, 0, N)
        else:
            for c in prange(nc, schedule='static', num_threads=T):
                for j in range(nb - 1):
                    ops.acc_add(tot_dw, scratch + j * k * part_bytes, c * K, _min(N, c * K + K))
                    if k == 2:
                        ops.acc_add(tot_db, scratch + (j * k + 1) * part_bytes, c * K, _min(N, c * K + K))
    cn_scratch_put(2, scratch)
    return 0


# ------------------------------------------------------------ C entry point --

cdef const char *_c_error_string(int status) noexcept nogil:
    if status == CYNORM_OK:
        return b"ok"
    if status == CYNORM_ENOMEM:
        return b"cynorm: could not allocate scratch memory"
    if status == CYNORM_EINVAL:
        return b"cynorm: invalid descriptor (unsupported dtype pair, rows < 0, cols < 1, eps negative or not finite, num_threads < 0, or a required pointer is NULL)"
    return b"cynorm: unknown status"


cdef inline int _pair_of(int x_dtype, int param_dtype) noexcept nogil:
    """The pair code (meson.build's table) of these dtypes (cynorm.h's codes), or -1;
    without params, x's first pair."""
    cdef int i
    for i in range(CN_NUM_PAIRS):
        if cn_pair_rows[i].x == x_dtype and (param_dtype == CYNORM_NO_PARAMS or cn_pair_rows[i].param == param_dtype):
            return i
    return -1


cdef inline bint _desc_ok(const cynorm_desc *d) noexcept nogil:
    return ((d.norm == CYNORM_LAYER_NORM or d.norm == CYNORM_RMS_NORM) and d.rows >= 0 and d.cols >= 1
            and d.num_threads >= 0 and LEVEL != NULL)


cdef void _fill_call(cn_call *c, const cn_ops *ops, const cynorm_desc *d, int backward, int in_flight) noexcept nogil:
    _fill_call_rows(c, ops, d.rows, d.cols, d.num_threads, (d.flags & CYNORM_FRESH_OUTPUT) != 0, backward, in_flight)


cdef void _fill_call_rows(cn_call *c, const cn_ops *ops, int64_t M, int64_t N, int num_threads, bint fresh,
                          int backward, int in_flight) noexcept nogil:
    """The policy's view of a call over M rows of N elements (GroupNorm: its (sample, group) rows)."""
    c.backward = backward
    c.M = M
    c.N = N
    c.x_size = ops.x_size
    c.acc_size = ops.acc_size
    c.small_max = ops.small_max
    c.multirow_stream = ops.multirow_stream
    c.grads = 0
    c.requested_threads = num_threads if num_threads > 0 else omp_get_max_threads()
    c.num_procs = omp_get_num_procs
    c.in_flight = in_flight
    c.in_parallel = omp_in_parallel()
    c.oversubscribe = MACHINE.oversubscribe
    c.openmp = CN_OPENMP
    c.fresh = fresh
    c.block_rows = 0
    c.out_addr = 0
    c.in_addr = 0


cdef int _c_forward(const cynorm_desc *d, const cynorm_fwd_bufs *b) noexcept nogil:
    cdef int pair = _pair_of(d.x_dtype, d.param_dtype)
    if pair < 0 or not _desc_ok(d) or not (d.eps >= 0.0 and d.eps <= 1.7976931348623157e308):
        return CYNORM_EINVAL
    if b.x == NULL or b.y == NULL:
        return CYNORM_EINVAL
    return _forward_impl(d, b, cn_get_ops(pair), _widened(pair), NULL)


cdef int _forward_impl(const cynorm_desc *d, const cynorm_fwd_bufs *b, const cn_ops *ops, int half,
                       const cn_fused_fwd *fused) noexcept nogil:
    """A checked forward call on `ops` (x's kernel); half: 16-bit params to widen
    (1 bf16, 2 f16). fused: the residual add first (x is then h)."""
    if d.rows == 0:
        return CYNORM_OK
    cdef int64_t N = d.cols
    cdef cn_fwd_args a
    cdef cn_call call
    cdef cn_policy pol
    cdef float *wide = NULL
    cdef int rc = 0
    a.x = b.x
    a.y = b.y
    a.w = b.weight
    a.b = b.bias
    a.mean = b.mean if d.norm == CYNORM_LAYER_NORM else NULL
    a.rstd = b.rstd
    a.M = d.rows
    a.N = N
    a.eps = d.eps
    a.center = d.norm == CYNORM_LAYER_NORM
    if a.rstd == NULL:   # the kernels always write rstd: into scratch when the caller wants none
        a.rstd = cn_scratch_get(3, d.rows * ops.acc_size)
        if a.rstd == NULL:
            return CYNORM_ENOMEM
    _fill_call(&call, ops, d, 0, cn_enter_call())
    call.out_addr = <uintptr_t>b.y
    pol = cn_policy_for(&MACHINE, &call)
    a.pol = &pol
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
    cdef cn_fused_fwd f
    if rc == 0 and fused != NULL:
        # h is stored as the policy would store y with h's freshness and address
        f = fused[0]
        call.fresh = f.fresh_h
        call.out_addr = <uintptr_t>f.h
        f.stream_h = cn_policy_for(&MACHINE, &call).stream != 0
        rc = _forward_fused(ops, &a, &f)
    elif rc == 0:
        rc = _forward(ops, &a)
    cn_scratch_put(0, wide)
    if b.rstd == NULL:
        cn_scratch_put(3, a.rstd)
    cn_leave_call()
    return CYNORM_OK if rc == 0 else CYNORM_ENOMEM


cdef int _c_backward(const cynorm_desc *d, const cynorm_bwd_bufs *b) noexcept nogil:
    cdef int pair = _pair_of(d.x_dtype, d.param_dtype)
    if pair < 0 or not _desc_ok(d) or not _bwd_bufs_ok(d, b):
        return CYNORM_EINVAL
    return _backward_impl(d, b, cn_get_ops(pair), _widened(pair), NULL)


cdef bint _bwd_bufs_ok(const cynorm_desc *d, const cynorm_bwd_bufs *b) noexcept nogil:
    """The backward's buffers: the required ones given, dweight only with a weight,
    dbias (LayerNorm) only with dweight, totals or blocks but not both."""
    cdef bint center = d.norm == CYNORM_LAYER_NORM
    cdef bint blocks = b.dweight_blocks != NULL
    cdef void *out_w = b.dweight_blocks if blocks else b.dweight
    cdef void *out_b = b.dbias_blocks if blocks else b.dbias
    return not (b.dy == NULL or b.x == NULL or b.rstd == NULL or b.dx == NULL or (center and b.mean == NULL)
                or d.block_rows < 0 or (out_w != NULL and b.weight == NULL)
                or (out_b != NULL and (out_w == NULL or not center))
                or (blocks and (b.dweight != NULL or b.dbias != NULL)) or (b.dbias_blocks != NULL and not blocks))


cdef int _backward_impl(const cynorm_desc *d, const cynorm_bwd_bufs *b, const cn_ops *ops, int half,
                        const void *dh) noexcept nogil:
    """A checked backward call on `ops` (x's kernel); half: 16-bit params (1 bf16,
    2 f16). dh (fused): added to dx before it is rounded."""
    cdef bint center = d.norm == CYNORM_LAYER_NORM
    cdef bint blocks = b.dweight_blocks != NULL
    cdef void *out_w = b.dweight_blocks if blocks else b.dweight
    cdef void *out_b = b.dbias_blocks if blocks else b.dbias
    cdef int k = 0 if out_w == NULL else (2 if out_b != NULL else 1)
    cdef int64_t N = d.cols
    cdef size_t grad_bytes = N * (2 if half else ops.p_size)
    if d.rows == 0:   # no rows: zero gradients (and no blocks)
        if k and not blocks:
            memset(b.dweight, 0, grad_bytes)
        if k == 2 and not blocks:
            memset(b.dbias, 0, grad_bytes)
        return CYNORM_OK
    cdef cn_bwd_args a
    cdef cn_call call
    cdef cn_policy pol
    cdef float *wide = NULL
    cdef char *out_dw = <char *>b.dweight
    cdef char *out_db = <char *>b.dbias
    cdef char *blocks_dw = <char *>b.dweight_blocks
    cdef char *blocks_db = <char *>b.dbias_blocks
    cdef int rc = 0
    a.dy = b.dy
    a.x = b.x
    a.mean = b.mean if center else NULL
    a.rstd = b.rstd
    a.w = b.weight
    a.dx = b.dx
    a.dh = dh
    a.M = d.rows
    a.N = N
    a.center = center
    _fill_call(&call, ops, d, 1, cn_enter_call())
    call.grads = k
    call.block_rows = d.block_rows
    call.out_addr = <uintptr_t>b.dx
    call.in_addr = <uintptr_t>b.x | <uintptr_t>b.dy | <uintptr_t>b.dx
    pol = cn_policy_for(&MACHINE, &call)
    a.pol = &pol
    if half and a.w != NULL:
        # float32 copy of the weight, and float32 sums for dweight/dbias
        wide = <float *>cn_scratch_get(0, (1 + k) * N * sizeof(float))
        if wide == NULL:
            rc = -1
        else:
            _widen(half, a.w, wide, N)
            a.w = wide
            if not blocks:
                out_dw = <char *>(wide + N) if k else NULL
                out_db = <char *>(wide + 2 * N) if k == 2 else NULL
    if rc == 0:
        if pol.path == CN_PATH_TEAM:
            rc = _backward_team(ops, &a, k, out_dw, out_db, blocks_dw, blocks_db)
        else:
            rc = _backward_blocks(ops, &a, k, out_dw, out_db, blocks_dw, blocks_db)
    if rc == 0 and wide != NULL and k and not blocks:
        _narrow(half, wide + N, b.dweight, N)
        if k == 2:
            _narrow(half, wide + 2 * N, b.dbias, N)
    cn_scratch_put(0, wide)
    cn_leave_call()
    return CYNORM_OK if rc == 0 else CYNORM_ENOMEM


cdef int64_t _c_block_rows(int64_t rows, int64_t cols, int x_dtype) noexcept nogil:
    cdef int k = _kernel_of(x_dtype)
    if k < 0 or LEVEL == NULL:
        return -1
    return cn_block_rows(rows, cols, LEVEL.kernels[k].acc_size)


cdef cynorm_api _C_API_TABLE
_C_API_TABLE.abi_version = CYNORM_ABI_VERSION
_C_API_TABLE.forward = _c_forward
_C_API_TABLE.backward = _c_backward
_C_API_TABLE.error_string = _c_error_string
_C_API_TABLE.block_rows = _c_block_rows
_C_API_TABLE.add_forward = _c_add_forward
_C_API_TABLE.add_backward = _c_add_backward
