void e_64_1e4a4486(char **restrict args, int64_t *restrict err) {
    float *restrict p0 = (float *)args[0];
    const float *restrict p1 = (const float *)args[1];
    for (int64_t i0 = 0; i0 < 64; i0++) {
        float t0 = p1[i0];
        float t1 = (t0 * ((float)1.5));
        float t2 = (t1 + ((float)0.5));
        uint8_t t3 = (((float)0.0) < t2);
        float t4 = (t3 ? t2 : ((float)0.0));
        uint8_t t5 = (t0 < ((float)0.0));
        uint8_t t6 = (t0 < ((float)0.0));
        float t7 = (-t0);
        float t8 = (t6 ? t7 : t0);
        float t9 = (-t8);
        float t10 = (t9 * ((float)1.4426950408889634));
        float t11 = mg_exp2f(t10);
        float t12 = (t11 + ((float)1.0));
        float t13 = (((float)1.0) / t12);
        float t14 = (t11 * t13);
        float t15 = (t11 + ((float)1.0));
        float t16 = (((float)1.0) / t15);
        float t17 = (t5 ? t14 : t16);
        float t18 = (t4 * t17);
        p0[i0] = t18;
    }
}

