#[test]
fn print_plan() {
    let path = std::env::var("PLAN_MODEL").unwrap();
    let gguf = ir::gguf::GgufFile::open(&path).unwrap();
    let model = compiler::load_model(&gguf).unwrap();
    let opts = compiler::passes::CompileOptions { n_ctx: 256, ubatches: vec![1, 64], all_logits: std::env::var("ALL").is_ok(), ..Default::default() };
    let plan = compiler::passes::compile(&model, &opts, &mut |_, _| {}).unwrap();
    println!("{plan}");
}
