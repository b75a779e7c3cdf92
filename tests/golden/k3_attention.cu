// plan kernel k3: attention kqv-0 (nodes kqv-0)
KERNEL(k3_attention, 128) {
    SHARED float sm[4];
    SHARED float sl[4];
    SHARED float sacc[4 * 64];
    const i32 h = BX; const i32 t = BY; const i32 lane = TX % 32; const i32 warp = TX / 32;
    const i32 kvh = h / 2;
    i32 hi = *(const GMEM i32*)(arena + ops.at[3] + (u64)(t) * 4u) + 1;
    hi = hi > 64 ? 64 : hi;
    i32 lo = 0;
    lo = lo < 0 ? 0 : (lo > hi ? hi : lo);
    float q[2];
    UNROLL for (i32 j = 0; j < 2; ++j) { const i32 e = lane + 32 * j; q[j] = e < 64 ? *(const GMEM float*)(arena + ops.at[0] + (u64)(e) * 4u + (u64)(h) * 256u + (u64)(t) * 1024u) : 0.0f; }
    float m = AS_FLOAT(0xff800000u);
    float l = 0.0f;
    float o[2];
    UNROLL for (i32 j = 0; j < 2; ++j) o[j] = 0.0f;
    for (i32 c = lo + warp; c < hi; c += 4) {
        float s = 0.0f;
        UNROLL for (i32 j = 0; j < 2; ++j) { const i32 e = lane + 32 * j; if (e < 64) s += q[j] * F16_TO_F32(*(const GMEM u16*)(kv + ops.at[1] + (u64)(e) * 2u + (u64)(kvh) * 128u + (u64)(c) * 256u)); }
        s = warp_sum(s);
        s = s * 0.125f;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);
        const float pr = expf(s - mn);
        l = l * corr + pr;
        UNROLL for (i32 j = 0; j < 2; ++j) { const i32 e = lane + 32 * j; if (e < 64) o[j] = o[j] * corr + pr * F16_TO_F32(*(const GMEM u16*)(kv + ops.at[2] + (u64)(e) * 2u + (u64)(kvh) * 128u + (u64)(c) * 256u)); }
        m = mn;
    }
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    UNROLL for (i32 j = 0; j < 2; ++j) { const i32 e = lane + 32 * j; if (e < 64) sacc[warp * 64 + e] = o[j]; }
    SYNC();
    if (warp != 0) return;
    float mx = sm[0];
    for (i32 w = 1; w < 4; ++w) mx = fmaxf(mx, sm[w]);
    float wt[4];
    float lt = 0.0f;
    UNROLL for (i32 w = 0; w < 4; ++w) { wt[w] = sl[w] > 0.0f ? expf(sm[w] - mx) : 0.0f; lt += sl[w] * wt[w]; }
    for (i32 e = lane; e < 64; e += 32) {
        float a = 0.0f;
        UNROLL for (i32 w = 0; w < 4; ++w) a += sacc[w * 64 + e] * wt[w];
        const float y = lt > 0.0f ? a / lt : 0.0f;
        *(GMEM float*)(arena + ops.at[4] + (u64)(e) * 4u + (u64)(h) * 256u + (u64)(t) * 1024u) = y;
    }
}
