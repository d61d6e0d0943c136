/*
 * The execution policy: cn_policy_for() decides how one call runs, from the
 * tunables (cn_tune), the machine's caches and the call. See cn_policy.h;
 * benchmarks/POLICY.md has the measurements behind each number.
 */
#include <stddef.h>
#include <stdint.h>

#include "cn_order.h"
#include "cn_policy.h"

/* An L3 this large is a mesh shared by many cores, which one core reads
 * slowly, unlike the 32 MB L3 of an AMD CCD. */
#define CN_MESH_L3_BYTES ((int64_t)64 << 20)
/* The fused forward adds this many bytes of h, then normalizes them while in
 * cache. Not a tunable: 16 KiB to 1 MiB ran alike on the Xeons we measured
 * (benchmarks/results/intel_spr/fused/fused_chunk_*.md). */
#define CN_FUSED_CHUNK_BYTES ((int64_t)64 << 10)

/* Not tunables: each was measured alike at its other settings on the kinds
 * in benchmarks/POLICY.md, or better where it is on every kind measured. */
#define CN_POPULATE_BYTES ((int64_t)1 << 20)   /* fresh outputs faulted in slabs of about this */
#define CN_BWD_PLAIN_MIN_BYTES ((int64_t)4 << 10)   /* fresh dx of 32-bit rows off the aligned route
                                                      from this row size: slabs and plain stores */
#define CN_PREFETCH_INTO_L2 1                   /* the forward row paths prefetch the next rows into L2 */
#define CN_PREFETCH_PIECES 1                    /* phase A by chunk, 16-bit rows: the next pair's piece */
/* The blocks of short and medium rows prefetch the same row of a block at
 * least this far ahead, in whole blocks: one block of short rows (64 fp32 or
 * fewer) or of medium rows of 8 KB or less (128 fp32, 128 or 256 bf16) is too
 * little lead to hide DRAM's latency. 16-bit short rows, whose arithmetic takes
 * longer per byte, keep the next block. The forward's short rows take their
 * lead from short_prefetch_bytes (the kinds disagree: see cn_tunables_for); the
 * backward's short rows take this one, each of T threads 1/T of it
 * (benchmarks/POLICY.md, "Prefetch leads"). */
#define CN_SHORT_PREFETCH_BYTES ((int64_t)8 << 10)
#define CN_MEDIUM_PREFETCH_BYTES ((int64_t)16 << 10)
/* The backward's rows (pass 2 prefetches the rows pass 1 takes next) keep at
 * least this much of each row stream in flight over all threads, in whole
 * groups: each of T threads 1/T of it, as the threads share DRAM's bandwidth
 * and latency (benchmarks/POLICY.md, "Prefetch leads"). */
#define CN_BWD_PREFETCH_BYTES ((int64_t)8 << 10)

/* Rows ahead: whole blocks of `rows` rows of `row_bytes`, at least `lead` bytes
 * (one block where there is nothing to read) */
static int64_t rows_ahead(int64_t rows, int64_t row_bytes, int64_t lead)
{
    const int64_t block = rows * row_bytes;
    return block > 0 && lead > block ? rows * ((lead + block - 1) / block) : rows;
}

/* Short rows' blocks: 32-bit rows at least `lead` bytes ahead, 16-bit rows the next block */
static int64_t short_rows_ahead(const cn_call *c, int64_t lead)
{
    return c->x_size < 4 ? CN_SMALL_BLOCK : rows_ahead(CN_SMALL_BLOCK, c->N * c->x_size, lead);
}

/* Each of `threads` threads' share of a lead kept in flight over all of them
 * (a call with no rows has no threads) */
static int64_t lead_per_thread(int64_t lead, int threads)
{
    return lead / (threads > 1 ? threads : 1);
}

#define CN_TUNABLE_DEFAULT(name, dflt, what) .name = (dflt),
#define CN_TUNABLES_DEFAULT {CN_FOR_EACH_TUNABLE(CN_TUNABLE_DEFAULT)}

cn_tunables cn_tune = CN_TUNABLES_DEFAULT;

void cn_tunables_defaults(cn_tunables *t)
{
    const cn_tunables d = CN_TUNABLES_DEFAULT;
    *t = d;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows per slab when a fresh output is faulted in just before it is written:
 * whole groups of `group` rows, about CN_POPULATE_BYTES, at least one group. */
static int64_t slab_rows(int64_t row_bytes, int64_t group)
{
    const int64_t group_bytes = group * row_bytes;
    return group_bytes >= CN_POPULATE_BYTES ? group : group * (CN_POPULATE_BYTES / group_bytes);
}

cn_tunables cn_tunables_for(const cn_tunables *base, const cn_machine *m)
{
    cn_tunables t = *base;
    const int mesh = m->l3_bytes >= CN_MESH_L3_BYTES;
    /* long rows come from DRAM or L3 twice: a group is a sixteenth of the L3,
     * within 8 MB and 32 MB (16 rows of 2 MB) */
    if (t.long_group_bytes < 0) t.long_group_bytes = min64(max64(m->l3_bytes / 16, 8 << 20), 32 << 20);
    /* one thread adds the partials in phase A while they stay in cache from one
     * pair of rows to the next: in L2 on a mesh, in the L3 elsewhere */
    if (t.parts_in_a_bytes < 0) t.parts_in_a_bytes = mesh ? (m->l2_bytes ? m->l2_bytes : 1 << 20) : 4 << 20;
    if (t.bwd_a_by_chunk < 0) t.bwd_a_by_chunk = mesh ? 2 : 1;
    /* a fresh page's zeroed lines stay in cache on a mesh: plain stores reuse them */
    if (t.fresh_plain_row_bytes < 0) t.fresh_plain_row_bytes = mesh ? t.long_row_bytes : 0;
    /* the forward's short 32-bit rows: a mesh's L3 (and its L2 prefetchers)
     * serve the next block in time, and a longer lead only costs; elsewhere
     * the lead that hides DRAM's latency */
    if (t.short_prefetch_bytes < 0) t.short_prefetch_bytes = mesh ? 0 : CN_SHORT_PREFETCH_BYTES;
    return t;
}

/* Threads worth using: small work stays on the calling thread; no more threads
 * than cores unless allowed; no nested team; concurrent calls share the cores. */
int cn_threads_for(const cn_tunables *t, const cn_call *c)
{
    int requested = c->requested_threads;
    if (!c->openmp || requested <= 1) return 1;
    const int64_t cap = (c->M * c->N) / (t->min_elems_per_thread > 0 ? t->min_elems_per_thread : 1);
    if (cap <= 1 || c->in_parallel) return 1;
    const int procs = c->num_procs ? c->num_procs() : 1;
    if (!c->oversubscribe && requested > procs) requested = procs;
    if (c->in_flight > 1) {
        const int share = procs / c->in_flight;
        if (requested >= share) requested = share > 1 ? share : 1;
    }
    return (int)min64(requested, cap);
}

/* Large outputs stream. Longer 16-bit rows only where every row starts on a
 * 16-byte boundary: their partial vectors would need 2-byte pieces beside the
 * stream. (Short rows stream whole blocks of rows from an L1 stage: any row.) */
static int streams(const cn_tunables *t, const cn_call *c)
{
    if (c->M * c->N * c->x_size < t->stream_min_bytes) return 0;
    if (c->out_addr % c->x_size) return 0;   /* an output off its elements' alignment: plain stores */
    return c->x_size != 2 || c->N <= c->small_max || (c->out_addr % 16 == 0 && c->N % 8 == 0);
}

/* Rows per group of long rows: as many as fit in long_group_bytes, at most
 * CN_LONG_GROUP_MAX; rows too long for 4 of them to fit go CN_LONG_GROUP_MAX
 * at a time with one thread, 4 with more. */
static int64_t long_rows_per_group(const cn_tunables *t, int64_t row_bytes, int threads)
{
    const int64_t fit = t->long_group_bytes / row_bytes;
    if (fit < 4) return threads == 1 ? CN_LONG_GROUP_MAX : 4;
    return min64(fit, CN_LONG_GROUP_MAX);
}

static void forward_policy(const cn_tunables *t, const cn_call *c, int T, cn_policy *p)
{
    const int64_t M = c->M, N = c->N, row_bytes = N * c->x_size;
    const int populate = p->stream && c->fresh;
    if (populate && row_bytes <= t->fresh_plain_row_bytes) p->stream = 0;
    p->prefetch_l2 = CN_PREFETCH_INTO_L2;
    p->apply_chunk = CN_CHUNK;
    if (T > 1 && N > CN_CHUNK && M < 4 * T) {
        /* too few rows to balance: split the columns too */
        p->path = CN_PATH_TEAM;
        p->threads = T;
        p->group_rows = min64(max64(t->long_group_bytes / row_bytes, 1), M);
        p->populate = populate ? CN_POPULATE_AHEAD : CN_POPULATE_NONE;
        return;
    }
    p->threads = (T <= 1 || M < 2) ? 1 : (int)min64(T, M);
    if (N <= c->small_max) {
        p->path = CN_PATH_SMALL;
        p->group_rows = CN_SMALL_BLOCK;
        p->prefetch_rows = short_rows_ahead(c, t->short_prefetch_bytes);
    } else if (row_bytes <= CN_MED_ROW_BYTES && N <= CN_CHUNK) {
        p->path = CN_PATH_MEDIUM;
        p->group_rows = row_bytes * CN_SMALL_BLOCK <= t->medium_block_bytes ? CN_SMALL_BLOCK
                        : max64(t->medium_block_bytes / row_bytes, 1);
        p->prefetch_rows = rows_ahead(p->group_rows, row_bytes, CN_MEDIUM_PREFETCH_BYTES);
    } else if (row_bytes > t->long_row_bytes) {
        p->path = CN_PATH_LONG;
        p->group_rows = long_rows_per_group(t, row_bytes, T);
    } else {
        p->path = CN_PATH_ROWS;
        p->group_rows = 1;
    }
    p->prefetch_elems = min64(N, t->prefetch_max);
    if (populate) {
        /* long rows fault in each group; shorter ones slab by slab, just before
         * they are written (rows never depend on the slab) */
        p->populate = row_bytes > t->long_row_bytes ? CN_POPULATE_AHEAD : CN_POPULATE_SLABS;
        p->slab_rows = slab_rows(row_bytes, 1);
    }
}

static void backward_policy(const cn_tunables *t, const cn_call *c, int T, cn_policy *p)
{
    const int64_t M = c->M, N = c->N, row_bytes = N * c->x_size, pair_bytes = 2 * row_bytes;
    const int64_t part_bytes = N * c->acc_size;
    const int k = c->grads;
    const int populate = p->stream && c->fresh;
    if (populate && row_bytes <= t->fresh_plain_row_bytes) p->stream = 0;
    const int64_t B = p->block_rows = c->block_rows > 0 ? c->block_rows : cn_block_rows(M, N, c->acc_size);
    const int64_t nb = (M + B - 1) / B;
    p->populate = populate ? CN_POPULATE_AHEAD : CN_POPULATE_NONE;
    p->prefetch_elems = min64(N, t->prefetch_max);
    if (N > c->small_max && (nb < T || k * part_bytes > t->part_cache_bytes)) {
        /* few blocks, or partials too large to keep in cache while a block's rows pass */
        p->path = CN_PATH_TEAM;
        p->threads = T;
        const int64_t fit = t->long_group_bytes / pair_bytes;
        p->group_rows = min64(fit > 1 ? fit : (T == 1 ? 16 : 4), B);
        const int pairs = T == 1 && k * part_bytes <= t->parts_in_a_bytes;
        const int by_chunk = k > 0 && !pairs && (t->bwd_a_by_chunk == 2 || (T > 1 && t->bwd_a_by_chunk == 1));
        p->team_parts = pairs ? CN_PARTS_BY_PAIRS : by_chunk ? CN_PARTS_BY_CHUNK : CN_PARTS_IN_PHASE_C;
        p->prefetch_pieces = CN_PREFETCH_PIECES && c->x_size == 2;
        return;
    }
    p->threads = (int)min64(T, nb);
    if (N <= c->small_max) {
        p->path = CN_PATH_SMALL;
        p->group_rows = CN_SMALL_BLOCK;
        /* as the forward's short rows, each thread its share of the lead */
        p->prefetch_rows = short_rows_ahead(c, lead_per_thread(CN_SHORT_PREFETCH_BYTES, p->threads));
        return;
    }
    p->path = CN_PATH_ROWS;
    /* CN_ROW_GROUP_MAX rows, 2 or 1: as many as bwd_group_bytes holds */
    const int64_t RB = pair_bytes * CN_ROW_GROUP_MAX <= t->bwd_group_bytes ? CN_ROW_GROUP_MAX
                       : pair_bytes * 2 <= t->bwd_group_bytes ? 2 : 1;
    p->group_rows = RB;
    p->prefetch_rows = rows_ahead(p->group_rows, row_bytes, lead_per_thread(CN_BWD_PREFETCH_BYTES, p->threads));
    /* aligned 32-bit rows with partials, where the level streams several rows
     * at once: pass 1 only sums, pass 2 adds the rows into the partials */
    p->late_parts = c->multirow_stream && c->x_size >= 4 && k > 0 && c->in_addr % 64 == 0 && row_bytes % 64 == 0;
    p->pass1_rows = p->late_parts ? 1 : RB;
    if (populate && !p->late_parts && c->x_size >= 4 && row_bytes >= CN_BWD_PLAIN_MIN_BYTES) {
        p->populate = CN_POPULATE_SLABS;
        p->stream = 0;
        p->slab_rows = slab_rows(row_bytes, p->group_rows);
    }
}

void cn_machine_update(cn_machine *m)
{
    m->tuned = cn_tunables_for(&cn_tune, m);
    for (int c = 0; c < CN_NUM_CLASSES; c++) {
        cn_tunables t = cn_tune;
        for (int i = 0; i < CN_NUM_TUNABLES; i++)
            if (m->class_set[c] >> i & 1u) *cn_tunable_slot(&t, i) = m->class_value[c][i];
        m->class_tuned[c] = cn_tunables_for(&t, m);
    }
}

void cn_machine_set_class_value(cn_machine *m, int cls, int i, int64_t value)
{
    if (cls < 0 || cls >= CN_NUM_CLASSES || i < 0 || i >= CN_NUM_TUNABLES) return;
    m->class_set[cls] |= 1u << i;
    m->class_value[cls][i] = value;
}

void cn_machine_clear_classes(cn_machine *m)
{
    for (int c = 0; c < CN_NUM_CLASSES; c++) m->class_set[c] = 0;
}

int cn_machine_class_value(const cn_machine *m, int cls, int i, int64_t *value)
{
    if (cls < 0 || cls >= CN_NUM_CLASSES || i < 0 || i >= CN_NUM_TUNABLES || !(m->class_set[cls] >> i & 1u))
        return 0;
    *value = m->class_value[cls][i];
    return 1;
}

const cn_tunables *cn_machine_tunables(const cn_machine *m, int cls)
{
    return cls >= 0 && cls < CN_NUM_CLASSES ? &m->class_tuned[cls] : &m->tuned;
}

int cn_class_of(const cn_call *c, int threads)
{
    const int64_t row_bytes = c->N * c->x_size;
    const int rows = c->N <= c->small_max ? CN_ROWS_SHORT
                     : row_bytes <= CN_MED_ROW_BYTES && c->N <= CN_CHUNK ? CN_ROWS_MEDIUM
                     : row_bytes <= CN_LONG_CLASS_BYTES ? CN_ROWS_PLAIN : CN_ROWS_LONG;
    return ((c->backward * 2 + (c->x_size > 2)) * CN_NUM_ROW_CLASSES + rows) * 2 + (threads > 1);
}

cn_policy cn_policy_for(const cn_machine *m, const cn_call *c)
{
    cn_policy p = {0};
    const int T = cn_threads_for(&m->tuned, c);
    /* the call's class's tunables: measured ones over the defaults (cn_machine_update) */
    const cn_tunables *t = &m->class_tuned[cn_class_of(c, T)];
    p.stream = streams(t, c);
    p.group_rows = 1;
    p.pass1_rows = 1;
    p.slab_rows = 1;
    p.fused_rows = max64(CN_FUSED_CHUNK_BYTES / max64(c->N * c->x_size, 1), 1);
    if (c->backward) backward_policy(t, c, T, &p);
    else forward_policy(t, c, T, &p);
    return p;
}

/* GroupNorm: y (dx) streams where the policy p of a LayerNorm over the same
 * rows streams (c: that call, out_addr y's or dx's) and every run of the
 * stores (channels-first: a channel's S positions; channels-last: a
 * position's C channels) starts at the same place in a cache line: the
 * kernels store plainly up to the first aligned vector (stream_peel), the
 * same for every run. 16-bit outputs need a 16-byte boundary there, so that
 * no piece is narrower than 4 bytes (as long 16-bit rows in streams()). */
int cn_gn_streams(const cn_policy *p, const cn_call *c, int64_t run)
{
    return p->stream && c->out_addr % c->x_size == 0 && (run * c->x_size) % 64 == 0 &&
           (c->x_size != 2 || c->out_addr % 16 == 0);
}

/* The tunables by name, for _core._policy() (tests, benchmarks/tunables.py, cynorm.tune). */
#define CN_FIELD(name, dflt, what) {#name, what, offsetof(cn_tunables, name)},
static const struct { const char *name, *what; size_t offset; } cn_tunable_fields[] = {
    CN_FOR_EACH_TUNABLE(CN_FIELD)
};
#undef CN_FIELD

const char *cn_tunable_name(int i)
{
    return i >= 0 && i < CN_NUM_TUNABLES ? cn_tunable_fields[i].name : NULL;
}

const char *cn_tunable_what(int i)
{
    return i >= 0 && i < CN_NUM_TUNABLES ? cn_tunable_fields[i].what : NULL;
}

int64_t *cn_tunable_slot(cn_tunables *t, int i)
{
    return cn_tunable_name(i) ? (int64_t *)((char *)t + cn_tunable_fields[i].offset) : NULL;
}
