//! The model behind the ICL mechanisms: the zero-shot prompt and the one-shot
//! prompts of one step in one batched forward (rows of different lengths,
//! padded, `EnsembleRunner::decoder` with the base model on every row).
//!
//! Prompts are token pieces joined as ids: `header`, then for a one-shot prompt the
//! demonstration `Word: w\nDefinition: g\n\n`, then the context (the query
//! `Word: w\nDefinition:` and the tokens generated so far). Log-probabilities
//! stand in for logits: they differ from them by one constant per row, which
//! softmax — and therefore DPS-MOZO's logit mixing — ignores.

use burn::backend::Flex;
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_mechanisms::{DpDemonstration, FewShotSource, IclSource, MechanismError};
use privmix_models::{Model, Tokenizer};

/// The runner the ICL experiment uses (base model only, no adapters).
pub type IclRunner = EnsembleRunner<Flex, Model<Flex>>;

fn source_error(e: impl std::fmt::Display) -> MechanismError {
    MechanismError::Source(e.to_string())
}

/// The rows of one batched forward, as f64 vectors.
fn forward_rows(runner: &IclRunner, rows: &[Vec<u32>]) -> Result<Vec<Vec<f64>>, MechanismError> {
    let mut decoder = runner
        .decoder(RowLayout::public_only(rows.len()))
        .map_err(source_error)?;
    let out = decoder.prefill_rows(rows).map_err(source_error)?;
    Ok((0..rows.len())
        .map(|r| out.row(r).iter().map(|&x| f64::from(x)).collect())
        .collect())
}

/// An [`IclSource`] over one model and a private demonstration set.
pub struct PromptSource<'a> {
    runner: &'a IclRunner,
    header: Vec<u32>,
    demos: Vec<Vec<u32>>,
    prepared: Option<Prepared>,
    /// Model forwards run (for the report).
    pub forwards: usize,
}

struct Prepared {
    context: Vec<u32>,
    drawn: Vec<usize>,
    rows: Vec<Vec<f64>>,
}

impl<'a> PromptSource<'a> {
    /// A source with the prompt `header` and the private demonstrations, each
    /// already tokenised as it appears in a prompt.
    pub fn new(runner: &'a IclRunner, header: Vec<u32>, demos: Vec<Vec<u32>>) -> Self {
        Self {
            runner,
            header,
            demos,
            prepared: None,
            forwards: 0,
        }
    }

    fn zero_row(&self, context: &[u32]) -> Vec<u32> {
        [self.header.as_slice(), context].concat()
    }

    fn one_shot_row(&self, demo: usize, context: &[u32]) -> Vec<u32> {
        [self.header.as_slice(), &self.demos[demo], context].concat()
    }

    fn check_demo(&self, demo: usize) -> Result<(), MechanismError> {
        if demo < self.demos.len() {
            Ok(())
        } else {
            Err(source_error(format!(
                "demonstration {demo} asked for, the set holds {}",
                self.demos.len()
            )))
        }
    }
}

impl IclSource for PromptSource<'_> {
    fn demonstrations(&self) -> usize {
        self.demos.len()
    }

    fn prepare(&mut self, drawn: &[usize], context: &[u32]) -> Result<(), MechanismError> {
        for &d in drawn {
            self.check_demo(d)?;
        }
        let mut rows = vec![self.zero_row(context)];
        rows.extend(drawn.iter().map(|&d| self.one_shot_row(d, context)));
        let rows = forward_rows(self.runner, &rows)?;
        self.forwards += 1;
        self.prepared = Some(Prepared {
            context: context.to_vec(),
            drawn: drawn.to_vec(),
            rows,
        });
        Ok(())
    }

    fn zero_shot_logits(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        if let Some(p) = &self.prepared
            && p.context == context
        {
            return Ok(p.rows[0].clone());
        }
        self.forwards += 1;
        Ok(forward_rows(self.runner, &[self.zero_row(context)])?.remove(0))
    }

    fn one_shot_logits(
        &mut self,
        demo: usize,
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        self.check_demo(demo)?;
        if let Some(p) = &self.prepared
            && p.context == context
            && let Some(i) = p.drawn.iter().position(|&d| d == demo)
        {
            return Ok(p.rows[1 + i].clone());
        }
        self.forwards += 1;
        Ok(forward_rows(self.runner, &[self.one_shot_row(demo, context)])?.remove(0))
    }
}

/// The online phase of DPS-MOZO+Off: the DP demonstrations (public input and DP
/// output, cut at the first line break) in the prompt before the context.
pub struct DpPromptSource<'a> {
    runner: &'a IclRunner,
    tokenizer: &'a Tokenizer,
    header: Vec<u32>,
    rendered: Option<Vec<u32>>,
}

impl<'a> DpPromptSource<'a> {
    /// A source over `runner` with the prompt `header`.
    pub fn new(runner: &'a IclRunner, tokenizer: &'a Tokenizer, header: Vec<u32>) -> Self {
        Self {
            runner,
            tokenizer,
            header,
            rendered: None,
        }
    }

    /// The demonstrations as prompt ids: input, the output's first line, a blank line.
    fn render(&self, demos: &[DpDemonstration]) -> Result<Vec<u32>, MechanismError> {
        let mut ids = Vec::new();
        for d in demos {
            let text = self.tokenizer.decode(&d.output).map_err(source_error)?;
            let first = text.split('\n').next().unwrap_or("").trim_end();
            ids.extend_from_slice(&d.input);
            ids.extend(
                self.tokenizer
                    .encode(&format!("{first}\n\n"), false)
                    .map_err(source_error)?,
            );
        }
        Ok(ids)
    }
}

impl FewShotSource for DpPromptSource<'_> {
    fn few_shot_logits(
        &mut self,
        demos: &[DpDemonstration],
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        if self.rendered.is_none() {
            self.rendered = Some(self.render(demos)?);
        }
        let demo_ids = self.rendered.as_deref().unwrap_or_default();
        let row = [self.header.as_slice(), demo_ids, context].concat();
        Ok(forward_rows(self.runner, &[row])?.remove(0))
    }
}
