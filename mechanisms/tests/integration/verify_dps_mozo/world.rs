//! The verifier's worlds: a public zero-shot table and a private set of demonstrations,
//! each a deterministic table of logits keyed on the context (an adaptive query rule: the
//! logits asked for at a step depend on every token released before it), served to the
//! mechanism through an [`IclSource`] that records every call.

use std::fmt;
use std::rc::Rc;

use privmix_mechanisms::{DpDemonstration, FewShotSource, IclSource, MechanismError};

use super::law::LOGIT_BOUND;

/// A row of logits as a function of the context (prompt and tokens released so far).
pub type RowFn = Rc<dyn Fn(&[u32]) -> Vec<f64>>;

/// One table: the zero-shot model's, or one demonstration's one-shot logits.
#[derive(Clone)]
pub struct Table {
    /// For messages.
    pub name: String,
    rows: RowFn,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

/// SplitMix64: the verifier's deterministic generator (tables and searches).
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform f64 in `[-1, 1)` from the generator.
pub fn unit(state: &mut u64) -> f64 {
    (splitmix(state) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

impl Table {
    /// A table from any function of the context.
    pub fn from_fn(name: impl Into<String>, f: impl Fn(&[u32]) -> Vec<f64> + 'static) -> Self {
        Table {
            name: name.into(),
            rows: Rc::new(f),
        }
    }

    /// The same row at every context.
    pub fn fixed(name: impl Into<String>, row: Vec<f64>) -> Self {
        Self::from_fn(name, move |_| row.clone())
    }

    /// `base` plus `by_last[t]` after a released token t (and `base` before any): the
    /// demonstration reacts to what was just released.
    pub fn adaptive(name: impl Into<String>, base: Vec<f64>, by_last: Vec<Vec<f64>>) -> Self {
        Self::from_fn(name, move |ctx| {
            let mut row = base.clone();
            if let Some(&t) = ctx.last() {
                for (r, d) in row.iter_mut().zip(&by_last[t as usize % by_last.len()]) {
                    *r += d;
                }
            }
            row
        })
    }

    /// A pseudo-random row per context: uniform in `[-scale, scale]`, each entry −∞
    /// with probability `neg_inf` (a zero probability), keyed on (seed, whole context).
    pub fn seeded(
        name: impl Into<String>,
        seed: u64,
        vocab: usize,
        scale: f64,
        neg_inf: f64,
    ) -> Self {
        Self::from_fn(name, move |ctx| {
            let mut s = seed;
            for &t in ctx {
                s ^= u64::from(t).wrapping_add(0x1234_5678);
                splitmix(&mut s);
            }
            (0..vocab)
                .map(|_| {
                    let x = scale * unit(&mut s);
                    if (unit(&mut s) + 1.0) / 2.0 < neg_inf {
                        f64::NEG_INFINITY
                    } else {
                        x
                    }
                })
                .collect()
        })
    }

    /// The row at `ctx`, checked against the verifier's error-bound premises.
    pub fn row(&self, ctx: &[u32], vocab: usize) -> Vec<f64> {
        let r = (self.rows)(ctx);
        assert_eq!(r.len(), vocab, "{}: row length", self.name);
        assert!(
            r.iter()
                .all(|x| *x == f64::NEG_INFINITY || (x.is_finite() && x.abs() <= LOGIT_BOUND)),
            "{}: logits {r:?} outside the verifier's premises",
            self.name
        );
        r
    }
}

/// A public zero-shot table and a private demonstration set.
#[derive(Clone, Debug)]
pub struct World {
    /// Vocabulary size (≤ 4 here).
    pub vocab: usize,
    /// Public: the zero-shot logits.
    pub zero: Table,
    /// Private: the demonstrations, in order.
    pub demos: Vec<Table>,
}

impl World {
    /// The replace-one neighbour: demonstration `j` replaced by `by`.
    pub fn replaced(&self, j: usize, by: &Table) -> World {
        let mut w = self.clone();
        w.demos[j] = by.clone();
        w
    }

    /// The add-one neighbour: `extra` appended.
    pub fn added(&self, extra: &Table) -> World {
        let mut w = self.clone();
        w.demos.push(extra.clone());
        w
    }
}

/// What the mechanism asked a [`Source`] for.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// `prepare(drawn, context)`.
    Prepare(Vec<usize>, Vec<u32>),
    /// `zero_shot_logits(context)`.
    Zero(Vec<u32>),
    /// `one_shot_logits(demo, context)`.
    One(usize, Vec<u32>),
}

/// The mechanism's view of a [`World`], with a log of its calls.
pub struct Source<'a> {
    world: &'a World,
    /// Every call, in order.
    pub calls: Vec<Call>,
}

impl<'a> Source<'a> {
    /// Serves `world`.
    pub fn new(world: &'a World) -> Self {
        Source {
            world,
            calls: Vec::new(),
        }
    }
}

impl IclSource for Source<'_> {
    fn demonstrations(&self) -> usize {
        self.world.demos.len()
    }
    fn prepare(&mut self, drawn: &[usize], context: &[u32]) -> Result<(), MechanismError> {
        self.calls
            .push(Call::Prepare(drawn.to_vec(), context.to_vec()));
        Ok(())
    }
    fn zero_shot_logits(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        self.calls.push(Call::Zero(context.to_vec()));
        Ok(self.world.zero.row(context, self.world.vocab))
    }
    fn one_shot_logits(
        &mut self,
        demo: usize,
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        self.calls.push(Call::One(demo, context.to_vec()));
        Ok(self.world.demos[demo].row(context, self.world.vocab))
    }
}

/// DPS-MOZO+Off's online phase: few-shot logits as a function of the DP demonstrations
/// and the context only.
pub type DecodeFn = Rc<dyn Fn(&[DpDemonstration], &[u32]) -> Vec<f64>>;

/// A [`FewShotSource`] recording what it was shown.
pub struct Decoder {
    f: DecodeFn,
    /// Every (demonstrations, context) it was asked about.
    pub calls: Vec<(Vec<DpDemonstration>, Vec<u32>)>,
}

impl Decoder {
    /// Serves `f`.
    pub fn new(f: DecodeFn) -> Self {
        Decoder {
            f,
            calls: Vec::new(),
        }
    }
}

impl FewShotSource for Decoder {
    fn few_shot_logits(
        &mut self,
        demos: &[DpDemonstration],
        context: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        self.calls.push((demos.to_vec(), context.to_vec()));
        Ok((self.f)(demos, context))
    }
}

/// A decoder that looks at the DP outputs: the logit of each token is raised by how
/// often the DP demonstrations produced it, and by the context's last token.
pub fn counting_decoder(vocab: usize, weight: f64) -> DecodeFn {
    Rc::new(move |demos, ctx| {
        let mut l: Vec<f64> = (0..vocab).map(|i| -0.3 * i as f64).collect();
        for d in demos {
            for &t in &d.output {
                l[t as usize] += weight;
            }
        }
        if let Some(&t) = ctx.last() {
            l[t as usize % vocab] -= 0.5 * weight;
        }
        l
    })
}
