/*
 * The row math of cynorm in plain scalar C, on one screen: what every kernel
 * computes for one row of n float32 values (16-bit rows are float32 once
 * widened), without the vector lanes, row blocks and threads that make the
 * kernels fast and fix their order of summation. Compiled into _core at
 * baseline flags; tests/test_reference.py checks it against the float64
 * oracle and the kernels against it.
 */
#include <math.h>
#include <stdint.h>

#include "cn_order.h"   /* CN_CHUNK */

/* y, mean, rstd of one row. LayerNorm (center): the moments about the row's
 * first element, chunk by chunk (two-pass within a chunk), merged with Chan's
 * formula; RMSNorm: the mean of squares. */
void cn_reference_forward(const float *x, int64_t n, const float *w, const float *b, double eps, int center,
                          float *y, float *mean, float *rstd)
{
    const double pivot = center ? x[0] : 0.0;
    double count = 0.0, delta = 0.0, m2 = 0.0;              /* the row so far, about the pivot */
    for (int64_t c0 = 0; c0 < n; c0 += CN_CHUNK) {
        const int64_t c1 = c0 + CN_CHUNK < n ? c0 + CN_CHUNK : n, k = c1 - c0;
        double d = 0.0, q = 0.0;
        for (int64_t j = c0; j < c1; j++) d += center ? x[j] - pivot : 0.0;
        d /= (double)k;                                       /* chunk mean - pivot */
        for (int64_t j = c0; j < c1; j++) { double e = x[j] - pivot - d; q += e * e; }
        const double tot = count + (double)k, dd = d - delta;  /* Chan et al.: merge the chunk */
        delta += dd * ((double)k / tot);
        m2 += q + dd * dd * (count * ((double)k / tot));
        count = tot;
    }
    const double var = m2 / (double)n > 0.0 ? m2 / (double)n : 0.0;
    const float r = (float)(1.0 / sqrt(var + eps)), mu = (float)(pivot + delta);
    for (int64_t j = 0; j < n; j++) {
        float v = center ? (x[j] - mu) * r : x[j] * r;
        if (w) v *= w[j];
        if (b) v += b[j];
        y[j] = v;
    }
    if (mean) *mean = mu;
    *rstd = r;
}

/* dx of one row, and the row's contributions added into dw and db (double):
 * g = dy * w, xhat = (x - mean) * rstd, dx = rstd * (g - mean(g) - xhat * mean(g * xhat));
 * RMSNorm: xhat = x * rstd, no mean(g) term; dweight += dy * xhat, dbias += dy. */
void cn_reference_backward(const float *dy, const float *x, int64_t n, const float *w, float mean, float rstd,
                           int center, float *dx, double *dw, double *db)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t j = 0; j < n; j++) {
        const float xhat = center ? (x[j] - mean) * rstd : x[j] * rstd, g = w ? dy[j] * w[j] : dy[j];
        s1 += g;
        s2 += (double)g * xhat;
    }
    const float c1 = center ? (float)(s1 / (double)n) : 0.0f, c2 = (float)(s2 / (double)n);
    for (int64_t j = 0; j < n; j++) {
        const float xhat = center ? (x[j] - mean) * rstd : x[j] * rstd, g = w ? dy[j] * w[j] : dy[j];
        dx[j] = rstd * (g - c1 - xhat * c2);
        if (dw) dw[j] += (double)dy[j] * xhat;
        if (db) db[j] += dy[j];
    }
}
