//! The ledger store as the step loop's charge sink (`privmix_mechanisms::step_loop`):
//! `generate` (a batch of one) and `serve` (every active request) commit a step's
//! charges through it, so that both release a token only once the store's
//! `commit_step` covering it has returned.

use privmix_mechanisms::step_loop::{ChargeSink, Verdict};

use crate::ledger_store::{LedgerStore, PendingCharge, StoreError};

/// A step's charges committed to a ledger store in one `commit_step` (one write and one
/// sync for a file, one transaction for PostgreSQL), in request order; a charge a
/// budget refuses is refused alone, with the store's message.
pub struct StoreSink<'a>(pub &'a mut dyn LedgerStore);

impl ChargeSink<PendingCharge> for StoreSink<'_> {
    type Error = StoreError;

    fn commit(&mut self, charges: &[PendingCharge]) -> Result<Vec<Verdict>, StoreError> {
        Ok(self
            .0
            .commit_step(charges)?
            .into_iter()
            .map(|outcome| match outcome {
                Ok(()) => Verdict::Accepted,
                Err(refused) => Verdict::Refused(refused.to_string()),
            })
            .collect())
    }
}
