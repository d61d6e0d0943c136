/*
 * cn_pair.h -- the storage types of this unit's kernel (-DCN_KERNEL=<name>),
 * the vector loads and stores between them and the accumulator lanes, and the
 * one row walker that every streaming pass over a row uses.
 *
 *   xt  storage of x, y, dy, dx       pt  storage of weight, bias (and their grads)
 *   at  accumulator scalar            vec accumulator lanes (cn_vf: fp32, cn_vd: fp64)
 *
 * Everything goes through cn_simd.h; there are no intrinsics here.
 */
#ifndef CN_PAIR_H
#define CN_PAIR_H

#define CN_CAT_(a, b) a##b
#define CN_CAT(a, b) CN_CAT_(a, b)
#define CN_CAT3(a, b, c) CN_CAT(CN_CAT(a, b), c)

/* the unit's kernel (-DCN_KERNEL=<name> of meson.build's table): x's storage,
 * and the accumulator kernel, whose storage the params and statistics have */
typedef CN_KERNEL_FIELD(CTYPE, CN_KERNEL) xt;
#define CN_XS CN_KERNEL
#define CN_PS CN_KERNEL_FIELD(ACC, CN_KERNEL)
typedef CN_KERNEL_FIELD(CTYPE, CN_PS) pt, at;
/* the accumulator lanes (cn_simd.h: CN_LANES_<accumulator kernel>) */
#define CN_LANE CN_CAT(CN_LANES_, CN_PS)
#define VL CN_CAT(CN_WIDTH_, CN_LANE)
typedef CN_CAT(cn_, CN_LANE) vec;
#define CN_AS CN_PS

/* vector operations on the accumulator lanes: VOP(add)(a, b) */
#define VOP(op) CN_CAT3(cn_, CN_LANE, _##op)
#define CN_IO(what, S) CN_CAT(CN_CAT3(cn_, CN_LANE, _##what##_), S)

/* x storage; `full`: t == VL (a constant wherever these are inlined) */
CN_VEC_INLINE vec load_x(const xt *p) { return CN_IO(load, CN_XS)(p); }
CN_VEC_INLINE vec load_x_t(const xt *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_XS)(p) : CN_IO(loadn, CN_XS)(p, t);
}
/* stream: non-temporal stores, partial vectors included (so that no cache line
 * gets both kinds of store; see cn_stream_bytes) */
CN_VEC_INLINE void store_x_t(xt *p, vec v, int64_t t, const int full, const int stream)
{
    if (full) {
        if (stream) CN_IO(stream, CN_XS)(p, v);
        else CN_IO(store, CN_XS)(p, v);
    } else {
        if (stream) CN_IO(streamn, CN_XS)(p, v, t);
        else CN_IO(storen, CN_XS)(p, v, t);
    }
}
/* two full vectors to p and p + VL (a level may convert both at once: cn_vf_store2_bf16) */
CN_VEC_INLINE void store_x2(xt *p, vec a, vec b, const int stream)
{
    if (stream) CN_IO(stream2, CN_XS)(p, a, b);
    else CN_IO(store2, CN_XS)(p, a, b);
}

/* param storage (pt) and accumulators (at) */
CN_VEC_INLINE vec load_p(const pt *p) { return CN_IO(load, CN_PS)(p); }
CN_VEC_INLINE vec load_p_t(const pt *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_PS)(p) : CN_IO(loadn, CN_PS)(p, t);
}
CN_VEC_INLINE vec load_a_t(const at *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_AS)(p) : CN_IO(loadn, CN_AS)(p, t);
}
CN_VEC_INLINE void store_a_t(at *p, vec v, int64_t t, const int full)
{
    if (full) CN_IO(store, CN_AS)(p, v);
    else CN_IO(storen, CN_AS)(p, v, t);
}
/* scalars: storage <-> accumulator (pivots, and the double-precision rescue) */
CN_INLINE at x_to_at(xt v) { return CN_CAT(cn_scalar_from_, CN_XS)(v); }
CN_INLINE xt double_to_x(double v) { return CN_CAT(cn_scalar_to_, CN_XS)(v); }

/* Elements to store plainly before x-typed pointer p is aligned to `align`
 * bytes (at most n; n where p is not even element-aligned: never stream). */
CN_INLINE int64_t peel_to(const void *p, int64_t n, int64_t align)
{
    int64_t mis = (int64_t)((uintptr_t)p % (uintptr_t)align);
    int64_t k = mis ? (align - mis) / (int64_t)sizeof(xt) : 0;
    if (mis % (int64_t)sizeof(xt)) k = n;
    return k < n ? k : n;
}
/* ... for a full-vector non-temporal store */
#define STREAM_ALIGN ((int64_t)(VL * sizeof(xt)))
CN_INLINE int64_t stream_peel(const void *p, int64_t n) { return peel_to(p, n, STREAM_ALIGN); }

/*
 * The row walker: columns [0, n) in SIMD steps. First `head` elements (a
 * partial vector, after which stores are aligned for streaming), then W full
 * vectors a step (STEP_W(j)), then single full vectors, then the partial tail.
 * STEP(j, t, full, slot) handles t elements at column j; `slot` says which
 * accumulator a reduction adds into: single full vectors 0, the tail 1
 * (STEP_W uses 0..W-1). Every pass's order of operations is this walk's.
 */
#define CN_WALK(n, head, W, STEP_W, STEP)                                  \
    do {                                                                   \
        const int64_t n_ = (n);                                            \
        int64_t j_ = (head);                                               \
        if (j_) { STEP(0, j_, 0, 0); }                                     \
        for (; j_ + (W) * VL <= n_; j_ += (W) * VL) { STEP_W(j_); }        \
        for (; j_ + VL <= n_; j_ += VL) { STEP(j_, VL, 1, 0); }            \
        if (j_ < n_) { STEP(j_, n_ - j_, 0, 1); }                          \
    } while (0)

/* Rows of at most SMALL_MAX = CN_SMALL_ROW_MAX elements live in registers, in
 * SMALL_NV_MAX vectors (cn_order.h); the kernels' arrays of a row's vectors
 * hold up to 8. */
#define SMALL_MAX CN_SMALL_ROW_MAX
#define SMALL_NV_MAX (SMALL_MAX / VL)
_Static_assert(SMALL_MAX % VL == 0 && SMALL_NV_MAX <= 8, "a small row's vectors: arrays of 8, CN_SMALL_DISPATCH");

/* Calls CALL(K, C) with K = the row's vector count and C = center as compile-
 * time constants, so each small-row kernel is specialised for its shape. */
#define CN_SMALL_CASE(a, CALL, K)                                              \
    case K:                                                                    \
        if (K <= SMALL_NV_MAX) {                                               \
            if ((a)->center) CALL(K, 1);                                       \
            else CALL(K, 0);                                                   \
        }                                                                      \
        break;
#define CN_SMALL_DISPATCH(a, CALL)                                             \
    switch ((int)(((a)->N + VL - 1) / VL)) {                                   \
        CN_SMALL_CASE(a, CALL, 1) CN_SMALL_CASE(a, CALL, 2)                    \
        CN_SMALL_CASE(a, CALL, 3) CN_SMALL_CASE(a, CALL, 4)                    \
        CN_SMALL_CASE(a, CALL, 5) CN_SMALL_CASE(a, CALL, 6)                    \
        CN_SMALL_CASE(a, CALL, 7) CN_SMALL_CASE(a, CALL, 8)                    \
    }

#endif /* CN_PAIR_H */
