/* r_8_53e1f804: 64 lanes per tile; NRAM use 264 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void r_8_53e1f804_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    __nram__ float nram0[TILE] __attribute__((aligned(64)));
    __nram__ float slot1[1] __attribute__((aligned(64)));
    __nram__ float slot2[1] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 8; i0++) {
            float acc = ((float)0.0);
            for (int64_t i1 = 0; i1 < 33; i1 += TILE) {
                const int64_t lanes = MG_MIN(TILE, 33 - i1);
                __memcpy(nram0, p1 + (((i0 * 33) + i1)), lanes * sizeof(float), GDRAM2NRAM);
                __bang_reduce_sum(slot1, nram0, lanes);
                acc += slot1[0];
            }
            slot2[0] = acc;
            __memcpy(p0 + i0, slot2, sizeof(float), NRAM2GDRAM);
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(r_8_53e1f804)
