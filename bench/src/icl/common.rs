//! What the methods of the ICL experiment share: the configuration, the prompt
//! texts, and how a method's answers are scored into an [`IclResult`]. Below the
//! parent module and the [`super::embedding`] and [`super::mia`] modules, which
//! all use it.

use std::path::PathBuf;
use std::time::Instant;

use privmix_mechanisms::StepOutcome;
use privmix_models::Tokenizer;
use serde::{Deserialize, Serialize};

use super::wordnet::Definition;
use crate::error::BenchError;
use crate::rouge::rouge_l;

/// The instruction every prompt starts with.
pub const HEADER: &str = "Give a short definition of each word.\n\n";

/// Settings of the ICL experiment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclConfig {
    /// Base model (GGUF file or HF folder).
    pub model: PathBuf,
    /// `tokenizer.json` (default: the model's own).
    pub tokenizer: Option<PathBuf>,
    /// WordNet's `data.noun`.
    pub wordnet: PathBuf,
    /// |D|, the private demonstrations.
    pub private_demos: usize,
    /// Test queries n_test of each seed (the seeds' queries are different nouns).
    pub test_queries: usize,
    /// Public inputs of DPS-MOZO+Off.
    pub public_inputs: usize,
    /// Demonstrations drawn per token.
    pub n_shots: usize,
    /// Top-k of the zero-shot distribution kept.
    pub top_k: usize,
    /// Tokens generated per query at most (T_max).
    pub max_tokens: usize,
    /// Target ε values.
    pub epsilons: Vec<f64>,
    /// δ.
    pub delta: f64,
    /// Seed of the split and of the sampling (each seed of the run derives its own).
    pub seed: u64,
    /// Seeds: independent deployments, each with its own test queries, private
    /// demonstrations, public inputs, randomness and budget ([`super::split`]).
    #[serde(default = "one")]
    pub seeds: usize,
    /// Examples m of each membership-inference repetition (0: no attack).
    pub mia_examples: usize,
    /// Repetitions of the membership-inference attack, on disjoint example sets.
    #[serde(default = "one")]
    pub mia_repetitions: usize,
    /// The sentence-transformers folder of the embedding baseline (None: not run).
    #[serde(default)]
    pub embedding_model: Option<PathBuf>,
    /// Embedding baseline: disjoint subsets N of the private demonstrations.
    #[serde(default)]
    pub esa_subsets: usize,
    /// Embedding baseline: demonstrations per subset.
    #[serde(default)]
    pub esa_shots: usize,
    /// Embedding baseline: public zero-shot candidates C per query.
    #[serde(default)]
    pub esa_candidates: usize,
    /// Where each seed's results and the attack's are kept, so that a run
    /// stopped part-way resumes where it stopped (see `docs/privacy-utility.md`; None: not kept).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

fn one() -> usize {
    1
}

/// One method's result on one seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IclResult {
    /// `zero-shot`, `few-shot`, `dps-mozo+on` or `dps-mozo+off`.
    pub method: String,
    /// Target ε (None for the baselines).
    pub target_epsilon: Option<f64>,
    /// Mean ROUGE-L F1 over the test queries.
    pub rouge_l_f1: f64,
    /// Each query's ROUGE-L F1.
    pub per_query: Vec<f64>,
    /// ε spent at δ, rounded up (None: no finite guarantee).
    pub spent_epsilon: Option<f64>,
    /// Tokens generated in all (for +Off: online tokens; offline ones in `parameters`).
    pub tokens: usize,
    /// Mean λ over the tokens that mixed demonstrations (DPS-MOZO).
    pub mean_lambda: Option<f64>,
    /// The first few `(word, reference, prediction)` triples.
    pub examples: Vec<(String, String, String)>,
    /// Parameters the method ran with.
    pub parameters: String,
    /// Seconds spent.
    pub seconds: f64,
}

pub(super) fn tokens(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, BenchError> {
    Ok(tokenizer.encode(text, false)?)
}

/// A private demonstration as it appears in a prompt: the query, its definition, a blank line.
pub(super) fn demo_text(d: &Definition) -> String {
    format!("{} {}\n\n", query_text(&d.word), d.gloss)
}

pub(super) fn query_text(word: &str) -> String {
    format!("Word: {word}\nDefinition:")
}

/// What one method generates for every query, and the ε its account spent.
pub(super) struct Decoded {
    pub(super) predictions: Vec<String>,
    pub(super) tokens: usize,
    pub(super) lambdas: Vec<f64>,
}

impl Decoded {
    /// Nothing decoded yet.
    pub(super) fn new() -> Self {
        Self {
            predictions: Vec::new(),
            tokens: 0,
            lambdas: Vec::new(),
        }
    }

    /// Counts one released token, and the mean λ of its step when it mixed.
    pub(super) fn count(&mut self, outcome: &StepOutcome) {
        self.tokens += 1;
        let l = &outcome.diagnostics.lambdas;
        if !l.is_empty() {
            self.lambdas.push(l.iter().sum::<f64>() / l.len() as f64);
        }
    }
}

/// One query's answer as it grows: the query's prompt, then the released tokens.
pub(super) struct Answer {
    /// The query's prompt ids and the tokens released so far.
    pub(super) context: Vec<u32>,
    prompt_len: usize,
    text: String,
    /// Whether the answer has ended (end-of-sequence token or a line break).
    pub(super) done: bool,
}

impl Answer {
    /// The empty answer to the query for `word`.
    pub(super) fn new(tokenizer: &Tokenizer, word: &str) -> Result<Self, BenchError> {
        let context = tokens(tokenizer, &query_text(word))?;
        Ok(Self {
            prompt_len: context.len(),
            context,
            text: String::new(),
            done: false,
        })
    }

    /// Takes one released token: the end-of-sequence token ends the answer
    /// (and is not kept), as does a line break in its text.
    pub(super) fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<(), BenchError> {
        if Some(token) == tokenizer.eos_id() {
            self.done = true;
            return Ok(());
        }
        self.context.push(token);
        self.text = tokenizer.decode(&self.context[self.prompt_len..])?;
        self.done = self.text.contains('\n');
        Ok(())
    }

    /// What the answer predicts: its first line, trimmed.
    pub(super) fn prediction(&self) -> String {
        self.text
            .split('\n')
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    }
}

/// One method's [`IclResult`] from what it decoded for `queries`: each answer's
/// ROUGE-L F1 against the query's definition, and their mean.
pub(super) fn scored(
    method: &str,
    target: Option<f64>,
    queries: &[Definition],
    decoded: Decoded,
    spent: Option<f64>,
    parameters: String,
    started: Instant,
) -> IclResult {
    let per_query: Vec<f64> = queries
        .iter()
        .zip(&decoded.predictions)
        .map(|(q, p)| rouge_l(&q.gloss, p).fmeasure)
        .collect();
    IclResult {
        method: method.into(),
        target_epsilon: target,
        rouge_l_f1: per_query.iter().sum::<f64>() / per_query.len().max(1) as f64,
        per_query,
        spent_epsilon: spent,
        tokens: decoded.tokens,
        mean_lambda: (!decoded.lambdas.is_empty())
            .then(|| decoded.lambdas.iter().sum::<f64>() / decoded.lambdas.len() as f64),
        examples: queries
            .iter()
            .zip(&decoded.predictions)
            .take(3)
            .map(|(q, p)| (q.word.clone(), q.gloss.clone(), p.clone()))
            .collect(),
        parameters,
        seconds: started.elapsed().as_secs_f64(),
    }
}
