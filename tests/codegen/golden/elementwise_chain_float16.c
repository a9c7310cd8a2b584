void e_64_04e30e71(char **restrict args, int64_t *restrict err) {
    uint16_t *p0 = (uint16_t *)args[0];
    const uint16_t *p1 = (const uint16_t *)args[1];
    const uint16_t *p2 = (const uint16_t *)args[2];
    for (int64_t i0 = 0; i0 < 64; i0++) {
        float t0 = mg_f16_to_f32(p1[i0]);
        float t1 = (t0 * ((float)1.5));
        float t2 = mg_round_f16(t1);
        float t3 = (t2 + ((float)0.5));
        float t4 = mg_round_f16(t3);
        uint8_t t5 = (((float)0.0) < t4);
        float t6 = mg_round_f16(t3);
        float t7 = mg_round_f16(t3);
        uint8_t t8 = (t6 != t7);
        uint8_t t9 = (t5 | t8);
        float t10 = mg_round_f16(t3);
        float t11 = (t9 ? t10 : ((float)0.0));
        float t12 = mg_round_f16(t11);
        float t13 = mg_f16_to_f32(p2[i0]);
        uint8_t t14 = (t13 < ((float)0.0));
        float t15 = mg_f16_to_f32(p2[i0]);
        uint8_t t16 = (t15 < ((float)0.0));
        float t17 = mg_f16_to_f32(p2[i0]);
        float t18 = (-t17);
        float t19 = mg_round_f16(t18);
        float t20 = mg_f16_to_f32(p2[i0]);
        float t21 = (t16 ? t19 : t20);
        float t22 = mg_round_f16(t21);
        float t23 = (-t22);
        float t24 = mg_round_f16(t23);
        float t25 = (t24 * ((float)1.4423828125));
        float t26 = mg_round_f16(t25);
        float t27 = mg_exp2f(t26);
        float t28 = mg_round_f16(t27);
        float t29 = mg_round_f16(t27);
        float t30 = (t29 + ((float)1.0));
        float t31 = mg_round_f16(t30);
        float t32 = (((float)1.0) / t31);
        float t33 = mg_round_f16(t32);
        float t34 = (t28 * t33);
        float t35 = mg_round_f16(t34);
        float t36 = mg_round_f16(t27);
        float t37 = (t36 + ((float)1.0));
        float t38 = mg_round_f16(t37);
        float t39 = (((float)1.0) / t38);
        float t40 = mg_round_f16(t39);
        float t41 = (t14 ? t35 : t40);
        float t42 = mg_round_f16(t41);
        float t43 = (t12 * t42);
        p0[i0] = mg_f32_to_f16(t43);
    }
}

