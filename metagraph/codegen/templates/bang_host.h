/* bang_host.h: the BANG intrinsics metagraph's `bang` kernels use, implemented in plain C so that
 * the kernels compile with the system C compiler and run on the CPU.
 *
 * A kernel is an `__mlu_entry__` function run once per task: taskId in [0, taskDim). Here each
 * task is a thread of an OpenMP team (MG_BANG_LAUNCH) and `__sync_all()` is a barrier of the team.
 * `__nram__` buffers are the task's on-chip scratchpad; here they live on the thread's stack.
 * Global memory (GDRAM) is reached only through __memcpy (contiguous or strided), __gather,
 * __scatter and the __scatter_<op> accumulations; the __bang_* vector intrinsics work on NRAM.
 *
 * Semantics are those of metagraph's numpy oracle: max lets NaN win, integer division floors,
 * integers wrap, float16 and bfloat16 math runs in float32 (the kernels convert). On a real MLU the
 * same kernel source is handed to the chip's compiler with the vendor's intrinsics in place of this
 * file. */
#ifndef METAGRAPH_BANG_HOST_H
#define METAGRAPH_BANG_HOST_H
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#ifdef MG_VECTOR_MATH
/* glibc's libmvec has vector versions of these: declaring them lets the math loops vectorise */
#pragma omp declare simd notinbranch
extern float exp2f(float);
#pragma omp declare simd notinbranch
extern float log2f(float);
#pragma omp declare simd notinbranch
extern float sinf(float);
#pragma omp declare simd notinbranch
extern float cosf(float);
#pragma omp declare simd notinbranch
extern double exp2(double);
#pragma omp declare simd notinbranch
extern double log2(double);
#pragma omp declare simd notinbranch
extern double sin(double);
#pragma omp declare simd notinbranch
extern double cos(double);
#endif

#define __mlu_entry__
#define __nram__
static __thread int64_t taskId, taskDim;

/* the host side of a launch: MG_TASKS tasks (the including file defines MG_TASKS) */
#define MG_BANG_LAUNCH(kernel)                                                         \
    void kernel(char **args, int64_t *err) {                                          \
        _Pragma("omp parallel num_threads(MG_TASKS)") {                               \
            taskId = omp_get_thread_num();                                            \
            taskDim = omp_get_num_threads();                                          \
            kernel##_entry(args, err);                                                \
        }                                                                             \
    }
#define __sync_all() _Pragma("omp barrier")
#define MG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MG_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- data movement -------------------------------------------------------------------------- */
typedef enum { GDRAM2NRAM, NRAM2GDRAM, NRAM2NRAM } mluMemcpyDirection_t;

static inline void mg_memcpy(void *dst, const void *src, int64_t size, mluMemcpyDirection_t dir) {
    (void)dir;
    memcpy(dst, src, (size_t)size);
}
/* segnum + 1 segments of `size` bytes; the next segment starts dst_stride / src_stride bytes on */
static inline void mg_memcpy_strided(void *dst, const void *src, int64_t size, mluMemcpyDirection_t dir,
                                     int64_t dst_stride, int64_t src_stride, int64_t segnum) {
    (void)dir;
    for (int64_t s = 0; s <= segnum; s++)
        memcpy((char *)dst + s * dst_stride, (const char *)src + s * src_stride, (size_t)size);
}
#define MG_MEMCPY_PICK(a, b, c, d, e, f, g, name, ...) name
#define __memcpy(...) \
    MG_MEMCPY_PICK(__VA_ARGS__, mg_memcpy_strided, _6, _5, mg_memcpy, _3, _2, _1)(__VA_ARGS__)

/* dst[l] = src[offsets[l]] (elements of `size` bytes); a negative offset reads nothing and gives 0 */
static inline void __gather(void *dst, const void *src, const int64_t *offsets, int64_t size, int64_t n) {
    for (int64_t l = 0; l < n; l++) {
        if (offsets[l] >= 0) memcpy((char *)dst + l * size, (const char *)src + offsets[l] * size, (size_t)size);
        else memset((char *)dst + l * size, 0, (size_t)size);
    }
}
/* dst[offsets[l]] = src[l]; a negative offset writes nothing */
static inline void __scatter(void *dst, const void *src, const int64_t *offsets, int64_t size, int64_t n) {
    for (int64_t l = 0; l < n; l++)
        if (offsets[l] >= 0) memcpy((char *)dst + offsets[l] * size, (const char *)src + l * size, (size_t)size);
}

/* ---- per-type intrinsics ---------------------------------------------------------------------- */
#define MG_GENERIC(name, p) _Generic((p), \
    uint8_t *: name##_u8, int8_t *: name##_i8, int16_t *: name##_i16, int32_t *: name##_i32, \
    int64_t *: name##_i64, _Float16 *: name##_f16, float *: name##_f32, double *: name##_f64)
#define MG_GENERIC_FLOAT(name, p) _Generic((p), _Float16 *: name##_f16, float *: name##_f32, double *: name##_f64)
#define MG_GENERIC_INT(name, p) _Generic((p), \
    uint8_t *: name##_u8, int8_t *: name##_i8, int16_t *: name##_i16, int32_t *: name##_i32, int64_t *: name##_i64)

#define MG_NAN(T, x) ((x) != (x))
#define MG_GREATER(x, y) (MG_NAN(T, x) || (x) > (y))      /* max: NaN wins */

/* each intrinsic is a loop the host compiler vectorises (omp simd) */
#define MG_SIMD _Pragma("omp simd")
#define MG_BINARY(name, T, s, expr) \
    static inline void name##_##s(T *d, T *a, T *b, int64_t n) { \
        MG_SIMD for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; d[i] = (expr); } }
#define MG_BINARY_SCALAR(name, T, s, expr) \
    static inline void name##_##s(T *d, T *a, T y, int64_t n) { \
        MG_SIMD for (int64_t i = 0; i < n; i++) { T x = a[i]; d[i] = (expr); } }
#define MG_COMPARE(name, T, s, expr) \
    static inline void name##_##s(uint8_t *d, T *a, T *b, int64_t n) { \
        MG_SIMD for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; d[i] = (expr); } }
#define MG_UNARY(name, T, s, expr) \
    static inline void name##_##s(T *d, T *a, int64_t n) { \
        MG_SIMD for (int64_t i = 0; i < n; i++) { T x = a[i]; d[i] = (expr); } }
#define MG_REDUCE(name, T, s, init, clause, step) \
    static inline void name##_##s(T *d, T *a, int64_t n) { \
        T r = (init); _Pragma(clause) for (int64_t i = 0; i < n; i++) { T x = a[i]; step; } d[0] = r; }

#define MG_ALL_TYPES(T, s) \
    MG_BINARY(mg_add, T, s, x + y) \
    MG_BINARY(mg_mul, T, s, x * y) \
    MG_BINARY(mg_maxequal, T, s, MG_GREATER(x, y) ? x : y) \
    MG_BINARY_SCALAR(mg_add_scalar, T, s, x + y) \
    MG_BINARY_SCALAR(mg_mul_scalar, T, s, x * y) \
    MG_BINARY_SCALAR(mg_maxequal_scalar, T, s, MG_GREATER(x, y) ? x : y) \
    MG_COMPARE(mg_lt, T, s, x < y) \
    MG_COMPARE(mg_ne, T, s, x != y) \
    MG_UNARY(mg_neg, T, s, -x) \
    MG_UNARY(mg_active_relu, T, s, (x > (T)0 || MG_NAN(T, x)) ? x : (T)0) \
    MG_REDUCE(mg_reduce_sum, T, s, 0, "omp simd reduction(+:r)", r += x) \
    MG_REDUCE(mg_reduce_mul, T, s, 1, "omp simd reduction(*:r)", r *= x) \
    static inline void mg_reduce_max_##s(T *d, T *a, int64_t n) { /* NaN wins */ \
        T r = a[0]; uint8_t nan = 0; \
        _Pragma("omp simd reduction(max:r) reduction(|:nan)") \
        for (int64_t i = 0; i < n; i++) { T x = a[i]; nan |= MG_NAN(T, x); r = x > r ? x : r; } \
        if (nan) for (int64_t i = 0; i < n; i++) if (MG_NAN(T, a[i])) { d[0] = a[i]; return; } \
        d[0] = r; } \
    static inline void mg_write_value_##s(T *d, int64_t n, T v) { for (int64_t i = 0; i < n; i++) d[i] = v; } \
    static inline void mg_select_##s(T *d, uint8_t *c, T *a, T *b, int64_t n) { \
        for (int64_t i = 0; i < n; i++) d[i] = c[i] ? a[i] : b[i]; } \
    static inline void mg_scatter_add_##s(T *d, T *a, const int64_t *o, int64_t n) { \
        for (int64_t i = 0; i < n; i++) if (o[i] >= 0) d[o[i]] += a[i]; } \
    static inline void mg_scatter_max_##s(T *d, T *a, const int64_t *o, int64_t n) { \
        for (int64_t i = 0; i < n; i++) if (o[i] >= 0 && MG_GREATER(a[i], d[o[i]])) d[o[i]] = a[i]; }

#define MG_INT_TYPES(T, s) \
    MG_BINARY(mg_band, T, s, x & y) \
    MG_BINARY(mg_bor, T, s, x | y) \
    MG_BINARY(mg_bxor, T, s, x ^ y) \
    MG_REDUCE(mg_reduce_or, T, s, 0, "omp simd reduction(|:r)", r |= x) \
    MG_REDUCE(mg_reduce_and, T, s, 1, "omp simd reduction(&:r)", r &= x) \
    static inline void mg_scatter_bor_##s(T *d, T *a, const int64_t *o, int64_t n) { \
        for (int64_t i = 0; i < n; i++) if (o[i] >= 0) d[o[i]] |= a[i]; } \
    static inline void mg_floordiv_##s(T *d, T *a, T *b, int64_t n, int64_t *err, int64_t site) { \
        for (int64_t i = 0; i < n; i++) { \
            int64_t x = a[i], y = b[i]; \
            if (y == 0) { *err = site; d[i] = 0; continue; } \
            int64_t q = y == -1 ? (int64_t)(0 - (uint64_t)x) : x / y; \
            d[i] = (T)((y != -1 && q * y != x && ((x < 0) != (y < 0))) ? q - 1 : q); } } \
    static inline void mg_floormod_##s(T *d, T *a, T *b, int64_t n, int64_t *err, int64_t site) { \
        for (int64_t i = 0; i < n; i++) { \
            int64_t x = a[i], y = b[i]; \
            if (y == 0) { *err = site; d[i] = 0; continue; } \
            int64_t r = y == -1 ? 0 : x % y; \
            d[i] = (T)((r != 0 && ((r < 0) != (y < 0))) ? r + y : r); } }

/* float16 math runs in float32, rounded back per op */
#define MG_FLOAT_TYPES(T, s, F, suffix) \
    MG_UNARY(mg_active_recip, T, s, (T)1 / x) \
    MG_UNARY(mg_active_sqrt, T, s, (T)sqrt##suffix((F)x)) \
    MG_UNARY(mg_active_exp2, T, s, (T)exp2##suffix((F)x)) \
    MG_UNARY(mg_active_log2, T, s, (T)log2##suffix((F)x)) \
    MG_UNARY(mg_active_sin, T, s, (T)sin##suffix((F)x)) \
    MG_UNARY(mg_active_cos, T, s, (T)cos##suffix((F)x)) \
    MG_BINARY(mg_pow, T, s, (T)pow##suffix((F)x, (F)y))

MG_ALL_TYPES(uint8_t, u8)
MG_ALL_TYPES(int8_t, i8)
MG_ALL_TYPES(int16_t, i16)
MG_ALL_TYPES(int32_t, i32)
MG_ALL_TYPES(int64_t, i64)
MG_ALL_TYPES(_Float16, f16)
MG_ALL_TYPES(float, f32)
MG_ALL_TYPES(double, f64)
MG_INT_TYPES(uint8_t, u8)
MG_INT_TYPES(int8_t, i8)
MG_INT_TYPES(int16_t, i16)
MG_INT_TYPES(int32_t, i32)
MG_INT_TYPES(int64_t, i64)
MG_FLOAT_TYPES(_Float16, f16, float, f)
MG_FLOAT_TYPES(float, f32, float, f)
MG_FLOAT_TYPES(double, f64, double, )

/* the intrinsics, by the BANG names (type-generic over their first NRAM operand's type) */
#define __bang_add(d, a, b, n) MG_GENERIC(mg_add, d)(d, a, b, n)
#define __bang_mul(d, a, b, n) MG_GENERIC(mg_mul, d)(d, a, b, n)
#define __bang_maxequal(d, a, b, n) MG_GENERIC(mg_maxequal, d)(d, a, b, n)
#define __bang_add_scalar(d, a, v, n) MG_GENERIC(mg_add_scalar, d)(d, a, v, n)
#define __bang_mul_scalar(d, a, v, n) MG_GENERIC(mg_mul_scalar, d)(d, a, v, n)
#define __bang_maxequal_scalar(d, a, v, n) MG_GENERIC(mg_maxequal_scalar, d)(d, a, v, n)
#define __bang_lt(d, a, b, n) MG_GENERIC(mg_lt, a)(d, a, b, n)
#define __bang_ne(d, a, b, n) MG_GENERIC(mg_ne, a)(d, a, b, n)
#define __bang_neg(d, a, n) MG_GENERIC(mg_neg, d)(d, a, n)
#define __bang_active_relu(d, a, n) MG_GENERIC(mg_active_relu, d)(d, a, n)
#define __bang_active_recip(d, a, n) MG_GENERIC_FLOAT(mg_active_recip, d)(d, a, n)
#define __bang_active_sqrt(d, a, n) MG_GENERIC_FLOAT(mg_active_sqrt, d)(d, a, n)
#define __bang_active_exp2(d, a, n) MG_GENERIC_FLOAT(mg_active_exp2, d)(d, a, n)
#define __bang_active_log2(d, a, n) MG_GENERIC_FLOAT(mg_active_log2, d)(d, a, n)
#define __bang_active_sin(d, a, n) MG_GENERIC_FLOAT(mg_active_sin, d)(d, a, n)
#define __bang_active_cos(d, a, n) MG_GENERIC_FLOAT(mg_active_cos, d)(d, a, n)
#define __bang_pow(d, a, b, n) MG_GENERIC_FLOAT(mg_pow, d)(d, a, b, n)
#define __bang_band(d, a, b, n) MG_GENERIC_INT(mg_band, d)(d, a, b, n)
#define __bang_bor(d, a, b, n) MG_GENERIC_INT(mg_bor, d)(d, a, b, n)
#define __bang_bxor(d, a, b, n) MG_GENERIC_INT(mg_bxor, d)(d, a, b, n)
#define __bang_floordiv(d, a, b, n, err, site) MG_GENERIC_INT(mg_floordiv, d)(d, a, b, n, err, site)
#define __bang_floormod(d, a, b, n, err, site) MG_GENERIC_INT(mg_floormod, d)(d, a, b, n, err, site)
#define __bang_select(d, c, a, b, n) MG_GENERIC_STORED(mg_select, d)(d, c, a, b, n)
#define __bang_write_value(d, n, v) MG_GENERIC_STORED(mg_write_value, d)(d, n, v)
#define __bang_write_zero(d, n) memset((d), 0, (size_t)(n) * sizeof(*(d)))
/* reductions: d[0] = the reduction of a[0..n) */
#define __bang_reduce_sum(d, a, n) MG_GENERIC(mg_reduce_sum, a)(d, a, n)
#define __bang_reduce_mul(d, a, n) MG_GENERIC(mg_reduce_mul, a)(d, a, n)
#define __bang_reduce_max(d, a, n) MG_GENERIC(mg_reduce_max, a)(d, a, n)
#define __bang_reduce_or(d, a, n) MG_GENERIC_INT(mg_reduce_or, a)(d, a, n)
#define __bang_reduce_and(d, a, n) MG_GENERIC_INT(mg_reduce_and, a)(d, a, n)
/* accumulate into global memory at offsets (negative: skipped), in lane order */
#define __scatter_add(d, a, o, n) MG_GENERIC_STORED(mg_scatter_add, d)(d, a, o, n)
#define __scatter_max(d, a, o, n) MG_GENERIC_STORED(mg_scatter_max, d)(d, a, o, n)
#define __scatter_bor(d, a, o, n) MG_GENERIC_INT(mg_scatter_bor, d)(d, a, o, n)

/* conversions __bang_<from>2<to>(d, a, n): C's casts; to bool means != 0 */
#define MG_CONVERT(S, sname, D, dname) \
    static inline void __bang_##sname##2##dname(D *d, S *a, int64_t n) { \
        for (int64_t i = 0; i < n; i++) d[i] = (D)a[i]; }
#define MG_CONVERT_FROM(S, sname) \
    MG_CONVERT(S, sname, uint8_t, uint8) MG_CONVERT(S, sname, int8_t, int8) \
    MG_CONVERT(S, sname, int16_t, int16) MG_CONVERT(S, sname, int32_t, int32) \
    MG_CONVERT(S, sname, int64_t, int64) MG_CONVERT(S, sname, _Float16, half) \
    MG_CONVERT(S, sname, float, float) MG_CONVERT(S, sname, double, double) \
    static inline void __bang_##sname##2bool(uint8_t *d, S *a, int64_t n) { \
        for (int64_t i = 0; i < n; i++) d[i] = a[i] != 0; }
MG_CONVERT_FROM(uint8_t, bool)
MG_CONVERT_FROM(uint8_t, uint8)
MG_CONVERT_FROM(int8_t, int8)
MG_CONVERT_FROM(int16_t, int16)
MG_CONVERT_FROM(int32_t, int32)
MG_CONVERT_FROM(int64_t, int64)
MG_CONVERT_FROM(_Float16, half)
MG_CONVERT_FROM(float, float)
MG_CONVERT_FROM(double, double)

/* bfloat16 lanes hold its bits (uint16_t): kernels only move them, convert them to and from
 * float32, and scatter into them (float32 math, rounded back per update). The conversions are
 * c_helpers.j2's, which every kernel file includes after this header. */
static inline float mg_bf16_to_f32(uint16_t h);
static inline uint16_t mg_f32_to_bf16(float x);
static inline void __bang_bfloat162float(float *d, uint16_t *a, int64_t n) {
    MG_SIMD for (int64_t i = 0; i < n; i++) d[i] = mg_bf16_to_f32(a[i]); }
static inline void __bang_float2bfloat16(uint16_t *d, float *a, int64_t n) {
    MG_SIMD for (int64_t i = 0; i < n; i++) d[i] = mg_f32_to_bf16(a[i]); }
static inline void mg_write_value_bf16(uint16_t *d, int64_t n, uint16_t v) {
    for (int64_t i = 0; i < n; i++) d[i] = v; }
static inline void mg_select_bf16(uint16_t *d, uint8_t *c, uint16_t *a, uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = c[i] ? a[i] : b[i]; }
static inline void mg_scatter_add_bf16(uint16_t *d, uint16_t *a, const int64_t *o, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (o[i] >= 0) d[o[i]] = mg_f32_to_bf16(mg_bf16_to_f32(d[o[i]]) + mg_bf16_to_f32(a[i])); }
static inline void mg_scatter_max_bf16(uint16_t *d, uint16_t *a, const int64_t *o, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = mg_bf16_to_f32(a[i]);
        if (o[i] >= 0 && MG_GREATER(x, mg_bf16_to_f32(d[o[i]]))) d[o[i]] = a[i]; } }
/* the intrinsics that also take bfloat16 lanes */
#define MG_GENERIC_STORED(name, p) _Generic((p), \
    uint8_t *: name##_u8, int8_t *: name##_i8, int16_t *: name##_i16, int32_t *: name##_i32, \
    int64_t *: name##_i64, _Float16 *: name##_f16, float *: name##_f32, double *: name##_f64, \
    uint16_t *: name##_bf16)

#endif
