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

/* The tunables: the numbers the policy is made of, one row each: X(name,
 * default, what it decides). -1: derived from the caches (cn_tunables_for).
 * Tests and benchmarks/tunables.py override single fields through
 * _core._policy(); cynorm.tune() measures them per class of call (below);
 * benchmarks/POLICY.md has the evidence for each default. */
#define CN_FOR_EACH_TUNABLE(X)                                                                        \
    X(min_elems_per_thread, 1 << 15, "fewer elements per thread: fewer threads")                      \
    X(stream_min_bytes, 8 << 20, "outputs this large: non-temporal stores")                           \
    X(fresh_plain_row_bytes, -1, "fresh outputs of rows up to this: plain stores (-1: from the L3)")  \
    X(long_row_bytes, 64 << 10, "longer rows: column chunks across a group of rows")                  \
    X(long_group_bytes, -1, "bytes of long rows taken as one group (-1: from the L3)")                \
    X(medium_block_bytes, 32 << 10, "forward medium rows: a block's x")                               \
    X(bwd_group_bytes, 256 << 10, "backward rows through pass 1 together: x and dy")                  \
    X(short_prefetch_bytes, -1, "forward short 32-bit rows: prefetch this far ahead (-1: the L3)")  \
    X(prefetch_max, 8192, "elements of the next row prefetched while one is finished")                \
    X(part_cache_bytes, 256 << 10, "backward: block partials beyond this take the team path")         \
    X(parts_in_a_bytes, -1, "one thread adds partials in phase A up to this (-1: from the caches)")   \
    X(bwd_a_by_chunk, -1, "phase A by column chunk: 0 never, 1 with threads, 2 always (-1: caches)")

#define CN_TUNABLE_FIELD(name, dflt, what) int64_t name;
typedef struct { CN_FOR_EACH_TUNABLE(CN_TUNABLE_FIELD) } cn_tunables;
#undef CN_TUNABLE_FIELD
#define CN_TUNABLE_COUNT(name, dflt, what) +1
enum { CN_NUM_TUNABLES = 0 CN_FOR_EACH_TUNABLE(CN_TUNABLE_COUNT) };
#undef CN_TUNABLE_COUNT

/* The classes of calls a measured policy (cynorm.tune()) holds tunables for:
 * direction x 16-bit or wider x x row class x one thread or more. A class's
 * index is ((backward * 2 + wide) * CN_NUM_ROW_CLASSES + row class) * 2 + (threads > 1). */
enum {   /* row classes: the forward's paths, at fixed bounds (never the tunables') */
    CN_ROWS_SHORT = 0,    /* up to CN_SMALL_ROW_MAX elements */
    CN_ROWS_MEDIUM = 1,   /* up to CN_MED_ROW_BYTES and CN_CHUNK elements */
    CN_ROWS_PLAIN = 2,    /* longer, up to CN_LONG_CLASS_BYTES */
    CN_ROWS_LONG = 3,     /* longer still */
    CN_NUM_ROW_CLASSES = 4
};
#define CN_LONG_CLASS_BYTES ((int64_t)64 << 10)
#define CN_NUM_CLASSES (2 * 2 * CN_NUM_ROW_CLASSES * 2)

/* The machine as the policy sees it (read once, at import), with the
 * tunables resolved for it (cn_machine_update, whenever any of it changes). */
typedef struct {
    int64_t l2_bytes, l3_bytes;     /* 0: unknown */
    int oversubscribe;              /* allow more threads than cores (CYNORM_OVERSUBSCRIBE=1) */
    cn_tunables tuned;              /* cn_tune with its cache-derived fields resolved */
    /* a measured policy: per class, the tunables set (bit i: the i-th tunable) and their values */
    uint32_t class_set[CN_NUM_CLASSES];
    int64_t class_value[CN_NUM_CLASSES][CN_NUM_TUNABLES];
    cn_tunables class_tuned[CN_NUM_CLASSES];   /* tuned with each class's values, resolved */
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
    int oversubscribe;              /* the machine allows more threads than cores */
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
    int64_t prefetch_rows;          /* rows ahead prefetched: forward and backward blocks, backward rows' pass 2 */
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
/* The class of a call that runs on `threads` threads (its measured tunables, if any). */
int cn_class_of(const cn_call *c, int threads);
int cn_threads_for(const cn_tunables *t, const cn_call *c);
/* GroupNorm: whether y or dx streams (p, c: the policy and call of its (sample, group) rows; run: S channels-first, C channels-last) */
int cn_gn_streams(const cn_policy *p, const cn_call *c, int64_t run);
/* base with its cache-derived tunables (-1) resolved for machine m; and
 * m->tuned = cn_tune resolved, and each class's measured values over it,
 * after the caches, cn_tune or the measured values change. */
cn_tunables cn_tunables_for(const cn_tunables *base, const cn_machine *m);
void cn_machine_update(cn_machine *m);
/* A measured policy: tunable i of class cls set to value (then cn_machine_update);
 * all classes back to the defaults; whether tunable i of class cls is set (and its value). */
void cn_machine_set_class_value(cn_machine *m, int cls, int i, int64_t value);
void cn_machine_clear_classes(cn_machine *m);
int cn_machine_class_value(const cn_machine *m, int cls, int i, int64_t *value);
/* The tunables a call of class cls runs with (cls < 0: the defaults, resolved). */
const cn_tunables *cn_machine_tunables(const cn_machine *m, int cls);
/* The i-th tunable's name and what it decides (NULL past the last), and its field in t. */
const char *cn_tunable_name(int i);
const char *cn_tunable_what(int i);
int64_t *cn_tunable_slot(cn_tunables *t, int i);

#endif /* CN_POLICY_H */
