#[test]
fn half_rounding() {
    use ir::ggml::{f16_to_f32, f32_to_f16};
    // Reference: enumerate all f16 values, find nearest (ties to even) for each input.
    let vals: Vec<(f32, u16)> = (0u16..0x7c00).map(|b| (f16_to_f32(b), b)).collect();
    let mut bad = 0;
    let mut x = 1e-9f32;
    let mut n = 0;
    while x < 70000.0 {
        for &s in &[1.0f32, -1.0] {
            let v = x * s;
            let got = f32_to_f16(v);
            // nearest by binary search
            let a = v.abs() as f64;
            let i = vals.partition_point(|(f, _)| (*f as f64) < a);
            let cand: Vec<(f64, u16)> = [i.saturating_sub(1), i.min(vals.len()-1)].iter().map(|&k| ((vals[k].0 as f64 - a).abs(), vals[k].1)).collect();
            let want = if cand[0].0 < cand[1].0 { cand[0].1 } else if cand[1].0 < cand[0].0 { cand[1].1 } else if cand[0].1 % 2 == 0 { cand[0].1 } else { cand[1].1 };
            let want = if a > 65519.0 { 0x7c00 } else { want } | if s < 0.0 { 0x8000 } else { 0 };
            if got != want { bad += 1; if bad < 5 { eprintln!("{v:e}: got {got:#06x} want {want:#06x}"); } }
            n += 1;
        }
        x *= 1.0001373;
    }
    eprintln!("checked {n}, bad {bad}");
    assert_eq!(bad, 0);
}
