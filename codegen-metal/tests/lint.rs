//! `codegen_metal::lint`: each construct the CPU shim accepts but Metal refuses is reported,
//! and kernels in the vocabulary pass; such kernels also run through the shim under the
//! Metal prelude.

use codegen_cuda::shim::{run_step, Dialect, ShimOptions};
use codegen_cuda::Launch;
use codegen_metal::{lint, METAL_PRELUDE};

fn src(kernels: &str) -> String {
    format!("{METAL_PRELUDE}\n{kernels}")
}

/// Line of `kernels`' first line in `src(kernels)`.
fn first_line() -> usize {
    METAL_PRELUDE.lines().count() + 2
}

/// A kernel in the vocabulary: a helper, pointers with address spaces, casts, shared memory,
/// a shuffle reduction, a multiplication that is not a pointer.
const GOOD: &str = r#"
// A comment with * and double and std:: in it.
FN float warp_sum(float v) {
    for (i32 m = 16; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

FN float dot(const GMEM float* a, const GMEM float* b, i32 n) {
    float s = 0.0f;
    for (i32 i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

KERNEL(k0_dot, 64) {
    SHARED float part[2];
    const GMEM float* x = (const GMEM float*)(wts + 256 * BX);
    GMEM float* y = (GMEM float*)arena;
    thread float acc[2] = {0.0f, 0.0f};
    thread float* p = &acc[0];
    *p = dot(x, x + 32, 32) * (float)TX;
    float v = warp_sum(*p * 2.0f);
    if ((TX & 31) == 0) part[TX >> 5] = v;
    SYNC();
    if (TX == 0) y[BX] = part[0] + part[1];
}
"#;

#[test]
fn kernels_in_the_vocabulary_pass() {
    assert_eq!(lint(&src(GOOD)), Vec::<String>::new());
    assert_eq!(lint(METAL_PRELUDE), Vec::<String>::new());
}

#[test]
fn kernels_in_the_vocabulary_run_in_the_shim() {
    let wts: Vec<u8> = (0..2 * 64)
        .flat_map(|i| ((i % 64) as f32 * 0.25).to_le_bytes())
        .collect();
    let mut arena = vec![0u8; 8];
    let launches = [Launch {
        kernel: "k0_dot".into(),
        plan_kernel: 0,
        grid: [2, 1, 1],
        block: 64,
        operands: Vec::new(),
    }];
    run_step(
        Dialect::Metal,
        &src(GOOD),
        &launches,
        &mut arena,
        &mut [],
        &wts,
        &ShimOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d: f32 = (0..32)
        .map(|i| (i as f32 * 0.25) * ((i + 32) as f32 * 0.25))
        .sum();
    let want: f32 = (0..64).map(|t| d * t as f32 * 2.0).sum();
    for b in 0..2 {
        let got = f32::from_le_bytes(arena[4 * b..4 * b + 4].try_into().expect("4 bytes"));
        assert!(
            (got - want).abs() <= 1e-4 * want,
            "block {b}: {got} != {want}"
        );
    }
}

/// `lint` of `kernels` reports exactly one problem, on the kernels' line `line` (1-based),
/// mentioning `what`.
fn rejects(kernels: &str, line: usize, what: &str) {
    let found = lint(&src(kernels));
    let at = format!("line {}:", first_line() + line - 1);
    assert_eq!(found.len(), 1, "{kernels}\n{found:#?}");
    assert!(
        found[0].starts_with(&at) && found[0].contains(what),
        "wanted `{at} … {what}`, got {found:?}"
    );
}

#[test]
fn a_pointer_parameter_without_address_space() {
    rejects(
        "FN float first(const float* a) { return a[0]; }",
        1,
        "`const float *` without an address space",
    );
    rejects(
        "FN void put(\n    GMEM float* a,\n    u32* b) { a[0] = (float)b[0]; }",
        3,
        "without an address space",
    );
}

#[test]
fn a_pointer_variable_cast_or_return_type_without_address_space() {
    rejects(
        "KERNEL(k, 32) {\n    float* y = (GMEM float*)arena;\n    y[TX] = 0.0f;\n}",
        2,
        "`float *`",
    );
    rejects(
        "KERNEL(k, 32) {\n    GMEM float* y = (float*)arena;\n    y[TX] = 0.0f;\n}",
        2,
        "`float *`",
    );
    rejects(
        "struct pair { float a; float b; };\nusing f32 = float;\nFN f32 first(pair* p) { return p->a; }",
        3,
        "`pair *`",
    );
    rejects(
        "FN float* at(GMEM float* a) { return a; }",
        1,
        "without an address space",
    );
    rejects(
        "KERNEL(k, 32) {\n    float& r = ((GMEM float*)arena)[TX];\n    r = 1.0f;\n}",
        2,
        "`float &`",
    );
}

#[test]
fn multiplications_are_not_pointers() {
    let k = "KERNEL(k, 32) {\n    GMEM float* y = (GMEM float*)arena;\n    const i32 n = 4;\n    \
             y[TX] = (float)TX * 2.0f + sizeof(float) * n * y[TX];\n}";
    assert_eq!(lint(&src(k)), Vec::<String>::new());
}

#[test]
fn double() {
    rejects(
        "KERNEL(k, 32) {\n    double d = 1.0;\n    ((GMEM float*)arena)[TX] = (float)d;\n}",
        2,
        "`double`",
    );
}

#[test]
fn std() {
    rejects(
        "KERNEL(k, 32) {\n    ((GMEM float*)arena)[TX] = std::max(1.0f, 2.0f);\n}",
        2,
        "`std::`",
    );
}

#[test]
fn recursion() {
    rejects(
        "FN u32 fact(u32 n) { return n < 2 ? 1 : n * fact(n - 1); }",
        1,
        "FN fact is recursive (fact -> fact)",
    );
    let found = lint(&src(
        "FN u32 odd(u32 n);\nFN u32 even(u32 n) { return n == 0 ? 1 : odd(n - 1); }\n\
         FN u32 odd(u32 n) { return n == 0 ? 0 : even(n - 1); }",
    ));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("FN even is recursive (even -> odd -> even)"));
}

#[test]
fn cuda_builtins() {
    rejects(
        "KERNEL(k, 32) {\n    __syncthreads();\n}",
        2,
        "`__syncthreads`",
    );
    rejects(
        "KERNEL(k, 32) {\n    ((GMEM u32*)arena)[0] = threadIdx.x;\n}",
        2,
        "`threadIdx`",
    );
}

#[test]
fn goto_new_delete_printf() {
    rejects(
        "KERNEL(k, 32) {\n    goto end;\nend:\n    return;\n}",
        2,
        "`goto`",
    );
    rejects(
        "KERNEL(k, 32) {\n    thread i32* p = new i32;\n}",
        2,
        "`new`",
    );
    rejects(
        "KERNEL(k, 32) {\n    thread i32* p = 0;\n    delete p;\n}",
        3,
        "`delete`",
    );
    rejects("KERNEL(k, 32) {\n    printf(\"%d\", TX);\n}", 2, "`printf`");
}

#[test]
fn shared_memory_in_a_helper() {
    rejects(
        "FN float f(float v) {\n    SHARED float s[32];\n    s[0] = v;\n    return s[0];\n}",
        2,
        "shared memory declared in FN f",
    );
}

#[test]
fn a_table_outside_the_constant_address_space() {
    rejects(
        "static const u8 t[4] = {1, 2, 3, 4};\nFN u32 f(i32 i) { return t[i]; }",
        1,
        "`t`: a program-scope variable outside the constant address space",
    );
    rejects(
        "CONSTANT u8 a[2] = {1, 2};\nfloat scale = 2.0f;",
        2,
        "`scale`",
    );
    let ok = "CONSTANT u64 grid[2] = {\n    0x0808080808080808, 0xffffffffffffffff,\n};\n\
              constant i8 values[2] = {-1, 1};\n\
              FN float f(const GMEM u8* b, i32 i) { float x[2] = {0.0f, 1.0f}; return x[i] + (float)values[b[0] & 1] + (float)(grid[i] & 1); }";
    assert_eq!(lint(&src(ok)), Vec::<String>::new());
}
