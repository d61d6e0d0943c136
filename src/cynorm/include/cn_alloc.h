/* Large outputs on transparent huge pages.
 *
 * A fresh output's pages are faulted in and zeroed by the OS on first touch.
 * On 4 KiB pages that costs ~1.5 us per page on the machines we measure on
 * (0.4 ms per MiB: 1.4 ms for a 3.6 MB mean+rstd pair, more than the kernel
 * itself spends on some shapes); a 2 MiB huge page is zeroed in ~40 us. NumPy
 * advises huge pages for arrays >= 4 MiB, but its buffers do not start on a
 * 2 MiB boundary, so the partial 2 MiB regions at both ends stay on 4 KiB
 * pages, and smaller arrays never get them.
 *
 * cn_huge_alloc maps the data on a 2 MiB boundary, advises MADV_HUGEPAGE and
 * frees with munmap. One 4 KiB page just before the data holds the mapping's
 * size. It is exposed to NumPy as a PyDataMem_Handler (NEP 49) so that the
 * arrays own their memory like any other. No caching: freed memory goes back
 * to the OS at once. Linux only; elsewhere cn_huge_available() is 0. */
#ifndef CN_ALLOC_H
#define CN_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cn_pages.h"

#define CN_HUGE_HEADER ((size_t)4096)

#if defined(__linux__)
#include <sys/mman.h>

static int cn_huge_available(void) { return 1; }

static void *cn_huge_alloc(size_t size)
{
    if (size == 0) size = 1;
    if (size > SIZE_MAX - 3 * CN_HUGE_PAGE) return NULL;
    const size_t len = (size + CN_HUGE_PAGE - 1) & ~(CN_HUGE_PAGE - 1);   /* whole huge pages */
    const size_t total = CN_HUGE_HEADER + len + CN_HUGE_PAGE;              /* room to align */
    char *base = (char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == (char *)MAP_FAILED) return NULL;
    char *data = (char *)(((uintptr_t)base + CN_HUGE_HEADER + CN_HUGE_PAGE - 1) & ~(uintptr_t)(CN_HUGE_PAGE - 1));
    char *head = data - CN_HUGE_HEADER, *end = data + len;
    /* give back what the alignment skipped, before and after */
    if (head > base) munmap(base, (size_t)(head - base));
    if (base + total > end) munmap(end, (size_t)(base + total - end));
    /* the whole mapping (header page too, so it stays one VMA); failure (no THP) is harmless */
    (void)madvise(head, CN_HUGE_HEADER + len, MADV_HUGEPAGE);
    *(size_t *)head = CN_HUGE_HEADER + len;
    return data;
}

static void cn_huge_free(void *ptr)
{
    if (ptr == NULL) return;
    char *head = (char *)ptr - CN_HUGE_HEADER;
    munmap(head, *(size_t *)head);
}

/* usable bytes at ptr (whole huge pages) */
static size_t cn_huge_size(const void *ptr) { return *(const size_t *)((const char *)ptr - CN_HUGE_HEADER) - CN_HUGE_HEADER; }

#else
static int cn_huge_available(void) { return 0; }
static void *cn_huge_alloc(size_t size) { (void)size; return NULL; }
static void cn_huge_free(void *ptr) { (void)ptr; }
static size_t cn_huge_size(const void *ptr) { (void)ptr; return 0; }
#endif

/* ---- the NumPy allocator (NEP 49): every array made while it is set is ours ---- */

static void *cn_np_malloc(void *ctx, size_t size) { (void)ctx; return cn_huge_alloc(size); }

static void *cn_np_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    return cn_huge_alloc(nelem * elsize);   /* fresh anonymous pages are zero */
}

static void *cn_np_realloc(void *ctx, void *ptr, size_t new_size)
{
    (void)ctx;
    if (ptr == NULL) return cn_huge_alloc(new_size);
    void *p = cn_huge_alloc(new_size);
    if (p == NULL) return NULL;             /* (ptr stays valid, as realloc promises) */
    size_t old = cn_huge_size(ptr);
    memcpy(p, ptr, old < new_size ? old : new_size);
    cn_huge_free(ptr);
    return p;
}

static void cn_np_free(void *ctx, void *ptr, size_t size) { (void)ctx; (void)size; cn_huge_free(ptr); }

#endif
