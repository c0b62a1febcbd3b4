//! A continuation's `requestState` (multi-round-trip requests): sealed to the operation that
//! asked, opened and checked inside the continuation's won claim, and — for a recipe with
//! `single_use_state` — consumed once through the ledger.
//!
//! The text a client echoes is `idem1.<nonce>.<expires>.<mac>` and, when the handler kept a state
//! of its own, `.<its state>`: a 128-bit nonce (hex), the ledger time it expires at (ms), and
//! HMAC-SHA256 under the server secret over the operation's [`Binding`], the nonce, the expiry
//! and the handler's state.
//!
//! Guarantees: a state opens only for the caller scope, namespace, tool and arguments (every one,
//! by their fingerprint) it was sealed for, under the secret it was sealed with, before it
//! expires, and unaltered; input responses named by `input_key` are left out of the binding, so
//! the continuation that carries them opens the state its first round was given. A consumed
//! nonce is refused on every replica; a consumption whose claim went unanswered is sent again
//! with the same token (the ledger recognises its own), and one whose outcome still cannot be
//! confirmed counts as used (refusing a confirmation is safe, accepting it twice is not).

use crate::bytes::{hex, unhex};
use crate::key::Key;
use crate::ledger::{Claim, ClaimRequest, LedgerError, Outcome, Token};
use crate::recipe::StalePolicy;
use crate::rejection::Rejection;
use crate::scope::{SubjectTag, TenantTag};
use crate::secret::Secret;

use super::Idem;
use super::arguments::Derive;
use super::time::clamp;

/// The prefix (and version) of every state idem sends.
const PREFIX: &str = "idem1";

/// What a `requestState` is sealed to: the operation apart from the input responses its key may
/// hold — the key derived without them, and the fingerprint of every argument — and the scope
/// tags its single-use record is kept under.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    /// The secret the operation was keyed with.
    pub(crate) secret: Secret,
    /// The operation's key without input responses.
    pub(crate) key: Key,
    /// The fingerprint of every argument.
    pub(crate) fingerprint: [u8; 32],
    /// The caller's tenant tag.
    pub(crate) tenant: TenantTag,
    /// The caller's subject tag.
    pub(crate) subject: SubjectTag,
    /// During a rotation, the operation's binding under each other secret still honoured: a
    /// state sealed under one of them (before the rotation step) still opens.
    pub(crate) earlier: Vec<Binding>,
}

impl Binding {
    /// What a `requestState` the operation keyed `key` under `secret` sends is sealed to. Input
    /// responses that joined the key are left out: the continuation that carries them must open
    /// the state its first round was given.
    pub(super) fn of(
        idem: &Idem,
        secret: &Secret,
        at: &Derive<'_, '_, '_>,
        key: Key,
        fingerprint: [u8; 32],
    ) -> Result<Self, Rejection> {
        let (recipe, namespace) = (at.recipe, idem.namespace(at.recipe));
        let asked = at.arguments.key_without_inputs(secret, namespace, at.scope, recipe.tool())?;
        Ok(Self {
            secret: secret.clone(),
            key: asked.unwrap_or(key),
            fingerprint,
            tenant: at.scope.tenant_tag(secret),
            subject: at.scope.subject_tag(secret),
            earlier: Vec::new(),
        })
    }

    fn mac(&self, nonce: &[u8; 16], expires: u64, inner: Option<&str>) -> [u8; 32] {
        let (present, inner) = match inner {
            Some(inner) => (&[1u8][..], inner.as_bytes()),
            None => (&[0u8][..], &[][..]),
        };
        let expires = expires.to_be_bytes();
        let parts: [&[u8]; 6] = [self.key.as_bytes(), &self.fingerprint, nonce, &expires, present, inner];
        self.secret.mac("idem/v2/request-state", &parts)
    }
}

/// A `requestState` as a client echoed it, taken apart but not yet checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EchoedState {
    /// In idem's form: checked inside the claim.
    Sealed {
        /// The nonce.
        nonce: [u8; 16],
        /// When it expires (ledger ms).
        expires: u64,
        /// Its MAC.
        mac: [u8; 32],
        /// The handler's own state.
        inner: Option<String>,
    },
    /// Not in idem's form: never accepted.
    Foreign,
}

impl EchoedState {
    /// Takes `text` apart (without checking it).
    pub(crate) fn parse(text: &str) -> Self {
        let mut parts = text.splitn(5, '.');
        let (Some(PREFIX), Some(nonce), Some(expires), Some(mac)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Self::Foreign;
        };
        match (unhex::<16>(nonce), expires.parse::<u64>(), unhex::<32>(mac)) {
            (Some(nonce), Ok(expires), Some(mac)) => {
                Self::Sealed { nonce, expires, mac, inner: parts.next().map(str::to_owned) }
            }
            _ => Self::Foreign,
        }
    }

    /// The handler's own state, given back to its `RequestState` extractor.
    pub(crate) fn inner(&self) -> Option<&str> {
        match self {
            Self::Sealed { inner, .. } => inner.as_deref(),
            Self::Foreign => None,
        }
    }
}

impl Idem {
    /// The text to send as the `requestState` of an input request: `inner` (the handler's own
    /// state) sealed to `binding`, valid for `ttl` from now on the ledger's clock.
    pub(crate) fn seal_state(&self, binding: &Binding, inner: Option<&str>, ttl: std::time::Duration) -> String {
        let nonce = nonce();
        let expires = clamp(self.ledger_now().saturating_add(super::time::millis(ttl)));
        let mac = binding.mac(&nonce, expires, inner);
        let mut text = format!("{PREFIX}.{}.{expires}.{}", hex(&nonce), hex(&mac));
        if let Some(inner) = inner {
            text.push('.');
            text.push_str(inner);
        }
        text
    }

    /// Checks an echoed state against `binding`.
    ///
    /// # Errors
    /// Not idem's, not this operation's, altered, or expired.
    /// Returns its nonce and the binding it opened under (the operation's own, or during a
    /// rotation its binding under the secret the state was sealed with).
    pub(crate) fn open_state<'s, 'b>(
        &self,
        binding: &'b Binding,
        state: &'s EchoedState,
    ) -> Result<(&'s [u8; 16], &'b Binding), Rejection> {
        let EchoedState::Sealed { nonce, expires, mac, inner } = state else {
            return Err(Rejection::RequestStateInvalid { why: FOREIGN });
        };
        let opened = std::iter::once(binding).chain(&binding.earlier).find(|binding| {
            let expected = binding.mac(nonce, *expires, inner.as_deref());
            // Constant time: a forger learns nothing from how long a wrong MAC takes to refuse.
            expected.iter().zip(mac).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
        });
        let Some(opened) = opened else { return Err(Rejection::RequestStateInvalid { why: FOREIGN }) };
        if self.ledger_now() >= *expires {
            return Err(Rejection::RequestStateExpired);
        }
        Ok((nonce, opened))
    }

    /// Consumes `nonce` of a state sealed to `binding` and valid until `expires`: one atomic
    /// claim on a key of its own, completed at once.
    ///
    /// # Errors
    /// It was consumed before (or a consumption's outcome is unknown): `RequestStateUsed`; the
    /// ledger cannot be reached: `LedgerUnavailable`.
    pub(crate) async fn consume_state(
        &self,
        binding: &Binding,
        nonce: &[u8; 16],
        expires: u64,
    ) -> Result<(), Rejection> {
        let key = Key::from_bytes(binding.secret.mac("idem/v2/request-state-use", &[binding.key.as_bytes(), nonce]));
        let (now, clock_trusted) = self.ledger_time().await.map_err(|error| Rejection::ledger_unavailable(&error))?;
        let window_end = expires.max(now.saturating_add(1));
        let request = ClaimRequest {
            key,
            tenant: binding.tenant,
            subject: binding.subject,
            fingerprint: [0; 32],
            arg_tags: Vec::new(),
            token: Token::random(),
            now,
            window_end,
            expires_at: clamp(window_end.saturating_add(super::time::millis(self.inner.settings.unsettled_retention))),
            lease_until: clamp(now.saturating_add(super::time::millis(self.inner.settings.lease))),
            stale: StalePolicy::Hold,
            clock_trusted,
            label: None,
        };
        // A claim whose answer was lost is sent once more with the same token: if the first
        // committed, the ledger recognises it as ours (won), so a lost answer does not burn the
        // state.
        let claim = match self.inner.ledger.claim(&request).await {
            Err(LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. }) => {
                self.inner.ledger.claim(&request).await
            }
            other => other,
        };
        match claim {
            Ok(Claim::Won { .. }) => {
                let used = self.results().encode::<(), ()>(Ok(&())).map_or(Outcome::Unknown, Outcome::Completed);
                let keep_until = self.keep_until(self.inner.settings.grace).max(window_end);
                if let Err(error) = self.inner.ledger.complete(&key, request.token, used, keep_until).await {
                    // Still in progress under our lease, so a second use is refused all the same.
                    tracing::warn!(%error, "could not record a request state as used; it stays claimed");
                }
                Ok(())
            }
            Ok(_) => Err(Rejection::RequestStateUsed),
            Err(error @ (LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. })) => {
                tracing::error!(%error, "ledger unavailable while consuming a request state; handler not run");
                Err(Rejection::ledger_unavailable(&error))
            }
            Err(error) => Err(Rejection::ledger_unavailable(&error)),
        }
    }
}

const FOREIGN: &str = "it was not issued by this server for this caller, tool and arguments, or it was altered";

/// 128 random bits from the operating system: no two `requestState`s share one.
fn nonce() -> [u8; 16] {
    crate::bytes::random()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{MemoryLedger, clock::ManualClock};

    fn binding(fingerprint: u8) -> Binding {
        let secret = Secret::new(1, &[7; 32]).unwrap();
        let key = Key::from_bytes([3; 32]);
        let (tenant, subject) = (TenantTag::from_bytes([1; 8]), SubjectTag::TENANT);
        Binding { secret, key, fingerprint: [fingerprint; 32], tenant, subject, earlier: Vec::new() }
    }

    #[tokio::test]
    async fn a_state_opens_for_its_operation_until_it_expires_and_is_consumed_once() {
        let clock = ManualClock::new(1_000_000);
        let idem = Idem::builder(MemoryLedger::with_clock(clock.clone())).clock(clock.clone()).build().unwrap();
        let sealed = idem.seal_state(&binding(9), Some("mine"), Duration::from_secs(600));
        let echoed = EchoedState::parse(&sealed);
        assert_eq!(echoed.inner(), Some("mine"));
        let nonce = *idem.open_state(&binding(9), &echoed).expect("opens for its operation").0;
        let other = idem.open_state(&binding(8), &echoed).map(|(nonce, _)| *nonce);
        assert!(matches!(other, Err(Rejection::RequestStateInvalid { .. })), "{other:?}");

        let EchoedState::Sealed { expires, .. } = echoed else { unreachable!() };
        assert_eq!(idem.consume_state(&binding(9), &nonce, expires).await, Ok(()));
        assert_eq!(idem.consume_state(&binding(9), &nonce, expires).await, Err(Rejection::RequestStateUsed));

        clock.advance(Duration::from_secs(600));
        assert_eq!(idem.open_state(&binding(9), &echoed).map(|(nonce, _)| *nonce), Err(Rejection::RequestStateExpired));
    }

    #[test]
    fn a_sealed_state_parses_back_with_its_inner_state() {
        let text = format!("idem1.{}.42.{}.a.b", "ab".repeat(16), "cd".repeat(32));
        let parsed = EchoedState::parse(&text);
        let EchoedState::Sealed { nonce, expires, mac, inner } = &parsed else { panic!("{parsed:?}") };
        assert_eq!((nonce, *expires, mac), (&[0xab; 16], 42, &[0xcd; 32]));
        assert_eq!(inner.as_deref(), Some("a.b"), "the handler's state may hold dots");
        let bare = format!("idem1.{}.42.{}", "ab".repeat(16), "cd".repeat(32));
        assert_eq!(EchoedState::parse(&bare).inner(), None);
    }

    #[test]
    fn anything_else_is_foreign() {
        for text in [
            "",
            "hello",
            "idem1",
            "idem1.zz.1.zz",
            "idem2.00.1.00",
            &format!("idem1.{}.x.{}", "0".repeat(32), "0".repeat(64)),
        ] {
            assert_eq!(EchoedState::parse(text), EchoedState::Foreign, "{text}");
        }
    }
}
