//! The stored-result format, in one place. A handler's result is stored as the JSON
//! `{"ok": value}` or `{"err": error}`, refused above the handle's size limit, and sealed by its
//! [`ResultSeal`] if it has one; read back, it is opened and decoded the same way. Everything
//! that writes or reads a result — a call's record, [`Operation::complete_in`], a replay, a
//! status lookup, an operator's verdict — goes through here.
//!
//! [`Operation::complete_in`]: super::Operation::complete_in

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::Ref;
use crate::ledger::{Outcome, Resolution};
use crate::rejection::{IdempotentError, Rejection, Restored, StorableError, Storing};

/// A stored result: `{"ok": value}` or `{"err": error}`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Stored<T, E> {
    Ok(T),
    Err(E),
}

/// A stored result read as JSON, whatever the handler's types: what the status tool and an
/// MCP task show, and what an operator's verdict is checked against.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StoredValue {
    /// `{"ok": value}`: the handler's `Ok` value (or an operator's "completed" verdict).
    Ok(serde_json::Value),
    /// `{"err": error}`: a final error.
    Err(serde_json::Value),
}

impl StoredValue {
    /// Reads an opened stored result; `None` if its bytes are not one.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        match serde_json::from_slice::<Stored<serde_json::Value, serde_json::Value>>(bytes).ok()? {
            Stored::Ok(value) => Some(Self::Ok(value)),
            Stored::Err(error) => Some(Self::Err(error)),
        }
    }

    /// The handler's `Ok` value of an opened stored result (`{"ok": value}`), if it is one.
    pub(crate) fn ok(bytes: &[u8]) -> Option<serde_json::Value> {
        match Self::parse(bytes)? {
            Self::Ok(value) => Some(value),
            Self::Err(_) => None,
        }
    }
}

impl Resolution {
    /// "It happened, and this is its result": `value` encoded as the operation's handler would
    /// have stored it, so repeats replay it as the handler's `Ok` value.
    ///
    /// # Errors
    /// `value` cannot be serialised.
    pub fn completed<T: Serialize>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_vec(&Stored::<_, ()>::Ok(serde_json::to_value(value)?)).map(Self::Completed)
    }
}

/// What happens to a result between the handler and the ledger: [`seal`](ResultSeal::seal)ed
/// before it is stored, [`open`](ResultSeal::open)ed after it is read back (replays, status).
///
/// Without one, results are stored as the handler returned them, and anyone who can read the
/// ledger (a backup, a replica, an export) can read them. Plug in an AEAD under a key from your
/// KMS to encrypt them, or a redaction (`open` returning its input) to keep only what repeats
/// need — then repeats get the redacted result. Every handle on a ledger must use the same seal.
pub trait ResultSeal: Send + Sync + 'static {
    /// The bytes to store for `plain` (the result's JSON).
    ///
    /// # Errors
    /// The result cannot be sealed: it is returned to its caller and recorded as "outcome
    /// unknown".
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String>;

    /// The result's JSON from stored bytes.
    ///
    /// # Errors
    /// The bytes cannot be opened (another key, tampering): repeats are refused as an
    /// unreadable result, and nothing runs again.
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, String>;
}

/// Why a result cannot be stored. Its message is what [`Operation::complete_in`] reports.
///
/// [`Operation::complete_in`]: super::Operation::complete_in
#[derive(Debug)]
pub(super) enum Unstorable {
    /// It does not serialise.
    Unserializable(serde_json::Error),
    /// Its JSON is larger than the handle's limit.
    TooLarge { size: usize, max: usize },
    /// The seal refused it.
    Unsealable(String),
}

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unserializable(error) => write!(f, "the result cannot be stored: {error}"),
            Self::TooLarge { size, max } => write!(f, "the result is {size} bytes, above the limit of {max}"),
            Self::Unsealable(error) => write!(f, "the result cannot be sealed: {error}"),
        }
    }
}

/// A handle's stored results: the format above under its seal and size limit.
#[derive(Clone, Copy)]
pub(super) struct Results<'a> {
    pub(super) seal: Option<&'a dyn ResultSeal>,
    pub(super) max_result_bytes: usize,
}

impl Results<'_> {
    /// A handler's result as it is stored: its JSON, within the size limit, sealed.
    pub(super) fn encode<T: Serialize, E: StorableError>(self, result: Result<&T, &E>) -> Result<Vec<u8>, Unstorable> {
        let stored = match result {
            Ok(value) => Stored::Ok(value),
            Err(error) => Stored::Err(Storing(error)),
        };
        let bytes = serde_json::to_vec(&stored).map_err(Unstorable::Unserializable)?;
        let max = self.max_result_bytes;
        if bytes.len() > max {
            return Err(Unstorable::TooLarge { size: bytes.len(), max });
        }
        self.seal(bytes)
    }

    /// What a call records for a result to replay: its stored bytes, or "outcome unknown" if it
    /// cannot be stored — the effect happened, so repeats are told to check rather than run.
    pub(super) fn completion<T: Serialize, E: StorableError>(self, reference: Ref, result: Result<&T, &E>) -> Outcome {
        match self.encode(result) {
            Ok(sealed) => Outcome::Completed(sealed),
            Err(Unstorable::TooLarge { size, max }) => {
                tracing::error!(%reference, size, max, "result too large to store; recording the outcome as unknown");
                Outcome::Unknown
            }
            Err(Unstorable::Unserializable(error)) => {
                tracing::error!(%reference, %error, "result cannot be stored; recording the outcome as unknown");
                Outcome::Unknown
            }
            Err(error @ Unstorable::Unsealable(_)) => {
                tracing::error!(%reference, %error, "recording the outcome as unknown");
                Outcome::Unknown
            }
        }
    }

    /// `plain` (a result's JSON) as it is stored.
    pub(super) fn seal(self, plain: Vec<u8>) -> Result<Vec<u8>, Unstorable> {
        match self.seal {
            Some(seal) => seal.seal(&plain).map_err(Unstorable::Unsealable),
            None => Ok(plain),
        }
    }

    /// Stored bytes as the result's JSON.
    pub(super) fn open(self, stored: Vec<u8>, reference: Ref) -> Result<Vec<u8>, Rejection> {
        match self.seal {
            Some(seal) => seal.open(&stored).map_err(|error| {
                tracing::error!(%reference, %error, "a stored result cannot be opened");
                Rejection::UnreadableResult { reference, detail: "the stored result cannot be opened".to_owned() }
            }),
            None => Ok(stored),
        }
    }

    /// The handler's result from stored bytes: opened, then decoded.
    pub(super) fn decode<T: DeserializeOwned, E: IdempotentError>(
        self,
        stored: Vec<u8>,
        reference: Ref,
    ) -> Result<Result<T, E>, Rejection> {
        let bytes = self.open(stored, reference)?;
        match serde_json::from_slice::<Stored<T, Restored<E>>>(&bytes) {
            Ok(Stored::Ok(value)) => Ok(Ok(value)),
            Ok(Stored::Err(Restored(error))) => Ok(Err(error)),
            Err(error) => Err(Rejection::UnreadableResult { reference, detail: error.to_string() }),
        }
    }
}
