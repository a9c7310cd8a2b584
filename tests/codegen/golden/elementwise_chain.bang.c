/* e_64_040bb5aa: 64 lanes per tile; NRAM use 4480 of 524288 bytes */
#define TILE 64
__mlu_entry__ static void e_64_040bb5aa_entry(char **args, int64_t *err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    __nram__ float nram0[TILE] __attribute__((aligned(64)));
    __nram__ float nram1[TILE] __attribute__((aligned(64)));
    __nram__ float nram2[TILE] __attribute__((aligned(64)));
    __nram__ float nram3[TILE] __attribute__((aligned(64)));
    __nram__ float nram4[TILE] __attribute__((aligned(64)));
    __nram__ float nram5[TILE] __attribute__((aligned(64)));
    __nram__ uint8_t nram6[TILE] __attribute__((aligned(64)));
    __nram__ float nram7[TILE] __attribute__((aligned(64)));
    __nram__ float nram8[TILE] __attribute__((aligned(64)));
    __nram__ float nram9[TILE] __attribute__((aligned(64)));
    __nram__ float nram10[TILE] __attribute__((aligned(64)));
    __nram__ float nram11[TILE] __attribute__((aligned(64)));
    __nram__ float nram12[TILE] __attribute__((aligned(64)));
    __nram__ uint8_t nram13[TILE] __attribute__((aligned(64)));
    __nram__ float nram14[TILE] __attribute__((aligned(64)));
    __nram__ float nram15[TILE] __attribute__((aligned(64)));
    __nram__ float nram16[TILE] __attribute__((aligned(64)));
    __nram__ float nram17[TILE] __attribute__((aligned(64)));
    __nram__ float nram18[TILE] __attribute__((aligned(64)));
    if (taskId == 0) {
        for (int64_t i0 = 0; i0 < 64; i0 += TILE) {
            const int64_t lanes = MG_MIN(TILE, 64 - i0);
            __memcpy(nram4, p1 + (i0), lanes * sizeof(float), GDRAM2NRAM);
            __bang_mul_scalar(nram3, nram4, ((float)1.5), lanes);
            __bang_add_scalar(nram2, nram3, ((float)0.5), lanes);
            __bang_active_relu(nram1, nram2, lanes);
            __bang_write_value(nram7, lanes, (float)((float)0.0));
            __bang_lt(nram6, nram4, nram7, lanes);
            __bang_lt(nram13, nram4, nram7, lanes);
            __bang_neg(nram14, nram4, lanes);
            __bang_select(nram12, nram13, nram14, nram4, lanes);
            __bang_neg(nram11, nram12, lanes);
            __bang_mul_scalar(nram10, nram11, ((float)1.4426950408889634), lanes);
            __bang_active_exp2(nram9, nram10, lanes);
            __bang_add_scalar(nram16, nram9, ((float)1.0), lanes);
            __bang_active_recip(nram15, nram16, lanes);
            __bang_mul(nram8, nram9, nram15, lanes);
            __bang_add_scalar(nram18, nram9, ((float)1.0), lanes);
            __bang_active_recip(nram17, nram18, lanes);
            __bang_select(nram5, nram6, nram8, nram17, lanes);
            __bang_mul(nram0, nram1, nram5, lanes);
            __memcpy(p0 + (i0), nram0, lanes * sizeof(float), NRAM2GDRAM);
        }
    }
}
#undef TILE
MG_BANG_LAUNCH(e_64_040bb5aa)
