/* r_4x9_89499145: 64 lanes per tile; NRAM use 552 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void r_4x9_89499145_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    const float *p2 = (const float *)args[2];
    __nram__ float acc[9] __attribute__((aligned(64)));
    __nram__ float nram1[TILE] __attribute__((aligned(64)));
    __nram__ float slot2[1] __attribute__((aligned(64)));
    __nram__ float nram3[TILE] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 4; i0++) {
            __bang_write_value(acc, 9, ((float)0.0));
            for (int64_t i2 = 0; i2 < 6; i2++) {
                for (int64_t i1 = 0; i1 < 9; i1 += TILE) {
                    const int64_t lanes = MG_MIN(TILE, 9 - i1);
                    __memcpy(slot2, p1 + ((i0 * 6) + i2), sizeof(float), GDRAM2NRAM);
                    float t0 = slot2[0];
                    __memcpy(nram3, p2 + ((i1 + (i2 * 9))), lanes * sizeof(float), GDRAM2NRAM);
                    __bang_mul_scalar(nram1, nram3, t0, lanes);
                    __bang_add(acc + i1, acc + i1, nram1, lanes);
                }
            }
            for (int64_t i1 = 0; i1 < 9; i1 += TILE) {
                const int64_t lanes = MG_MIN(TILE, 9 - i1);
                __memcpy(p0 + (((i0 * 9) + i1)), (acc + i1), lanes * sizeof(float), NRAM2GDRAM);
            }
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(r_4x9_89499145)
