/*
 * cn_xla_ffi.h -- the few parts of XLA's FFI C ABI that cynorm's handlers use
 * (xla/ffi/api/c_api.h, API version 0.x), declared here so that building
 * cynorm needs no jax. Field order and types follow that header exactly;
 * every struct starts with its size, which the handlers check.
 */
#ifndef CN_XLA_FFI_H
#define CN_XLA_FFI_H

#include <stddef.h>
#include <stdint.h>

#define CN_XLA_FFI_API_MAJOR 0
#define CN_XLA_FFI_API_MINOR 1

enum { CN_XLA_EXTENSION_METADATA = 1 };
enum { CN_XLA_STAGE_EXECUTE = 3 };
enum { CN_XLA_ARG_BUFFER = 1 };
enum { CN_XLA_ATTR_SCALAR = 3 };
enum { CN_XLA_ERROR_INVALID_ARGUMENT = 3, CN_XLA_ERROR_RESOURCE_EXHAUSTED = 8, CN_XLA_ERROR_INTERNAL = 13 };
enum {   /* XLA_FFI_DataType (xla::PrimitiveType) */
    CN_XLA_S32 = 4, CN_XLA_S64 = 5, CN_XLA_F16 = 10, CN_XLA_F32 = 11, CN_XLA_F64 = 12, CN_XLA_BF16 = 16
};

typedef struct cn_xla_extension {
    size_t struct_size;
    int type;
    struct cn_xla_extension *next;
} cn_xla_extension;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    int major_version, minor_version;
} cn_xla_version;

typedef struct {
    size_t struct_size;
    cn_xla_version api_version;
    uint32_t traits;
} cn_xla_metadata;

typedef struct {
    cn_xla_extension base;
    cn_xla_metadata *metadata;
} cn_xla_metadata_extension;

typedef struct cn_xla_error cn_xla_error;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    const char *message;
    int errc;
} cn_xla_error_create_args;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    cn_xla_version api_version;
    const void *internal_api;
    cn_xla_error *(*error_create)(cn_xla_error_create_args *args);
    /* ... further functions, unused here */
} cn_xla_api;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    int dtype;
    void *data;
    int64_t rank;
    int64_t *dims;
} cn_xla_buffer;

typedef struct {
    const char *ptr;
    size_t len;
} cn_xla_bytespan;

typedef struct {
    int dtype;
    void *value;
} cn_xla_scalar;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    int64_t size;
    int *types;
    void **items;
} cn_xla_list;   /* XLA_FFI_Args and XLA_FFI_Rets */

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    int64_t size;
    int *types;
    cn_xla_bytespan **names;
    void **attrs;
} cn_xla_attrs;

typedef struct {
    size_t struct_size;
    cn_xla_extension *extension_start;
    const cn_xla_api *api;
    void *ctx;
    int stage;
    cn_xla_list args;
    cn_xla_list rets;
    cn_xla_attrs attrs;
} cn_xla_call_frame;

typedef cn_xla_error *cn_xla_handler(cn_xla_call_frame *frame);

#endif /* CN_XLA_FFI_H */
