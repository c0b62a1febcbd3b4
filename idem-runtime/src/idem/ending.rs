//! How a call that won its claim ends: one [`Ending`], sent as one ledger statement. The call
//! sends it while its caller waits (`Attempt::end` in `call.rs`, a few quick retries); the
//! background keeps sending it after that (`background.rs`) until the lease would have run out
//! twice over.

use crate::ledger::{ClaimRequest, LedgerError, Outcome};

use super::Idem;
use super::hooks::Completion;

/// What the ledger is told when a call that won its claim is done.
#[derive(Clone, Debug)]
pub(super) enum Ending {
    /// The outcome is recorded under the claim: completed (replayed from now on), failed
    /// (nothing happened: a repeat runs again) or unknown (repeats are told to check).
    Record(Outcome),
    /// The claim is given back: the operation stays in progress (same window, same forwarded
    /// key) and its stale policy decides again. A run that took over (or reconciled and ran)
    /// and found that nothing happened speaks for this run only: the holder it replaced may
    /// have acted, or may still.
    GiveBack,
}

impl Ending {
    /// The [`Completion`] this ending records once the ledger takes it.
    pub(super) fn completion(&self) -> Completion {
        match self {
            Ending::Record(Outcome::Completed(_)) => Completion::Completed,
            Ending::Record(Outcome::Failed) => Completion::Failed,
            Ending::Record(Outcome::Unknown) => Completion::Unknown,
            Ending::GiveBack => Completion::GivenBack,
        }
    }

    /// Sends this ending for the claim of `request` on `idem`'s ledger, once, and says how the
    /// call ended: as this ending records, or [`Completion::Superseded`] when the claim had been
    /// taken over while the handler ran (its result is not recorded). `recorded`: the handler recorded its
    /// result in its own transaction ([`Operation::complete_in`](super::Operation::complete_in)),
    /// so a fenced answer is its own doing, not a takeover's.
    ///
    /// # Errors
    /// The ledger's failure (unavailable or ambiguous: worth sending again).
    pub(super) async fn send(
        &self,
        idem: &Idem,
        request: &ClaimRequest,
        recorded: bool,
    ) -> Result<Completion, LedgerError> {
        let ledger = &idem.inner.ledger;
        let answer = match self {
            Ending::Record(outcome) => {
                let keep_until = idem.keep_until(idem.inner.settings.grace);
                ledger.complete(&request.key, request.token, outcome.clone(), keep_until).await
            }
            Ending::GiveBack => ledger.release(&request.key, request.token).await,
        };
        match answer {
            Ok(()) => Ok(self.completion()),
            Err(LedgerError::Fenced) if recorded => {
                tracing::debug!(reference = %request.key.reference(), "recorded in the handler's own transaction");
                Ok(self.completion())
            }
            Err(LedgerError::Fenced) => {
                tracing::warn!(reference = %request.key.reference(),
                    "the claim was taken over while the handler ran; its result is not recorded");
                Ok(Completion::Superseded)
            }
            Err(error) => Err(error),
        }
    }
}
