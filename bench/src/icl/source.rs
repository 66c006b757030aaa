//! The model behind the ICL mechanisms: the zero-shot prompt and the one-shot
//! prompts of one step, base model on every row (`EnsembleRunner::decoder`).
//!
//! Prompts are token pieces joined as ids: `header`, then for a one-shot prompt the
//! demonstration `Word: w\nDefinition: g\n\n`, then the context (the query
//! `Word: w\nDefinition:` and the tokens generated so far). Log-probabilities
//! stand in for logits: they differ from them by one constant per row, which
//! softmax — and therefore DPS-MOZO's logit mixing — ignores.
//!
//! What is computed once and reused (the KV cache keeps every row exactly what it
//! would be alone: padding slots are masked and take no position):
//! - each demonstration's prefix, `header` and the demonstration, is prefilled the
//!   first time it is drawn; a step clones the drawn demonstrations' prefixes into
//!   one batch and feeds them the context only;
//! - the zero-shot row is its own decoder over `header` and the context, extended
//!   by the new tokens as the context grows, so it reads nothing but public text.

use crate::Backend;
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::{Decoder, EnsembleRunner};
use privmix_mechanisms::{DpDemonstration, FewShotSource, IclSource, MechanismError};
use privmix_models::{Model, Tokenizer};

/// The runner the ICL experiment uses (base model only, no adapters).
pub type IclRunner = EnsembleRunner<Backend, Model<Backend>>;

/// An incremental decoder of the runner.
pub type IclDecoder<'a> = Decoder<'a, Backend, Model<Backend>>;

fn source_error(e: impl std::fmt::Display) -> MechanismError {
    MechanismError::Source(e.to_string())
}

fn to_f64(rows: &privmix_ensemble::rows::LogProbRows) -> Vec<Vec<f64>> {
    (0..rows.rows())
        .map(|r| rows.row(r).iter().map(|&x| f64::from(x)).collect())
        .collect()
}

/// An [`IclSource`] over one model and a private demonstration set.
pub struct PromptSource<'a> {
    runner: &'a IclRunner,
    header: Vec<u32>,
    demos: Vec<Vec<u32>>,
    /// Demonstration j's prefilled prefix (`header`, demonstration j), once drawn.
    prefixes: Vec<Option<IclDecoder<'a>>>,
    /// The zero-shot decoder, grown along the current query's context.
    zero: Option<GrowingRow<'a>>,
    prepared: Option<Prepared>,
    /// Model forwards run (for the report).
    pub forwards: usize,
}

struct Prepared {
    context: Vec<u32>,
    drawn: Vec<usize>,
    rows: Vec<Vec<f64>>,
}

/// One decoder row grown along a context: the decoder, the context it has been fed
/// (after its prompt prefix) and its last log-probabilities.
struct GrowingRow<'a> {
    decoder: IclDecoder<'a>,
    fed: Vec<u32>,
    last: Vec<f64>,
}

impl<'a> GrowingRow<'a> {
    /// Feeds `decoder` (holding whatever it was prefilled with) `prefix` then `context`.
    fn start(
        mut decoder: IclDecoder<'a>,
        prefix: &[u32],
        context: &[u32],
    ) -> Result<Self, MechanismError> {
        let out = decoder
            .prefill(&[prefix, context].concat())
            .map_err(source_error)?;
        Ok(Self {
            decoder,
            fed: context.to_vec(),
            last: to_f64(&out).remove(0),
        })
    }

    /// The row after `context` when it extends what was fed, feeding only the new
    /// tokens, with whether a forward ran; None when it does not extend it.
    fn extend(&mut self, context: &[u32]) -> Result<Option<(Vec<f64>, bool)>, MechanismError> {
        if !context.starts_with(&self.fed) {
            return Ok(None);
        }
        let new = &context[self.fed.len()..];
        if new.is_empty() {
            return Ok(Some((self.last.clone(), false)));
        }
        let out = if let [token] = new {
            self.decoder.next_log_probs(*token)
        } else {
            self.decoder.prefill(new)
        }
        .map_err(source_error)?;
        self.last = to_f64(&out).remove(0);
        self.fed.extend_from_slice(new);
        Ok(Some((self.last.clone(), true)))
    }
}

impl<'a> PromptSource<'a> {
    /// A source with the prompt `header` and the private demonstrations, each
    /// already tokenised as it appears in a prompt.
    pub fn new(runner: &'a IclRunner, header: Vec<u32>, demos: Vec<Vec<u32>>) -> Self {
        Self {
            runner,
            header,
            prefixes: (0..demos.len()).map(|_| None).collect(),
            demos,
            zero: None,
            prepared: None,
            forwards: 0,
        }
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

    fn check_context(context: &[u32]) -> Result<(), MechanismError> {
        if context.is_empty() {
            return Err(source_error("an empty context"));
        }
        Ok(())
    }

    /// The zero-shot row after `header` and `context`, feeding its decoder only the
    /// tokens it has not seen when `context` extends what it was fed.
    fn zero_row(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        Self::check_context(context)?;
        if let Some(row) = &mut self.zero
            && let Some((last, ran)) = row.extend(context)?
        {
            self.forwards += usize::from(ran);
            return Ok(last);
        }
        let decoder = self
            .runner
            .decoder(RowLayout::public_only(1))
            .map_err(source_error)?;
        let row = GrowingRow::start(decoder, &self.header, context)?;
        self.forwards += 1;
        let last = row.last.clone();
        self.zero = Some(row);
        Ok(last)
    }

    /// The model the prompts run through.
    pub(super) fn runner(&self) -> &'a IclRunner {
        self.runner
    }

    /// The instruction every prompt starts with.
    pub(super) fn header(&self) -> &[u32] {
        &self.header
    }

    /// Demonstration `demo`'s prefilled prefix (made on first use).
    fn prefix(&mut self, demo: usize) -> Result<IclDecoder<'a>, MechanismError> {
        self.check_demo(demo)?;
        if let Some(d) = &self.prefixes[demo] {
            return Ok(d.clone());
        }
        let mut decoder = self
            .runner
            .decoder(RowLayout::public_only(1))
            .map_err(source_error)?;
        decoder
            .prefill(&[self.header.as_slice(), &self.demos[demo]].concat())
            .map_err(source_error)?;
        self.forwards += 1;
        self.prefixes[demo] = Some(decoder.clone());
        Ok(decoder)
    }

    /// The one-shot rows of `drawn` after `context`, in one batch over their prefixes.
    fn one_shot_rows(
        &mut self,
        drawn: &[usize],
        context: &[u32],
    ) -> Result<Vec<Vec<f64>>, MechanismError> {
        Self::check_context(context)?;
        let Some((&first, rest)) = drawn.split_first() else {
            return Ok(Vec::new());
        };
        let mut batch = self.prefix(first)?;
        for &d in rest {
            let next = self.prefix(d)?;
            batch.append(next).map_err(source_error)?;
        }
        let out = batch.prefill(context).map_err(source_error)?;
        self.forwards += 1;
        Ok(to_f64(&out))
    }
}

impl PromptSource<'_> {
    /// The one-shot rows of many `(demonstration, context)` requests (any
    /// queries), in batches of at most [`ONE_SHOT_BATCH_ROWS`] rows: the drawn
    /// prefixes cloned into one decoder, each row fed its own context, left-padded
    /// with masked slots so that every row is what it would be alone.
    pub(super) fn one_shot_batch(
        &mut self,
        requests: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f64>>, MechanismError> {
        let mut rows = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(ONE_SHOT_BATCH_ROWS) {
            let Some((&(first, _), rest)) = chunk.split_first() else {
                continue;
            };
            let mut batch = self.prefix(first)?;
            for &(d, _) in rest {
                let next = self.prefix(d)?;
                batch.append(next).map_err(source_error)?;
            }
            let contexts: Vec<Vec<u32>> = chunk
                .iter()
                .map(|&(_, c)| {
                    Self::check_context(c)?;
                    Ok(c.to_vec())
                })
                .collect::<Result<_, MechanismError>>()?;
            let out = batch.prefill_rows(&contexts).map_err(source_error)?;
            self.forwards += 1;
            rows.extend(to_f64(&out));
        }
        Ok(rows)
    }
}

/// Rows of one batched one-shot forward at most (bounds the joined KV cache).
pub const ONE_SHOT_BATCH_ROWS: usize = 64;

impl IclSource for PromptSource<'_> {
    fn demonstrations(&self) -> usize {
        self.demos.len()
    }

    fn prepare(&mut self, drawn: &[usize], context: &[u32]) -> Result<(), MechanismError> {
        for &d in drawn {
            self.check_demo(d)?;
        }
        let mut rows = vec![self.zero_row(context)?];
        rows.extend(self.one_shot_rows(drawn, context)?);
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
        self.zero_row(context)
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
        Ok(self.one_shot_rows(&[demo], context)?.remove(0))
    }
}

/// The online phase of DPS-MOZO+Off: the DP demonstrations (public input and DP
/// output, cut at the first line break) in the prompt before the context.
///
/// The prompt's prefix (`header` and the rendered demonstrations) is the same for
/// every query: it is prefilled once, and each query's decoder starts from a clone
/// of it and is extended token by token as the context grows.
pub struct DpPromptSource<'a> {
    runner: &'a IclRunner,
    tokenizer: &'a Tokenizer,
    header: Vec<u32>,
    /// The demonstrations rendered and prefilled after `header`, once.
    prefix: Option<(Vec<DpDemonstration>, IclDecoder<'a>)>,
    /// The current query's decoder, grown along its context.
    current: Option<GrowingRow<'a>>,
}

impl<'a> DpPromptSource<'a> {
    /// A source over `runner` with the prompt `header`.
    pub fn new(runner: &'a IclRunner, tokenizer: &'a Tokenizer, header: Vec<u32>) -> Self {
        Self {
            runner,
            tokenizer,
            header,
            prefix: None,
            current: None,
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

    /// The decoder prefilled with `header` and `demos` (made once per set of demonstrations).
    fn prefix(&mut self, demos: &[DpDemonstration]) -> Result<IclDecoder<'a>, MechanismError> {
        if let Some((seen, decoder)) = &self.prefix
            && seen.as_slice() == demos
        {
            return Ok(decoder.clone());
        }
        let ids = [self.header.clone(), self.render(demos)?].concat();
        let mut decoder = self
            .runner
            .decoder(RowLayout::public_only(1))
            .map_err(source_error)?;
        decoder.prefill(&ids).map_err(source_error)?;
        self.prefix = Some((demos.to_vec(), decoder.clone()));
        self.current = None;
        Ok(decoder)
    }
}

impl FewShotSource for DpPromptSource<'_> {
    fn few_shot_logits(
        &mut self,
        demos: &[DpDemonstration],
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        if context.is_empty() {
            return Err(source_error("an empty context"));
        }
        let same_demos = self
            .prefix
            .as_ref()
            .is_some_and(|(seen, _)| seen.as_slice() == demos);
        if same_demos
            && let Some(row) = &mut self.current
            && let Some((last, _)) = row.extend(context)?
        {
            return Ok(last);
        }
        let row = GrowingRow::start(self.prefix(demos)?, &[], context)?;
        let last = row.last.clone();
        self.current = Some(row);
        Ok(last)
    }
}

/// What the tests of the ICL modules share: the tiny model and exact references.
#[cfg(test)]
pub(super) mod fixtures {
    use std::path::Path;

    use privmix_ensemble::rows::RowLayout;
    use privmix_ensemble::runner::EnsembleRunner;
    use privmix_mechanisms::MechanismError;
    use privmix_models::{LoadOptions, Model, Tokenizer};

    use crate::Backend;
    use crate::icl::source::{IclRunner, source_error, to_f64};

    /// The rows of one batched forward of whole prompts, as f64 vectors.
    pub(crate) fn forward_rows(
        runner: &IclRunner,
        rows: &[Vec<u32>],
    ) -> Result<Vec<Vec<f64>>, MechanismError> {
        let mut decoder = runner
            .decoder(RowLayout::public_only(rows.len()))
            .map_err(source_error)?;
        let out = decoder.prefill_rows(rows).map_err(source_error)?;
        Ok(to_f64(&out))
    }

    /// The tiny Llama fixture (vocabulary 256) of the models crate.
    pub(crate) fn runner() -> IclRunner {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/llama");
        let model = Model::<Backend>::load(LoadOptions::path(&dir, &Default::default())).unwrap();
        EnsembleRunner::new(model, &[]).unwrap()
    }

    pub(crate) fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "largest difference {worst}");
    }

    /// The byte-level tokenizer fixture (ids fit the tiny model's vocabulary).
    pub(crate) fn tokenizer() -> Tokenizer {
        Tokenizer::from_file(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../cli/tests/fixtures/tokenizer/tokenizer.json"),
        )
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{close, forward_rows, runner, tokenizer};
    use super::*;

    /// The cached prefixes and the growing zero-shot decoder give the rows a full
    /// forward of each whole prompt gives.
    #[test]
    fn cached_rows_equal_whole_prompt_forwards() {
        let runner = runner();
        let header = vec![71, 105, 118, 101, 10];
        let demos = vec![
            vec![
                87, 58, 32, 99, 97, 116, 10, 68, 58, 32, 97, 110, 105, 109, 97, 108, 10, 10,
            ],
            vec![
                87, 58, 32, 111, 97, 107, 10, 68, 58, 32, 116, 114, 101, 101, 10, 10,
            ],
            vec![87, 58, 32, 120, 10, 68, 58, 32, 121, 10, 10],
        ];
        let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
        let mut context = vec![87, 58, 32, 100, 111, 103, 10, 68, 58];
        for step in 0..4 {
            let drawn: &[usize] = if step % 2 == 0 { &[0, 2] } else { &[1, 2] };
            src.prepare(drawn, &context).unwrap();
            let mut whole = vec![[header.as_slice(), &context].concat()];
            whole.extend(
                drawn
                    .iter()
                    .map(|&d| [header.as_slice(), &demos[d], &context].concat()),
            );
            let expected = forward_rows(&runner, &whole).unwrap();
            close(&src.zero_shot_logits(&context).unwrap(), &expected[0]);
            for (i, &d) in drawn.iter().enumerate() {
                close(&src.one_shot_logits(d, &context).unwrap(), &expected[1 + i]);
            }
            // A demonstration not drawn at this step: its own forward.
            close(
                &src.one_shot_logits(1 - (step % 2), &context).unwrap(),
                &forward_rows(
                    &runner,
                    &[[header.as_slice(), &demos[1 - (step % 2)], &context].concat()],
                )
                .unwrap()[0],
            );
            context.push(97 + step as u32);
        }
        // A new query (not an extension): the zero-shot decoder starts over.
        let other = vec![87, 58, 32, 122, 10, 68, 58];
        close(
            &src.zero_shot_logits(&other).unwrap(),
            &forward_rows(&runner, &[[header.as_slice(), &other].concat()]).unwrap()[0],
        );
        assert!(src.prepare(&[3], &other).is_err());

        // Prefixes of different lengths prefilled in one padded batch, then one
        // shared context (the membership-inference attack's forwards).
        let prefixes = vec![header.clone(), [header.as_slice(), &demos[0]].concat()];
        let mut batch = runner.decoder(RowLayout::public_only(2)).unwrap();
        batch.prefill_rows(&prefixes).unwrap();
        let rows = to_f64(&batch.clone().prefill(&other).unwrap());
        let whole: Vec<Vec<u32>> = prefixes
            .iter()
            .map(|p| [p.as_slice(), &other].concat())
            .collect();
        let expected = forward_rows(&runner, &whole).unwrap();
        close(&rows[0], &expected[0]);
        close(&rows[1], &expected[1]);
        assert!(src.zero_shot_logits(&[]).is_err());
    }

    /// DPS-MOZO+Off's online source: the cached prefix of DP demonstrations and
    /// the decoder extended token by token give what a forward of the whole prompt
    /// gives, across queries and after the demonstrations change.
    #[test]
    fn dp_prompt_rows_equal_whole_prompt_forwards() {
        let runner = runner();
        let tokenizer = tokenizer();
        let header = tokenizer.encode("Give definitions.\n", false).unwrap();
        let demo = |input: &str, output: &str| DpDemonstration {
            input: tokenizer.encode(input, false).unwrap(),
            output: tokenizer.encode(output, false).unwrap(),
        };
        let demos = vec![
            demo("Word: cat\nDefinition:", " an animal\nWord: x"),
            demo("Word: oak\nDefinition:", " a tree"),
        ];
        let rendered = tokenizer
            .encode(
                "Word: cat\nDefinition: an animal\n\nWord: oak\nDefinition: a tree\n\n",
                false,
            )
            .unwrap();
        let mut src = DpPromptSource::new(&runner, &tokenizer, header.clone());
        let whole = |demo_ids: &[u32], context: &[u32]| {
            forward_rows(&runner, &[[header.as_slice(), demo_ids, context].concat()]).unwrap()[0]
                .clone()
        };
        for query in ["Word: dog\nDefinition:", "Word: elm\nDefinition:"] {
            let mut context = tokenizer.encode(query, false).unwrap();
            for step in 0..3u32 {
                let got = src.few_shot_logits(&demos, &context).unwrap();
                close(&got, &whole(&rendered, &context));
                // Asked again without a new token: the same row.
                close(&src.few_shot_logits(&demos, &context).unwrap(), &got);
                context.push(97 + step);
            }
        }
        // Other demonstrations: a new prefix.
        let other = vec![demo("Word: sun\nDefinition:", " a star")];
        let rendered = tokenizer
            .encode("Word: sun\nDefinition: a star\n\n", false)
            .unwrap();
        let context = tokenizer.encode("Word: dog\nDefinition:", false).unwrap();
        close(
            &src.few_shot_logits(&other, &context).unwrap(),
            &whole(&rendered, &context),
        );
        assert!(src.few_shot_logits(&other, &[]).is_err());
    }
}
