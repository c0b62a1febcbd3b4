//! Two services of one package, each with a `create` handler of the same name keyed on `id`:
//! two different handlers that must never share an operation, whichever handle or process they
//! run in (`it::owners` runs them on two handles, `owners_child` in two processes).

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, idempotent};
use serde::{Deserialize, Serialize};

/// What the services answer with: a refusal keeps idem's code and words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceError {
    /// idem refused the call; the handler did not run.
    Refused {
        /// [`Rejection::code`].
        code: String,
        /// Its words.
        message: String,
    },
}

impl IdempotentError for ServiceError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

/// Places orders.
pub struct Orders {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran (the far side of the boundary).
    pub ran: AtomicUsize,
}

impl HasIdem for Orders {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Orders {
    /// Places order `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id")]
    pub async fn create(&self, id: String) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("order {id} #{run}"))
    }
}

/// Issues invoices: its `create` is another handler with the same name.
pub struct Invoices {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran.
    pub ran: AtomicUsize,
}

impl HasIdem for Invoices {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Invoices {
    /// Issues invoice `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id")]
    pub async fn create(&self, id: String) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("invoice {id} #{run}"))
    }
}

/// Receipts: a `create` pinned with `name = "..."`, so it is another tool.
pub struct Receipts {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran.
    pub ran: AtomicUsize,
}

impl HasIdem for Receipts {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Receipts {
    /// Issues receipt `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id", name = "create_receipt")]
    pub async fn create(&self, id: String) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("receipt {id} #{run}"))
    }
}
