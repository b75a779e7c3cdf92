// plan kernel k4: mul_mat+add ffn_inp-0 (nodes attn_out-0, ffn_inp-0)
KERNEL(k4_mul_mat_add, 128) {
    const i32 lane = TX % 32; const i32 warp = TX / 32;
    const i32 gr = BX * 4 + warp;
    if (gr >= 256) return;
    {
        const i32 m = gr - 0;
        for (i32 c0 = 0; c0 < 8; c0 += 8) {
            float acc[8];
            UNROLL for (i32 c = 0; c < 8; ++c) acc[c] = 0.0f;
            for (i32 k0 = lane * 8; k0 < 256; k0 += 256) {
                const GMEM u8* wb = (wts + ops.at[1] + (u64)(k0) / 32 * 18u + (u64)(m) * 144u); const i32 wi = k0 % 32;
                float w[8];
                UNROLL for (i32 j = 0; j < 8; ++j) w[j] = dq_Q4_0(wb, wi + j);
                UNROLL for (i32 c = 0; c < 8; ++c) {
                    {
                        const i32 n = c0 + c;
                        UNROLL for (i32 j = 0; j < 8; ++j) {
                            const i32 k = k0 + j;
                            const float xv = *(const GMEM float*)(arena + ops.at[0] + (u64)(k) * 4u + (u64)(n) * 1024u);
                            acc[c] += w[j] * xv;
                        }
                    }
                }
            }
            UNROLL for (i32 c = 0; c < 8; ++c) acc[c] = warp_sum(acc[c]);
            UNROLL for (i32 c = 0; c < 8; ++c) {
                if (lane == c) {
                    const i32 i0 = m; const i32 i1 = c0 + c; const i32 i2 = 0; const i32 i3 = 0;
                    *(GMEM float*)(arena + ops.at[2] + (u64)(i0) * 4u + (u64)(i1) * 1024u) = acc[c] + *(const GMEM float*)(arena + ops.at[2] + (u64)(i0) * 4u + (u64)(i1) * 1024u);
                }
            }
        }
    }
}
