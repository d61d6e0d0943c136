/* Per-thread scratch buffers that outlive a call.
 *
 * A fresh malloc of megabytes is fresh pages, which the OS faults in and
 * zeroes on first touch -- on every call. So each calling
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

#include "cn_pages.h"   /* cn_populate_write, cn_populate_share */

#define CN_SCRATCH_SLOTS 4
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
