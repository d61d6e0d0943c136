/*
 * cn_policy.h -- how a call runs: threads, path, stores, prefetch and group
 * sizes. Every such choice is made in one function, cn_policy_for()
 * (core/policy.c), from the machine's caches, the call's shape and its
 * thread count; the drivers (_drivers.pxi) and the row kernels (kernels/) only
 * follow it. No choice here changes a result bit: the arithmetic order is
 * fixed by the constants in cn_order.h. benchmarks/POLICY.md lists each tunable
 * with the measurements behind it; cynorm.explain() shows a call's policy.
 */
#ifndef CN_POLICY_H
#define CN_POLICY_H

#include <stdint.h>

#include "cn_order.h"

/* The most threads a call may ask for (num_threads; more is refused). */
#define CN_MAX_THREADS 1024

/* The tunables: the numbers the policy is made of (defaults in policy.c).
 * -1 where noted: derived from the caches. Tests and benchmarks/tunables.py
 * override single fields through _core._policy(). */
typedef struct {
    int64_t min_elems_per_thread;   /* fewer elements per thread: fewer threads */
    int64_t oversubscribe;          /* 1: allow more threads than cores (CYNORM_OVERSUBSCRIBE) */
    int64_t stream_min_bytes;       /* outputs this large: non-temporal stores */
    int64_t fresh_plain_row_bytes;  /* -1: caches. Fresh outputs of rows up to this: plain stores */
    int64_t bwd_plain_min_bytes;    /* fresh dx of 32-bit rows from this size, off the aligned route:
                                       faulted in slab by slab, plain stores */
    int64_t long_row_bytes;         /* longer rows: column chunks across a group of rows */
    int64_t long_group_bytes;       /* -1: the L3. Bytes of long rows taken as one group */
    int64_t medium_block_bytes;     /* forward medium rows: a block's x */
    int64_t bwd_group_bytes;        /* backward rows through pass 1 together: x and dy */
    int64_t bwd_far_bytes;          /* -1: caches. Backward 32-bit rows: prefetch two groups ahead from this */
    int64_t prefetch_max;           /* elements of the next row prefetched while one is finished */
    int64_t prefetch_into_l2;       /* -1: caches. Forward row paths prefetch into L2, not L1 */
    int64_t populate_bytes;         /* fresh outputs faulted in slabs of about this size */
    int64_t part_cache_bytes;       /* backward: block partials beyond this take the team path */
    int64_t parts_in_a_bytes;       /* -1: caches. One thread adds partials in phase A up to this */
    int64_t bwd_a_by_chunk;         /* -1: caches. Phase A by column chunk: 0 never, 1 threads, 2 always */
    int64_t prefetch_pieces;        /* phase A by chunk, 16-bit rows: prefetch the next pair's piece */
} cn_tunables;

/* The machine as the policy sees it (read once, at import), with the
 * tunables resolved for it (cn_machine_update, whenever either changes). */
typedef struct {
    int64_t l2_bytes, l3_bytes;     /* 0: unknown */
    cn_tunables tuned;              /* cn_tune with its cache-derived fields resolved */
} cn_machine;

/* One call as the policy sees it. */
typedef struct {
    int backward;                   /* 0: forward, 1: backward */
    int64_t M, N;                   /* rows, elements per row */
    int x_size, acc_size;           /* bytes per element of x and of the accumulators */
    int64_t small_max;              /* the in-register row limit */
    int multirow_stream;            /* the kernel streams several rows at once (meson.build's ISA table) */
    int grads;                      /* backward: 0, 1 (dweight), 2 (dweight and dbias) */
    int64_t block_rows;             /* backward: rows per dweight block; 0: cn_block_rows(M, N) */
    int requested_threads;          /* >= 1 */
    int (*num_procs)(void);         /* cores this process may use (omp_get_num_procs: a system call,
                                       so asked only when more than one thread is in question) */
    int in_flight;                  /* calls in this process right now, this one included */
    int in_parallel;                /* called from inside an OpenMP region */
    int openmp;                     /* built with OpenMP */
    int fresh;                      /* the output was just allocated: its pages are not yet in */
    uintptr_t out_addr;             /* y or dx */
    uintptr_t in_addr;              /* backward: x | dy | dx, for their common alignment */
} cn_call;

enum {   /* cn_policy.path */
    CN_PATH_SMALL = 0,    /* rows in registers, 16 at a time */
    CN_PATH_MEDIUM = 1,   /* forward: rows up to 8 KB in blocks of up to 16 */
    CN_PATH_ROWS = 2,     /* whole rows in short groups, each row by chunks */
    CN_PATH_LONG = 3,     /* forward: long rows in groups, normalized chunk by chunk across a group */
    CN_PATH_TEAM = 4      /* all threads on each group of rows, split by column chunk */
};
enum {   /* cn_policy.populate: how a fresh output's pages are faulted in */
    CN_POPULATE_NONE = 0,   /* not fresh, or not streamed */
    CN_POPULATE_AHEAD = 1,  /* each block's or group's pages before its rows are read */
    CN_POPULATE_SLABS = 2   /* slab by slab (slab_rows), just before they are written */
};
enum {   /* cn_policy.team_parts: where the backward team path adds rows into the partials */
    CN_PARTS_IN_PHASE_C = 0, CN_PARTS_BY_PAIRS = 1, CN_PARTS_BY_CHUNK = 2
};

typedef struct {
    int threads;                    /* team size (1: the calling thread only) */
    int path;                       /* CN_PATH_* */
    int stream;                     /* non-temporal stores for y / dx */
    int populate;                   /* CN_POPULATE_* */
    int64_t slab_rows;              /* CN_POPULATE_SLABS: rows per slab */
    int prefetch_l2;                /* forward row paths: next rows into L2, not L1 */
    int64_t prefetch_elems;         /* elements of the next row prefetched from a row's pass */
    int64_t group_rows;             /* rows taken together: a block (small, medium), a group (rows,
                                       long rows, team) */
    int64_t apply_chunk;            /* long rows: columns normalized across the group at once */
    int64_t pass1_rows;             /* backward rows: rows through pass 1 at once */
    int64_t prefetch_rows;          /* backward rows: pass 2 prefetches this many rows ahead */
    int late_parts;                 /* backward rows: partials added in pass 2 (aligned 32-bit rows) */
    int team_parts;                 /* CN_PARTS_* */
    int prefetch_pieces;            /* team phase A by chunk: next pair's piece into L2 */
    int64_t block_rows;             /* backward: rows per dweight/dbias block (fixed by M, N: not tuned) */
    int64_t fused_rows;             /* fused forward: rows added into h before they are normalized */
} cn_policy;

/* The tunables in use (process-wide). */
extern cn_tunables cn_tune;
void cn_tunables_defaults(cn_tunables *t);
/* The policy of one call, and the thread count it starts from. */
cn_policy cn_policy_for(const cn_machine *m, const cn_call *c);
int cn_threads_for(const cn_tunables *t, const cn_call *c);
/* base with its cache-derived tunables (-1) resolved for machine m; and
 * m->tuned = cn_tune resolved, after the caches, the level or cn_tune change. */
cn_tunables cn_tunables_for(const cn_tunables *base, const cn_machine *m);
void cn_machine_update(cn_machine *m);
/* The i-th tunable's name (NULL past the last) and its field in t. */
const char *cn_tunable_name(int i);
int64_t *cn_tunable_slot(cn_tunables *t, int i);

#endif /* CN_POLICY_H */
