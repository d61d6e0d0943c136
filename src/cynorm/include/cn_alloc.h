/* Large outputs on transparent huge pages.
 *
 * A fresh output's pages are faulted in and zeroed by the OS on first touch,
 * which on 4 KiB pages can cost more than the kernel itself (numbers in
 * benchmarks/NOTES.md); a 2 MiB huge page is far cheaper per byte. NumPy
 * advises huge pages for arrays >= 4 MiB, but its buffers do not start on a
 * 2 MiB boundary, so the partial 2 MiB regions at both ends stay on 4 KiB
 * pages, and smaller arrays never get them.
 *
 * cn_huge_alloc maps the data on a 2 MiB boundary, advises MADV_HUGEPAGE and
 * frees with munmap. One OS page just before the data (the header: 4 KiB on
 * x86, up to 64 KiB on aarch64 kernels; cn_page_size) holds the mapping's size
 * and the header's own size, so every mapping frees with the header it was
 * made with. It is exposed to NumPy as a PyDataMem_Handler (NEP 49) so that the
 * arrays own their memory like any other. Linux only; elsewhere
 * cn_huge_available() is 0.
 *
 * Recycling: a freed mapping is kept (at most CN_RECYCLE_SLOTS of them and
 * cn_recycle_limit bytes in all, oldest given back first) and handed to the
 * next output of the same mapped size. Its pages are already faulted in, so
 * that output costs what an out= array costs. The common loop `y = f(x)`
 * frees the old y just after the new one is made, so one slot per shape is
 * enough. Memory that needs zeros (calloc) never comes from here. */
#ifndef CN_ALLOC_H
#define CN_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cn_pages.h"

#if defined(__linux__)
#include <sys/mman.h>

/* A page size to use instead of the OS's (0: the OS's), larger than the OS's:
 * lets a test on a 4 KiB machine run the arithmetic of a 64 KiB one. */
static size_t cn_fake_page;

/* the header of new mappings: one page (whole pages, or munmap of the part
 * before it would take the header away too) */
static size_t cn_huge_header(void)
{
    const size_t os = cn_page_size();
    return cn_fake_page > os ? cn_fake_page : os;
}

/* pages larger than a huge page, or not a power of two: not for us */
static int cn_huge_available(void)
{
    const size_t page = cn_huge_header();
    return page >= sizeof(size_t) * 2 && page <= CN_HUGE_PAGE && (page & (page - 1)) == 0;
}

/* set cn_fake_page (0: none); 0 if refused (not a power of two in [OS page, 2 MiB]) */
static int cn_set_fake_page(size_t page)
{
    if (page != 0 && (page < cn_page_size() || page > CN_HUGE_PAGE || (page & (page - 1)) != 0)) return 0;
    cn_fake_page = page;
    return 1;
}

/* a mapping's head: [0] its mapped bytes, [1] its header's bytes; the data's
 * last word before it holds the header's bytes too, to find the head */
static size_t cn_map_len(const char *head) { return ((const size_t *)head)[0]; }
static size_t cn_map_header(const char *head) { return ((const size_t *)head)[1]; }
static char *cn_head_of(const void *ptr) { return (char *)ptr - ((const size_t *)ptr)[-1]; }

/* the data bytes mapped for `size` (whole huge pages); 0 when too large */
static size_t cn_huge_len(size_t size)
{
    if (size == 0) size = 1;
    if (size > SIZE_MAX - 3 * CN_HUGE_PAGE) return 0;
    return (size + CN_HUGE_PAGE - 1) & ~(CN_HUGE_PAGE - 1);
}

static void *cn_huge_alloc(size_t size)
{
    const size_t len = cn_huge_len(size), header = cn_huge_header();
    if (len == 0 || !cn_huge_available()) return NULL;
    const size_t total = header + len + CN_HUGE_PAGE;              /* room to align */
    char *base = (char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == (char *)MAP_FAILED) return NULL;
    char *data = (char *)(((uintptr_t)base + header + CN_HUGE_PAGE - 1) & ~(uintptr_t)(CN_HUGE_PAGE - 1));
    char *head = data - header, *end = data + len;
    /* give back what the alignment skipped, before and after (whole pages:
     * base, head and end all lie on page boundaries) */
    if (head > base) munmap(base, (size_t)(head - base));
    if (base + total > end) munmap(end, (size_t)(base + total - end));
    /* the whole mapping (header page too, so it stays one VMA); failure (no THP) is harmless */
    (void)madvise(head, header + len, MADV_HUGEPAGE);
    ((size_t *)head)[0] = header + len;
    ((size_t *)head)[1] = header;
    ((size_t *)data)[-1] = header;
    return data;
}

/* ---- recycled mappings (see above); every access under cn_recycle_lock ---- */
#define CN_RECYCLE_SLOTS 8
static char *cn_recycled[CN_RECYCLE_SLOTS + 1];   /* mapping heads, oldest first (+1: room to add, then trim) */
static int cn_recycled_count;
static size_t cn_recycled_bytes, cn_recycle_limit;
static char cn_recycle_lock_flag;
static __thread int cn_last_recycled;             /* did this thread's last cn_huge_alloc_any recycle? */

static void cn_recycle_lock(void) { while (__atomic_test_and_set(&cn_recycle_lock_flag, __ATOMIC_ACQUIRE)) {} }
static void cn_recycle_unlock(void) { __atomic_clear(&cn_recycle_lock_flag, __ATOMIC_RELEASE); }

/* slot i taken out of the list (lock held) */
static char *cn_recycle_remove(int i)
{
    char *head = cn_recycled[i];
    for (int j = i; j + 1 < cn_recycled_count; j++) cn_recycled[j] = cn_recycled[j + 1];
    cn_recycled_count--;
    cn_recycled_bytes -= cn_map_len(head);
    return head;
}

/* the newest kept mapping of exactly `len` data bytes, taken out; NULL if none */
static char *cn_recycle_take(size_t len)
{
    char *head = NULL;
    cn_recycle_lock();
    for (int i = cn_recycled_count - 1; i >= 0 && head == NULL; i--)
        if (cn_map_len(cn_recycled[i]) - cn_map_header(cn_recycled[i]) == len) head = cn_recycle_remove(i);
    cn_recycle_unlock();
    return head;
}

/* Keep the mapping at head (NULL: keep nothing) and give back the oldest ones
 * until at most min(cap, the limit) bytes and CN_RECYCLE_SLOTS mappings are
 * kept: one locked step, so a mapping freed meanwhile is either kept or
 * counted. A mapping larger than that is given back at once (it must not push
 * out the others). Returns the bytes given back. */
static size_t cn_recycle_keep(char *head, size_t cap)
{
    char *drop[CN_RECYCLE_SLOTS + 1];
    int ndrop = 0;
    size_t freed = 0;
    cn_recycle_lock();
    const size_t keep = cap < cn_recycle_limit ? cap : cn_recycle_limit;
    if (head != NULL && cn_map_len(head) > keep) drop[ndrop++] = head;
    else if (head != NULL) {
        cn_recycled[cn_recycled_count++] = head;
        cn_recycled_bytes += cn_map_len(head);
    }
    while (cn_recycled_count > CN_RECYCLE_SLOTS || cn_recycled_bytes > keep)
        drop[ndrop++] = cn_recycle_remove(0);
    cn_recycle_unlock();
    for (int i = 0; i < ndrop; i++) {   /* (outside the lock: munmap takes a while) */
        freed += cn_map_len(drop[i]);
        munmap(drop[i], cn_map_len(drop[i]));
    }
    return freed;
}

/* Set the limit, then give back what it no longer allows; returns those bytes. */
static size_t cn_recycle_set_limit(size_t limit)
{
    cn_recycle_lock();
    cn_recycle_limit = limit;
    cn_recycle_unlock();
    return cn_recycle_keep(NULL, (size_t)-1);
}

static size_t cn_recycle_limit_now(void)
{
    cn_recycle_lock();
    size_t n = cn_recycle_limit;
    cn_recycle_unlock();
    return n;
}

static size_t cn_recycled_now(void)
{
    cn_recycle_lock();
    size_t n = cn_recycled_bytes;
    cn_recycle_unlock();
    return n;
}

static void cn_huge_free(void *ptr)
{
    if (ptr == NULL) return;
    (void)cn_recycle_keep(cn_head_of(ptr), (size_t)-1);
}

/* cn_huge_alloc, or a recycled mapping of the same size when recycle is set */
static void *cn_huge_alloc_any(size_t size, int recycle)
{
    const size_t len = cn_huge_len(size);
    cn_last_recycled = 0;
    if (recycle && len != 0) {
        char *head = cn_recycle_take(len);
        if (head != NULL) {
            cn_last_recycled = 1;
            return head + cn_map_header(head);
        }
    }
    return cn_huge_alloc(size);
}

/* usable bytes at ptr (whole huge pages) */
static size_t cn_huge_size(const void *ptr)
{
    const char *head = cn_head_of(ptr);
    return cn_map_len(head) - cn_map_header(head);
}

/* the header's bytes before ptr (a test reads it) */
static size_t cn_huge_header_of(const void *ptr) { return ((const size_t *)ptr)[-1]; }

#else
static int cn_huge_available(void) { return 0; }
static int cn_set_fake_page(size_t page) { return page == 0; }
static size_t cn_huge_header_of(const void *ptr) { (void)ptr; return 0; }
static void *cn_huge_alloc(size_t size) { (void)size; return NULL; }
static void *cn_huge_alloc_any(size_t size, int recycle) { (void)size; (void)recycle; return NULL; }
static void cn_huge_free(void *ptr) { (void)ptr; }
static size_t cn_huge_size(const void *ptr) { (void)ptr; return 0; }
static size_t cn_recycle_keep(char *head, size_t cap) { (void)head; (void)cap; return 0; }
static size_t cn_recycle_set_limit(size_t limit) { (void)limit; return 0; }
static size_t cn_recycle_limit_now(void) { return 0; }
static size_t cn_recycled_now(void) { return 0; }
static int cn_last_recycled;
#endif

/* ---- the NumPy allocator (NEP 49): every array made while it is set is ours ---- */

static void *cn_np_malloc(void *ctx, size_t size) { (void)ctx; return cn_huge_alloc_any(size, 1); }

static void *cn_np_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    return cn_huge_alloc_any(nelem * elsize, 0);   /* fresh anonymous pages are zero */
}

static void *cn_np_realloc(void *ctx, void *ptr, size_t new_size)
{
    (void)ctx;
    if (ptr == NULL) return cn_huge_alloc_any(new_size, 1);
    void *p = cn_huge_alloc_any(new_size, 1);
    if (p == NULL) return NULL;             /* (ptr stays valid, as realloc promises) */
    size_t old = cn_huge_size(ptr);
    memcpy(p, ptr, old < new_size ? old : new_size);
    cn_huge_free(ptr);
    return p;
}

static void cn_np_free(void *ctx, void *ptr, size_t size) { (void)ctx; (void)size; cn_huge_free(ptr); }

#endif
