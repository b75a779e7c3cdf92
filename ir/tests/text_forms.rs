//! The text forms of graphs and plans: print → parse gives an equal structure and printing
//! that again gives the same text, on hand-made graphs covering every op and parameter and
//! on hand-made plans covering every kernel op and table; errors name the line and column;
//! mangled text gives errors, never a panic.

mod plan_common;

use ir::graph::{
    parse_graph, AttnParams, DType, Def, Graph, Input, KvKind, Op, RopeMode, RopeParams, Shape,
    TensorId,
};
use ir::plan::{
    parse_plan, Base, Buffer, BufferId, Epilogue, Kernel, KernelOp, MulMatSpec, Plan,
    RopeKvStoreSpec, Value, ValueId,
};
use ir::text::ParseError;
use plan_common::{ffn_graph, ffn_plan, kv_graph, kv_plan};

/// Asserts print → parse → equal → print gives the same text; returns the text.
fn graph_round_trip(g: &Graph) -> String {
    let text = g.to_string();
    let back = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, g, "{text}");
    assert_eq!(back.to_string(), text);
    text
}

fn plan_round_trip(p: &Plan) -> String {
    let text = p.to_string();
    let back = parse_plan(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, p, "{text}");
    assert_eq!(back.to_string(), text);
    text
}

fn yarn() -> RopeParams {
    RopeParams {
        mode: RopeMode::Neox,
        n_rot: 6,
        freq_base: 1_000_000.0,
        freq_scale: 0.25,
        n_ctx_orig: 32768,
        ext_factor: 1.0,
        attn_factor: 1.0 / 3.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

/// A graph with every op, awkward floats, names that need quotes and a shadowed name.
fn every_op_graph() -> Graph {
    let mut g = Graph::new();
    let t = g.input("inp_tokens", Input::Tokens, DType::I32, Shape::new(&[3]));
    let pos = g.input("inp_pos", Input::Positions, DType::I32, Shape::new(&[3]));
    let emb = g.weight("token_embd.weight", DType::F16, Shape::new(&[8, 11]));
    let x = g.get_rows("inp_embd", emb, t).unwrap();
    let n = g.rms_norm("norm, with comma", x, 1e-6).unwrap();
    let n2 = g.norm("%not an id", n, 0.1).unwrap();
    let w = g.weight("blk.0.w", DType::F32, Shape::new(&[8]));
    let m = g.mul("x", n2, w).unwrap();
    let a = g.add("x", m, x).unwrap(); // shadows the first `x`
    let s = g.scale("scaled", a, f32::MIN_POSITIVE / 8.0).unwrap(); // a subnormal
    let hs = g.hadamard("had", s, 4).unwrap();
    let mm_w = g.weight("blk.0.mm", DType::F32, Shape::new(&[8, 12]));
    let mm = g.mul_mat("mm", mm_w, s).unwrap();
    let q = g.reshape("q3", mm, &[6, 2, 3]).unwrap();
    let ff = g.input(
        "rope_freqs.weight",
        Input::Weight,
        DType::F32,
        Shape::new(&[3]),
    );
    let qr = g.rope("q_rope", q, pos, Some(ff), yarn()).unwrap();
    let kc = g.input(
        "cache_k_l0",
        Input::KvCache {
            layer: 0,
            kind: KvKind::K,
        },
        DType::F16,
        Shape::new(&[6, 8]),
    );
    let vc = g.input(
        "cache_v_l0",
        Input::KvCache {
            layer: 0,
            kind: KvKind::V,
        },
        DType::F32,
        Shape::new(&[6, 8]),
    );
    let kflat = g.reshape("k2", qr, &[12, 3]).unwrap();
    let k6 = g
        .view("k6", kflat, Shape::new(&[6, 3]), [4, 48, 144, 144], 0)
        .unwrap();
    let k6 = g.cont("k6c", k6).unwrap();
    let ks = g.kv_store("ks", kc, k6, pos).unwrap();
    let vs = g.kv_store("vs", vc, k6, pos).unwrap();
    let kv_shape = Shape::new(&[3, 2, 8]).with_kv_dim(2);
    let kview = g.view("kview", ks, kv_shape, [2, 6, 12, 96], 0).unwrap();
    let vview = g.view("vview", vs, kv_shape, [4, 12, 24, 192], 0).unwrap();
    let q2 = g
        .view("q2", qr, Shape::new(&[3, 4, 3]), [4, 12, 48, 144], 0)
        .unwrap();
    let att = g
        .attention(
            "kqv",
            q2,
            kview,
            vview,
            pos,
            AttnParams {
                kq_scale: 0.1118034,
                softcap: Some(50.0),
                window: Some(4096),
                causal: false,
            },
        )
        .unwrap();
    let att2 = g
        .attention(
            "kqv2",
            q2,
            kview,
            vview,
            pos,
            AttnParams {
                kq_scale: 1.0,
                softcap: None,
                window: None,
                causal: true,
            },
        )
        .unwrap();
    let p = g.permute("kqv_perm", att, [0, 2, 1, 3]).unwrap();
    let p = g.cont("kqv_cont", p).unwrap();
    let sm = g.soft_max("sm", p, 0.125).unwrap();
    let si = g.silu("si", sm).unwrap();
    let ge = g.gelu("ge", si).unwrap();
    let th = g.op("th", Op::Tanh, &[ge]).unwrap();
    let sc = g.softcap("sc", th, 30.0).unwrap();
    let sw = g.swiglu("sw", sc, sc).unwrap();
    let gg = g.geglu("gg", sw, sw).unwrap();
    g.mark_output(gg);
    g.mark_output(m); // the first `x`, shadowed: written %7
    g.mark_output(hs);
    g.mark_output(att2);
    g
}

#[test]
fn every_op_and_parameter_survives_the_graph_round_trip() {
    let g = every_op_graph();
    g.verify().expect("the test graph verifies");
    let text = graph_round_trip(&g);
    assert!(
        text.contains("\"norm, with comma\" = (F32) rms_norm(inp_embd {8, 3}) = {8, 3} [eps=1e-6]"),
        "{text}"
    );
    assert!(text.contains("[mode=neox n_rot=6 freq_base=1000000 freq_scale=0.25 n_ctx_orig=32768 ext_factor=1 attn_factor=0.33333334 beta_fast=32 beta_slow=1]"), "{text}");
    assert!(
        text.contains("[kq_scale=0.1118034 softcap=50 window=4096 non-causal]"),
        "{text}"
    );
    assert!(text.contains("outputs: gg, %7, had, kqv2"), "{text}");
    assert!(
        text.contains("x = (F32) add(x {8, 3}, inp_embd {8, 3}) = {8, 3}"),
        "{text}"
    );
    assert!(
        text.contains("input \"%not an id\"") || text.contains("\"%not an id\" ="),
        "{text}"
    );
}

#[test]
fn the_test_graphs_of_the_plan_tests_round_trip() {
    for g in [ffn_graph(), kv_graph()] {
        graph_round_trip(&g);
    }
    graph_round_trip(&Graph::new());
}

#[test]
fn unverified_graphs_round_trip_too() {
    // A recorded contiguity the op does not give, a non-contiguous input, a source below
    // its reader, an output out of range: all written so they come back.
    let mut g = ffn_graph();
    let last = g.tensors.len() - 1;
    g.tensors[last].contiguous = false;
    g.tensors[0].contiguous = false;
    g.nodes[0].srcs[1] = TensorId(last as u32);
    g.outputs.push(TensorId(999));
    let text = graph_round_trip(&g);
    assert!(text.contains("contiguous=false"), "{text}");
    assert!(text.contains("outputs: out, %999"), "{text}");
}

#[test]
fn a_hand_written_graph_may_leave_out_source_shapes() {
    let text = "\
; a comment
input x: F32 {32, 2} data   ; trailing comment
input w: Q8_0 {32, 4} weight
y = (F32) mul_mat(w, x) = {4, 2}
z = (F32) rms_norm(y) = {4, 2} [eps=0.00001]
outputs: z
";
    let g = parse_graph(text).expect("parses");
    g.verify().expect("verifies");
    assert_eq!(g.nodes[1].op, Op::RmsNorm { eps: 1e-5 });
    assert_eq!(g.tensors[1].dtype, DType::Block(ir::ggml::GgmlType::Q8_0));
    assert!(matches!(g.tensors[3].def, Def::Node(_)));
    // And it is also what `str::parse` does.
    assert_eq!(text.parse::<Graph>(), Ok(g));
}

fn err_at(r: Result<impl std::fmt::Debug, ParseError>, line: usize, col: usize, needle: &str) {
    let e = r.expect_err("an error");
    assert_eq!((e.line, e.col), (line, col), "{e}");
    assert!(e.to_string().contains(needle), "{e}");
}

#[test]
fn graph_errors_name_line_column_and_what_was_expected() {
    let head = "input x: F32 {4, 2} data\n";
    err_at(
        parse_graph(&format!("{head}y = (F32) frob(x) = {{4, 2}}\n")),
        2,
        11,
        "unknown op `frob`",
    );
    err_at(
        parse_graph(&format!("{head}y = (F32) rms_norm(x) = {{4, 2}}\n")),
        2,
        31,
        "needs parameter `eps",
    );
    err_at(
        parse_graph(&format!("{head}y = (F32) silu(q) = {{4, 2}}\n")),
        2,
        16,
        "no tensor named q",
    );
    err_at(
        parse_graph(&format!("{head}y = (F32) silu(x {{4, 3}}) = {{4, 2}}\n")),
        2,
        16,
        "written as {4, 3} but is {4, 2}",
    );
    err_at(
        parse_graph(&format!("{head}y = (F32) silu(x) = {{4, 2}} [s=1]\n")),
        2,
        29,
        "silu has no parameter `s`",
    );
    err_at(
        parse_graph(&format!("{head}y = (F99) silu(x) = {{4, 2}}\n")),
        2,
        6,
        "expected a type",
    );
    err_at(
        parse_graph("input x: F32 {4, 2} pixels\n"),
        1,
        21,
        "expected an input kind",
    );
    err_at(
        parse_graph("input \"x: F32 {4, 2} data\n"),
        1,
        7,
        "not closed",
    );
    err_at(parse_graph("outputs: x\n"), 1, 10, "no tensor named x");
    err_at(
        parse_graph("input x: F32 {1, 2, 3, 4, 5} data\n"),
        1,
        27,
        "at most 4 dimensions",
    );
    err_at(
        parse_graph(&format!("{head}y = (F32) scale(x) = {{4, 2}} [s=one]\n")),
        2,
        30,
        "expected a number for `s`",
    );
}

/// A plan with every kernel op, a planned and an unplanned step, shared names, strided and
/// offset values, a target annotation and a kernel named apart from its result.
fn every_kernel_plan() -> Plan {
    let mut p = kv_plan();
    let mut s = ffn_plan(false).steps.remove(0);
    // Planned offsets for the second step (kept different from the first's shape).
    s.n_tokens = 5;
    for (i, b) in s.buffers.iter_mut().enumerate() {
        b.offset = Some(64 * i as u64);
    }
    s.arena_bytes = 4096;
    // Two values sharing one name, a strided view at an offset.
    let dup = Value {
        name: "x".into(),
        ..s.values[s.kernels[0].dsts[0].index()].clone()
    };
    s.values.push(dup);
    s.values.push(Value {
        name: "strided \"view\"".into(),
        dtype: DType::F32,
        shape: Shape::new(&[2, 4, 1]),
        base: Base::Arena(BufferId(0)),
        offset: 8,
        nb: [8, 64, 999, 7],
    });
    s.buffers.push(Buffer {
        name: "spare".into(),
        bytes: 12,
        offset: None,
    });
    s.kernels[1].target = Some(serde_json::json!({"tile": [4, 8], "layout": "q8;x\"y"}));
    s.kernels[2].name = "renamed".into();
    s.kernels.push(Kernel {
        name: "no results".into(),
        op: KernelOp::MulMat(MulMatSpec {
            norm: None,
            n_mat: 1,
            epilogue: Epilogue::None,
        }),
        srcs: vec![ValueId(0), ValueId(9999)],
        dsts: vec![],
        nodes: vec![],
        target: None,
    });
    s.kernels.push(Kernel {
        name: "rkv".into(),
        op: KernelOp::RopeKvStore(RopeKvStoreSpec {
            rope: yarn(),
            freq_factors: true,
            q: false,
            v: true,
        }),
        srcs: vec![],
        dsts: vec![],
        nodes: vec!["a".into(), "b,c".into()],
        target: None,
    });
    s.kernels.push(Kernel {
        name: "rmsmul".into(),
        op: KernelOp::RmsNormMul { eps: 1e-6 },
        srcs: vec![],
        dsts: vec![ValueId(1)],
        nodes: vec!["rmsmul".into()],
        target: None,
    });
    for (norm, n_mat, epilogue) in [
        (Some(1e-5), 3, Epilogue::None),
        (None, 2, Epilogue::Geglu),
        (Some(0.1), 1, Epilogue::Add),
        (None, 0, Epilogue::None),
    ] {
        s.kernels.push(Kernel {
            name: "mm".into(),
            op: KernelOp::MulMat(MulMatSpec {
                norm,
                n_mat,
                epilogue,
            }),
            srcs: vec![ValueId(2)],
            dsts: vec![],
            nodes: vec!["mm".into()],
            target: None,
        });
    }
    p.steps.push(s);
    p
}

#[test]
fn the_test_plans_round_trip() {
    for p in [ffn_plan(true), ffn_plan(false), kv_plan()] {
        p.verify().expect("verifies");
        plan_round_trip(&p);
    }
}

#[test]
fn every_kernel_op_and_table_survives_the_plan_round_trip() {
    let p = every_kernel_plan();
    let text = plan_round_trip(&p);
    for needle in [
        "rope+kv_store+rope_q+kv_store_v",
        "rope+kv_store+kv_store_v",
        "freq_factors",
        "mul_mat×1 = (",
        "mul_mat×0 = (",
        "rms_norm+mul+mul_mat×3",
        "mul_mat×2+geglu",
        "rms_norm+mul+mul_mat+add",
        "name=renamed",
        "nodes=[a, \"b,c\"]",
        "%9999",
        "target={",
        "\"strided \\\"view\\\"\"",
        "nb=[8, 64, 999, 7]",
        "@A+64",
        "@b0",
        "(not planned)",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

#[test]
fn operands_may_be_written_by_name_alone_but_annotations_are_checked() {
    let p = kv_plan();
    let text = p.to_string();
    // Drop every operand's annotation: the same plan comes back.
    let bare: String = text
        .lines()
        .map(|l| {
            if l.starts_with('k') && !l.starts_with("kv ") {
                let (label_op, rest) = l.split_at(l.find(' ').unwrap() + 1);
                let op_end = rest.find(' ').unwrap();
                let (op, rest) = rest.split_at(op_end);
                let (dsts, srcs) = rest.split_once(" = (").unwrap();
                let (srcs, tail) = srcs.split_once(')').unwrap();
                let names = |s: &str| {
                    s.split(", ")
                        .filter(|o| o.contains('{'))
                        .map(|o| o.trim().split(' ').next().unwrap().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                format!("{label_op}{op} {} = ({}){tail}\n", names(dsts), names(srcs))
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(bare, text);
    assert_eq!(
        parse_plan(&bare).unwrap_or_else(|e| panic!("{e}\n{bare}")),
        p
    );
    // A wrong annotation is an error naming both.
    let wrong = text.replacen("qin {32, 4} @b2", "qin {32, 5} @b2", 1);
    assert_ne!(wrong, text);
    let e = parse_plan(&wrong).expect_err("wrong shape");
    assert!(
        e.to_string()
            .contains("written as `{32, 5} @b2` but the value is `{32, 4} @b2`"),
        "{e}"
    );
}

#[test]
fn plan_errors_name_line_column_and_what_was_expected() {
    let head = "plan format=1 n_ctx=16 align=64 tail=pad\n";
    err_at(
        parse_plan("weight w0 a F32 {4}\n"),
        1,
        1,
        "expected `plan format",
    );
    err_at(
        parse_plan(&format!("{head}weight w1 a F32 {{4}}\n")),
        2,
        8,
        "expected w0",
    );
    err_at(
        parse_plan(&format!("{head}buffer b0 a 4 bytes\n")),
        2,
        1,
        "expected `weight`, `kv` or `step`",
    );
    let step = format!(
        "{head}step n_tokens=1 n_outputs=1 arena=0\nbuffer b0 a 16 bytes\nvalue %0 a {{4}} b0\n"
    );
    err_at(
        parse_plan(&format!("{step}k0 frob a = (a)\n")),
        5,
        4,
        "unknown op `frob`",
    );
    err_at(
        parse_plan(&format!("{step}k1 silu a = (a)\n")),
        5,
        1,
        "expected k0",
    );
    err_at(
        parse_plan(&format!("{step}k0 silu a = (b)\n")),
        5,
        14,
        "no value of step n_tokens=1 is named b",
    );
    err_at(
        parse_plan(&format!("{step}value %1 a {{4}} b0\nk0 silu a = (a)\n")),
        6,
        9,
        "several values are named a (%0, %1)",
    );
    err_at(
        parse_plan(&format!("{step}k0 silu a = (a {{4}} @b1)\n")),
        5,
        14,
        "written as `{4} @b1` but the value is `{4} @b0`",
    );
    err_at(
        parse_plan(&format!("{step}k0 mul_mat×x a = (a)\n")),
        5,
        4,
        "number of weights",
    );
    err_at(
        parse_plan(&format!("{step}k0 silu a = (a) target={{oops\n")),
        5,
        24,
        "not JSON",
    );
    err_at(
        parse_plan(&format!("{step}value %1 a {{4}} q0\n")),
        5,
        16,
        "expected the value's base",
    );
    err_at(
        parse_plan(&format!("{head}step n_tokens=1 arena=0\n")),
        2,
        17,
        "expected `n_outputs`",
    );
}

/// xorshift64*: deterministic pseudo-random numbers for the mangling loop.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `text` with one random edit: truncated, a span deleted or duplicated, a character
/// replaced by a troublesome one, a number made huge, two lines swapped.
fn mangle(text: &str, rng: &mut Rng) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let at = rng.below(n + 1);
    let span = 1 + rng.below(12);
    let end = (at + span).min(n);
    let tricky = [
        '{', '}', '[', ']', '(', ')', ',', '=', ':', ';', '"', '%', '@', '+', '×', '≤', '-', '0',
        '9', ' ', '\n', '\\', 'k', 'b', 'w', 'e',
    ];
    let s: String = match rng.below(7) {
        0 => chars[..at].iter().collect(),
        1 => chars[..at].iter().chain(&chars[end..]).collect(),
        2 => chars[..end].iter().chain(&chars[at..]).collect(),
        3 => {
            let mut c = chars.clone();
            if at < n {
                c[at] = tricky[rng.below(tricky.len())];
            }
            c.into_iter().collect()
        }
        4 => {
            let mut s: String = chars[..at].iter().collect();
            s += [
                "99999999999999999999",
                "4294967296",
                "-1",
                "1e99",
                "NaN",
                "kv≤",
            ][rng.below(6)];
            s.extend(&chars[at..]);
            s
        }
        5 => {
            let mut lines: Vec<&str> = text.lines().collect();
            let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
            if !lines.is_empty() {
                lines.swap(a, b);
            }
            lines.join("\n")
        }
        _ => {
            let mut s: String = chars[..at].iter().collect();
            s.push('"');
            s.extend(&chars[at..]);
            s
        }
    };
    s
}

#[test]
fn mangled_text_gives_errors_not_panics() {
    let graphs = [every_op_graph().to_string(), kv_graph().to_string()];
    let plans = [every_kernel_plan().to_string(), kv_plan().to_string()];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut err) = (0, 0);
    for round in 0..3000 {
        let mut g = graphs[round % 2].clone();
        let mut p = plans[round % 2].clone();
        for _ in 0..1 + rng.below(3) {
            g = mangle(&g, &mut rng);
            p = mangle(&p, &mut rng);
        }
        // Whatever parses can be printed and verified without a panic either.
        match parse_graph(&g) {
            Ok(graph) => {
                ok += 1;
                // What parses prints to text that parses to the same text again.
                let text = graph.to_string();
                let again = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(again.to_string(), text);
                let _ = graph.verify();
            }
            Err(e) => {
                err += 1;
                assert!(e.line >= 1 && e.col >= 1 && !e.msg.is_empty());
            }
        }
        match parse_plan(&p) {
            Ok(plan) => {
                ok += 1;
                let text = plan.to_string();
                let again = parse_plan(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(again.to_string(), text);
                let _ = plan.verify();
            }
            Err(e) => {
                err += 1;
                assert!(e.line >= 1 && e.col >= 1 && !e.msg.is_empty());
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}
