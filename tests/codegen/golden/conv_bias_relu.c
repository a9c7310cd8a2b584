void r_2x4x6x6_17753bab(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    const float *restrict p2 = (const float *)args[2];
    const float *restrict p3 = (const float *)args[3];
    for (int64_t i0 = 0; i0 < 2; i0++) {
        for (int64_t i1 = 0; i1 < 1; i1++) {
            for (int64_t i2 = 0; i2 < 6; i2++) {
                float acc[24] __attribute__((aligned(64)));
                for (int64_t q = 0; q < 24; q++) acc[q] = ((float)0.0);
                for (int64_t i4 = 0; i4 < 3; i4++) {
                    for (int64_t i5 = 0; i5 < 3; i5++) {
                        for (int64_t i6 = 0; i6 < 3; i6++) {
                            float t0 = p2[((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6)];
                            float t1 = p2[(((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 27)];
                            float t2 = p2[(((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 54)];
                            float t3 = p2[(((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 81)];
                            #pragma omp simd
                            for (int64_t i3 = 0; i3 < 6; i3++) {
                                float t4 = ((((0 <= ((i2 + i5) - 1)) & (((i2 + i5) - 1) < 6)) & ((0 <= ((i3 + i6) - 1)) & (((i3 + i6) - 1) < 6))) ? p1[(((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)] : 0);
                                acc[i3] = fmaf(t4, t0, acc[i3]);
                                acc[(i3 + 6)] = fmaf(t4, t1, acc[(i3 + 6)]);
                                acc[(i3 + 12)] = fmaf(t4, t2, acc[(i3 + 12)]);
                                acc[(i3 + 18)] = fmaf(t4, t3, acc[(i3 + 18)]);
                            }
                        }
                    }
                }
                for (int64_t i7 = 0; i7 < 4; i7++) {
                    #pragma omp simd
                    for (int64_t i3 = 0; i3 < 6; i3++) {
                        float t5 = p3[((i1 * 4) + i7)];
                        float t6 = (acc[(i3 + (i7 * 6))] + t5);
                        uint8_t t7 = (((float)0.0) < t6);
                        uint8_t t8 = (t6 != t6);
                        uint8_t t9 = (t7 | t8);
                        float t10 = (t9 ? t6 : ((float)0.0));
                        p0[(((((i0 * 144) + (i1 * 144)) + (i2 * 6)) + i3) + (i7 * 36))] = t10;
                    }
                }
            }
        }
    }
}

