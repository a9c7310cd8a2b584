void e_64_040bb5aa(char **restrict args, int64_t *restrict err) {
    float *p0 = (float *)args[0];
    const float *p1 = (const float *)args[1];
    for (int64_t i0 = 0; i0 < 64; i0++) {
        float t0 = p1[i0];
        float t1 = (t0 * ((float)1.5));
        float t2 = (t1 + ((float)0.5));
        uint8_t t3 = (((float)0.0) < t2);
        uint8_t t4 = (t2 != t2);
        uint8_t t5 = (t3 | t4);
        float t6 = (t5 ? t2 : ((float)0.0));
        uint8_t t7 = (t0 < ((float)0.0));
        uint8_t t8 = (t0 < ((float)0.0));
        float t9 = (-t0);
        float t10 = (t8 ? t9 : t0);
        float t11 = (-t10);
        float t12 = (t11 * ((float)1.4426950408889634));
        float t13 = mg_exp2f(t12);
        float t14 = (t13 + ((float)1.0));
        float t15 = (((float)1.0) / t14);
        float t16 = (t13 * t15);
        float t17 = (t13 + ((float)1.0));
        float t18 = (((float)1.0) / t17);
        float t19 = (t7 ? t16 : t18);
        float t20 = (t6 * t19);
        p0[i0] = t20;
    }
}

