void r_2x4x6x6_490ad996(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    const float *restrict p2 = (const float *)args[2];
    const float *restrict p3 = (const float *)args[3];
    for (int64_t i0 = 0; i0 < 2; i0++) {
        float acc[144] __attribute__((aligned(64)));
        for (int64_t q = 0; q < 144; q++) acc[q] = ((float)0.0);
        for (int64_t i4 = 0; i4 < 3; i4++) {
            for (int64_t i5 = 0; i5 < 3; i5++) {
                for (int64_t i6 = 0; i6 < 3; i6++) {
                    for (int64_t i1 = 0; i1 < 4; i1++) {
                        for (int64_t i2 = 0; i2 < 6; i2++) {
                            #pragma omp simd
                            for (int64_t i3 = 0; i3 < 6; i3++) {
                                float t0 = ((((0 <= ((i2 + i5) - 1)) && (((i2 + i5) - 1) < 6)) && ((0 <= ((i3 + i6) - 1)) && (((i3 + i6) - 1) < 6))) ? p1[(((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)] : 0);
                                float t1 = p2[((((i1 * 27) + (i4 * 9)) + (i5 * 3)) + i6)];
                                acc[(((i1 * 36) + (i2 * 6)) + i3)] = fmaf(t0, t1, acc[(((i1 * 36) + (i2 * 6)) + i3)]);
                            }
                        }
                    }
                }
            }
        }
        for (int64_t i1 = 0; i1 < 4; i1++) {
            for (int64_t i2 = 0; i2 < 6; i2++) {
                #pragma omp simd
                for (int64_t i3 = 0; i3 < 6; i3++) {
                    float t2 = p3[i1];
                    float t3 = (acc[(((i1 * 36) + (i2 * 6)) + i3)] + t2);
                    uint8_t t4 = (((float)0.0) < t3);
                    float t5 = (t4 ? t3 : ((float)0.0));
                    p0[((((i0 * 144) + (i1 * 36)) + (i2 * 6)) + i3)] = t5;
                }
            }
        }
    }
}

