//! `idem` makes an agent tool call safe to repeat.
//!
//! A tool handler annotated with [`idempotent`] derives an idempotency key on the server
//! (caller scope + tool + canonicalised chosen arguments, SHA-256), claims it in a [`Ledger`]
//! before its side effect, and answers every repeat from the stored result instead of running
//! twice. This crate is the one users depend on: it re-exports the macros and holds key
//! derivation, the ledger trait and its backends, and the call orchestration.
//!
//! The pieces, bottom up:
//!
//! - [`canonical`]: RFC 8785 canonical JSON, so key order, whitespace and number spelling never
//!   change a key.
//! - [`Key`], [`Ref`], [`Fingerprint`]: what a call is, derived from a [`Recipe`] and a [`Scope`].
//! - [`Ledger`]: the atomic claim and the record's state machine; [`MemoryLedger`] for tests.
//! - [`Idem`]: the handle that runs a handler under a recipe ([`Idem::call`]).
//!
//! ```
//! use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! enum ChargeError {
//!     Declined,
//!     Rejected(String),
//! }
//!
//! impl IdempotentError for ChargeError {
//!     fn classify(&self) -> ErrorClass {
//!         match self {
//!             // The processor said no: that is the answer, replay it.
//!             ChargeError::Declined => ErrorClass::Final,
//!             ChargeError::Rejected(_) => ErrorClass::NothingHappened,
//!         }
//!     }
//!     fn from_rejection(rejection: Rejection) -> Self {
//!         ChargeError::Rejected(rejection.to_string())
//!     }
//! }
//!
//! static CHARGE: Recipe = Recipe::new("charge_card", &["order_id", "amount"]);
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idem = Idem::new(MemoryLedger::new());
//! let caller = Caller::new("acme", "alice");
//! let args = serde_json::json!({ "order_id": "o-1", "amount": 1250 });
//!
//! let first = idem
//!     .call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ChargeError>("receipt-1".to_string()) })
//!     .await
//!     .unwrap();
//! let again = idem
//!     .call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ChargeError>("receipt-2".to_string()) })
//!     .await
//!     .unwrap();
//! assert_eq!(again.value, "receipt-1");
//! assert!(again.replayed && !first.replayed);
//! # }
//! ```

pub mod canonical;
mod clock;
mod idem;
mod key;
pub mod ledger;
mod macro_support;
mod recipe;
mod rejection;
mod scope;
mod window;

pub use clock::{Clock, ManualClock, SystemClock};
pub use idem::{
    DEFAULT_LEASE, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETENTION, HasIdem, Idem, Operation, Reconciled, Served,
    StatusError, current_operation, with_caller,
};
pub use key::{Fingerprint, Key, Ref, RefError, TenantTag};
pub use ledger::memory::MemoryLedger;
pub use ledger::{Ledger, LedgerError, State, StatusReport};
pub use recipe::{Recipe, ScopeRule, StalePolicy};
pub use rejection::{ErrorClass, IdempotentError, Rejection, STATUS_TOOL};
pub use scope::{Caller, CallerError, Scope};
pub use window::{WindowError, parse_window};

pub use idem_macros::{audit_idempotent, idempotent};

/// Items the macros expand to. Not public API: names and signatures change without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::*;
}
