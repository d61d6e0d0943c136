/* The least a two-pass channels-first GroupNorm forward and backward do, float32 and
 * bfloat16, AVX-512 (groupnorm_two_pass_bound.py compiles and loads it; the
 * bfloat16 one where the compiler has AVX512_BF16): per group of L
 * contiguous elements, one pass of sums from cache, then one normalizing pass
 * (x - m) * r + l, * w + b with non-temporal stores, fetching the next group
 * into L2 meanwhile -- as cynorm's channels-first path, without its exact
 * moments, rescue checks or per-channel params. Not a correct GroupNorm: a
 * floor for the loop structure. */
#include <immintrin.h>
#include <stdint.h>

static float sums(const float *x, long n)
{
    __m512 s[4], q[4];
    const __m512 p = _mm512_set1_ps(0.1f);
    for (int k = 0; k < 4; k++) s[k] = q[k] = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 64)
        for (int k = 0; k < 4; k++) {
            const __m512 e = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16 * k), p);
            s[k] = _mm512_add_ps(s[k], e);
            q[k] = _mm512_fmadd_ps(e, e, q[k]);
        }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]))) +
           _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3])));
}

static void normalize(const float *x, float *y, long n, float m, const float *next)
{
    const __m512 M = _mm512_set1_ps(m), R = _mm512_set1_ps(1.1f), L = _mm512_set1_ps(0.001f);
    const __m512 W = _mm512_set1_ps(0.9f), B = _mm512_set1_ps(0.1f);
    for (long i = 0; i < n; i += 32) {
        if (next) {
            _mm_prefetch((const char *)(next + i), _MM_HINT_T1);
            _mm_prefetch((const char *)(next + i + 16), _MM_HINT_T1);
        }
        const __m512 a = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), M), R, L), W, B);
        const __m512 b = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), M), R, L), W, B);
        _mm512_stream_ps(y + i, a);
        _mm512_stream_ps(y + i + 16, b);
    }
}

/* y (64-byte aligned) from x: n elements in groups of L (L and n multiples of 64) */
void two_pass_minimal(const float *x, float *y, long n, long L)
{
    for (long g = 0; g < n; g += L)
        normalize(x + g, y + g, L, sums(x + g, L) * 1e-30f, g + L < n ? x + g + L : 0);
    _mm_sfence();
}

/* The backward's least, float32: per group, the sums of dy * xhat and of dy
 * from cache, then dx = (dy * w - xhat * c1 - c2) * r with streamed stores,
 * fetching the next group's x and dy into L2 meanwhile -- as cynorm's
 * channels-first backward, without its per-channel dweight/dbias sums, exact
 * totals or per-channel params. */
static void grads(const float *x, const float *dy, long n, float *a, float *b)
{
    __m512 s[4], q[4];
    const __m512 M = _mm512_set1_ps(0.1f), R = _mm512_set1_ps(1.1f);
    for (int k = 0; k < 4; k++) s[k] = q[k] = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 64)
        for (int k = 0; k < 4; k++) {
            const __m512 d = _mm512_loadu_ps(dy + i + 16 * k);
            s[k] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16 * k), M), R), s[k]);
            q[k] = _mm512_add_ps(q[k], d);
        }
    *a = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
    *b = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3])));
}

static void dx_pass(const float *x, const float *dy, float *dx, long n, float c1, float c2, const float *nx,
                    const float *ndy)
{
    const __m512 M = _mm512_set1_ps(0.1f), R = _mm512_set1_ps(1.1f), W = _mm512_set1_ps(0.9f);
    const __m512 C1 = _mm512_set1_ps(c1), C2 = _mm512_set1_ps(c2);
    for (long i = 0; i < n; i += 16) {
        if (nx) {
            _mm_prefetch((const char *)(nx + i), _MM_HINT_T1);
            _mm_prefetch((const char *)(ndy + i), _MM_HINT_T1);
        }
        const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), M), R);
        const __m512 t = _mm512_fmsub_ps(_mm512_loadu_ps(dy + i), W, _mm512_fmadd_ps(xh, C1, C2));
        _mm512_stream_ps(dx + i, _mm512_mul_ps(t, R));
    }
}

/* dx (64-byte aligned) from x, dy: n elements in groups of L (multiples of 64) */
void two_pass_minimal_bwd(const float *x, const float *dy, float *dx, long n, long L)
{
    for (long g = 0; g < n; g += L) {
        float a, b;
        grads(x + g, dy + g, L, &a, &b);
        dx_pass(x + g, dy + g, dx + g, L, a * 1e-30f, b * 1e-30f, g + L < n ? x + g + L : 0, dy + g + L);
    }
    _mm_sfence();
}

#ifdef __AVX512BF16__
/* bfloat16 storage, float32 arithmetic: the same loops, each load widened
 * (vpmovzxwd, vpslld) and each result rounded back (vcvtneps2bf16), as
 * cynorm's AVX-512 BF16 level does */
static __m512 load_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static float sums_bf16(const uint16_t *x, long n)
{
    __m512 s[4], q[4];
    const __m512 p = _mm512_set1_ps(0.1f);
    for (int k = 0; k < 4; k++) s[k] = q[k] = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 64)
        for (int k = 0; k < 4; k++) {
            const __m512 e = _mm512_sub_ps(load_bf16(x + i + 16 * k), p);
            s[k] = _mm512_add_ps(s[k], e);
            q[k] = _mm512_fmadd_ps(e, e, q[k]);
        }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]))) +
           _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3])));
}

static void normalize_bf16(const uint16_t *x, uint16_t *y, long n, float m, const uint16_t *next)
{
    const __m512 M = _mm512_set1_ps(m), R = _mm512_set1_ps(1.1f), L = _mm512_set1_ps(0.001f);
    const __m512 W = _mm512_set1_ps(0.9f), B = _mm512_set1_ps(0.1f);
    for (long i = 0; i < n; i += 32) {
        if (next) _mm_prefetch((const char *)(next + i), _MM_HINT_T1);
        const __m512 a = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_sub_ps(load_bf16(x + i), M), R, L), W, B);
        const __m512 b = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_sub_ps(load_bf16(x + i + 16), M), R, L), W, B);
        _mm256_stream_si256((__m256i *)(y + i), (__m256i)_mm512_cvtneps_pbh(a));
        _mm256_stream_si256((__m256i *)(y + i + 16), (__m256i)_mm512_cvtneps_pbh(b));
    }
}

void two_pass_minimal_bf16(const uint16_t *x, uint16_t *y, long n, long L)
{
    for (long g = 0; g < n; g += L)
        normalize_bf16(x + g, y + g, L, sums_bf16(x + g, L) * 1e-30f, g + L < n ? x + g + L : 0);
    _mm_sfence();
}
static void grads_bf16(const uint16_t *x, const uint16_t *dy, long n, float *a, float *b)
{
    __m512 s[4], q[4];
    const __m512 M = _mm512_set1_ps(0.1f), R = _mm512_set1_ps(1.1f);
    for (int k = 0; k < 4; k++) s[k] = q[k] = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 64)
        for (int k = 0; k < 4; k++) {
            const __m512 d = load_bf16(dy + i + 16 * k);
            s[k] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_sub_ps(load_bf16(x + i + 16 * k), M), R), s[k]);
            q[k] = _mm512_add_ps(q[k], d);
        }
    *a = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
    *b = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3])));
}

static void dx_pass_bf16(const uint16_t *x, const uint16_t *dy, uint16_t *dx, long n, float c1, float c2,
                         const uint16_t *nx, const uint16_t *ndy)
{
    const __m512 M = _mm512_set1_ps(0.1f), R = _mm512_set1_ps(1.1f), W = _mm512_set1_ps(0.9f);
    const __m512 C1 = _mm512_set1_ps(c1), C2 = _mm512_set1_ps(c2);
    for (long i = 0; i < n; i += 32) {
        if (nx) {
            _mm_prefetch((const char *)(nx + i), _MM_HINT_T1);
            _mm_prefetch((const char *)(ndy + i), _MM_HINT_T1);
        }
        for (int k = 0; k < 2; k++) {
            const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(load_bf16(x + i + 16 * k), M), R);
            const __m512 t = _mm512_fmsub_ps(load_bf16(dy + i + 16 * k), W, _mm512_fmadd_ps(xh, C1, C2));
            _mm256_stream_si256((__m256i *)(dx + i + 16 * k), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(t, R)));
        }
    }
}

void two_pass_minimal_bwd_bf16(const uint16_t *x, const uint16_t *dy, uint16_t *dx, long n, long L)
{
    for (long g = 0; g < n; g += L) {
        float a, b;
        grads_bf16(x + g, dy + g, L, &a, &b);
        dx_pass_bf16(x + g, dy + g, dx + g, L, a * 1e-30f, b * 1e-30f, g + L < n ? x + g + L : 0, dy + g + L);
    }
    _mm_sfence();
}
#endif
