//! Ledger time: this handle's clock measured against the ledger's, so leases and windows do
//! not depend on every replica's clock agreeing. A measurement older than a third of the lease
//! is refreshed in the background; one that cannot be trusted (too uncertain, a jump, a clock
//! that stepped back) is not acted on; one taken before a statement lost its server (the ledger
//! may have failed over to another machine, with another clock) is taken again before any time
//! is stated.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::ledger::LedgerError;

use super::Idem;

/// A measurement of this handle's clock against the ledger's.
#[derive(Clone, Copy, Debug)]
pub(super) struct Skew {
    /// When it was taken, by this handle's clock.
    at: u64,
    /// Ledger time minus local time, in milliseconds.
    offset: i64,
    /// Whether times corrected by it can be acted on (see
    /// [`ClaimRequest::clock_trusted`](crate::ledger::ClaimRequest::clock_trusted)).
    trusted: bool,
    /// The ledger keeps no clock: every handle on it shares this process's, for good.
    clockless: bool,
    /// How many statements had lost their server ([`LedgerTime::lost`]) when it was sent.
    lost: u64,
}

impl Idem {
    /// Now, by this handle's clock ([`Admin::now_ms`](super::Admin::now_ms)).
    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.settings.clock.now_ms()
    }

    /// Now on the ledger's clock, as last measured (this handle's clock corrected by the
    /// measured skew; uncorrected before the first measurement;
    /// [`Admin::ledger_now`](super::Admin::ledger_now)).
    pub(crate) fn ledger_now(&self) -> u64 {
        let offset = self.skew().map_or(0, |skew| skew.offset);
        self.now_ms().saturating_add_signed(offset)
    }

    fn skew(&self) -> Option<Skew> {
        *self.inner.time.skew.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Now on the ledger's clock, and whether it can be acted on. The first call measures the
    /// skew against the ledger's clock; after that a measurement older than a third of the lease
    /// is refreshed in the background (one extra statement per handle that often, never per
    /// call), and one older than the whole lease — the handle sat idle — or taken before a
    /// statement lost its server is measured again on the call that finds it so (a call that
    /// arrives while another measures waits for that measurement: nothing is stamped on the old
    /// one).
    ///
    /// # Errors
    /// The ledger's clock has never been read, or could not be read again after a lost statement
    /// or an idle spell: no time is stated on an unmeasured clock (a claim's lease and window
    /// would be on this replica's own clock, or on a server that is gone).
    pub(super) async fn ledger_time(&self) -> Result<(u64, bool), LedgerError> {
        let local = self.now_ms();
        let skew = match self.skew() {
            Some(skew) if skew.clockless => return Ok((local, true)),
            Some(skew) => Some(skew),
            None => None,
        };
        let skew = match skew {
            // This clock stepped back since the last measurement (an NTP step, a restored VM):
            // its offset is void, and nothing may be stamped with it — measure again now.
            Some(skew) if local < skew.at => {
                let skew = self.measure_again().await?;
                return Ok((self.now_ms().saturating_add_signed(skew.offset), skew.trusted));
            }
            Some(skew) => skew,
            None => {
                // No measurement yet (a cold handle's first burst): one call measures, and the
                // calls that queued meanwhile take its measurement — or, if it failed, its failure
                // — instead of each sending one. A call that comes after a failure measures again.
                let first = &self.inner.time.first;
                let seen = first.failures.load(Ordering::Acquire);
                let mut failed = first.failed.lock().await;
                let skew = match (self.skew(), &*failed) {
                    (Some(skew), _) => skew,
                    // A measurement failed while this call queued behind it: its failure.
                    (None, Some((failure, error))) if *failure > seen => return Err(error.clone()),
                    (None, _) => self.measure().await.inspect_err(|error| {
                        let failure = first.failures.fetch_add(1, Ordering::AcqRel) + 1;
                        *failed = Some((failure, error.clone()));
                    })?,
                };
                let offset = if skew.clockless { 0 } else { skew.offset };
                return Ok((self.now_ms().saturating_add_signed(offset), skew.trusted));
            }
        };
        let age = local - skew.at;
        // Idle for a lease or more (no call refreshed it), or measured before a statement lost
        // its server: the ledger that answers now may be a promoted standby, another machine
        // with another clock. Nothing is stamped on that measurement — not even "untrusted": a
        // dead holder's lapsed lease would read as "in flight" to the first repeat after a quiet
        // spell, and a claim stamped on the old primary's clock could have lapsed already on the
        // new one's. Measure now (or take the measurement another call is taking), or answer
        // "unavailable".
        if !self.fresh(&skew, local) {
            let skew = self.measure_again().await?;
            return Ok((self.now_ms().saturating_add_signed(skew.offset), skew.trusted));
        }
        if age >= millis(self.inner.settings.lease / 3).max(1)
            && let Ok(measuring) = Arc::clone(&self.inner.time.measuring).try_lock_owned()
        {
            let idem = self.clone();
            tokio::spawn(async move {
                let mut measuring = measuring;
                let outcome = idem.measure().await;
                idem.inner.time.measured(&mut measuring, outcome);
            });
        }
        Ok((local.saturating_add_signed(skew.offset), skew.trusted))
    }

    /// Whether `skew` may be stamped on at `local`: taken less than a lease ago, and after the
    /// last statement that lost its server.
    fn fresh(&self, skew: &Skew, local: u64) -> bool {
        local >= skew.at
            && local - skew.at < millis(self.inner.settings.lease).max(1)
            && self.inner.time.lost_count() == skew.lost
    }

    /// A measurement that may be stamped on, taken now: by this call, or by the call measuring
    /// while this one queued (its reading, or its failure — the calls that queue behind a
    /// failed measurement do not each send one more, every one bounded by the ledger timeout).
    ///
    /// # Errors
    /// The ledger's clock could not be read: the caller is told nothing was executed.
    async fn measure_again(&self) -> Result<Skew, LedgerError> {
        let time = &self.inner.time;
        let seen = time.measurements.load(Ordering::Acquire);
        let mut measuring = time.measuring.lock().await;
        if let Some(skew) = self.skew()
            && self.fresh(&skew, self.now_ms())
        {
            return Ok(skew);
        }
        if time.measurements.load(Ordering::Acquire) != seen
            && let Some(error) = &*measuring
        {
            return Err(error.clone());
        }
        // Another statement lost its server while this one measured: the reading may be the old
        // server's. Measured once more, then the call is told to try again.
        let mut outcome =
            Err(LedgerError::unavailable("the ledger kept losing connections while its clock was measured; try again"));
        for _ in 0..2 {
            match self.measure().await {
                Ok(skew) if time.lost_count() != skew.lost && !skew.clockless => {}
                measured => {
                    outcome = measured;
                    break;
                }
            }
        }
        time.measured(&mut measuring, outcome.clone());
        outcome
    }

    /// Ledger time that may be acted on (takeovers, expiry), for the operator's paths.
    pub(super) async fn trusted_time(&self) -> Result<u64, LedgerError> {
        match self.ledger_time().await? {
            (now, true) => Ok(now),
            (_, false) => Err(LedgerError::unavailable(
                "this replica's clock against the ledger's is not settled yet; try again shortly",
            )),
        }
    }

    /// Measures this handle's clock against the ledger's, and keeps the measurement. A failed
    /// read fails, and keeps the last good offset only untrusted and as old as it was (for
    /// [`Idem::ledger_now`]: nothing is stamped on it, see [`Idem::fresh`]).
    async fn measure(&self) -> Result<Skew, LedgerError> {
        let last = self.skew();
        let lost = self.inner.time.lost_count();
        let before = self.now_ms();
        let answer = self.inner.ledger.now().await;
        let after = self.now_ms();
        let quarter = millis(self.inner.settings.lease / 4);
        let skew = match answer {
            // The ledger keeps no clock of its own: every handle on it shares this process's.
            Ok(None) => Skew { at: after, offset: 0, trusted: true, clockless: true, lost },
            Ok(Some(ledger)) => {
                let midpoint = u64::try_from((u128::from(before) + u128::from(after)) / 2).unwrap_or(after);
                let offset = i64::try_from(i128::from(ledger) - i128::from(midpoint)).unwrap_or(0);
                let uncertain = after.saturating_sub(before) / 2 > quarter;
                // A clock that jumped since the last measurement is not acted on until it holds.
                let jumped = last.is_some_and(|last| last.offset.abs_diff(offset) > quarter);
                if uncertain || jumped {
                    tracing::warn!(
                        offset,
                        uncertain,
                        jumped,
                        "clock against the ledger's is not settled; \
                        no takeovers or window ends are acted on until it is"
                    );
                }
                Skew { at: after, offset, trusted: !uncertain && !jumped, clockless: false, lost }
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the ledger's clock; no takeovers until it can be read");
                if let Some(last) = last {
                    // Still the measurement of a server that may be gone: measured again next time.
                    let kept = Skew { trusted: false, ..last };
                    *self.inner.time.skew.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(kept);
                }
                return Err(error);
            }
        };
        *self.inner.time.skew.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(skew);
        Ok(skew)
    }

    /// Ledger time `after` from now.
    pub(super) fn keep_until(&self, after: Duration) -> u64 {
        clamp(self.ledger_now().saturating_add(millis(after)))
    }
}

/// A handle's ledger time: its last measurement of the skew, the one background refresh in
/// flight, and a cold handle's first measurement.
#[derive(Default)]
pub(super) struct LedgerTime {
    skew: std::sync::Mutex<Option<Skew>>,
    /// How many statements lost their server (counted by the timeout layer).
    lost: Arc<AtomicU64>,
    /// Held while a measurement of the skew runs (so calls start at most one, and a call that
    /// needs a new reading waits for the one under way); holds the last one's failure.
    measuring: Arc<tokio::sync::Mutex<Option<LedgerError>>>,
    /// How many measurements taken under `measuring` have ended.
    measurements: AtomicU64,
    /// A cold handle's first measurement of the skew, shared by the calls that queue on it.
    first: FirstMeasure,
}

impl LedgerTime {
    /// The count the timeout layer adds each statement that lost its server to.
    pub(super) fn lost(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.lost)
    }

    fn lost_count(&self) -> u64 {
        self.lost.load(Ordering::Acquire)
    }

    /// A measurement taken under `measuring` ended with `outcome`.
    fn measured(&self, measuring: &mut Option<LedgerError>, outcome: Result<Skew, LedgerError>) {
        *measuring = outcome.err();
        self.measurements.fetch_add(1, Ordering::AcqRel);
    }
}

/// A cold handle's first measurement: taken by the call that sends it, while the calls that
/// queue behind it take its outcome. Only a failure that ended after a call queued answers it:
/// nothing is cached for later calls.
#[derive(Default)]
struct FirstMeasure {
    /// How many first measurements failed (counted as each ends).
    failures: AtomicU64,
    /// The last failure, with its number.
    failed: tokio::sync::Mutex<Option<(u64, LedgerError)>>,
}

/// Times are stored as signed 64-bit integers by SQL backends: keep them in that range, so
/// what a claim asks for is what it reads back.
pub(super) fn clamp(ms: u64) -> u64 {
    ms.min(i64::MAX.unsigned_abs())
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
