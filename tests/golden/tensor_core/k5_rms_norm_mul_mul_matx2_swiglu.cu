// plan kernel k5: rms_norm+mul+mul_mat×2+swiglu ffn_swiglu-0 (nodes norm-ffn_norm-0, ffn_norm-0, ffn_gate-0, ffn_up-0, ffn_swiglu-0)
KERNEL(k5_rms_norm_mul_mul_matx2_swiglu, 128) {
    const i32 lane = TX % 32; const i32 warp = TX / 32; const i32 g = lane / 4; const i32 t = lane % 4;
    const i32 r0 = BX * 64; const i32 c0 = BY * 16;
    const i32 wr = warp % 4; const i32 wc = warp / 4;
    SHARED float nsc[16];
    for (i32 c = warp; c < 16; c += 4) {
        const i32 n = c0 + c;
        float s = 0.0f;
        if (n < 16) { for (i32 k = lane; k < 256; k += 32) { const float v = *(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u); s += v * v; } }
        s = warp_sum(s);
        if (lane == 0) nsc[c] = 1.0f / sqrtf(s / 256.0f + 1e-5f);
    }
    SYNC();
    SHARED float xs[16 * 36];
    SHARED float ws[128 * 36];
    const i32 m0 = r0;
    float acc[2][4];
    UNROLL for (i32 j = 0; j < 2; ++j) { acc[j][0] = 0.0f; acc[j][1] = 0.0f; acc[j][2] = 0.0f; acc[j][3] = 0.0f; }
    float accu[2][4];
    UNROLL for (i32 j = 0; j < 2; ++j) { accu[j][0] = 0.0f; accu[j][1] = 0.0f; accu[j][2] = 0.0f; accu[j][3] = 0.0f; }
    for (i32 k0 = 0; k0 < 256; k0 += 32) {
        for (i32 e = TX; e < 32 * 16; e += 128) { const i32 c = e / 32; const i32 kk = e % 32; const i32 k = k0 + kk; const i32 n = c0 + c; xs[c * 36 + kk] = TO_TF32((*(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u) * nsc[n - c0]) * *(const GMEM float*)(wts + ops.at[4] + (u64)(k) * 4u)); }
        for (i32 e = TX; e < 512; e += 128) {
            const i32 r = e / 4; const i32 kq = (e % 4) * 8;
            if (r < 64) { const i32 m = m0 + r; { const GMEM u8* wb = (wts + ops.at[1] + (u64)(k0 + kq) / 32 * 18u + (u64)(m) * 144u); const i32 wi = (k0 + kq) % 32; UNROLL for (i32 j = 0; j < 8; ++j) ws[r * 36 + kq + j] = TO_TF32(dq_Q4_0(wb, wi + j)); } }
            else { const i32 m = m0 + r - 64; { const GMEM u8* wb = (wts + ops.at[2] + (u64)(k0 + kq) / 32 * 18u + (u64)(m) * 144u); const i32 wi = (k0 + kq) % 32; UNROLL for (i32 j = 0; j < 8; ++j) ws[r * 36 + kq + j] = TO_TF32(dq_Q4_0(wb, wi + j)); } }
        }
        SYNC();
        UNROLL for (i32 ks = 0; ks < 32; ks += 8) {
            const i32 ra = (wr * 16 + g) * 36 + ks + t;
            const float a[4] = { ws[ra], ws[ra + 288], ws[ra + 4], ws[ra + 288 + 4] };
            const float au[4] = { ws[ra + 2304], ws[ra + 2304 + 288], ws[ra + 2304 + 4], ws[ra + 2304 + 288 + 4] };
            UNROLL for (i32 j = 0; j < 2; ++j) {
                const i32 rb = (wc * 16 + j * 8 + g) * 36 + ks + t;
                const float bb[2] = { xs[rb], xs[rb + 4] };
                MMA_TF32(acc[j], a, bb); MMA_TF32(accu[j], au, bb);
            }
        }
        SYNC();
    }
    {
        UNROLL for (i32 j = 0; j < 2; ++j) UNROLL for (i32 e = 0; e < 4; ++e) {
            const i32 i0 = m0 + wr * 16 + g + (e / 2) * 8; const i32 i1 = c0 + wc * 16 + j * 8 + 2 * t + e % 2; const i32 i2 = 0; const i32 i3 = 0;
            { *(GMEM float*)(arena + ops.at[3] + (u64)(i0) * 4u + (u64)(i1) * 2048u) = (acc[j][e] / (1.0f + expf(-acc[j][e]))) * accu[j][e]; }
        }
    }
}
