FN i32 s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope_pair(i32 d) {
    if (d >= 64) return d;
    const bool first = (d % 2) == 0;
    return first ? d + 1 : d - 1;
}
FN float s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope(float xd, float xo, i32 d, float pf) {
    if (d >= 64) return xd;
    const i32 i = d / 2; const bool first = (d % 2) == 0;
    float theta = pf;
    for (i32 ii = 0; ii < i; ++ii) theta *= 0.7498942f;
    const float te = theta;
    const float ti = 1.0f * te;
    const float th = ti;
    const float ms = 1.0f;
    const float c = cosf(th) * ms; const float sn = sinf(th) * ms;
    const float x0 = first ? xd : xo; const float x1 = first ? xo : xd;
    return first ? x0 * c - x1 * sn : x0 * sn + x1 * c;
}
// plan kernel k2: rope+kv_store+rope_q+kv_store_v cache_k_store-0 (nodes Qcur_rope-0, Kcur_rope-0, cache_k_store-0, cache_v_store-0)
KERNEL(s8x1_k2_rope_kv_store_rope_q_kv_store_v, 128) {
    const i32 t = BX;
    const i32 p = *(const GMEM i32*)(arena + ops.at[1] + (u64)(t) * 4u);
    const float pf = (float)p;
    SHARED float kx[128];
    for (i32 e = TX; e < 128; e += 128) kx[e] = *(const GMEM float*)(arena + ops.at[0] + (u64)(e % 64) * 4u + (u64)(e / 64) * 256u + (u64)(t) * 512u);
    SHARED float qx[256];
    for (i32 e = TX; e < 256; e += 128) qx[e] = *(const GMEM float*)(arena + ops.at[2] + (u64)(e % 64) * 4u + (u64)(e / 64) * 256u + (u64)(t) * 1024u);
    SHARED float vx[128];
    for (i32 e = TX; e < 128; e += 128) vx[e] = *(const GMEM float*)(arena + ops.at[3] + (u64)(e) * 4u + (u64)(t) * 512u);
    SHARED float kr[128];
    SYNC();
    for (i32 e = TX; e < 128; e += 128) { const i32 d = e % 64; const i32 h0 = e - d; kr[e] = s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope(kx[e], kx[h0 + s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope_pair(d)], d, pf); }
    for (i32 e = TX; e < 256; e += 128) { const i32 d = e % 64; const i32 h0 = e - d; const float y = s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope(qx[e], qx[h0 + s8x1_k2_rope_kv_store_rope_q_kv_store_v_rope_pair(d)], d, pf); *(GMEM float*)(arena + ops.at[2] + (u64)(e % 64) * 4u + (u64)(e / 64) * 256u + (u64)(t) * 1024u) = y; }
    SYNC();
    for (i32 e = TX; e < 128; e += 128) { *(GMEM u16*)(kv + ops.at[4] + (u64)(e) * 2u + (u64)(p) * 256u) = F32_TO_F16(kr[e]); }
    for (i32 e = TX; e < 128; e += 128) { *(GMEM u16*)(kv + ops.at[5] + (u64)(e) * 2u + (u64)(p) * 256u) = F32_TO_F16(vx[e]); }
}
