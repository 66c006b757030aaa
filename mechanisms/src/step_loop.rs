//! The step loop every driver shares: step → charge → refusal → release.
//!
//! A decoding step of a batch of requests (one request for `privmix generate` and the
//! drivers in this crate, every active request for `privmix serve`, every contender for
//! the benchmark's teacher-forced scoring) goes through the same three stages:
//!
//! 1. **Step.** Each request's mechanism runs on its distributions and its output (a
//!    token, or a released distribution that is scored) is sealed in a [`Drawn`]
//!    together with the charge it still owes, if any. A sealed output cannot be read.
//! 2. **Commit.** [`commit`] hands every pending charge of the step to a
//!    [`ChargeSink`] at once, in request order; the sink returns only once the
//!    charges it accepts are durable (a ledger: synced, or its transaction committed),
//!    and says for each whether it was accepted.
//! 3. **Release.** Only [`commit`]'s [`Settled`] values hold the outputs again: a
//!    request's output is handed out where its charge was accepted (or none was owed),
//!    and dropped where its charge was refused or the commit failed.
//!
//! **Guarantee.** No output (nor anything derived from it) can leave before the commit
//! covering its charge has returned: [`Drawn`] has no accessor, and the only way from a
//! [`Drawn`] to its output is [`commit`], which calls the sink first. A refusal drops
//! only that request's output, and is itself what the run may publish about it. This is
//! the contract of [`Account`](crate::Account) (charge accepted, and durable, before
//! release) lifted from one charge to a step of many requests; the mechanisms' guarantees
//! (PMixED, arXiv:2403.15638; AdaPMixED, arXiv:2410.02016; SubMix, arXiv:2201.00971;
//! DPS-MOZO, arXiv:2501.19287) are for tokens released under charges accounted this
//! way.
//!
//! A mechanism stepped with an account that commits each charge itself (an in-memory
//! [`Budget`](privmix_accountant::Budget), a [`Ledger`](privmix_accountant::Ledger),
//! [`Unbudgeted`](crate::Unbudgeted)) owes nothing more once its step returns: its
//! [`Drawn`] carries no pending charge and [`AlreadyCharged`] is its sink; a refusal
//! of that account arrives as [`MechanismError::ChargeRefused`] from the step and
//! settles as [`Settled::Refused`] like a sink's refusal.

use std::convert::Infallible;

use crate::MechanismError;

/// One request's part of a step after its mechanism ran, before any commit: its
/// output sealed with the charge it still owes. The output cannot be read until
/// [`commit`] has settled the step.
#[derive(Debug)]
pub struct Drawn<O, C>(Draw<O, C>);

#[derive(Debug)]
enum Draw<O, C> {
    Idle,
    Output { output: O, charge: Option<C> },
    Refused(String),
    Failed(MechanismError),
}

impl<O, C> Drawn<O, C> {
    /// A request that was not stepped (its client left, or it has finished).
    pub fn idle() -> Self {
        Self(Draw::Idle)
    }

    /// An output owing `charge` to the step's sink (`None`: nothing is owed, because
    /// the mechanism's account committed it already or the step charged nothing).
    pub fn output(output: O, charge: Option<C>) -> Self {
        Self(Draw::Output { output, charge })
    }

    /// What a mechanism step returned: its output owing `charge`; a refusal of the
    /// account it charged ([`MechanismError::ChargeRefused`]) as a refusal; any other
    /// error as the request's failure.
    pub fn from_step(step: Result<O, MechanismError>, charge: Option<C>) -> Self {
        match step {
            Ok(output) => Self::output(output, charge),
            Err(MechanismError::ChargeRefused(message)) => Self(Draw::Refused(message)),
            Err(e) => Self(Draw::Failed(e)),
        }
    }
}

impl<O, C> Drawn<O, C> {
    /// The same draw owing `f(charge)` instead of `charge` (a collected charge given its
    /// payer, say); the output stays sealed. `f` returning `None` says nothing is owed.
    pub fn map_charge<D>(self, f: impl FnOnce(C) -> Option<D>) -> Drawn<O, D> {
        Drawn(match self.0 {
            Draw::Idle => Draw::Idle,
            Draw::Output { output, charge } => Draw::Output {
                output,
                charge: charge.and_then(f),
            },
            Draw::Refused(message) => Draw::Refused(message),
            Draw::Failed(e) => Draw::Failed(e),
        })
    }
}

/// Whether a sink accepted one pending charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted and durable: the output it pays for may be released.
    Accepted,
    /// A budget refused it (the message names which): the output is dropped.
    Refused(String),
}

/// Where a step's pending charges are committed: a ledger store, or a test double.
pub trait ChargeSink<C> {
    /// Why a commit failed as a whole.
    type Error;

    /// Commits `charges` (a step's, in request order) together and returns one
    /// verdict per charge, in order, only once every accepted one is durable.
    ///
    /// **Contract:** an `Err` means nothing of the step was acknowledged (charges may
    /// have been recorded: an over-count, which is safe); a verdict list of another
    /// length than `charges` is treated as a failed commit.
    fn commit(&mut self, charges: &[C]) -> Result<Vec<Verdict>, Self::Error>;
}

/// The sink of steps whose account committed every charge itself: nothing should be
/// pending. A charge left pending all the same is refused (its output dropped), never
/// accepted unrecorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlreadyCharged;

impl<C> ChargeSink<C> for AlreadyCharged {
    type Error = Infallible;

    fn commit(&mut self, charges: &[C]) -> Result<Vec<Verdict>, Infallible> {
        Ok(charges
            .iter()
            .map(|_| {
                Verdict::Refused(
                    "a charge was left pending where the account commits its own".into(),
                )
            })
            .collect())
    }
}

/// What the commit left one request: the only way back to a [`Drawn`] output.
#[derive(Debug)]
pub enum Settled<O, C> {
    /// It was not stepped.
    Idle,
    /// Its charge is committed (or none was owed): `output` may be released. `charge`
    /// is the committed charge, for the request's own usage figures.
    Released {
        /// The output.
        output: O,
        /// The charge the sink accepted for it, if one was pending.
        charge: Option<C>,
    },
    /// Its charge was refused (by the sink, or by the account it stepped with): its
    /// output is dropped. The message names the budget.
    Refused(String),
    /// Its mechanism failed: nothing was drawn.
    Failed(MechanismError),
    /// The commit failed ([`Committed::error`] holds why): its output is dropped.
    Unrecorded,
}

/// A settled step: one [`Settled`] per request, in order, and the sink's error if the
/// commit failed (then every request that owed a charge is [`Settled::Unrecorded`]).
#[derive(Debug)]
pub struct Committed<O, C, E> {
    /// Each request's settlement, in request order.
    pub settled: Vec<Settled<O, C>>,
    /// Why the commit failed, if it did.
    pub error: Option<E>,
}

/// Stage 2 of a step: commits every pending charge of `drawn` to `sink` in one call,
/// then unseals each output whose charge was accepted (or owed nothing). Outputs whose
/// charge was refused, and all those that owed one when the commit failed, are dropped.
pub fn commit<O, C, S: ChargeSink<C> + ?Sized>(
    drawn: Vec<Drawn<O, C>>,
    sink: &mut S,
) -> Committed<O, C, S::Error> {
    let mut pending = Vec::new();
    let mut sealed = Vec::with_capacity(drawn.len());
    for Drawn(d) in drawn {
        sealed.push(match d {
            Draw::Output {
                output,
                charge: Some(charge),
            } => {
                pending.push(charge);
                Sealed::Owing(output)
            }
            Draw::Output {
                output,
                charge: None,
            } => Sealed::Settled(Settled::Released {
                output,
                charge: None,
            }),
            Draw::Idle => Sealed::Settled(Settled::Idle),
            Draw::Refused(message) => Sealed::Settled(Settled::Refused(message)),
            Draw::Failed(e) => Sealed::Settled(Settled::Failed(e)),
        });
    }
    let (verdicts, error) = if pending.is_empty() {
        (Vec::new(), None)
    } else {
        match sink.commit(&pending) {
            Ok(v) if v.len() == pending.len() => (v, None),
            Ok(_) => (Vec::new(), None),
            Err(e) => (Vec::new(), Some(e)),
        }
    };
    // A verdict list of the wrong length settles every owing request as unrecorded.
    let recorded = verdicts.len() == pending.len();
    let mut verdicts = verdicts.into_iter().zip(pending);
    let settled = sealed
        .into_iter()
        .map(|s| match s {
            Sealed::Settled(s) => s,
            Sealed::Owing(output) => match (recorded, verdicts.next()) {
                (true, Some((Verdict::Accepted, charge))) => Settled::Released {
                    output,
                    charge: Some(charge),
                },
                (true, Some((Verdict::Refused(message), _))) => Settled::Refused(message),
                _ => Settled::Unrecorded,
            },
        })
        .collect();
    Committed { settled, error }
}

/// A request's output before the commit: settled already, or waiting for its verdict.
enum Sealed<O, C> {
    Settled(Settled<O, C>),
    Owing(O),
}

/// [`commit`] for a batch of one.
pub fn commit_one<O, C, S: ChargeSink<C> + ?Sized>(
    drawn: Drawn<O, C>,
    sink: &mut S,
) -> (Settled<O, C>, Option<S::Error>) {
    let Committed { mut settled, error } = commit(vec![drawn], sink);
    (settled.pop().unwrap_or(Settled::Unrecorded), error)
}

/// A batch of one whose account committed its own charge as it stepped (sink:
/// [`AlreadyCharged`]), settled: `Some(output)` to release, `None` where that account
/// refused the charge (nothing is released), or the mechanism's failure.
pub fn settle_charged<O>(stepped: Result<O, MechanismError>) -> Result<Option<O>, MechanismError> {
    match commit_one(
        Drawn::<O, Infallible>::from_step(stepped, None),
        &mut AlreadyCharged,
    )
    .0
    {
        Settled::Released { output, .. } => Ok(Some(output)),
        Settled::Refused(_) => Ok(None),
        Settled::Failed(e) => Err(e),
        Settled::Idle | Settled::Unrecorded => Err(MechanismError::Source(
            "a step of one request settled without an output".into(),
        )),
    }
}

#[cfg(test)]
mod tests;
