/* bf16_gemm.c: bfloat16 matmuls with the AVX-512 BF16 dot product (vdpbf16ps), for metagraph's
 * bfloat16 contractions (codegen/bf16_gemm.py). C[m][n] = sum over k of A[m][k] B[k][n] in float32:
 * vdpbf16ps multiplies two bfloat16 pairs exactly and adds them to 16 float32 sums per
 * instruction, twice the multiply-adds of a float32 FMA.
 *
 * Blocked as a packed GEMM: per block of KC values of k, B is packed into panels of NR columns
 * holding each column's (k, k+1) pair side by side, A into blocks of MR rows holding each row's
 * pair as one 32-bit word; a micro-kernel keeps MR x NR sums in 24 zmm registers, loads two
 * vectors of B and broadcasts one word of A per row and pair. Edges are zero-padded in the packs
 * and stored through masks. C is contiguous (batch, M, N); A and B are read at any strides, and
 * each batch entry starts at its own offsets. Returns 0, or 1 when memory runs out. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define MR 12
#define NR 32
#define KC 512          /* values of k per block: 256 pairs */
#define MC 96           /* rows of A per packed block (a multiple of MR) */

static void pack_a(uint32_t *restrict out, const uint16_t *a, int64_t sm, int64_t sk, int64_t rows,
                   int64_t k0, int64_t kc) {
    int64_t pairs = (kc + 1) / 2;
    for (int64_t ib = 0; ib < rows; ib += MR)
        for (int64_t p = 0; p < pairs; p++, out += MR)
            for (int64_t r = 0; r < MR; r++) {
                uint32_t lo = 0, hi = 0;
                if (ib + r < rows) {
                    const uint16_t *row = a + (ib + r) * sm + (k0 + 2 * p) * sk;
                    lo = row[0];
                    if (2 * p + 1 < kc) hi = row[sk];
                }
                out[r] = lo | hi << 16;
            }
}

static void pack_b(uint16_t *restrict out, const uint16_t *b, int64_t sk, int64_t sn, int64_t cols,
                   int64_t k0, int64_t kc) {
    int64_t pairs = (kc + 1) / 2;
    for (int64_t p = 0; p < pairs; p++, out += 2 * NR)
        for (int64_t j = 0; j < NR; j++) {
            uint16_t lo = 0, hi = 0;
            if (j < cols) {
                const uint16_t *column = b + (k0 + 2 * p) * sk + j * sn;
                lo = column[0];
                if (2 * p + 1 < kc) hi = column[sk];
            }
            out[2 * j] = lo;
            out[2 * j + 1] = hi;
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

/* rows [i0, i0 + rows) of one product, for one block of k whose B panels are packed in pb */
static void rows_block(const uint16_t *a, const uint16_t *pb, float *c, int64_t N, int64_t sam, int64_t sak,
                       int64_t i0, int64_t rows, int64_t k0, int64_t kc) {
    uint32_t pa[MC * (KC / 2)] __attribute__((aligned(64)));
    int64_t pairs = (kc + 1) / 2;
    pack_a(pa, a + i0 * sam, sam, sak, rows, k0, kc);
    for (int64_t j0 = 0; j0 < N; j0 += NR)
        for (int64_t ib = 0; ib < rows; ib += MR)
            tile(pa + ib * pairs, pb + j0 * 2 * pairs, c + (i0 + ib) * N + j0, N, pairs, k0 == 0,
                 rows - ib, N - j0 < NR ? N - j0 : NR);
}

/* one product with `threads` threads sharing its row blocks */
static int product(const uint16_t *a, const uint16_t *b, float *c, int64_t M, int64_t N, int64_t K,
                   int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, int threads) {
    int64_t panels = (N + NR - 1) / NR;
    uint16_t *pb = aligned_alloc(64, (size_t)panels * 2 * NR * (KC / 2) * sizeof(uint16_t));
    if (!pb) return 1;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = K - k0 < KC ? K - k0 : KC, pairs = (kc + 1) / 2;
        #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t j = 0; j < panels; j++)
            pack_b(pb + j * 2 * NR * pairs, b + j * NR * sbn, sbk, sbn, N - j * NR < NR ? N - j * NR : NR,
                   k0, kc);
        #pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
        for (int64_t i0 = 0; i0 < M; i0 += MC)
            rows_block(a, pb, c, N, sam, sak, i0, M - i0 < MC ? M - i0 : MC, k0, kc);
    }
    free(pb);
    return 0;
}

int mg_bf16_gemm(const uint16_t *a, const uint16_t *b, float *c, int64_t batch, const int64_t *a_offsets,
                 const int64_t *b_offsets, int64_t M, int64_t N, int64_t K, int64_t sam, int64_t sak,
                 int64_t sbk, int64_t sbn, int threads) {
    if (K == 0) {
        for (int64_t i = 0; i < batch * M * N; i++) c[i] = 0.0f;
        return 0;
    }
    if (batch < threads) {       /* few products: the threads share each one's rows */
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
