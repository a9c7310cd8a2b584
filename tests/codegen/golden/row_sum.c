void r_8_53e1f804(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    for (int64_t i0 = 0; i0 < 8; i0++) {
        float acc = ((float)0.0);
        #pragma omp simd reduction(+:acc)
        for (int64_t i1 = 0; i1 < 33; i1++) {
            float t0 = p1[((i0 * 33) + i1)];
            acc += t0;
        }
        p0[i0] = acc;
    }
}

