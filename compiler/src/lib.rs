//! `compiler`: lowering of a GGUF model to the modelc IR (`arch`, one module per architecture
//! family) and the named optimisation passes that turn a graph into a plan (`passes`).
//!
//! Entry point: [`load_model`] reads the hyperparameters ([`HParams`]) and the tensor table
//! and returns a [`Model`], which builds the [`ir::graph::Graph`] of any ubatch shape
//! ([`Model::build_graph`]) and serves as the [`ir::interp::GraphSource`] of an interpreter
//! session:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gguf = ir::gguf::GgufFile::open("model.gguf")?;
//! let model = compiler::load_model(&gguf)?;
//! let mut session = ir::interp::Session::new(&gguf, &model, Default::default());
//! let logits = session.eval(&[1, 2, 3], 0, &ir::interp::Outputs::Last)?;
//! assert_eq!(logits.n_vocab, model.hparams.n_vocab as usize);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod arch;
pub mod error;
pub mod hparams;
pub mod passes;

pub use arch::Arch;

pub use error::{Error, Result};
pub use hparams::{HParams, RopeScaling};

use ir::gguf::GgufFile;
use ir::graph::{Graph, KvTypes};
use ir::interp::{GraphRequest, GraphSource};

/// A model ready to be lowered: its hyperparameters and tensor table (names, types, shapes;
/// the data stays in the GGUF file).
#[derive(Clone, Debug)]
pub struct Model {
    /// The hyperparameters.
    pub hparams: HParams,
    tensors: arch::TensorTable,
    output: GraphOutput,
}

/// What a model's graphs put in their first output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GraphOutput {
    /// The logits, `{n_vocab, n_outputs}` (`result_output`): generation.
    #[default]
    Logits,
    /// The final hidden state after the output norm and before the output head,
    /// `{n_embd, n_outputs}` (`result_norm`, llama.cpp's `t_embd`): what llama.cpp pools
    /// into embeddings (`llama_get_embeddings_ith`, `--pooling none` gives it as is).
    Embeddings,
}

/// Reads the hyperparameters and tensor table of `gguf` and checks that the model lowers
/// (every tensor its architecture needs is present with the right shape and a supported type).
///
/// # Errors
/// What [`HParams::from_gguf`] reports; [`Error::MissingTensor`], [`Error::TensorShape`],
/// [`Error::TensorType`] for the tensors.
pub fn load_model(gguf: &GgufFile) -> Result<Model> {
    let hparams = HParams::from_gguf(gguf)?;
    let tensors = gguf
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), (t.ggml_type, t.ne)))
        .collect();
    // An encoder (bert) has no output head: its graphs give hidden states.
    let output = if hparams.arch.is_encoder() {
        GraphOutput::Embeddings
    } else {
        GraphOutput::Logits
    };
    let model = Model {
        hparams,
        tensors,
        output,
    };
    model.build_graph(&GraphRequest {
        n_tokens: 1,
        n_outputs: 1,
        n_ctx: model.hparams.n_ctx_train.min(256),
        kv_types: KvTypes::F16,
    })?;
    Ok(model)
}

impl Model {
    /// This model with graphs whose first output is `output` (the logits by default;
    /// [`GraphOutput::Embeddings`] for embeddings).
    pub fn with_output(mut self, output: GraphOutput) -> Model {
        self.output = output;
        self
    }

    /// What the graphs output.
    pub fn output(&self) -> GraphOutput {
        self.output
    }

    /// The graph of one ubatch: `req.n_tokens` tokens, logits for `req.n_outputs` of them
    /// (`{n_vocab, n_outputs}`, the graph's first output; the hidden state `{n_embd,
    /// n_outputs}` with [`GraphOutput::Embeddings`]), KV caches of `req.n_ctx` cells of
    /// types `req.kv_types`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an impossible request (no tokens, more outputs than
    /// tokens, a KV type other than F16/F32); tensor errors as [`load_model`].
    pub fn build_graph(&self, req: &GraphRequest) -> Result<Graph> {
        arch::lower(&self.hparams, &self.tensors, req, self.output)
    }
}

impl GraphSource for Model {
    fn build_graph(&self, req: &GraphRequest) -> std::result::Result<Graph, String> {
        Model::build_graph(self, req).map_err(|e| e.to_string())
    }
}
