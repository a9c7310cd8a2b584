/* r_2x4x6x6_17753bab: 64 lanes per tile; NRAM use 2676 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void r_2x4x6x6_17753bab_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    const float *p2 = (const float *)args[2];
    const float *p3 = (const float *)args[3];
    __nram__ float acc[24] __attribute__((aligned(64)));
    __nram__ float nram1[TILE] __attribute__((aligned(64)));
    __nram__ float nram2[TILE] __attribute__((aligned(64)));
    __nram__ float slot3[1] __attribute__((aligned(64)));
    __nram__ float nram4[TILE] __attribute__((aligned(64)));
    __nram__ float nram5[TILE] __attribute__((aligned(64)));
    __nram__ float slot6[1] __attribute__((aligned(64)));
    __nram__ float nram7[TILE] __attribute__((aligned(64)));
    __nram__ float nram8[TILE] __attribute__((aligned(64)));
    __nram__ float slot9[1] __attribute__((aligned(64)));
    __nram__ float nram10[TILE] __attribute__((aligned(64)));
    __nram__ float nram11[TILE] __attribute__((aligned(64)));
    __nram__ float slot12[1] __attribute__((aligned(64)));
    __nram__ float nram13[TILE] __attribute__((aligned(64)));
    __nram__ float nram14[TILE] __attribute__((aligned(64)));
    __nram__ float slot15[1] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 2; i0++) {
            for (int64_t i1 = 0; i1 < 1; i1++) {
                for (int64_t i2 = 0; i2 < 6; i2++) {
                    __bang_write_value(acc, 24, ((float)0.0));
                    for (int64_t i4 = 0; i4 < 3; i4++) {
                        for (int64_t i5 = 0; i5 < 3; i5++) {
                            for (int64_t i6 = 0; i6 < 3; i6++) {
                                for (int64_t i3 = 0; i3 < 6; i3 += TILE) {
                                    const int64_t lanes = MG_MIN(TILE, 6 - i3);
                                    __bang_write_zero(nram2, lanes);
                                    { const int64_t lo = ((0) > ((((i3 * -1) - i6) + 1)) ? (0) : ((((i3 * -1) - i6) + 1))), hi = MG_MAX(lo, ((((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) < ((((i3 * -1) - i6) + 7)) ? (((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) : ((((i3 * -1) - i6) + 7))));
                                        if (hi > lo) __memcpy(nram2 + lo, p1 + ((((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)) + 1 * lo, (hi - lo) * sizeof(float), GDRAM2NRAM);
                                    }
                                    __memcpy(slot3, p2 + ((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6), sizeof(float), GDRAM2NRAM);
                                    float t0 = slot3[0];
                                    __bang_mul_scalar(nram1, nram2, t0, lanes);
                                    __bang_add(acc + i3, acc + i3, nram1, lanes);
                                    __bang_write_zero(nram5, lanes);
                                    { const int64_t lo = ((0) > ((((i3 * -1) - i6) + 1)) ? (0) : ((((i3 * -1) - i6) + 1))), hi = MG_MAX(lo, ((((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) < ((((i3 * -1) - i6) + 7)) ? (((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) : ((((i3 * -1) - i6) + 7))));
                                        if (hi > lo) __memcpy(nram5 + lo, p1 + ((((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)) + 1 * lo, (hi - lo) * sizeof(float), GDRAM2NRAM);
                                    }
                                    __memcpy(slot6, p2 + (((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 27), sizeof(float), GDRAM2NRAM);
                                    float t1 = slot6[0];
                                    __bang_mul_scalar(nram4, nram5, t1, lanes);
                                    __bang_add(acc + (i3 + 6), acc + (i3 + 6), nram4, lanes);
                                    __bang_write_zero(nram8, lanes);
                                    { const int64_t lo = ((0) > ((((i3 * -1) - i6) + 1)) ? (0) : ((((i3 * -1) - i6) + 1))), hi = MG_MAX(lo, ((((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) < ((((i3 * -1) - i6) + 7)) ? (((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) : ((((i3 * -1) - i6) + 7))));
                                        if (hi > lo) __memcpy(nram8 + lo, p1 + ((((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)) + 1 * lo, (hi - lo) * sizeof(float), GDRAM2NRAM);
                                    }
                                    __memcpy(slot9, p2 + (((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 54), sizeof(float), GDRAM2NRAM);
                                    float t2 = slot9[0];
                                    __bang_mul_scalar(nram7, nram8, t2, lanes);
                                    __bang_add(acc + (i3 + 12), acc + (i3 + 12), nram7, lanes);
                                    __bang_write_zero(nram11, lanes);
                                    { const int64_t lo = ((0) > ((((i3 * -1) - i6) + 1)) ? (0) : ((((i3 * -1) - i6) + 1))), hi = MG_MAX(lo, ((((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) < ((((i3 * -1) - i6) + 7)) ? (((((i2 + i5) - 7) < 0) ? ((((i2 * -1) - i5) < 0) ? lanes : 0) : 0)) : ((((i3 * -1) - i6) + 7))));
                                        if (hi > lo) __memcpy(nram11 + lo, p1 + ((((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)) + 1 * lo, (hi - lo) * sizeof(float), GDRAM2NRAM);
                                    }
                                    __memcpy(slot12, p2 + (((((i1 * 108) + (i4 * 9)) + (i5 * 3)) + i6) + 81), sizeof(float), GDRAM2NRAM);
                                    float t3 = slot12[0];
                                    __bang_mul_scalar(nram10, nram11, t3, lanes);
                                    __bang_add(acc + (i3 + 18), acc + (i3 + 18), nram10, lanes);
                                }
                            }
                        }
                    }
                    for (int64_t i7 = 0; i7 < 4; i7++) {
                        for (int64_t i3 = 0; i3 < 6; i3 += TILE) {
                            const int64_t lanes = MG_MIN(TILE, 6 - i3);
                            __memcpy(slot15, p3 + ((i1 * 4) + i7), sizeof(float), GDRAM2NRAM);
                            float t4 = slot15[0];
                            __bang_add_scalar(nram14, (acc + (i3 + (i7 * 6))), t4, lanes);
                            __bang_active_relu(nram13, nram14, lanes);
                            __memcpy(p0 + ((((((i0 * 144) + (i1 * 144)) + (i2 * 6)) + i3) + (i7 * 36))), nram13, lanes * sizeof(float), NRAM2GDRAM);
                        }
                    }
                }
            }
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(r_2x4x6x6_17753bab)
