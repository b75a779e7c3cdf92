//! Hand-built plans and the graphs they stand for, shared by the plan tests.

#![allow(dead_code)]

use ir::ggml::{f32_to_f16, GgmlType};
use ir::graph::{
    contiguous_nb, AttnParams, DType, Graph, Input, KvKind, Op, RopeMode, RopeParams, Shape,
};
use ir::interp::{InterpOptions, MemWeights};
use ir::plan::{
    Base, Buffer, BufferId, Epilogue, Kernel, KernelOp, KvBuf, KvId, MulMatSpec, Plan,
    RopeKvStoreSpec, Step, StepInput, TailPolicy, Value, ValueId, WeightBuf, WeightId, PLAN_FORMAT,
};

/// Builds a one-step plan by hand.
pub struct B {
    pub plan: Plan,
    pub step: Step,
}

impl B {
    pub fn new(n_tokens: u32, n_ctx: u32) -> B {
        B {
            plan: Plan {
                format: PLAN_FORMAT,
                n_ctx,
                align: 64,
                tail: TailPolicy::Pad,
                weights: vec![],
                kv: vec![],
                steps: vec![],
                target: None,
            },
            step: Step {
                n_tokens,
                n_outputs: n_tokens,
                buffers: vec![],
                values: vec![],
                kernels: vec![],
                inputs: vec![],
                outputs: vec![],
                arena_bytes: 0,
            },
        }
    }
    pub fn value(&mut self, v: Value) -> ValueId {
        self.step.values.push(v);
        ValueId(self.step.values.len() as u32 - 1)
    }
    pub fn weight(&mut self, name: &str, dtype: DType, ne: &[u64]) -> ValueId {
        self.plan.weights.push(WeightBuf {
            name: name.into(),
            dtype,
            shape: Shape::new(ne),
        });
        let id = WeightId(self.plan.weights.len() as u32 - 1);
        self.value(Value::dense(name, dtype, Shape::new(ne), Base::Weight(id)))
    }
    pub fn arena(&mut self, name: &str, dtype: DType, ne: &[u64]) -> ValueId {
        let shape = Shape::new(ne);
        let bytes = ir::plan::dense_bytes(dtype, &shape).unwrap();
        self.step.buffers.push(Buffer {
            name: name.into(),
            bytes,
            offset: None,
        });
        let b = BufferId(self.step.buffers.len() as u32 - 1);
        self.value(Value::dense(name, dtype, shape, Base::Arena(b)))
    }
    /// The same bytes as `of`, contiguous, another shape.
    pub fn reshape(&mut self, of: ValueId, name: &str, ne: &[u64]) -> ValueId {
        let v = self.step.values[of.index()].clone();
        let shape = Shape::new(ne);
        self.value(Value {
            name: name.into(),
            shape,
            nb: contiguous_nb(v.dtype, &shape),
            ..v
        })
    }
    pub fn kv(&mut self, name: &str, layer: u32, kind: KvKind, ne: &[u64]) -> ValueId {
        self.plan.kv.push(KvBuf {
            name: name.into(),
            layer,
            kind,
            dtype: DType::F16,
            shape: Shape::new(ne),
            window: None,
        });
        let id = KvId(self.plan.kv.len() as u32 - 1);
        self.value(Value::dense(name, DType::F16, Shape::new(ne), Base::Kv(id)))
    }
    pub fn input(&mut self, kind: Input, name: &str, n: u64) -> ValueId {
        let v = self.arena(name, DType::I32, &[n]);
        self.step.inputs.push(StepInput { kind, value: v });
        v
    }
    pub fn kernel(&mut self, name: &str, op: KernelOp, srcs: &[ValueId], dsts: &[ValueId]) {
        self.step.kernels.push(Kernel {
            name: name.into(),
            op,
            srcs: srcs.to_vec(),
            dsts: dsts.to_vec(),
            nodes: vec![name.into()],
            target: None,
        });
    }
    pub fn finish(mut self, outputs: &[ValueId]) -> Plan {
        self.step.outputs = outputs.to_vec();
        self.plan.steps.push(self.step);
        self.plan.verify().expect("hand-built plan verifies");
        self.plan
    }
}

/// Deterministic values in [-s, s).
pub fn vals(n: u64, seed: u32, s: f32) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0 * s
        })
        .collect()
}

pub fn f16_weight(w: &mut MemWeights, name: &str, ne: [u64; 2], seed: u32) {
    let data = vals(ne[0] * ne[1], seed, 0.3)
        .iter()
        .flat_map(|v| f32_to_f16(*v).to_le_bytes())
        .collect();
    w.insert(name, GgmlType::F16, [ne[0], ne[1], 1, 1], data);
}

pub fn opts() -> InterpOptions {
    InterpOptions {
        n_threads: 1,
        ..InterpOptions::llama_cpp()
    }
}

pub const TOKENS: [i32; 4] = [3, 9, 0, 7];

/// An FFN block: lookup, rms_norm × w into gate/up with swiglu, down with the residual add.
pub fn ffn_weights() -> MemWeights {
    let mut w = MemWeights::new();
    w.insert_f32("emb", [16, 10, 1, 1], &vals(160, 1, 1.0));
    w.insert_f32(
        "nw",
        [16, 1, 1, 1],
        &vals(16, 2, 1.0)
            .iter()
            .map(|v| 1.0 + 0.2 * v)
            .collect::<Vec<_>>(),
    );
    f16_weight(&mut w, "wg", [16, 24], 3);
    f16_weight(&mut w, "wu", [16, 24], 4);
    f16_weight(&mut w, "wd", [24, 16], 5);
    w
}

pub fn ffn_graph() -> Graph {
    let mut g = Graph::new();
    let t = g.input("tokens", Input::Tokens, DType::I32, Shape::new(&[4]));
    let emb = g.weight("emb", DType::F32, Shape::new(&[16, 10]));
    let nw = g.weight("nw", DType::F32, Shape::new(&[16]));
    let wg = g.weight("wg", DType::F16, Shape::new(&[16, 24]));
    let wu = g.weight("wu", DType::F16, Shape::new(&[16, 24]));
    let wd = g.weight("wd", DType::F16, Shape::new(&[24, 16]));
    let x = g.get_rows("x", emb, t).unwrap();
    let n = g.rms_norm("n", x, 1e-5).unwrap();
    let n = g.mul("nm", n, nw).unwrap();
    let gate = g.mul_mat("gate", wg, n).unwrap();
    let up = g.mul_mat("up", wu, n).unwrap();
    let a = g.swiglu("act", gate, up).unwrap();
    let d = g.mul_mat("down", wd, a).unwrap();
    let out = g.add("out", d, x).unwrap();
    g.mark_output(out);
    g
}

/// The FFN as three kernels; with `in_place` the result overwrites the residual `x`.
pub fn ffn_plan(in_place: bool) -> Plan {
    let mut b = B::new(4, 16);
    let t = b.input(Input::Tokens, "tokens", 4);
    let emb = b.weight("emb", DType::F32, &[16, 10]);
    let nw = b.weight("nw", DType::F32, &[16]);
    let wg = b.weight("wg", DType::F16, &[16, 24]);
    let wu = b.weight("wu", DType::F16, &[16, 24]);
    let wd = b.weight("wd", DType::F16, &[24, 16]);
    let x = b.arena("x", DType::F32, &[16, 4]);
    let act = b.arena("act", DType::F32, &[24, 4]);
    let out = if in_place {
        b.reshape(x, "out", &[16, 4])
    } else {
        b.arena("out", DType::F32, &[16, 4])
    };
    b.kernel("x", KernelOp::Op(Op::GetRows), &[emb, t], &[x]);
    let glu = MulMatSpec {
        norm: Some(1e-5),
        n_mat: 2,
        epilogue: Epilogue::Swiglu,
    };
    b.kernel("act", KernelOp::MulMat(glu), &[x, nw, wg, wu], &[act]);
    let add = MulMatSpec {
        norm: None,
        n_mat: 1,
        epilogue: Epilogue::Add,
    };
    b.kernel("out", KernelOp::MulMat(add), &[act, wd, x], &[out]);
    b.finish(&[out])
}

pub fn rope() -> RopeParams {
    RopeParams {
        mode: RopeMode::Norm,
        n_rot: 8,
        freq_base: 10000.0,
        freq_scale: 1.0,
        n_ctx_orig: 16,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

pub fn attn() -> AttnParams {
    AttnParams {
        kq_scale: 0.35,
        softcap: None,
        window: None,
        causal: true,
    }
}

pub fn kv_weights() -> MemWeights {
    let mut w = MemWeights::new();
    w.insert_f32("eq", [32, 10, 1, 1], &vals(320, 11, 1.0));
    w.insert_f32("ek", [16, 10, 1, 1], &vals(160, 12, 1.0));
    w.insert_f32("ev", [16, 10, 1, 1], &vals(160, 13, 1.0));
    w
}

/// Attention over the cache: 4 query heads and 2 KV heads of 8, caches of 16 cells.
pub fn kv_graph() -> Graph {
    let mut g = Graph::new();
    let t = g.input("tokens", Input::Tokens, DType::I32, Shape::new(&[4]));
    let pos = g.input("pos", Input::Positions, DType::I32, Shape::new(&[4]));
    let (eq, ek, ev) = (
        g.weight("eq", DType::F32, Shape::new(&[32, 10])),
        g.weight("ek", DType::F32, Shape::new(&[16, 10])),
        g.weight("ev", DType::F32, Shape::new(&[16, 10])),
    );
    let kc = g.input(
        "kc",
        Input::KvCache {
            layer: 0,
            kind: KvKind::K,
        },
        DType::F16,
        Shape::new(&[16, 16]),
    );
    let vc = g.input(
        "vc",
        Input::KvCache {
            layer: 0,
            kind: KvKind::V,
        },
        DType::F16,
        Shape::new(&[16, 16]),
    );
    let q = g.get_rows("qin", eq, t).unwrap();
    let k = g.get_rows("kin", ek, t).unwrap();
    let v = g.get_rows("vin", ev, t).unwrap();
    let q3 = g.reshape("q3", q, &[8, 4, 4]).unwrap();
    let k3 = g.reshape("k3", k, &[8, 2, 4]).unwrap();
    let qr = g.rope("qr", q3, pos, None, rope()).unwrap();
    let kr = g.rope("kr", k3, pos, None, rope()).unwrap();
    let kr2 = g.reshape("kr2", kr, &[16, 4]).unwrap();
    let ks = g.kv_store("ks", kc, kr2, pos).unwrap();
    let vs = g.kv_store("vs", vc, v, pos).unwrap();
    let kv_shape = Shape::new(&[8, 2, 16]).with_kv_dim(2);
    let kview = g.view("kview", ks, kv_shape, [2, 16, 32, 512], 0).unwrap();
    let vview = g.view("vview", vs, kv_shape, [2, 16, 32, 512], 0).unwrap();
    let out = g.attention("att", qr, kview, vview, pos, attn()).unwrap();
    g.mark_output(out);
    g
}

pub fn kv_plan() -> Plan {
    let mut b = B::new(4, 16);
    let t = b.input(Input::Tokens, "tokens", 4);
    let pos = b.input(Input::Positions, "pos", 4);
    let eq = b.weight("eq", DType::F32, &[32, 10]);
    let ek = b.weight("ek", DType::F32, &[16, 10]);
    let ev = b.weight("ev", DType::F32, &[16, 10]);
    let kc = b.kv("kc", 0, KvKind::K, &[16, 16]);
    let vc = b.kv("vc", 0, KvKind::V, &[16, 16]);
    let q = b.arena("qin", DType::F32, &[32, 4]);
    let k = b.arena("kin", DType::F32, &[16, 4]);
    let v = b.arena("vin", DType::F32, &[16, 4]);
    let q3 = b.reshape(q, "q3", &[8, 4, 4]);
    let k3 = b.reshape(k, "k3", &[8, 2, 4]);
    let qr = b.arena("qr", DType::F32, &[8, 4, 4]);
    let kv_shape = Shape::new(&[8, 2, 16]).with_kv_dim(2);
    let view = |b: &mut B, of: ValueId, name: &str| {
        let c = b.step.values[of.index()].clone();
        b.value(Value {
            name: name.into(),
            shape: kv_shape,
            nb: [2, 16, 32, 512],
            ..c
        })
    };
    let (kview, vview) = (view(&mut b, kc, "kview"), view(&mut b, vc, "vview"));
    let att = b.arena("att", DType::F32, &[8, 4, 4]);
    b.kernel("qin", KernelOp::Op(Op::GetRows), &[eq, t], &[q]);
    b.kernel("kin", KernelOp::Op(Op::GetRows), &[ek, t], &[k]);
    b.kernel("vin", KernelOp::Op(Op::GetRows), &[ev, t], &[v]);
    let spec = RopeKvStoreSpec {
        rope: rope(),
        freq_factors: false,
        q: true,
        v: true,
    };
    b.kernel(
        "ks",
        KernelOp::RopeKvStore(spec),
        &[k3, pos, q3, v],
        &[kc, qr, vc],
    );
    b.kernel(
        "att",
        KernelOp::Op(Op::Attention(attn())),
        &[qr, kview, vview, pos],
        &[att],
    );
    b.finish(&[att])
}
