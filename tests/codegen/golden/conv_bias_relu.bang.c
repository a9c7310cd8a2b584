/* r_2x4x6x6_490ad996: 64 lanes per tile; NRAM use 1608 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void r_2x4x6x6_490ad996_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    const float *p2 = (const float *)args[2];
    const float *p3 = (const float *)args[3];
    __nram__ float acc[144] __attribute__((aligned(64)));
    __nram__ float nram1[TILE] __attribute__((aligned(64)));
    __nram__ float nram2[TILE] __attribute__((aligned(64)));
    __nram__ float slot3[1] __attribute__((aligned(64)));
    __nram__ float nram4[TILE] __attribute__((aligned(64)));
    __nram__ float nram5[TILE] __attribute__((aligned(64)));
    __nram__ float slot6[1] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 2; i0++) {
            __bang_write_value(acc, 144, ((float)0.0));
            for (int64_t i4 = 0; i4 < 3; i4++) {
                for (int64_t i5 = 0; i5 < 3; i5++) {
                    for (int64_t i6 = 0; i6 < 3; i6++) {
                        for (int64_t i1 = 0; i1 < 4; i1++) {
                            for (int64_t i2 = 0; i2 < 6; i2++) {
                                for (int64_t i3 = 0; i3 < 6; i3 += TILE) {
                                    const int64_t lanes = MG_MIN(TILE, 6 - i3);
                                    __bang_write_zero(nram2, lanes);
                                    { const int64_t lo = MG_MAX(0, mg_floordiv(((0 - ((i3 + i6) - 1)) - 1), 1) + 1), hi = MG_MIN((((((i2 + i5) - 1) - 6)) < 0 ? ((((0 - ((i2 + i5) - 1)) - 1)) < 0 ? lanes : 0) : 0), mg_floordiv(-((((i3 + i6) - 1) - 6)) - 1, 1) + 1);
                                        if (hi > lo)
                                        __memcpy(nram2 + lo, p1 + ((((((((i0 * 108) + (i2 * 6)) + i3) + (i4 * 36)) + (i5 * 6)) + i6) - 7)) + 1 * lo, (hi - lo) * sizeof(float), GDRAM2NRAM);
                                    }
                                    __memcpy(slot3, p2 + ((((i1 * 27) + (i4 * 9)) + (i5 * 3)) + i6), sizeof(float), GDRAM2NRAM);
                                    float t0 = slot3[0];
                                    __bang_mul_scalar(nram1, nram2, t0, lanes);
                                    __bang_add(acc + (((i1 * 36) + (i2 * 6)) + i3), acc + (((i1 * 36) + (i2 * 6)) + i3), nram1, lanes);
                                }
                            }
                        }
                    }
                }
            }
            for (int64_t i1 = 0; i1 < 4; i1++) {
                for (int64_t i2 = 0; i2 < 6; i2++) {
                    for (int64_t i3 = 0; i3 < 6; i3 += TILE) {
                        const int64_t lanes = MG_MIN(TILE, 6 - i3);
                        __memcpy(slot6, p3 + i1, sizeof(float), GDRAM2NRAM);
                        float t1 = slot6[0];
                        __bang_add_scalar(nram5, (acc + (((i1 * 36) + (i2 * 6)) + i3)), t1, lanes);
                        __bang_active_relu(nram4, nram5, lanes);
                        __memcpy(p0 + (((((i0 * 144) + (i1 * 36)) + (i2 * 6)) + i3)), nram4, lanes * sizeof(float), NRAM2GDRAM);
                    }
                }
            }
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(r_2x4x6x6_490ad996)
