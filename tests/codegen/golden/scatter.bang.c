/* s_3x3_da08a0a4: 64 lanes per tile; NRAM use 1024 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void s_3x3_da08a0a4_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    __nram__ float nram0[TILE] __attribute__((aligned(64)));
    __nram__ float nram1[TILE] __attribute__((aligned(64)));
    __nram__ int64_t offsets2[TILE] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 3; i0++) {
            for (int64_t i1 = 0; i1 < 3; i1 += TILE) {
                const int64_t lanes = MG_MIN(TILE, 3 - i1);
                __bang_write_value(nram0, lanes, (float)((float)0.0));
                __memcpy(p0 + (((i0 * 3) + i1)), nram0, lanes * sizeof(float), NRAM2GDRAM);
            }
        }
        for (int64_t i0 = 0; i0 < 5; i0++) {
            for (int64_t i1 = 0; i1 < 3; i1 += TILE) {
                const int64_t lanes = MG_MIN(TILE, 3 - i1);
                __memcpy(nram1, p1 + (((i0 * 3) + i1)), lanes * sizeof(float), GDRAM2NRAM);
                for (int64_t lane = 0; lane < lanes; lane++) {
                    const int64_t i1_lane = i1 + lane;
                    offsets2[lane] = (((i0 / 2) * 3) + i1_lane);
                }
                __scatter_add(p0, nram1, offsets2, lanes);
            }
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(s_3x3_da08a0a4)
