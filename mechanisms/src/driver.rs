//! A generation driver: runs mechanism steps over any source of distributions.

use std::convert::Infallible;

use crate::step::EnsembleMechanism;
use crate::step_loop::{AlreadyCharged, Drawn, Settled, commit_one};
use crate::{Account, Ensemble, MechanismError, PrivacyRng, StepOutcome};

/// Anything that can give the next-token distributions of the public model and
/// the members for a context (a model ensemble, a fixture in tests).
pub trait DistributionSource {
    /// Distributions for the next token after `context`.
    fn next_distributions(&mut self, context: &[u32]) -> Result<Ensemble, MechanismError>;
}

/// The tokens a driver released and the outcome of every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The released tokens (not including the prompt).
    pub tokens: Vec<u32>,
    /// Per-step outcomes, in order.
    pub steps: Vec<StepOutcome>,
}

/// Generates up to `max_tokens` tokens after `prompt`, stopping early at
/// `stop_token`. Each token is charged to `account` before it is appended; the
/// first error ends generation and is returned with nothing more released.
pub fn generate(
    mechanism: &mut dyn EnsembleMechanism,
    source: &mut dyn DistributionSource,
    prompt: &[u32],
    max_tokens: usize,
    stop_token: Option<u32>,
    rng: &mut PrivacyRng,
    account: &mut dyn Account,
) -> Result<Generation, MechanismError> {
    run_steps(prompt, max_tokens, stop_token, |context| {
        let ensemble = source.next_distributions(context)?;
        mechanism.step(&ensemble, rng, account)
    })
}

/// The sequential driver of one request: calls `step` with the context so far, settles
/// each step through the [step loop](crate::step_loop) (the mechanism's account commits
/// its charge itself, so the sink is [`AlreadyCharged`]), appends each released token,
/// stops after `max_tokens` or `stop_token`, and ends at the first error, a refusal
/// included, with nothing more released.
pub(crate) fn run_steps(
    prompt: &[u32],
    max_tokens: usize,
    stop_token: Option<u32>,
    mut step: impl FnMut(&[u32]) -> Result<StepOutcome, MechanismError>,
) -> Result<Generation, MechanismError> {
    let mut context = prompt.to_vec();
    let mut generation = Generation {
        tokens: Vec::new(),
        steps: Vec::new(),
    };
    for _ in 0..max_tokens {
        let drawn = Drawn::<_, Infallible>::from_step(step(&context), None);
        let outcome = match commit_one(drawn, &mut AlreadyCharged).0 {
            Settled::Released { output, .. } => output,
            Settled::Refused(message) => return Err(MechanismError::ChargeRefused(message)),
            Settled::Failed(e) => return Err(e),
            Settled::Idle | Settled::Unrecorded => {
                return Err(MechanismError::Source(
                    "a step of one request settled without an output".into(),
                ));
            }
        };
        let token = u32::try_from(outcome.token).map_err(|_| MechanismError::InvalidParameter {
            name: "token",
            value: outcome.token as f64,
            reason: "token index does not fit in u32",
        })?;
        context.push(token);
        generation.tokens.push(token);
        generation.steps.push(outcome);
        if Some(token) == stop_token {
            break;
        }
    }
    Ok(generation)
}
