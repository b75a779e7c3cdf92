// plan kernel k5: rms_norm+mul+mul_mat×2+swiglu ffn_swiglu-0 (nodes norm-ffn_norm-0, ffn_norm-0, ffn_gate-0, ffn_up-0, ffn_swiglu-0)
KERNEL(k5_rms_norm_mul_mul_matx2_swiglu, 128) {
    const i32 lane = TX % 32; const i32 warp = TX / 32;
    SHARED float nsc[8];
    for (i32 n = warp; n < 8; n += 4) {
        float s = 0.0f;
        for (i32 k = lane; k < 256; k += 32) { const float v = *(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u); s += v * v; }
        s = warp_sum(s);
        if (lane == 0) nsc[n] = 1.0f / sqrtf(s / 256.0f + 1e-5f);
    }
    SYNC();
    const i32 gr = BX * 4 + warp;
    if (gr >= 512) return;
    {
        const i32 m = gr - 0;
        for (i32 c0 = 0; c0 < 8; c0 += 8) {
            float acc[8];
            UNROLL for (i32 c = 0; c < 8; ++c) acc[c] = 0.0f;
            float accu[8];
            UNROLL for (i32 c = 0; c < 8; ++c) accu[c] = 0.0f;
            for (i32 k0 = lane * 8; k0 < 256; k0 += 256) {
                const GMEM u8* wb = (wts + ops.at[1] + (u64)(k0) / 32 * 18u + (u64)(m) * 144u); const i32 wi = k0 % 32;
                float w[8];
                UNROLL for (i32 j = 0; j < 8; ++j) w[j] = dq_Q4_0(wb, wi + j);
                const GMEM u8* ub = (wts + ops.at[2] + (u64)(k0) / 32 * 18u + (u64)(m) * 144u); const i32 ui = k0 % 32;
                float u[8];
                UNROLL for (i32 j = 0; j < 8; ++j) u[j] = dq_Q4_0(ub, ui + j);
                UNROLL for (i32 c = 0; c < 8; ++c) {
                    {
                        const i32 n = c0 + c;
                        UNROLL for (i32 j = 0; j < 8; ++j) {
                            const i32 k = k0 + j;
                            const float xv = (*(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u) * nsc[n]) * *(const GMEM float*)(wts + ops.at[4] + (u64)(k) * 4u);
                            acc[c] += w[j] * xv; accu[c] += u[j] * xv;
                        }
                    }
                }
            }
            UNROLL for (i32 c = 0; c < 8; ++c) acc[c] = warp_sum(acc[c]);
            UNROLL for (i32 c = 0; c < 8; ++c) accu[c] = warp_sum(accu[c]);
            UNROLL for (i32 c = 0; c < 8; ++c) {
                if (lane == c) {
                    const i32 i0 = m; const i32 i1 = c0 + c; const i32 i2 = 0; const i32 i3 = 0;
                    *(GMEM float*)(arena + ops.at[3] + (u64)(i0) * 4u + (u64)(i1) * 2048u) = (acc[c] / (1.0f + expf(-acc[c]))) * accu[c];
                }
            }
        }
    }
}
