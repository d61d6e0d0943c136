/*
 * cn_pair.h -- the storage types of this unit's kernel (ops.c sets CN_KERNEL),
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

#if CN_KERNEL == CN_KERNEL_F32
typedef float xt;
#  define CN_XS f32
#elif CN_KERNEL == CN_KERNEL_F64
typedef double xt;
#  define CN_XS f64
#elif CN_KERNEL == CN_KERNEL_BF16
typedef cn_bf16 xt;
#  define CN_XS bf16
#elif CN_KERNEL == CN_KERNEL_F16
typedef cn_f16 xt;
#  define CN_XS f16
#else
#  error "unknown CN_KERNEL"
#endif

#if CN_KERNEL == CN_KERNEL_F64
typedef double pt, at;
typedef cn_vd vec;
#  define CN_LANE vd
#  define CN_PS f64
#  define VL CN_VD_LANES
#else   /* 16-bit params are widened to float32 by the caller */
typedef float pt, at;
typedef cn_vf vec;
#  define CN_LANE vf
#  define CN_PS f32
#  define VL CN_VF_LANES
#endif
#define CN_AS CN_PS

/* vector operations on the accumulator lanes: VOP(add)(a, b) */
#define VOP(op) CN_CAT3(cn_, CN_LANE, _##op)
#define CN_IO(what, S) CN_CAT(CN_CAT3(cn_, CN_LANE, _##what##_), S)

/* x storage; `full`: t == VL (a constant wherever these are inlined) */
CN_INLINE vec load_x(const xt *p) { return CN_IO(load, CN_XS)(p); }
CN_INLINE vec load_x_t(const xt *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_XS)(p) : CN_IO(loadn, CN_XS)(p, t);
}
/* stream: non-temporal stores, partial vectors included (so that no cache line
 * gets both kinds of store; see cn_stream_bytes) */
CN_INLINE void store_x_t(xt *p, vec v, int64_t t, const int full, const int stream)
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
CN_INLINE void store_x2(xt *p, vec a, vec b, const int stream)
{
    if (stream) CN_IO(stream2, CN_XS)(p, a, b);
    else CN_IO(store2, CN_XS)(p, a, b);
}

/* param storage (pt) and accumulators (at) */
CN_INLINE vec load_p(const pt *p) { return CN_IO(load, CN_PS)(p); }
CN_INLINE vec load_p_t(const pt *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_PS)(p) : CN_IO(loadn, CN_PS)(p, t);
}
CN_INLINE vec load_a_t(const at *p, int64_t t, const int full)
{
    return full ? CN_IO(load, CN_AS)(p) : CN_IO(loadn, CN_AS)(p, t);
}
CN_INLINE void store_a_t(at *p, vec v, int64_t t, const int full)
{
    if (full) CN_IO(store, CN_AS)(p, v);
    else CN_IO(storen, CN_AS)(p, v, t);
}
CN_INLINE void store_p_t(pt *p, vec v, int64_t t, const int full)
{
    if (full) CN_IO(store, CN_PS)(p, v);
    else CN_IO(storen, CN_PS)(p, v, t);
}

/* scalars: storage <-> accumulator (pivots, and the double-precision rescue) */
#if CN_KERNEL == CN_KERNEL_BF16
CN_INLINE at x_to_at(xt v) { return cn_bf16_to_f32(v); }
CN_INLINE xt double_to_x(double v) { return cn_f32_to_bf16((float)v); }
#elif CN_KERNEL == CN_KERNEL_F16
CN_INLINE at x_to_at(xt v) { return cn_f16_to_f32(v); }
CN_INLINE xt double_to_x(double v) { return cn_f32_to_f16((float)v); }
#else
CN_INLINE at x_to_at(xt v) { return v; }
CN_INLINE xt double_to_x(double v) { return (xt)v; }
#endif

/* Elements to store plainly before x-typed pointer p is aligned for a
 * full-vector non-temporal store (at most n). */
#define STREAM_ALIGN ((int64_t)(VL * sizeof(xt)))
CN_INLINE int64_t stream_peel(const void *p, int64_t n)
{
    int64_t mis = (int64_t)((uintptr_t)p % (uintptr_t)STREAM_ALIGN);
    int64_t k = mis ? (STREAM_ALIGN - mis) / (int64_t)sizeof(xt) : 0;
    if (mis % (int64_t)sizeof(xt)) k = n;  /* not even element-aligned: never stream */
    return k < n ? k : n;
}

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

/* Rows of at most SMALL_MAX elements live in registers: up to 4 vectors of 16
 * float lanes or 8 of 8 double lanes (64 elements), the same at every level.
 * (Which rows these are changes the arithmetic: this is part of the reduction
 * order, not a tunable.) */
#define SMALL_NV_MAX (VL >= 16 ? 4 : 8)
#define SMALL_MAX (SMALL_NV_MAX * VL)

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
