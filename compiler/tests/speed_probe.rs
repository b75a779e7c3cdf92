use std::time::Instant;
#[test]
fn kernels() {
    use ir::ggml::*;
    let k = 576usize;
    let rows = 2000usize;
    for t in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K] {
        let k = if t == GgmlType::Q4_K { 512 } else { k };
        let rb = t.row_size(k as u64).unwrap() as usize;
        let x: Vec<f32> = (0..k*rows).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut w = vec![0u8; rb * rows];
        // quantize weights via Q8 path isn't available for Q4; use random bytes with sane scales
        for (i, b) in w.iter_mut().enumerate() { *b = (i * 31 % 251) as u8; }
        for r in 0..rows*rb/t.type_size() { let o = r * t.type_size(); w[o] = 0; w[o+1] = 0x3c; if t==GgmlType::Q4_1 || t == GgmlType::Q4_K { w[o+2]=0; w[o+3]=0x3c; } }
        let mut buf = vec![0f32; k];
        let t0 = Instant::now();
        for r in 0..rows { dequantize(t, &w[r*rb..(r+1)*rb], &mut buf).unwrap(); }
        let dq = t0.elapsed().as_secs_f64() / (rows * k) as f64 * 1e9;
        let vdt = vec_dot_type(t).unwrap();
        let ab = vdt.row_size(k as u64).unwrap() as usize;
        let mut act = vec![0u8; ab];
        quantize(vdt, &x[..k], &mut act, Q8Flavor::X86).unwrap();
        let t0 = Instant::now();
        let mut s = 0.0;
        for r in 0..rows { s += vec_dot(t, &w[r*rb..(r+1)*rb], &act).unwrap(); }
        let vd = t0.elapsed().as_secs_f64() / (rows * k) as f64 * 1e9;
        let t0 = Instant::now();
        for r in 0..rows { quantize(vdt, &x[r*k..(r+1)*k], &mut act, Q8Flavor::X86).unwrap(); }
        let q = t0.elapsed().as_secs_f64() / (rows * k) as f64 * 1e9;
        eprintln!("{t}: dequant {dq:.2} ns/val, vec_dot {vd:.2} ns/val, quantize {q:.2} ns/val ({s})");
    }
}
