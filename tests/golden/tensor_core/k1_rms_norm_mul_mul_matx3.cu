// plan kernel k1: rms_norm+mul+mul_mat×3 Qcur-0,Kcur-0,Vcur-0 (nodes norm-attn_norm-0, attn_norm-0, Qcur-0, Kcur-0, Vcur-0)
KERNEL(k1_rms_norm_mul_mul_matx3, 128) {
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
    SHARED float ws[64 * 36];
    i32 mat = 0; i32 m0 = r0;
    if (r0 >= 256) { mat = 1; m0 = r0 - 256; }
    if (r0 >= 384) { mat = 2; m0 = r0 - 384; }
    float acc[2][4];
    UNROLL for (i32 j = 0; j < 2; ++j) { acc[j][0] = 0.0f; acc[j][1] = 0.0f; acc[j][2] = 0.0f; acc[j][3] = 0.0f; }
    for (i32 k0 = 0; k0 < 256; k0 += 32) {
        for (i32 e = TX; e < 32 * 16; e += 128) { const i32 c = e / 32; const i32 kk = e % 32; const i32 k = k0 + kk; const i32 n = c0 + c; xs[c * 36 + kk] = TO_TF32((*(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u) * nsc[n - c0]) * *(const GMEM float*)(wts + ops.at[7] + (u64)(k) * 4u)); }
        for (i32 e = TX; e < 256; e += 128) {
            const i32 r = e / 4; const i32 kq = (e % 4) * 8;
            const i32 m = m0 + r;
            if (mat == 0 || mat == 1 || mat == 2) { const u64 wat = mat == 0 ? ops.at[1] : mat == 1 ? ops.at[2] : ops.at[3]; { const GMEM u8* wb = (wts + wat + (u64)(k0 + kq) / 32 * 18u + (u64)(m) * 144u); const i32 wi = (k0 + kq) % 32; UNROLL for (i32 j = 0; j < 8; ++j) ws[r * 36 + kq + j] = TO_TF32(dq_Q4_0(wb, wi + j)); } }
        }
        SYNC();
        UNROLL for (i32 ks = 0; ks < 32; ks += 8) {
            const i32 ra = (wr * 16 + g) * 36 + ks + t;
            const float a[4] = { ws[ra], ws[ra + 288], ws[ra + 4], ws[ra + 288 + 4] };
            UNROLL for (i32 j = 0; j < 2; ++j) {
                const i32 rb = (wc * 16 + j * 8 + g) * 36 + ks + t;
                const float bb[2] = { xs[rb], xs[rb + 4] };
                MMA_TF32(acc[j], a, bb);
            }
        }
        SYNC();
    }
    if (mat == 0) {
        UNROLL for (i32 j = 0; j < 2; ++j) UNROLL for (i32 e = 0; e < 4; ++e) {
            const i32 i0 = m0 + wr * 16 + g + (e / 2) * 8; const i32 i1 = c0 + wc * 16 + j * 8 + 2 * t + e % 2; const i32 i2 = 0; const i32 i3 = 0;
            { *(GMEM float*)(arena + ops.at[4] + (u64)(i0) * 4u + (u64)(i1) * 1024u) = acc[j][e]; }
        }
    }
    if (mat == 1) {
        UNROLL for (i32 j = 0; j < 2; ++j) UNROLL for (i32 e = 0; e < 4; ++e) {
            const i32 i0 = m0 + wr * 16 + g + (e / 2) * 8; const i32 i1 = c0 + wc * 16 + j * 8 + 2 * t + e % 2; const i32 i2 = 0; const i32 i3 = 0;
            { *(GMEM float*)(arena + ops.at[5] + (u64)(i0) * 4u + (u64)(i1) * 512u) = acc[j][e]; }
        }
    }
    if (mat == 2) {
        UNROLL for (i32 j = 0; j < 2; ++j) UNROLL for (i32 e = 0; e < 4; ++e) {
            const i32 i0 = m0 + wr * 16 + g + (e / 2) * 8; const i32 i1 = c0 + wc * 16 + j * 8 + 2 * t + e % 2; const i32 i2 = 0; const i32 i3 = 0;
            { *(GMEM float*)(arena + ops.at[6] + (u64)(i0) * 4u + (u64)(i1) * 512u) = acc[j][e]; }
        }
    }
}
