/* Per-thread scratch buffers that outlive a call.
 *
 * A fresh malloc of megabytes is fresh pages, which the OS faults in and
 * zeroes on first touch -- on every call (measured: bf16-param backward on
 * (64,128,56,56) at 2 threads took 11.8 ms, 9.3 ms with this). So each calling
 * thread keeps its buffers (grow-only, one per slot) until it exits.
 * Buffers above CN_SCRATCH_KEEP_MAX bytes are not kept. Without pthreads
 * (MSVC) every buffer is a plain malloc/free.
 *
 *   p = cn_scratch_get(slot, bytes);  ...  cn_scratch_put(slot, p);
 */
#ifndef CN_SCRATCH_H
#define CN_SCRATCH_H

#include <stdint.h>
#include <stdlib.h>

#include "cn_pages.h"

/* Fault in (writable) the pages of dst[0:bytes] now, without changing any
 * byte: MADV_POPULATE_WRITE (Linux 5.14+; elsewhere, or when refused, a no-op).
 * A fresh output's pages are zeroed by the OS on first touch, 2 MB at a time
 * with huge pages, and that zeroing runs through the caches: done in the middle
 * of a row group it evicts the rows about to be reread from cache. Populated
 * before the group's first pass, it cannot. Pages already present cost only a
 * page-table walk. */
#if defined(__linux__)
#include <stdint.h>
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* (glibc declares it only under _DEFAULT_SOURCE; a strict -std=c11 unit may not have it) */
extern int madvise(void *addr, size_t len, int advice);
static inline void cn_populate_write(void *dst, size_t bytes)
{
    uintptr_t a = (uintptr_t)dst & ~(uintptr_t)4095, e = ((uintptr_t)dst + bytes + 4095) & ~(uintptr_t)4095;
    if (bytes) (void)madvise((void *)a, (size_t)(e - a), MADV_POPULATE_WRITE);
}
#else
static inline void cn_populate_write(void *dst, size_t bytes) { (void)dst; (void)bytes; }
#endif

/* Thread t's share (of T) of cn_populate_write(dst, bytes), in whole 2 MiB
 * pages: two threads faulting the same huge page would both zero a fresh
 * 2 MiB page, and the kernel would throw one away. The pages that start in
 * the range are dealt out evenly; thread 0 also takes the part before the
 * first of them (already faulted in with the previous group, as a rule).
 * Measured, backward team path, (64,128,56,56) allocating, 2 threads, A/B:
 * bf16 6.58-6.65 -> 5.95-6.04 ms, fp16 6.77 -> 6.03, fp32 12.69-12.81 ->
 * 10.98-13.21; the forward team path, (6,4000000) bf16, 17.0 -> 11.3. */
#define CN_SHARE_PAGE ((uintptr_t)CN_HUGE_PAGE)
static inline uintptr_t cn_share_edge(uintptr_t lo, uintptr_t hi, int64_t t, int64_t T)
{
    if (t <= 0) return lo;
    if (t >= T) return hi;
    uintptr_t first = (lo + CN_SHARE_PAGE - 1) & ~(CN_SHARE_PAGE - 1);
    if (first >= hi) return hi;
    uintptr_t pages = (hi - first + CN_SHARE_PAGE - 1) / CN_SHARE_PAGE;
    uintptr_t e = first + (uintptr_t)(((unsigned long long)pages * (unsigned long long)t) / (unsigned long long)T) * CN_SHARE_PAGE;
    return e < hi ? e : hi;
}

static inline void cn_populate_share(void *dst, size_t bytes, int64_t t, int64_t T)
{
    uintptr_t lo = (uintptr_t)dst, hi = lo + bytes;
    uintptr_t a = cn_share_edge(lo, hi, t, T), e = cn_share_edge(lo, hi, t + 1, T);
    if (e > a) cn_populate_write((void *)a, (size_t)(e - a));
}

#define CN_SCRATCH_SLOTS 3
#define CN_SCRATCH_KEEP_MAX ((size_t)64 << 20)

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>

typedef struct { void *ptr[CN_SCRATCH_SLOTS]; size_t cap[CN_SCRATCH_SLOTS]; } cn_scratch_set;

static pthread_key_t cn_scratch_key;
static pthread_once_t cn_scratch_once = PTHREAD_ONCE_INIT;
static int cn_scratch_ok = 0;

static void cn_scratch_free_set(void *p)   /* runs when a thread exits */
{
    cn_scratch_set *s = (cn_scratch_set *)p;
    for (int i = 0; i < CN_SCRATCH_SLOTS; i++) free(s->ptr[i]);
    free(s);
}

static void cn_scratch_init(void) { cn_scratch_ok = pthread_key_create(&cn_scratch_key, cn_scratch_free_set) == 0; }

static cn_scratch_set *cn_scratch_mine(void)
{
    pthread_once(&cn_scratch_once, cn_scratch_init);
    if (!cn_scratch_ok) return NULL;
    cn_scratch_set *s = (cn_scratch_set *)pthread_getspecific(cn_scratch_key);
    if (s == NULL) {
        s = (cn_scratch_set *)calloc(1, sizeof(cn_scratch_set));
        if (s != NULL && pthread_setspecific(cn_scratch_key, s) != 0) { free(s); s = NULL; }
    }
    return s;
}

static void *cn_scratch_get(int slot, size_t bytes)
{
    cn_scratch_set *s = bytes <= CN_SCRATCH_KEEP_MAX ? cn_scratch_mine() : NULL;
    if (s == NULL) return malloc(bytes ? bytes : 1);
    if (bytes > s->cap[slot]) {
        free(s->ptr[slot]);
        s->ptr[slot] = malloc(bytes);
        s->cap[slot] = s->ptr[slot] ? bytes : 0;
    }
    return s->ptr[slot];
}

static void cn_scratch_put(int slot, void *p)
{
    cn_scratch_set *s = p != NULL ? cn_scratch_mine() : NULL;
    if (s == NULL || p != s->ptr[slot]) free(p);   /* not kept: give it back */
}

#else
static void *cn_scratch_get(int slot, size_t bytes) { (void)slot; return malloc(bytes ? bytes : 1); }
static void cn_scratch_put(int slot, void *p) { (void)slot; free(p); }
#endif

#endif
