void s_3x3_da08a0a4(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    for (int64_t i0 = 0; i0 < 3; i0++) {
        for (int64_t i1 = 0; i1 < 3; i1++) {
            p0[((i0 * 3) + i1)] = ((float)0.0);
        }
    }
    for (int64_t i0 = 0; i0 < 5; i0++) {
        for (int64_t i1 = 0; i1 < 3; i1++) {
            float t0 = p1[((i0 * 3) + i1)];
            p0[(((i0 / 2) * 3) + i1)] += t0;
        }
    }
}

