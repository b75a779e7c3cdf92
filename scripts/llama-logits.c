// llama-logits: llama.cpp's logits for a prompt, in the settings of shared/fixtures/reference
// (n_ctx 256, n_batch = n_ubatch 64, 2 threads, flash attention off, f16 K/V cache): the
// prompt as one batch with logits at every position (PREFIX.batch.f32), then, after clearing
// the cache, one token per decode (PREFIX.step.f32). Dev time only: the end-to-end check of
// weight types CI cannot make files of (llama-quantize); see runtime/tests/cpu_engine.rs
// `extra_fixtures`.
//
//   L=/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp
//   cc -O2 -o /tmp/llama-logits scripts/llama-logits.c -I$L/include -I$L/ggml/include
//      -L$L/build/bin -lllama -lggml-base -lggml -Wl,-rpath,$L/build/bin
//   /tmp/llama-logits MODEL.gguf 1,2,3,... PREFIX

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int decode_all(struct llama_context * ctx, const llama_token * toks, int n, int pos0,
                      int n_vocab, FILE * out, int one_by_one) {
    struct llama_batch b = llama_batch_init(64, 0, 1);
    int i = 0;
    while (i < n) {
        int len = one_by_one ? 1 : (n - i < 64 ? n - i : 64);
        b.n_tokens = len;
        for (int j = 0; j < len; j++) {
            b.token[j] = toks[i + j];
            b.pos[j] = pos0 + i + j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = 1;
        }
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "decode failed at %d\n", i);
            return 1;
        }
        for (int j = 0; j < len; j++) fwrite(llama_get_logits_ith(ctx, j), 4, n_vocab, out);
        i += len;
    }
    llama_batch_free(b);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS PREFIX\n", argv[0]);
        return 2;
    }
    llama_token toks[512];
    int n = 0;
    for (char * p = strtok(argv[2], ","); p && n < 512; p = strtok(NULL, ",")) toks[n++] = atoi(p);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 64;
    cp.n_ubatch = 64;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    char path[4096];
    snprintf(path, sizeof path, "%s.batch.f32", argv[3]);
    FILE * f = fopen(path, "wb");
    if (!f || decode_all(ctx, toks, n, 0, n_vocab, f, 0)) return 1;
    fclose(f);
    llama_memory_clear(llama_get_memory(ctx), true);
    snprintf(path, sizeof path, "%s.step.f32", argv[3]);
    f = fopen(path, "wb");
    if (!f || decode_all(ctx, toks, n, 0, n_vocab, f, 1)) return 1;
    fclose(f);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
