//! Step commits: the charges of one decoding step of many requests, checked in
//! order and recorded with one write and one sync.
//!
//! # Guarantee
//!
//! [`Ledger::charge_step`] returns `Ok` only after every accepted charge is on
//! stable storage, exactly as [`Ledger::charge`] does for one (the same
//! contract: release what a charge pays for only after `Ok`). The budget check
//! is [`Ledger::charge`]'s, made in memory for each charge in turn on the total
//! composed so far, accepted charges of the same step included; a charge the
//! budget cannot pay is dropped and the next one is checked, so a refusal costs
//! only its own request's token.
//!
//! The accepted charges are written (format version 4) as step records: each
//! distinct charge (its curve's bits and its event) is defined once per file
//! under a number, and a step record lists runs of (definition, count, label).
//! Reading a run back composes its curve `count` times in turn, rounded up
//! ([`crate::RdpCurve::compose`], Mironov, arXiv:1702.07476, Prop. 1), which is
//! the very sequence of operations the writer made, so the total read back
//! equals the total acknowledged bit for bit. A file of an older version gets
//! the same charges as ordinary charge records, still in one write.

use std::collections::HashMap;

use super::format::{
    self, Definition, DefinitionBytes, FIRST_EVENT_VERSION, FIRST_STEP_VERSION, MAX_DEFINITIONS,
    MAX_LABEL_BYTES, MAX_STEP_DEFINITIONS, MAX_STEP_RUNS, RunRef,
};
use super::{Ledger, LedgerError, MAX_EVENT_BYTES, event_codec, now_ms};
use crate::{AccountantError, DpEvent, EpsilonDelta, RdpCurve};

/// What one charge of a step costs: a curve at the ledger's orders, or an event
/// (charged as its curve at the ledger's orders, and recorded as the event).
#[derive(Debug, Clone, Copy)]
pub enum StepCost<'a> {
    /// An RDP curve.
    Curve(&'a RdpCurve),
    /// A structured event.
    Event(&'a DpEvent),
}

/// One charge of a step: its cost and its label.
#[derive(Debug, Clone, Copy)]
pub struct StepCharge<'a> {
    /// What it costs.
    pub cost: StepCost<'a>,
    /// Its label (at most [`MAX_LABEL_BYTES`] bytes).
    pub label: &'a str,
}

/// What a step commit did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StepReceipt {
    /// For each charge, in order: whether it was recorded (`false`: the budget
    /// could not pay it, and nothing of it was written).
    pub accepted: Vec<bool>,
    /// The spent total after the step at the budget's δ (rounded up); `None`
    /// without a budget.
    pub spent: Option<EpsilonDelta>,
    /// How many records the step wrote (0 when nothing was accepted).
    pub records: u64,
}

/// A charge ready to record: its curve and how it is stored.
struct Prepared<'a> {
    curve: RdpCurve,
    definition: DefinitionBytes,
    /// The event's encoding, for a charge record in a version 3 file.
    event: Option<Vec<u8>>,
    label: &'a str,
}

impl Ledger {
    /// Records the charges of one step, checked in order: see the module docs
    /// (`ledger/step.rs`) for the guarantee. Refused charges are reported in
    /// [`StepReceipt::accepted`], not as an error.
    ///
    /// An invalid charge (a label over [`MAX_LABEL_BYTES`], a curve over other
    /// orders, an invalid event or one whose encoding exceeds
    /// [`MAX_EVENT_BYTES`]) fails the whole step before anything is written.
    /// After an I/O error the handle is poisoned, as after [`Ledger::charge`].
    pub fn charge_step(&mut self, charges: &[StepCharge<'_>]) -> Result<StepReceipt, LedgerError> {
        self.check_writable()?;
        let prepared = charges
            .iter()
            .map(|c| self.prepare(c))
            .collect::<Result<Vec<_>, _>>()?;
        let mut total = self.spent.clone();
        let mut accepted = Vec::with_capacity(prepared.len());
        for p in &prepared {
            let next = total.compose(&p.curve)?;
            let fits = match self.budget {
                Some(budget) => next.epsilon(budget.delta())?.epsilon <= budget.epsilon(),
                None => true,
            };
            if fits {
                total = next;
            }
            accepted.push(fits);
        }
        let chosen: Vec<&Prepared<'_>> = prepared
            .iter()
            .zip(&accepted)
            .filter_map(|(p, &ok)| ok.then_some(p))
            .collect();
        let (frames, records, definitions) = self.encode_step(&chosen);
        if records > 0 {
            self.append_frames(&frames, records)?;
        }
        self.definitions.extend(definitions);
        self.spent = total;
        self.charges += chosen.len() as u64;
        let spent = match self.budget {
            Some(budget) => Some(self.spent.epsilon(budget.delta())?),
            None => None,
        };
        Ok(StepReceipt {
            accepted,
            spent,
            records,
        })
    }

    /// Checks one charge and computes its curve and stored form.
    fn prepare<'a>(&self, charge: &StepCharge<'a>) -> Result<Prepared<'a>, LedgerError> {
        if charge.label.len() > MAX_LABEL_BYTES {
            return Err(LedgerError::LabelTooLong {
                len: charge.label.len(),
                max: MAX_LABEL_BYTES,
            });
        }
        let (curve, event) = match charge.cost {
            StepCost::Curve(curve) => {
                if curve.orders() != &self.orders {
                    return Err(AccountantError::OrdersDiffer.into());
                }
                (curve.clone(), None)
            }
            StepCost::Event(event) => {
                let curve = event.rdp(&self.orders)?;
                let mut encoded = Vec::new();
                event_codec::encode(event, &mut encoded);
                if encoded.len() > MAX_EVENT_BYTES {
                    return Err(LedgerError::EventTooLarge {
                        len: encoded.len(),
                        max: MAX_EVENT_BYTES,
                    });
                }
                (curve, Some(encoded))
            }
        };
        let definition = DefinitionBytes::new(curve.epsilons(), event.as_deref());
        Ok(Prepared {
            curve,
            definition,
            event,
            label: charge.label,
        })
    }

    /// The framed records of `chosen` (in order), how many there are, and the
    /// definitions they make (number by bytes).
    fn encode_step(&self, chosen: &[&Prepared<'_>]) -> (Vec<u8>, u64, HashMap<Vec<u8>, u32>) {
        let mut out = Frames {
            bytes: Vec::new(),
            sequence: self.next_sequence,
            time: now_ms(),
        };
        let mut made: HashMap<Vec<u8>, u32> = HashMap::new();
        if self.version < FIRST_STEP_VERSION {
            for p in chosen {
                let event = p
                    .event
                    .as_deref()
                    .filter(|_| self.version >= FIRST_EVENT_VERSION);
                out.charge(p, event);
            }
            return (out.bytes, out.sequence - self.next_sequence, made);
        }
        // The step record being built: the definitions it makes and its runs.
        let mut defs: Vec<&DefinitionBytes> = Vec::new();
        let mut runs: Vec<RunRef<'_>> = Vec::new();
        let known = self.definitions.len();
        for p in chosen {
            let bytes = &p.definition.bytes;
            let mut number = self
                .definitions
                .get(bytes)
                .or_else(|| made.get(bytes))
                .copied();
            if number.is_none() && known + made.len() < MAX_DEFINITIONS {
                if defs.len() == MAX_STEP_DEFINITIONS {
                    out.step(&mut defs, &mut runs);
                }
                let n = u32::try_from(known + made.len()).expect("below MAX_DEFINITIONS");
                made.insert(bytes.clone(), n);
                defs.push(&p.definition);
                number = Some(n);
            }
            let Some(definition) = number else {
                // No room for another definition: an ordinary charge record, in
                // its place in the order.
                out.step(&mut defs, &mut runs);
                out.charge(p, p.event.as_deref());
                continue;
            };
            match runs.last_mut() {
                Some(run)
                    if run.definition == definition
                        && run.label == p.label
                        && run.count < u32::MAX =>
                {
                    run.count += 1;
                }
                _ => {
                    if runs.len() == MAX_STEP_RUNS {
                        // Definitions made in the record written here are
                        // before the runs of the next one, as they must be.
                        out.step(&mut defs, &mut runs);
                    }
                    runs.push(RunRef {
                        definition,
                        count: 1,
                        label: p.label,
                    });
                }
            }
        }
        out.step(&mut defs, &mut runs);
        (out.bytes, out.sequence - self.next_sequence, made)
    }
}

/// Framed records of one write, numbered from the ledger's next sequence.
struct Frames {
    bytes: Vec<u8>,
    sequence: u64,
    time: u64,
}

impl Frames {
    fn push(&mut self, payload: &[u8]) {
        self.bytes.extend_from_slice(&format::encode_frame(payload));
        self.sequence += 1;
    }

    /// A step record of `defs` and `runs`, if there are runs; both are emptied.
    fn step(&mut self, defs: &mut Vec<&DefinitionBytes>, runs: &mut Vec<RunRef<'_>>) {
        if !runs.is_empty() {
            let payload = format::step_payload(self.sequence, self.time, defs, runs);
            self.push(&payload);
        }
        defs.clear();
        runs.clear();
    }

    /// An ordinary charge record of `p`, with `event`'s encoding when given.
    fn charge(&mut self, p: &Prepared<'_>, event: Option<&[u8]>) {
        let values = p.curve.epsilons();
        let payload = match event {
            Some(e) => format::event_charge_payload(self.sequence, self.time, values, p.label, e),
            None => format::charge_payload(self.sequence, self.time, values, p.label),
        };
        self.push(&payload);
    }
}

/// The numbers of a file's definitions, by their stored bytes.
pub(super) fn definition_numbers(definitions: &[Definition]) -> HashMap<Vec<u8>, u32> {
    definitions
        .iter()
        .enumerate()
        .map(|(n, d)| {
            let n = u32::try_from(n).expect("a file holds at most MAX_DEFINITIONS");
            (d.bytes.bytes.clone(), n)
        })
        .collect()
}
