void r_4x9_89499145(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    const float *restrict p2 = (const float *)args[2];
    for (int64_t i0 = 0; i0 < 4; i0++) {
        float acc[9] __attribute__((aligned(64)));
        for (int64_t q = 0; q < 9; q++) acc[q] = ((float)0.0);
        for (int64_t i2 = 0; i2 < 6; i2++) {
            float t0 = p1[((i0 * 6) + i2)];
            #pragma omp simd
            for (int64_t i1 = 0; i1 < 9; i1++) {
                float t1 = p2[(i1 + (i2 * 9))];
                acc[i1] = fmaf(t0, t1, acc[i1]);
            }
        }
        #pragma omp simd
        for (int64_t i1 = 0; i1 < 9; i1++) {
            p0[((i0 * 9) + i1)] = acc[i1];
        }
    }
}

