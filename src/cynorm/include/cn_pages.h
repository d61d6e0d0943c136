/* Pages of fresh outputs: the huge-page size that cn_alloc maps outputs on,
 * and faulting a fresh output's pages in before it is written. */
#ifndef CN_PAGES_H
#define CN_PAGES_H

#include <stddef.h>
#include <stdint.h>

#define CN_HUGE_PAGE ((size_t)2 << 20)

/* The OS's page size: 4 KiB on x86, 4, 16 or 64 KiB on aarch64 kernels
 * (Apple silicon and Asahi: 16 KiB; RHEL's and Grace's 64k kernels). Asked
 * once per unit; never assume 4096. */
#if defined(__linux__)
#include <unistd.h>
static inline size_t cn_page_size(void)
{
    static size_t page;
    size_t p = __atomic_load_n(&page, __ATOMIC_RELAXED);
    if (p == 0) {
        const long s = sysconf(_SC_PAGESIZE);
        p = s > 0 ? (size_t)s : 4096;
        __atomic_store_n(&page, p, __ATOMIC_RELAXED);
    }
    return p;
}
#endif

/* Fault in (writable) the pages of dst[0:bytes] now, without changing any
 * byte: MADV_POPULATE_WRITE (Linux 5.14+; elsewhere, or when refused, a no-op).
 * A fresh output's pages are zeroed by the OS on first touch, 2 MB at a time
 * with huge pages, and that zeroing runs through the caches: done in the middle
 * of a row group it evicts the rows about to be reread from cache. Populated
 * before the group's first pass, it cannot. Pages already present cost only a
 * page-table walk. */
#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* (glibc declares it only under _DEFAULT_SOURCE; a strict -std=c11 unit may not have it) */
extern int madvise(void *addr, size_t len, int advice);
static inline void cn_populate_write(void *dst, size_t bytes)
{
    const uintptr_t m = (uintptr_t)cn_page_size() - 1;
    uintptr_t a = (uintptr_t)dst & ~m, e = ((uintptr_t)dst + bytes + m) & ~m;
    if (bytes) (void)madvise((void *)a, (size_t)(e - a), MADV_POPULATE_WRITE);
}

/* 1 if dst[0:bytes] looks freshly mapped (its middle page is not in memory):
 * for buffers allocated by others (XLA's), where only the allocator knows. */
extern int mincore(void *addr, size_t len, unsigned char *vec);
static inline int cn_pages_absent(void *dst, size_t bytes)
{
    unsigned char in = 1;
    const size_t page = cn_page_size();
    uintptr_t mid = ((uintptr_t)dst + bytes / 2) & ~(uintptr_t)(page - 1);
    return bytes >= ((size_t)1 << 20) && mincore((void *)mid, page, &in) == 0 && !(in & 1);
}

/* Ask for huge pages on the 2 MiB pages inside dst[0:bytes] not yet faulted
 * in (advice only: no byte changes). */
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif
static inline void cn_advise_huge(void *dst, size_t bytes)
{
    uintptr_t a = ((uintptr_t)dst + CN_HUGE_PAGE - 1) & ~(uintptr_t)(CN_HUGE_PAGE - 1);
    uintptr_t e = ((uintptr_t)dst + bytes) & ~(uintptr_t)(CN_HUGE_PAGE - 1);
    if (e > a) (void)madvise((void *)a, (size_t)(e - a), MADV_HUGEPAGE);
}
#else
static inline void cn_populate_write(void *dst, size_t bytes) { (void)dst; (void)bytes; }
static inline int cn_pages_absent(void *dst, size_t bytes) { (void)dst; (void)bytes; return 0; }
static inline void cn_advise_huge(void *dst, size_t bytes) { (void)dst; (void)bytes; }
#endif

/* Thread t's share (of T) of cn_populate_write(dst, bytes), in whole 2 MiB
 * pages: two threads faulting the same huge page would both zero a fresh
 * 2 MiB page, and the kernel would throw one away. The pages that start in
 * the range are dealt out evenly; thread 0 also takes the part before the
 * first of them (already faulted in with the previous group, as a rule). */
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


/* dst[0:bytes] = src[0:bytes] with non-temporal stores: the lines go to
 * memory without being read first (a plain store reads each line before
 * overwriting it). The caller fences (sfence) before dst is read elsewhere. */
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
static inline void cn_copy_stream(void *dst, const void *src, size_t bytes)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16) _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, bytes);
}
#else
static inline void cn_copy_stream(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
#endif

#endif
