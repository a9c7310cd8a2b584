void r_8_d11815a7(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    float acc[8] __attribute__((aligned(64)));
    for (int64_t q = 0; q < 8; q++) acc[q] = ((float)0.0);
    for (int64_t i1 = 0; i1 < 33; i1++) {
        #pragma omp simd
        for (int64_t i0 = 0; i0 < 8; i0++) {
            float t0 = p1[((i0 * 33) + i1)];
            acc[i0] += t0;
        }
    }
    #pragma omp simd
    for (int64_t i0 = 0; i0 < 8; i0++) {
        p0[i0] = acc[i0];
    }
}

