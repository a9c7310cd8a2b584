/* bf16_gemm.c: bfloat16 matmuls with the AVX-512 BF16 dot product (vdpbf16ps), for metagraph's
 * bfloat16 contractions (codegen/bf16_gemm.py). C[m][n] = sum over k of A[m][k] B[k][n] in float32:
 * vdpbf16ps multiplies two bfloat16 pairs exactly and adds them to 16 float32 sums per
 * instruction, twice the multiply-adds of a float32 FMA.
 *
 * Blocked as a packed GEMM: per block of KC values of k, B is packed into panels of NR columns
 * holding each column's (k, k+1) pair side by side, A into blocks of MC rows holding each row's
 * pair as one 32-bit word; a micro-kernel keeps MR x NR sums in 24 zmm registers, loads two
 * vectors of B and broadcasts one word of A per row and pair. Edges are zero-padded in the packs
 * and stored through masks. C is contiguous (batch, M, N); A and B are read at any strides (a
 * stride of 1 along k or along m/n takes a vector path), and each batch entry starts at its own
 * offsets. Returns 0, or 1 when memory runs out.
 *
 * Threads share a product's work as items of (MC rows, a group of B panels), handed out one at a
 * time, so a small M still feeds every thread and a thread slowed by a neighbouring process takes
 * fewer items. B's panels for the next block of k are packed into a second buffer while late
 * threads finish the current one: one barrier per block of k. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Chosen on a Zen 4 core (32 KiB L1, 1 MiB L2), 2048^3 and 1024^3 on 1 thread, GFLOP/s of CPU
 * time (the machine was shared): KC 1024 gave 196-207, 512 gave 185, 256 gave 164; MR from 8 to 14
 * and MC from 48 to 384 were within 2% of each other. */
#define MR 12
#define NR 32
#define KC 1024         /* values of k per block: 512 pairs */
#define MC 96           /* rows of A per packed block (a multiple of MR) */
#define NC 2048         /* columns of B per packed chunk: two buffers of KC x NC bfloat16, 8 MiB */
#define ITEMS_PER_THREAD 4

static inline uint32_t word_at(const uint16_t *p) {
    uint32_t word;
    memcpy(&word, p, sizeof word);
    return word;
}

/* words[j] = (x[j], y[j]) for j < count <= 32 from two contiguous rows (y null: zeros), and zero
 * words from count to `words` (12 or 32) */
static inline void interleave(uint16_t *out, const uint16_t *x, const uint16_t *y, int64_t count,
                              int64_t words) {
    const __m512i low_half = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                              39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i high_half = _mm512_add_epi16(low_half, _mm512_set1_epi16(16));
    __mmask32 present = count >= 32 ? 0xffffffffu : (__mmask32)((1u << count) - 1);
    __m512i first = _mm512_maskz_loadu_epi16(present, x);
    __m512i second = y ? _mm512_maskz_loadu_epi16(present, y) : _mm512_setzero_si512();
    __mmask32 stored = words >= 16 ? 0xffffffffu : (__mmask32)((1u << (2 * words)) - 1);
    _mm512_mask_storeu_epi16(out, stored, _mm512_permutex2var_epi16(first, low_half, second));
    if (words > 16)
        _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(first, high_half, second));
}

/* A's rows [0, rows) and k in [k0, k0 + kc) as blocks of MR rows: word [block][pair][row] */
static void pack_a(uint32_t *restrict out, const uint16_t *a, int64_t sm, int64_t sk, int64_t rows,
                   int64_t k0, int64_t kc) {
    int64_t pairs = (kc + 1) / 2, whole = kc / 2;
    for (int64_t ib = 0; ib < rows; ib += MR, out += MR * pairs) {
        int64_t height = rows - ib < MR ? rows - ib : MR;
        const uint16_t *block = a + ib * sm + k0 * sk;
        if (sk == 1) {                 /* row-major: a pair is one word of the row */
            for (int64_t r = 0; r < MR; r++) {
                const uint16_t *row = block + r * sm;
                if (r >= height) {
                    for (int64_t p = 0; p < pairs; p++) out[p * MR + r] = 0;
                    continue;
                }
                for (int64_t p = 0; p < whole; p++) out[p * MR + r] = word_at(row + 2 * p);
                if (whole < pairs) out[whole * MR + r] = row[2 * whole];
            }
        } else if (sm == 1) {          /* column-major: a pair interleaves two columns of k */
            for (int64_t p = 0; p < pairs; p++) {
                const uint16_t *x = block + 2 * p * sk;
                interleave((uint16_t *)(out + p * MR), x, 2 * p + 1 < kc ? x + sk : 0, height, MR);
            }
        } else {
            for (int64_t p = 0; p < pairs; p++)
                for (int64_t r = 0; r < MR; r++) {
                    uint32_t lo = 0, hi = 0;
                    if (r < height) {
                        const uint16_t *value = block + r * sm + 2 * p * sk;
                        lo = value[0];
                        if (2 * p + 1 < kc) hi = value[sk];
                    }
                    out[p * MR + r] = lo | hi << 16;
                }
        }
    }
}

/* one panel of B: columns [0, cols < NR] and k in [k0, k0 + kc), as halves [pair][column][2] */
static void pack_b(uint16_t *restrict out, const uint16_t *b, int64_t sk, int64_t sn, int64_t cols,
                   int64_t k0, int64_t kc) {
    int64_t pairs = (kc + 1) / 2, whole = kc / 2;
    const uint16_t *panel = b + k0 * sk;
    if (sn == 1) {                     /* row-major: interleave two rows of k */
        for (int64_t p = 0; p < pairs; p++) {
            const uint16_t *x = panel + 2 * p * sk;
            interleave(out + 2 * NR * p, x, 2 * p + 1 < kc ? x + sk : 0, cols, NR);
        }
    } else if (sk == 1) {              /* column-major (a transposed weight): a pair is one word */
        uint32_t *words = (uint32_t *)out;
        for (int64_t j = 0; j < NR; j++) {
            const uint16_t *column = panel + j * sn;
            if (j >= cols) {
                for (int64_t p = 0; p < pairs; p++) words[p * NR + j] = 0;
                continue;
            }
            for (int64_t p = 0; p < whole; p++) words[p * NR + j] = word_at(column + 2 * p);
            if (whole < pairs) words[whole * NR + j] = column[2 * whole];
        }
    } else {
        for (int64_t p = 0; p < pairs; p++)
            for (int64_t j = 0; j < NR; j++) {
                uint16_t lo = 0, hi = 0;
                if (j < cols) {
                    const uint16_t *value = panel + 2 * p * sk + j * sn;
                    lo = value[0];
                    if (2 * p + 1 < kc) hi = value[sk];
                }
                out[2 * NR * p + 2 * j] = lo;
                out[2 * NR * p + 2 * j + 1] = hi;
            }
    }
}

/* an MR x NR tile of C (rows x cols of it stored), over `pairs` pairs of k; adds to C unless first */
static void tile(const uint32_t *restrict pa, const uint16_t *restrict pb, float *c, int64_t ldc,
                 int64_t pairs, int first, int64_t rows, int64_t cols) {
    __m512 acc[MR][2];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(pb + 2 * NR * p);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(pb + 2 * NR * p + NR);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)pa[MR * p + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
    __mmask16 low = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    __mmask16 high = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        if (r >= rows) break;
        float *row = c + r * ldc;
        if (!first) {
            acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_maskz_loadu_ps(low, row));
            acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_maskz_loadu_ps(high, row + 16));
        }
        _mm512_mask_storeu_ps(row, low, acc[r][0]);
        _mm512_mask_storeu_ps(row + 16, high, acc[r][1]);
    }
}

/* rows x cols of C (row stride ldc) against B's panels [first, last) of a packed block of k */
static void tiles(const uint32_t *pa, const uint16_t *pb, float *c, int64_t ldc, int64_t rows, int64_t cols,
                  int64_t first, int64_t last, int64_t pairs, int first_block) {
    for (int64_t j = first; j < last; j++)
        for (int64_t ib = 0; ib < rows; ib += MR)
            tile(pa + ib * pairs, pb + j * 2 * NR * pairs, c + ib * ldc + j * NR, ldc, pairs, first_block,
                 rows - ib, cols - j * NR < NR ? cols - j * NR : NR);
}

/* items of one chunk of columns: each row block's panels split into groups when rows alone are too
 * few for every thread to take several */
static int64_t panel_groups(int64_t row_blocks, int64_t panels, int threads) {
    if (threads == 1 || row_blocks >= ITEMS_PER_THREAD * threads)
        return 1;
    int64_t groups = (ITEMS_PER_THREAD * threads + row_blocks - 1) / row_blocks;
    return groups < panels ? groups : panels;
}

/* one product, its work shared by `threads` threads */
static int product(const uint16_t *a, const uint16_t *b, float *c, int64_t M, int64_t N, int64_t K,
                   int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, int threads) {
    int64_t row_blocks = (M + MC - 1) / MC, widest = N < NC ? N : NC, deepest = K < KC ? K : KC;
    size_t buffer_halves = (size_t)((widest + NR - 1) / NR) * 2 * NR * ((deepest + 1) / 2);
    uint16_t *buffers = aligned_alloc(64, 2 * buffer_halves * sizeof(uint16_t));
    if (!buffers) return 1;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1) reduction(|:failed)
    {
        uint32_t *pa = aligned_alloc(64, MC * ((deepest + 1) / 2) * sizeof(uint32_t));
        int64_t packed_block = -1, packed_k0 = -1, step = 0;
        failed = pa == 0;
        for (int64_t n0 = 0; n0 < N; n0 += NC)
            for (int64_t k0 = 0; k0 < K; k0 += KC, step++) {
                int64_t cols = N - n0 < NC ? N - n0 : NC, panels = (cols + NR - 1) / NR;
                int64_t kc = K - k0 < KC ? K - k0 : KC, pairs = (kc + 1) / 2;
                int64_t groups = panel_groups(row_blocks, panels, threads);
                int64_t per_group = (panels + groups - 1) / groups;
                uint16_t *pb = buffers + (step & 1) * buffer_halves;
                #pragma omp for schedule(dynamic, 4)
                for (int64_t j = 0; j < panels; j++)
                    pack_b(pb + j * 2 * NR * pairs, b + (n0 + j * NR) * sbn, sbk, sbn,
                           cols - j * NR < NR ? cols - j * NR : NR, k0, kc);
                #pragma omp for schedule(dynamic) nowait
                for (int64_t item = 0; item < row_blocks * groups; item++) {
                    if (!pa) continue;
                    int64_t block = item / groups, i0 = block * MC, rows = M - i0 < MC ? M - i0 : MC;
                    int64_t first = item % groups * per_group;
                    if (block != packed_block || k0 != packed_k0)
                        pack_a(pa, a + i0 * sam, sam, sak, rows, k0, kc);
                    packed_block = block;
                    packed_k0 = k0;
                    tiles(pa, pb, c + i0 * N + n0, N, rows, cols, first,
                          first + per_group < panels ? first + per_group : panels, pairs, k0 == 0);
                }
            }
        free(pa);
    }
    free(buffers);
    return failed;
}

int mg_bf16_gemm(const uint16_t *a, const uint16_t *b, float *c, int64_t batch, const int64_t *a_offsets,
                 const int64_t *b_offsets, int64_t M, int64_t N, int64_t K, int64_t sam, int64_t sak,
                 int64_t sbk, int64_t sbn, int threads) {
    if (M == 0 || N == 0)
        return 0;
    if (K == 0) {
        for (int64_t i = 0; i < batch * M * N; i++) c[i] = 0.0f;
        return 0;
    }
    if (batch < threads) {       /* few products: the threads share each one's work */
        for (int64_t e = 0; e < batch; e++)
            if (product(a + a_offsets[e], b + b_offsets[e], c + e * M * N, M, N, K, sam, sak, sbk, sbn,
                        threads))
                return 1;
        return 0;
    }
    int failed = 0;              /* many products (attention's heads): one per thread at a time */
    #pragma omp parallel for num_threads(threads) schedule(dynamic) reduction(|:failed)
    for (int64_t e = 0; e < batch; e++)
        failed |= product(a + a_offsets[e], b + b_offsets[e], c + e * M * N, M, N, K, sam, sak, sbk, sbn, 1);
    return failed;
}
