// plan kernel k0: get_rows inp_embd (nodes inp_embd)
KERNEL(s8x1_k0_get_rows, 256) {
    const i32 idx = BX * 256 + TX;
    if (idx >= 2048) return;
    const i32 i0 = idx % 256; const i32 i1 = idx / 256;
    const i32 id = *(const GMEM i32*)(arena + ops.at[1] + (u64)(i1) * 4u);
    const i32 row = id < 0 ? 0 : (id > 1023 ? 1023 : id);
    const float x = dq_Q4_0(wts + ops.at[0] + (u64)(i0) / 32 * 18u + (u64)(row) * 144u, (i0) % 32);
    *(GMEM float*)(arena + ops.at[2] + (u64)(i0) * 4u + (u64)(i1) * 1024u) = x;
}
