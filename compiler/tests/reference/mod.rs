//! The prompts of a `shared/reference/ref-*.json` file (format: `shared/reference/README.md`),
//! shared by the interpreter's fidelity tests. A malformed reference file fails the test.

/// One reference prompt: its id, the tokens evaluated, the `llama_decode` calls llama.cpp
/// made for them, llama.cpp's greedy continuation and its teacher-forced top 5 per position.
pub struct Prompt {
    pub id: String,
    pub tokens: Vec<u32>,
    pub calls: Vec<usize>,
    pub completion: Vec<u32>,
    pub top5: Vec<Vec<(u32, f64)>>,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn load_prompts(reference: &std::path::Path) -> Vec<Prompt> {
    let s = std::fs::read_to_string(reference).expect("reference json");
    let v: serde_json::Value = serde_json::from_str(&s).expect("reference json parses");
    v["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let tokens = ids(&p["tokens_add_special_true"]);
            // The variants' files do not record the calls: SmolLM2's prompts were decoded in
            // one call each (as the Q4_1 file records).
            let calls = match p["server_prompt_decode_calls"].as_array() {
                Some(c) => c
                    .iter()
                    .map(|c| c.as_u64().expect("call") as usize)
                    .collect(),
                None => vec![tokens.len()],
            };
            (p, tokens, calls)
        })
        .map(|(p, tokens, calls)| Prompt {
            id: p["id"].as_str().unwrap_or("?").to_string(),
            tokens,
            calls,
            completion: ids(&p["completion"]["tokens"]),
            top5: p["teacher_forced"]["top5"]
                .as_array()
                .expect("top5")
                .iter()
                .map(|pos| {
                    pos.as_array()
                        .expect("position")
                        .iter()
                        .map(|e| {
                            (
                                e[0].as_u64().expect("id") as u32,
                                e[1].as_f64().expect("logprob"),
                            )
                        })
                        .collect()
                })
                .collect(),
        })
        .collect()
}
