/*
 * XLA FFI handlers (jax.ffi) for cynorm.jax: LayerNorm and RMSNorm, forward
 * and backward, on XLA's buffers, through cynorm's C entry point (cynorm.h).
 * No Python and no GIL on this path.
 *
 * Under jax.vmap (vmap_method="expand_dims") every operand gets one leading
 * dimension per vmap level, of the batch size or 1 (unbatched). The handlers
 * take the results' leading dimensions as the groups and run each group on its
 * own, each operand's group picked by broadcasting (a dimension of 1 serves
 * every group): so a batched weight normalizes each example with its own
 * weight, and the backward returns per-example dweight/dbias, each the bits a
 * call on that example alone gives.
 *
 * Attributes (scalars): center (s32: 1 LayerNorm, 0 RMSNorm), eps (f64),
 * x_ndim (s32: x's rank without vmap), norm_ndim (s32: normalized trailing
 * dims), has_weight, has_bias (s32), num_threads (s32, 0: the default).
 *   forward:  x [, weight] [, bias]             -> y [, mean], rstd
 *   backward: dy, x [, mean], rstd [, weight]    -> dx [, dweight [, dbias]]
 * The fused residual add + norm (cynorm.h's add_forward/add_backward), with
 * has_dh (s32) in the backward; dtypes are the buffers':
 *   add forward:  x, residual [, weight] [, bias]        -> y, h [, mean], rstd
 *   add backward: dy, h [, mean], rstd [, weight] [, dh]  -> dsum [, dweight [, dbias]]
 * GroupNorm (cynorm.h's group_forward/group_backward), with num_groups and
 * channels_last (s32) and x_ndim, has_weight, has_bias, num_threads, eps:
 *   group forward:  x [, weight] [, bias]             -> y, mean, rstd (mean, rstd: batch x groups)
 *   group backward: dy, x, mean, rstd [, weight]      -> dx [, dweight, dbias]
 */
#include <stdint.h>
#include <string.h>

#include "cn_pages.h"
#include "cn_xla_ffi.h"
#include "cynorm.h"

#define CN_MAX_LEVELS 8   /* vmap levels handled */

static const cynorm_api *cn_xla_cynorm;   /* set by _core at import */

void cn_xla_set_api(const cynorm_api *api) { cn_xla_cynorm = api; }

static cn_xla_error *fail(const cn_xla_call_frame *f, int code, const char *message)
{
    cn_xla_error_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.message = message;
    a.errc = code;
    return f->api->error_create(&a);
}

/* A metadata query (XLA asks which FFI version a handler was built for): answered, 1. */
static int answer_metadata(cn_xla_call_frame *f)
{
    for (cn_xla_extension *e = f->extension_start; e != NULL; e = e->next) {
        if (e->type != CN_XLA_EXTENSION_METADATA) continue;
        cn_xla_metadata *m = ((cn_xla_metadata_extension *)e)->metadata;
        m->api_version.major_version = CN_XLA_FFI_API_MAJOR;
        m->api_version.minor_version = CN_XLA_FFI_API_MINOR;
        m->traits = 0;
        return 1;
    }
    return 0;
}

/* The named scalar attribute as an int64 or a double; 0 if absent. */
static int attr(const cn_xla_call_frame *f, const char *name, int64_t *i, double *d)
{
    const size_t len = strlen(name);
    for (int64_t k = 0; k < f->attrs.size; k++) {
        const cn_xla_bytespan *n = f->attrs.names[k];
        if (n->len != len || memcmp(n->ptr, name, len) != 0 || f->attrs.types[k] != CN_XLA_ATTR_SCALAR) continue;
        const cn_xla_scalar *s = (const cn_xla_scalar *)f->attrs.attrs[k];
        switch (s->dtype) {
        case CN_XLA_S32: *i = *(const int32_t *)s->value; *d = (double)*i; return 1;
        case CN_XLA_S64: *i = *(const int64_t *)s->value; *d = (double)*i; return 1;
        case CN_XLA_F32: *d = *(const float *)s->value; *i = (int64_t)*d; return 1;
        case CN_XLA_F64: *d = *(const double *)s->value; *i = (int64_t)*d; return 1;
        default: return 0;
        }
    }
    return 0;
}

static int cynorm_dtype(int xla)
{
    switch (xla) {
    case CN_XLA_F32: return CYNORM_F32;
    case CN_XLA_F64: return CYNORM_F64;
    case CN_XLA_BF16: return CYNORM_BF16;
    case CN_XLA_F16: return CYNORM_F16;
    default: return -2;
    }
}

static int64_t item_bytes(int xla) { return xla == CN_XLA_F64 ? 8 : xla == CN_XLA_F32 ? 4 : 2; }

/* One operand: its data, and how far its data moves from one group to the next
 * along each vmap level (0 where it is broadcast). */
typedef struct {
    char *data;
    int64_t step[CN_MAX_LEVELS];
} operand;

/* levels: the vmap levels (leading dims of the results); group dims in dims[].
 * An operand of `rank` dims whose trailing (rank - levels) dims hold `inner`
 * elements of `bytes` each. */
static int operand_of(const cn_xla_buffer *b, int levels, const int64_t *dims, operand *o)
{
    if (b->rank < levels) return 0;
    int64_t inner = item_bytes(b->dtype);
    for (int64_t k = levels; k < b->rank; k++) inner *= b->dims[k];
    for (int k = levels - 1; k >= 0; k--) {
        if (b->dims[k] != 1 && b->dims[k] != dims[k]) return 0;
        o->step[k] = b->dims[k] == 1 ? 0 : inner;
        inner *= b->dims[k];
    }
    o->data = (char *)b->data;
    return 1;
}

static char *at(const operand *o, int levels, const int64_t *index)
{
    char *p = o->data;
    for (int k = 0; k < levels; k++) p += index[k] * o->step[k];
    return p;
}

/* Shared checks and layout: levels of vmap, the group dims, rows per group and
 * columns, from the first result (y or dx) and the attributes. */
typedef struct {
    int levels;
    int64_t dims[CN_MAX_LEVELS], groups, rows, cols;
    int64_t center, x_ndim, norm_ndim, has_weight, has_bias, num_threads;
    double eps;
} layout;

static const char *read_layout(const cn_xla_call_frame *f, const cn_xla_buffer *first, layout *l)
{
    double d;
    int64_t i;
    if (!(attr(f, "center", &l->center, &d) && attr(f, "x_ndim", &l->x_ndim, &d) &&
          attr(f, "norm_ndim", &l->norm_ndim, &d) && attr(f, "has_weight", &l->has_weight, &d) &&
          attr(f, "has_bias", &l->has_bias, &d) && attr(f, "num_threads", &l->num_threads, &d)))
        return "cynorm: an attribute is missing";
    if (!attr(f, "eps", &i, &l->eps)) l->eps = 0.0;   /* (the backward has none) */
    l->levels = (int)(first->rank - l->x_ndim);
    if (l->levels < 0 || l->levels > CN_MAX_LEVELS || l->norm_ndim < 1 || l->norm_ndim > l->x_ndim)
        return "cynorm: operand ranks do not match the attributes";
    l->groups = 1;
    for (int k = 0; k < l->levels; k++) { l->dims[k] = first->dims[k]; l->groups *= first->dims[k]; }
    l->rows = 1;
    l->cols = 1;
    for (int64_t k = l->levels; k < first->rank; k++) {
        if (k < first->rank - l->norm_ndim) l->rows *= first->dims[k];
        else l->cols *= first->dims[k];
    }
    return NULL;
}

static void next_index(int64_t *index, const layout *l)
{
    for (int k = l->levels - 1; k >= 0; k--) {
        if (++index[k] < l->dims[k]) return;
        index[k] = 0;
    }
}

/* XLA allocates every output afresh. With glibc's malloc a large one is a new
 * mapping whose pages are not in yet (with tcmalloc they are: reused memory).
 * A fresh one gets huge pages advised (as cynorm's own outputs have) and the
 * fresh-output path (its pages faulted in just ahead of the writes). */
static unsigned fresh_output(void *data, int64_t elems, int xla_dtype)
{
    const size_t bytes = (size_t)(elems * item_bytes(xla_dtype));
    if (!cn_pages_absent(data, bytes)) return 0;
    cn_advise_huge(data, bytes);
    return CYNORM_FRESH_OUTPUT;
}

static cn_xla_error *status(const cn_xla_call_frame *f, int rc)
{
    if (rc == CYNORM_OK) return NULL;
    return fail(f, rc == CYNORM_ENOMEM ? CN_XLA_ERROR_RESOURCE_EXHAUSTED : CN_XLA_ERROR_INVALID_ARGUMENT,
                cn_xla_cynorm->error_string(rc));
}

static cn_xla_error *check_frame(cn_xla_call_frame *f, int *done)
{
    *done = 0;
    if (f->struct_size < offsetof(cn_xla_call_frame, attrs) + sizeof(cn_xla_attrs)) return NULL;   /* cannot answer */
    if (answer_metadata(f)) { *done = 1; return NULL; }
    if (f->stage != CN_XLA_STAGE_EXECUTE) { *done = 1; return NULL; }
    if (cn_xla_cynorm == NULL) return fail(f, CN_XLA_ERROR_INTERNAL, "cynorm: the C entry point is not set");
    for (int64_t k = 0; k < f->args.size; k++)
        if (f->args.types[k] != CN_XLA_ARG_BUFFER) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operands must be buffers");
    return NULL;
}

/* x [, weight] [, bias] -> y [, mean], rstd */
static cn_xla_error *cn_xla_forward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    layout l;
    const char *why = f->rets.size >= 2 ? read_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l) : "cynorm: results";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    if (f->args.size != 1 + l.has_weight + l.has_bias || f->rets.size != 2 + l.center)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands or results");
    operand x, w, b, y, mean, rstd;
    const cn_xla_buffer *xb = (const cn_xla_buffer *)f->args.items[0];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[1] : NULL;
    const cn_xla_buffer *bb = l.has_bias ? (const cn_xla_buffer *)f->args.items[1 + l.has_weight] : NULL;
    const int ok = operand_of(xb, l.levels, l.dims, &x) && (!wb || operand_of(wb, l.levels, l.dims, &w)) &&
                   (!bb || operand_of(bb, l.levels, l.dims, &b)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[0], l.levels, l.dims, &y) &&
                   (!l.center || operand_of((const cn_xla_buffer *)f->rets.items[1], l.levels, l.dims, &mean)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[1 + l.center], l.levels, l.dims, &rstd);
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    cynorm_desc d = {l.center ? CYNORM_LAYER_NORM : CYNORM_RMS_NORM, cynorm_dtype(xb->dtype),
                     wb ? cynorm_dtype(wb->dtype) : bb ? cynorm_dtype(bb->dtype) : CYNORM_NO_PARAMS,
                     l.rows, l.cols, l.eps, (int)l.num_threads, 0, 0};
    /* groups whose operands follow each other in memory, with one weight and bias for
     * all, are one call: rows never depend on the call they are in */
    int64_t groups = l.groups, index[CN_MAX_LEVELS] = {0};
    int merge = 1;
    for (int k = 0; k < l.levels; k++)
        merge &= x.step[k] != 0 && (!wb || w.step[k] == 0) && (!bb || b.step[k] == 0);
    if (merge) { d.rows = l.rows * l.groups; groups = 1; }
    d.flags = fresh_output(y.data, d.rows * l.cols, xb->dtype);
    for (int64_t g = 0; g < groups; g++, next_index(index, &l)) {
        cynorm_fwd_bufs bufs = {at(&x, l.levels, index), wb ? at(&w, l.levels, index) : NULL,
                                bb ? at(&b, l.levels, index) : NULL, at(&y, l.levels, index),
                                l.center ? at(&mean, l.levels, index) : NULL, at(&rstd, l.levels, index)};
        int rc = cn_xla_cynorm->forward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* dy, x [, mean], rstd [, weight] -> dx [, dweight [, dbias]] */
static cn_xla_error *cn_xla_backward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    layout l;
    const char *why = f->rets.size >= 1 ? read_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l) : "cynorm: results";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    const int64_t grads = l.has_weight ? 1 + l.center : 0;
    if (f->args.size != 3 + l.center + l.has_weight || f->rets.size != 1 + grads)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands or results");
    operand dy, x, mean, rstd, w, dx, dw, db;
    const cn_xla_buffer *xb = (const cn_xla_buffer *)f->args.items[1];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[3 + l.center] : NULL;
    const int ok = operand_of((const cn_xla_buffer *)f->args.items[0], l.levels, l.dims, &dy) &&
                   operand_of(xb, l.levels, l.dims, &x) &&
                   (!l.center || operand_of((const cn_xla_buffer *)f->args.items[2], l.levels, l.dims, &mean)) &&
                   operand_of((const cn_xla_buffer *)f->args.items[2 + l.center], l.levels, l.dims, &rstd) &&
                   (!wb || operand_of(wb, l.levels, l.dims, &w)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[0], l.levels, l.dims, &dx) &&
                   (grads < 1 || operand_of((const cn_xla_buffer *)f->rets.items[1], l.levels, l.dims, &dw)) &&
                   (grads < 2 || operand_of((const cn_xla_buffer *)f->rets.items[2], l.levels, l.dims, &db));
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    cynorm_desc d = {l.center ? CYNORM_LAYER_NORM : CYNORM_RMS_NORM, cynorm_dtype(xb->dtype),
                     wb ? cynorm_dtype(wb->dtype) : CYNORM_NO_PARAMS, l.rows, l.cols, 0.0, (int)l.num_threads, 0, 0};
    int64_t index[CN_MAX_LEVELS] = {0};
    d.flags = fresh_output(dx.data, l.groups * l.rows * l.cols, xb->dtype);
    /* one call per group: each example's dweight/dbias are its own */
    for (int64_t g = 0; g < l.groups; g++, next_index(index, &l)) {
        cynorm_bwd_bufs bufs = {at(&dy, l.levels, index), at(&x, l.levels, index),
                                l.center ? at(&mean, l.levels, index) : NULL, at(&rstd, l.levels, index),
                                wb ? at(&w, l.levels, index) : NULL, at(&dx, l.levels, index),
                                grads >= 1 ? at(&dw, l.levels, index) : NULL, grads >= 2 ? at(&db, l.levels, index) : NULL,
                                NULL, NULL};
        int rc = cn_xla_cynorm->backward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* x, residual [, weight] [, bias] -> y, h [, mean], rstd */
static cn_xla_error *cn_xla_add_forward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    layout l;
    const char *why = f->rets.size >= 3 ? read_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l) : "cynorm: results";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    if (f->args.size != 2 + l.has_weight + l.has_bias || f->rets.size != 3 + l.center)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands or results");
    operand x, r, w, b, y, h, mean, rstd;
    const cn_xla_buffer *xb = (const cn_xla_buffer *)f->args.items[0], *rb = (const cn_xla_buffer *)f->args.items[1];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[2] : NULL;
    const cn_xla_buffer *bb = l.has_bias ? (const cn_xla_buffer *)f->args.items[2 + l.has_weight] : NULL;
    const cn_xla_buffer *hb = (const cn_xla_buffer *)f->rets.items[1];
    const int ok = operand_of(xb, l.levels, l.dims, &x) && operand_of(rb, l.levels, l.dims, &r) &&
                   (!wb || operand_of(wb, l.levels, l.dims, &w)) && (!bb || operand_of(bb, l.levels, l.dims, &b)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[0], l.levels, l.dims, &y) &&
                   operand_of(hb, l.levels, l.dims, &h) &&
                   (!l.center || operand_of((const cn_xla_buffer *)f->rets.items[2], l.levels, l.dims, &mean)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[2 + l.center], l.levels, l.dims, &rstd);
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    cynorm_add_desc d = {{l.center ? CYNORM_LAYER_NORM : CYNORM_RMS_NORM, cynorm_dtype(xb->dtype),
                          wb ? cynorm_dtype(wb->dtype) : bb ? cynorm_dtype(bb->dtype) : CYNORM_NO_PARAMS,
                          l.rows, l.cols, l.eps, (int)l.num_threads, 0, 0},
                         cynorm_dtype(rb->dtype), cynorm_dtype(hb->dtype), cynorm_dtype(hb->dtype)};
    int64_t groups = l.groups, index[CN_MAX_LEVELS] = {0};
    int merge = 1;
    for (int k = 0; k < l.levels; k++)
        merge &= x.step[k] != 0 && r.step[k] != 0 && (!wb || w.step[k] == 0) && (!bb || b.step[k] == 0);
    if (merge) { d.base.rows = l.rows * l.groups; groups = 1; }
    d.base.flags = fresh_output(y.data, d.base.rows * l.cols, xb->dtype) |
                   (fresh_output(h.data, d.base.rows * l.cols, hb->dtype) ? CYNORM_FRESH_H : 0u);
    for (int64_t g = 0; g < groups; g++, next_index(index, &l)) {
        cynorm_add_fwd_bufs bufs = {at(&x, l.levels, index), at(&r, l.levels, index),
                                    wb ? at(&w, l.levels, index) : NULL, bb ? at(&b, l.levels, index) : NULL,
                                    at(&y, l.levels, index), at(&h, l.levels, index),
                                    l.center ? at(&mean, l.levels, index) : NULL, at(&rstd, l.levels, index)};
        int rc = cn_xla_cynorm->add_forward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* dy, h [, mean], rstd [, weight] [, dh] -> dsum [, dweight [, dbias]] */
static cn_xla_error *cn_xla_add_backward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    layout l;
    int64_t has_dh = 0;
    double unused;
    const char *why = f->rets.size >= 1 ? read_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l) : "cynorm: results";
    if (!why && !attr(f, "has_dh", &has_dh, &unused)) why = "cynorm: an attribute is missing";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    const int64_t grads = l.has_weight ? 1 + l.center : 0;
    if (f->args.size != 3 + l.center + l.has_weight + has_dh || f->rets.size != 1 + grads)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands or results");
    operand dy, h, mean, rstd, w, dh, dsum, dw, db;
    const cn_xla_buffer *dyb = (const cn_xla_buffer *)f->args.items[0], *hb = (const cn_xla_buffer *)f->args.items[1];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[3 + l.center] : NULL;
    const cn_xla_buffer *dhb = has_dh ? (const cn_xla_buffer *)f->args.items[3 + l.center + l.has_weight] : NULL;
    const cn_xla_buffer *sb = (const cn_xla_buffer *)f->rets.items[0];
    const int ok = operand_of(dyb, l.levels, l.dims, &dy) && operand_of(hb, l.levels, l.dims, &h) &&
                   (!l.center || operand_of((const cn_xla_buffer *)f->args.items[2], l.levels, l.dims, &mean)) &&
                   operand_of((const cn_xla_buffer *)f->args.items[2 + l.center], l.levels, l.dims, &rstd) &&
                   (!wb || operand_of(wb, l.levels, l.dims, &w)) && (!dhb || operand_of(dhb, l.levels, l.dims, &dh)) &&
                   operand_of(sb, l.levels, l.dims, &dsum) &&
                   (grads < 1 || operand_of((const cn_xla_buffer *)f->rets.items[1], l.levels, l.dims, &dw)) &&
                   (grads < 2 || operand_of((const cn_xla_buffer *)f->rets.items[2], l.levels, l.dims, &db));
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    if (dhb && dhb->dtype != hb->dtype) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: dh must have h's dtype");
    cynorm_add_desc d = {{l.center ? CYNORM_LAYER_NORM : CYNORM_RMS_NORM, cynorm_dtype(dyb->dtype),
                          wb ? cynorm_dtype(wb->dtype) : CYNORM_NO_PARAMS, l.rows, l.cols, 0.0, (int)l.num_threads, 0, 0},
                         cynorm_dtype(hb->dtype), cynorm_dtype(hb->dtype), cynorm_dtype(sb->dtype)};
    int64_t index[CN_MAX_LEVELS] = {0};
    d.base.flags = fresh_output(dsum.data, l.groups * l.rows * l.cols, sb->dtype);
    /* one call per group: each example's dweight/dbias are its own */
    for (int64_t g = 0; g < l.groups; g++, next_index(index, &l)) {
        cynorm_add_bwd_bufs bufs = {at(&dy, l.levels, index), at(&h, l.levels, index),
                                    l.center ? at(&mean, l.levels, index) : NULL, at(&rstd, l.levels, index),
                                    wb ? at(&w, l.levels, index) : NULL, dhb ? at(&dh, l.levels, index) : NULL,
                                    at(&dsum, l.levels, index), grads >= 1 ? at(&dw, l.levels, index) : NULL,
                                    grads >= 2 ? at(&db, l.levels, index) : NULL, NULL, NULL};
        int rc = cn_xla_cynorm->add_backward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* GroupNorm's layout: the vmap levels and groups from the first result (y or
 * dx, of x's rank plus the levels), the sample shape from its trailing dims. */
typedef struct {
    int levels;
    int64_t dims[CN_MAX_LEVELS], vgroups, batch, channels, spatial;
    int64_t groups, channels_last, x_ndim, has_weight, has_bias, num_threads;
    double eps;
} group_layout;

static const char *read_group_layout(const cn_xla_call_frame *f, const cn_xla_buffer *first, group_layout *l)
{
    double d;
    int64_t i;
    if (!(attr(f, "num_groups", &l->groups, &d) && attr(f, "channels_last", &l->channels_last, &d) &&
          attr(f, "x_ndim", &l->x_ndim, &d) && attr(f, "has_weight", &l->has_weight, &d) &&
          attr(f, "has_bias", &l->has_bias, &d) && attr(f, "num_threads", &l->num_threads, &d)))
        return "cynorm: an attribute is missing";
    if (!attr(f, "eps", &i, &l->eps)) l->eps = 0.0;
    l->levels = (int)(first->rank - l->x_ndim);
    if (l->levels < 0 || l->levels > CN_MAX_LEVELS || l->x_ndim < 2)
        return "cynorm: operand ranks do not match the attributes";
    l->vgroups = 1;
    for (int k = 0; k < l->levels; k++) { l->dims[k] = first->dims[k]; l->vgroups *= first->dims[k]; }
    const int64_t *sample = first->dims + l->levels;
    l->batch = sample[0];
    l->channels = l->channels_last ? sample[l->x_ndim - 1] : sample[1];
    l->spatial = 1;
    for (int64_t k = 1; k < l->x_ndim; k++)
        if (k != (l->channels_last ? l->x_ndim - 1 : 1)) l->spatial *= sample[k];
    return NULL;
}

static void next_group_index(int64_t *index, const group_layout *l)
{
    for (int k = l->levels - 1; k >= 0; k--) {
        if (++index[k] < l->dims[k]) return;
        index[k] = 0;
    }
}

/* x [, weight] [, bias] -> y, mean, rstd */
static cn_xla_error *cn_xla_group_forward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    group_layout l;
    const char *why = f->rets.size == 3 ? read_group_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l)
                                        : "cynorm: results";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    if (f->args.size != 1 + l.has_weight + l.has_bias)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands");
    operand x, w, b, y, mean, rstd;
    const cn_xla_buffer *xb = (const cn_xla_buffer *)f->args.items[0];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[1] : NULL;
    const cn_xla_buffer *bb = l.has_bias ? (const cn_xla_buffer *)f->args.items[1 + l.has_weight] : NULL;
    const int ok = operand_of(xb, l.levels, l.dims, &x) && (!wb || operand_of(wb, l.levels, l.dims, &w)) &&
                   (!bb || operand_of(bb, l.levels, l.dims, &b)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[0], l.levels, l.dims, &y) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[1], l.levels, l.dims, &mean) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[2], l.levels, l.dims, &rstd);
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    cynorm_group_desc d = {cynorm_dtype(xb->dtype), wb ? cynorm_dtype(wb->dtype) : bb ? cynorm_dtype(bb->dtype)
                                                                                      : CYNORM_NO_PARAMS,
                           l.batch, l.channels, l.spatial, l.groups, (int)l.channels_last, l.eps, (int)l.num_threads};
    /* examples that follow each other in memory, with one weight and bias for all, are
     * one call (more samples): a sample never depends on the call it is in */
    int64_t calls = l.vgroups, index[CN_MAX_LEVELS] = {0};
    int merge = 1;
    for (int k = 0; k < l.levels; k++) merge &= x.step[k] != 0 && (!wb || w.step[k] == 0) && (!bb || b.step[k] == 0);
    if (merge) { d.batch = l.batch * l.vgroups; calls = 1; }
    for (int64_t g = 0; g < calls; g++, next_group_index(index, &l)) {
        cynorm_group_fwd_bufs bufs = {at(&x, l.levels, index), wb ? at(&w, l.levels, index) : NULL,
                                      bb ? at(&b, l.levels, index) : NULL, at(&y, l.levels, index),
                                      at(&mean, l.levels, index), at(&rstd, l.levels, index)};
        int rc = cn_xla_cynorm->group_forward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* dy, x, mean, rstd [, weight] -> dx [, dweight, dbias] */
static cn_xla_error *cn_xla_group_backward(cn_xla_call_frame *f)
{
    int done;
    cn_xla_error *err = check_frame(f, &done);
    if (err || done) return err;
    group_layout l;
    const char *why = f->rets.size >= 1 ? read_group_layout(f, (const cn_xla_buffer *)f->rets.items[0], &l)
                                        : "cynorm: results";
    if (why) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, why);
    if (f->args.size != 4 + l.has_weight || f->rets.size != 1 + 2 * l.has_weight)
        return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: wrong number of operands or results");
    operand dy, x, mean, rstd, w, dx, dw, db;
    const cn_xla_buffer *xb = (const cn_xla_buffer *)f->args.items[1];
    const cn_xla_buffer *wb = l.has_weight ? (const cn_xla_buffer *)f->args.items[4] : NULL;
    const int ok = operand_of((const cn_xla_buffer *)f->args.items[0], l.levels, l.dims, &dy) &&
                   operand_of(xb, l.levels, l.dims, &x) &&
                   operand_of((const cn_xla_buffer *)f->args.items[2], l.levels, l.dims, &mean) &&
                   operand_of((const cn_xla_buffer *)f->args.items[3], l.levels, l.dims, &rstd) &&
                   (!wb || operand_of(wb, l.levels, l.dims, &w)) &&
                   operand_of((const cn_xla_buffer *)f->rets.items[0], l.levels, l.dims, &dx) &&
                   (!wb || (operand_of((const cn_xla_buffer *)f->rets.items[1], l.levels, l.dims, &dw) &&
                            operand_of((const cn_xla_buffer *)f->rets.items[2], l.levels, l.dims, &db)));
    if (!ok) return fail(f, CN_XLA_ERROR_INVALID_ARGUMENT, "cynorm: operand shapes do not broadcast over the vmap levels");
    cynorm_group_desc d = {cynorm_dtype(xb->dtype), wb ? cynorm_dtype(wb->dtype) : CYNORM_NO_PARAMS, l.batch,
                           l.channels, l.spatial, l.groups, (int)l.channels_last, 0.0, (int)l.num_threads};
    int64_t index[CN_MAX_LEVELS] = {0};
    /* one call per example: each example's dweight/dbias are its own */
    for (int64_t g = 0; g < l.vgroups; g++, next_group_index(index, &l)) {
        cynorm_group_bwd_bufs bufs = {at(&dy, l.levels, index), at(&x, l.levels, index), at(&mean, l.levels, index),
                                      at(&rstd, l.levels, index), wb ? at(&w, l.levels, index) : NULL,
                                      at(&dx, l.levels, index), wb ? at(&dw, l.levels, index) : NULL,
                                      wb ? at(&db, l.levels, index) : NULL, NULL};
        int rc = cn_xla_cynorm->group_backward(&d, &bufs);
        if (rc != CYNORM_OK) return status(f, rc);
    }
    return NULL;
}

/* The handlers' addresses, for PyCapsules (jax.ffi.register_ffi_target):
 * 0 forward, 1 backward, 2 add forward, 3 add backward, 4 group forward, 5 group backward. */
void *cn_xla_handler_address(int which)
{
    switch (which) {
    case 1: return (void *)cn_xla_backward;
    case 2: return (void *)cn_xla_add_forward;
    case 3: return (void *)cn_xla_add_backward;
    case 4: return (void *)cn_xla_group_forward;
    case 5: return (void *)cn_xla_group_backward;
    default: return (void *)cn_xla_forward;
    }
}
