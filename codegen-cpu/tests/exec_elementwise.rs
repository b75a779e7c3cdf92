//! The executor's elementwise and row kernels as unfused plan kernels (what other
//! architectures and the last layer's output selection use) against the interpreter, on
//! random rows of SmolLM2's width (576, and 1536 for the GLUs) with 7 tokens.
//!
//! Tolerance: SiLU and softmax use a vectorized `exp` (about 1e-7 relative, as ggml's
//! `ggml_v_expf`); everything else is the interpreter's arithmetic (a norm's f64 sum in
//! another order) and agrees to an ulp.

mod exec_common;

use exec_common::*;
use ir::graph::{DType, Graph, Input, Op, Shape};
use ir::interp::MemWeights;

const N: u64 = 7;

#[test]
fn unfused_ops() {
    let mut g = Graph::new();
    let e = |r: Result<ir::graph::TensorId, ir::graph::GraphError>| r.expect("graph op");
    let x = g.input("x", Input::Data, DType::F32, Shape::new(&[576, N]));
    let y = g.input("y", Input::Data, DType::F32, Shape::new(&[576, N]));
    let bias = g.input("bias", Input::Data, DType::F32, Shape::new(&[576]));
    let gate = g.input("gate", Input::Data, DType::F32, Shape::new(&[1536, N]));
    let up = g.input("up", Input::Data, DType::F32, Shape::new(&[1536, N]));
    let ids = g.input(
        "inp_out_ids",
        Input::OutputIds,
        DType::I32,
        Shape::new(&[N]),
    );
    let outs = [
        e(g.add("add", x, y)),
        e(g.add("add_bias", x, bias)),
        e(g.mul("mul", x, y)),
        e(g.scale("scale", x, 0.37)),
        e(g.silu("silu", x)),
        e(g.gelu("gelu", x)),
        e(g.op("tanh", Op::Tanh, &[x])),
        e(g.softcap("softcap", x, 3.0)),
        e(g.swiglu("swiglu", gate, up)),
        e(g.geglu("geglu", gate, up)),
        e(g.soft_max("soft_max", x, 0.7)),
        e(g.norm("norm", x, 1e-5)),
        e(g.rms_norm("rms_norm", y, 1e-6)),
        e(g.get_rows("sel", x, ids)),
    ];
    let xt = e(g.permute("xt", x, [1, 0, 2, 3]));
    let cont = e(g.cont("cont", xt));
    for t in outs.iter().chain([&cont]) {
        g.mark_output(*t);
    }
    let mut rng = Rng(3);
    let xs = rng.vec(576 * N as usize, -6.0, 6.0);
    let ys = rng.vec(576 * N as usize, -2.0, 2.0);
    let bs = rng.vec(576, -1.0, 1.0);
    let gs = rng.vec(1536 * N as usize, -12.0, 12.0);
    let us = rng.vec(1536 * N as usize, -1.0, 1.0);
    let data = [
        ("x", &xs[..]),
        ("y", &ys[..]),
        ("bias", &bs[..]),
        ("gate", &gs[..]),
        ("up", &us[..]),
    ];
    let pos: Vec<i32> = (0..N as i32).collect();
    let names = [
        "add", "add_bias", "mul", "scale", "silu", "gelu", "tanh", "softcap", "swiglu", "geglu",
        "soft_max", "norm", "rms_norm", "get_rows", "cont",
    ];
    for nt in [1, 2] {
        let plan = plan_of(&[(N as u32, g.clone())]);
        let w = MemWeights::new();
        let mut cpu = codegen_cpu::exec::CompiledPlan::new(&plan, &w, nt).expect("compiles");
        let args = codegen_cpu::exec::StepArgs {
            tokens: &[],
            positions: &pos,
            output_ids: &[5, 2, 6, 0, 0, 1, 3],
            kv_len: N as usize,
            data: &data,
        };
        let mut kv = codegen_cpu::layout::AlignedBuf::zeroed(cpu.kv_layout().stream_bytes as usize);
        cpu.step(kv.as_mut_slice(), N as u32, N as u32, &args)
            .expect("step");
        let mut interp = ir::interp::Interpreter::new(&w, llama_cpp());
        let inputs = ir::interp::Inputs {
            tokens: &[],
            positions: &pos,
            output_ids: &[5, 2, 6, 0, 0, 1, 3],
            kv_len: N,
            data: &data,
        };
        let want = interp.run(&g, &inputs).expect("interpreter");
        for (i, name) in names.iter().enumerate() {
            let got = cpu.output(i).expect("output");
            assert_close(&format!("{name} t={nt}"), &got, &want[i], 2e-6);
        }
        // Bad output rows are refused before anything runs.
        let bad = codegen_cpu::exec::StepArgs {
            output_ids: &[5, 2, 6, 0, 7, 1, 3],
            ..args
        };
        assert!(cpu
            .step(kv.as_mut_slice(), N as u32, N as u32, &bad)
            .is_err());
    }
}
