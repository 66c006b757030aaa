//! Lockstep decoding: one ICL method answers all of a seed's queries together, one
//! token of every unfinished query per round, so that a round's one-shot prompts
//! run as a few batched forwards and its zero-shot prompts as one decode step,
//! instead of one small forward per query and token.
//!
//! The mechanism is called exactly as in sequential decoding — `step` once per
//! released token, with that query's context so far — through a replay:
//! 1. each unfinished query's step runs against a [`Recorder`], which notes the
//!    demonstrations the step drew and stops it with [`PENDING`] in `prepare`,
//!    before anything is charged or sampled (an [`IclSource`] is asked for its
//!    rows before the step charges: see `IclMechanism`);
//! 2. the rows of every recorded request are computed in batches;
//! 3. each step runs again from the same random state against a [`Served`]
//!    source holding those rows: it draws the same demonstrations, then charges
//!    its account and samples as it always does.
//!
//! Each query has its own random stream, drawn from the method's, so a query's
//! answer does not depend on the others. The account is shared and charged in
//! query order within a round; when it refuses a charge nothing more is released
//! to any query (the budgets the experiment calibrates cover every token, so this
//! only ends a misconfigured run early).

use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::step_loop::settle_charged;
use privmix_mechanisms::{Account, IclMechanism, IclSource, MechanismError, PrivacyRng};
use privmix_models::Tokenizer;
use rand::RngCore;

use super::common::{Answer, Decoded};
use super::source::{IclDecoder, PromptSource};
use super::wordnet::Definition;
use crate::error::BenchError;

/// What the [`Recorder`] stops a step with.
const PENDING: &str = "lockstep: the step's rows are computed in the round's batch";

fn pending() -> MechanismError {
    MechanismError::Source(PENDING.into())
}

/// Notes the demonstrations a step draws, and stops the step there.
struct Recorder {
    demonstrations: usize,
    drawn: Option<Vec<usize>>,
}

impl IclSource for Recorder {
    fn demonstrations(&self) -> usize {
        self.demonstrations
    }

    fn prepare(&mut self, drawn: &[usize], _context: &[u32]) -> Result<(), MechanismError> {
        self.drawn = Some(drawn.to_vec());
        Err(pending())
    }

    fn zero_shot_logits(&mut self, _context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        Err(pending())
    }

    fn one_shot_logits(&mut self, _demo: usize, _: &[u32]) -> Result<Vec<f64>, MechanismError> {
        Err(pending())
    }
}

/// Serves one step the rows computed for what its recorded run drew.
struct Served<'r> {
    demonstrations: usize,
    drawn: &'r [usize],
    zero: &'r [f64],
    rows: &'r [Vec<f64>],
}

impl IclSource for Served<'_> {
    fn demonstrations(&self) -> usize {
        self.demonstrations
    }

    fn prepare(&mut self, drawn: &[usize], _context: &[u32]) -> Result<(), MechanismError> {
        if drawn == self.drawn {
            Ok(())
        } else {
            Err(MechanismError::Source(
                "lockstep: the replayed step drew other demonstrations than its recorded run"
                    .into(),
            ))
        }
    }

    fn zero_shot_logits(&mut self, _context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        Ok(self.zero.to_vec())
    }

    fn one_shot_logits(&mut self, demo: usize, _: &[u32]) -> Result<Vec<f64>, MechanismError> {
        self.drawn
            .iter()
            .position(|&d| d == demo)
            .map(|i| self.rows[i].clone())
            .ok_or_else(|| {
                MechanismError::Source(format!(
                    "lockstep: demonstration {demo} was not drawn at this step"
                ))
            })
    }
}

/// One query being answered, with its own random stream.
struct Query {
    answer: Answer,
    rng: PrivacyRng,
}

/// The zero-shot rows of the unfinished queries: one decoder row per query over
/// `header` and its context, stepped by one token per round.
struct ZeroRows<'a> {
    decoder: Option<IclDecoder<'a>>,
    /// The query of each decoder row, and the context length it has been fed.
    rows: Vec<(usize, usize)>,
}

impl<'a> ZeroRows<'a> {
    /// The rows of queries `live` (ascending; each unfinished since the last call).
    fn rows(
        &mut self,
        source: &PromptSource<'a>,
        live: &[usize],
        queries: &[Query],
    ) -> Result<Vec<Vec<f64>>, MechanismError> {
        let err = |e: privmix_ensemble::EnsembleError| MechanismError::Source(e.to_string());
        let out = match &mut self.decoder {
            None => {
                let mut decoder = source
                    .runner()
                    .decoder(RowLayout::public_only(live.len()))
                    .map_err(err)?;
                let prompts: Vec<Vec<u32>> = live
                    .iter()
                    .map(|&q| [source.header(), &queries[q].answer.context].concat())
                    .collect();
                let out = decoder.prefill_rows(&prompts).map_err(err)?;
                self.rows = live
                    .iter()
                    .map(|&q| (q, queries[q].answer.context.len()))
                    .collect();
                self.decoder = Some(decoder);
                out
            }
            Some(decoder) => {
                let keep: Vec<usize> = (0..self.rows.len())
                    .filter(|&r| live.contains(&self.rows[r].0))
                    .collect();
                if keep.len() != live.len() {
                    return Err(MechanismError::Source(
                        "lockstep: a query came back after it finished".into(),
                    ));
                }
                if keep.len() < self.rows.len() {
                    decoder.retain_rows(&keep).map_err(err)?;
                    self.rows = keep.iter().map(|&r| self.rows[r]).collect();
                }
                let mut next = Vec::with_capacity(live.len());
                for (q, fed) in &mut self.rows {
                    let context = &queries[*q].answer.context;
                    if context.len() != *fed + 1 {
                        return Err(MechanismError::Source(
                            "lockstep: a query's context did not grow by one token".into(),
                        ));
                    }
                    next.push(context[*fed]);
                    *fed += 1;
                }
                decoder.next_log_probs_rows(&next).map_err(err)?
            }
        };
        Ok((0..out.rows())
            .map(|r| out.row(r).iter().map(|&x| f64::from(x)).collect())
            .collect())
    }
}

/// Answers every query with `mechanism` over `source` (see the module docs):
/// up to `max_tokens` tokens each, stopping at a line break or the
/// end-of-sequence token, each query with its own stream drawn from `rng`.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_lockstep(
    mechanism: &mut dyn IclMechanism,
    source: &mut PromptSource<'_>,
    tokenizer: &Tokenizer,
    queries: &[Definition],
    max_tokens: usize,
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
    bar: &indicatif::ProgressBar,
) -> Result<Decoded, BenchError> {
    bar.set_length(queries.len() as u64);
    bar.set_position(0);
    let demonstrations = source.demonstrations();
    let mut state = queries
        .iter()
        .map(|q| {
            Ok(Query {
                answer: Answer::new(tokenizer, &q.word)?,
                rng: PrivacyRng::from_seed(rng.next_u64()),
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    let mut out = Decoded::new();
    let mut zero = ZeroRows {
        decoder: None,
        rows: Vec::new(),
    };
    for _round in 0..max_tokens {
        let live: Vec<usize> = (0..state.len())
            .filter(|&q| !state[q].answer.done)
            .collect();
        if live.is_empty() {
            break;
        }
        // 1. What each step draws.
        let mut drawn = Vec::with_capacity(live.len());
        for &q in &live {
            let mut recorder = Recorder {
                demonstrations,
                drawn: None,
            };
            let mut rng = state[q].rng.clone();
            match mechanism.step(&mut recorder, &state[q].answer.context, &mut rng, account) {
                Err(MechanismError::Source(m)) if m == PENDING => {}
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    return Err(BenchError::Config(format!(
                        "{} released a token without asking for its rows",
                        mechanism.name()
                    )));
                }
            }
            drawn.push(recorder.drawn.unwrap_or_default());
        }
        // 2. Their rows, batched.
        let zero_rows = zero.rows(source, &live, &state)?;
        let mut requests: Vec<(usize, &[u32])> = Vec::new();
        for (&q, d) in live.iter().zip(&drawn) {
            requests.extend(d.iter().map(|&j| (j, state[q].answer.context.as_slice())));
        }
        let one_shot = source.one_shot_batch(&requests)?;
        // 3. The steps, replayed on those rows.
        let mut offset = 0;
        let mut exhausted = false;
        for (i, &q) in live.iter().enumerate() {
            let rows = &one_shot[offset..offset + drawn[i].len()];
            offset += drawn[i].len();
            let mut served = Served {
                demonstrations,
                drawn: &drawn[i],
                zero: &zero_rows[i],
                rows,
            };
            let query = &mut state[q];
            let context = &query.answer.context;
            let stepped = mechanism.step(&mut served, context, &mut query.rng, account);
            let Some(outcome) = settle_charged(stepped)? else {
                exhausted = true;
                break;
            };
            out.count(&outcome);
            query.answer.push(tokenizer, outcome.token as u32)?;
            if query.answer.done {
                bar.inc(1);
            }
        }
        if exhausted {
            break;
        }
    }
    bar.set_position(queries.len() as u64);
    out.predictions = state.iter().map(|q| q.answer.prediction()).collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use privmix_accountant::Orders;
    use privmix_mechanisms::{DpsMozo, DpsMozoConfig, FewShotProduct, Unbudgeted, ZeroShot};

    use super::super::common::{demo_text, query_text};
    use super::super::source::ONE_SHOT_BATCH_ROWS;
    use super::super::source::fixtures::{close, forward_rows, runner, tokenizer};
    use super::*;

    fn definition(word: &str, gloss: &str) -> Definition {
        Definition {
            word: word.into(),
            gloss: gloss.into(),
        }
    }

    /// Batched one-shot rows — prefixes of different lengths, contexts of
    /// different lengths, more requests than one batch holds — equal a forward
    /// of each whole prompt.
    #[test]
    fn one_shot_batch_equals_whole_prompt_forwards() {
        let runner = runner();
        let header = vec![71, 105, 118, 101, 10];
        let demos: Vec<Vec<u32>> = vec![
            (0..18).map(|i| 97 + i).collect(),
            (0..5).map(|i| 65 + i).collect(),
            (0..11).map(|i| 48 + i).collect(),
        ];
        let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
        let contexts: Vec<Vec<u32>> = (1..=7).map(|n| (0..n).map(|i| 100 + i).collect()).collect();
        let requests: Vec<(usize, &[u32])> = (0..ONE_SHOT_BATCH_ROWS + 6)
            .map(|i| (i % demos.len(), contexts[i % contexts.len()].as_slice()))
            .collect();
        let rows = src.one_shot_batch(&requests).unwrap();
        assert_eq!(rows.len(), requests.len());
        let whole: Vec<Vec<u32>> = requests
            .iter()
            .map(|&(d, c)| [header.as_slice(), &demos[d], c].concat())
            .collect();
        for (i, w) in whole.iter().enumerate() {
            close(
                &rows[i],
                &forward_rows(&runner, std::slice::from_ref(w)).unwrap()[0],
            );
        }
        assert!(src.one_shot_batch(&[(3, &contexts[0])]).is_err());
        assert!(src.one_shot_batch(&[(0, &[])]).is_err());
    }

    /// The same answers, token counts and privacy spent as decoding each query on
    /// its own, one forward per token, with the same per-query random streams.
    #[test]
    fn lockstep_equals_sequential_decoding() {
        let runner = runner();
        let tokenizer = tokenizer();
        let header = tokenizer.encode("Define.\n", false).unwrap();
        let private = [
            definition("cat", "a small animal"),
            definition("oak", "a tree"),
            definition("sun", "a star"),
            definition("ice", "frozen water"),
        ];
        let demos: Vec<Vec<u32>> = private
            .iter()
            .map(|d| tokenizer.encode(&demo_text(d), false).unwrap())
            .collect();
        let queries = [
            definition("dog", "an animal"),
            definition("elm", "a tree"),
            definition("x", "a letter"),
        ];
        let orders = Orders::dp_accounting_default();
        let config = DpsMozoConfig::new(2, 20, 0.3).unwrap();
        let mechanisms: Vec<Box<dyn Fn() -> Box<dyn IclMechanism>>> = vec![
            Box::new(|| Box::new(ZeroShot::new(20).unwrap())),
            Box::new(move || Box::new(FewShotProduct::new(config))),
            Box::new(move || Box::new(DpsMozo::new(config))),
        ];
        let bar = indicatif::ProgressBar::hidden();
        for make in &mechanisms {
            for seed in [3, 4] {
                let mut account = Unbudgeted::new(orders.clone());
                let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
                let batched = decode_lockstep(
                    make().as_mut(),
                    &mut src,
                    &tokenizer,
                    &queries,
                    6,
                    &mut PrivacyRng::from_seed(seed),
                    &mut account,
                    &bar,
                )
                .unwrap();

                // Reference: each query alone, the source asked token by token.
                let mut mechanism = make();
                let mut reference_account = Unbudgeted::new(orders.clone());
                let mut src = PromptSource::new(&runner, header.clone(), demos.clone());
                let mut rng = PrivacyRng::from_seed(seed);
                let mut streams: Vec<PrivacyRng> = queries
                    .iter()
                    .map(|_| PrivacyRng::from_seed(rng.next_u64()))
                    .collect();
                let mut predictions = Vec::new();
                let mut generated = 0;
                for (q, stream) in queries.iter().zip(&mut streams) {
                    let mut context = tokenizer.encode(&query_text(&q.word), false).unwrap();
                    let start = context.len();
                    let mut text = String::new();
                    for _ in 0..6 {
                        let outcome = mechanism
                            .step(&mut src, &context, stream, &mut reference_account)
                            .unwrap();
                        generated += 1;
                        if Some(outcome.token as u32) == tokenizer.eos_id() {
                            break;
                        }
                        context.push(outcome.token as u32);
                        text = tokenizer.decode(&context[start..]).unwrap();
                        if text.contains('\n') {
                            break;
                        }
                    }
                    predictions.push(text.split('\n').next().unwrap().trim().to_string());
                }
                assert_eq!(batched.predictions, predictions, "{}", mechanism.name());
                assert_eq!(batched.tokens, generated);
                assert!(
                    generated > queries.len(),
                    "answers of one token test little"
                );
                assert_eq!(account.charges(), reference_account.charges());
                assert_eq!(
                    account.spent().epsilons(),
                    reference_account.spent().epsilons()
                );
            }
        }
    }
}
