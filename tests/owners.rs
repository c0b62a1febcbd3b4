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

/// What a generic [`Store`] keeps: its rows say what they are.
pub trait Row: Send + Sync + 'static {
    /// The row's kind, in the handler's answer.
    const KIND: &'static str;
}

/// An order row.
pub struct OrderRow;
/// An invoice row.
pub struct InvoiceRow;

impl Row for OrderRow {
    const KIND: &'static str = "order";
}

impl Row for InvoiceRow {
    const KIND: &'static str = "invoice";
}

/// One generic service, one `#[idempotent] create`: `Store<OrderRow>` and `Store<InvoiceRow>`
/// run different code (the row's), so they are two handlers.
pub struct Store<T> {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran.
    pub ran: AtomicUsize,
    /// The rows it keeps.
    pub rows: std::marker::PhantomData<T>,
}

impl<T> Store<T> {
    /// A store on `idem` whose handler has not run.
    #[must_use]
    pub const fn new(idem: Idem) -> Self {
        Self { idem, ran: AtomicUsize::new(0), rows: std::marker::PhantomData }
    }
}

impl<T> HasIdem for Store<T> {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl<T: Row> Store<T> {
    /// Creates row `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id")]
    pub async fn create(&self, id: u64) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("{} {id} #{run}", T::KIND))
    }
}

/// Places orders, its `create` pinned as `place`.
pub struct PinnedOrders {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran.
    pub ran: AtomicUsize,
}

impl HasIdem for PinnedOrders {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl PinnedOrders {
    /// Places order `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id", name = "place")]
    pub async fn create(&self, id: String) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("order {id} #{run}"))
    }
}

/// Issues invoices, its `create` pinned as `place` too: another handler under the same pin.
pub struct PinnedInvoices {
    /// Its handle.
    pub idem: Idem,
    /// How many times its handler ran.
    pub ran: AtomicUsize,
}

impl HasIdem for PinnedInvoices {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl PinnedInvoices {
    /// Issues invoice `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id", name = "place")]
    pub async fn create(&self, id: String) -> Result<String, ServiceError> {
        let run = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("invoice {id} #{run}"))
    }
}

/// How many times [`Parcels::ship`] ran.
pub static PARCELS_RAN: AtomicUsize = AtomicUsize::new(0);
/// How many times [`Letters::ship`] ran.
pub static LETTERS_RAN: AtomicUsize = AtomicUsize::new(0);

/// Ships parcels: a function with no `self` in an impl without `#[audit_idempotent]`.
pub struct Parcels;

impl Parcels {
    /// Ships parcel `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id", idem = idem)]
    pub async fn ship(idem: &Idem, id: String) -> Result<String, ServiceError> {
        let _ = idem;
        let run = PARCELS_RAN.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("parcel {id} #{run}"))
    }
}

/// Ships letters: a function of the same name, in the same module, in another impl without the
/// audit.
pub struct Letters;

impl Letters {
    /// Ships letter `id`.
    ///
    /// # Errors
    /// idem's refusals.
    #[idempotent(key = "id", idem = idem)]
    pub async fn ship(idem: &Idem, id: String) -> Result<String, ServiceError> {
        let _ = idem;
        let run = LETTERS_RAN.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("letter {id} #{run}"))
    }
}

/// How many times [`load`] ran, per row kind.
pub static LOADS_RAN: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// A generic free function whose type parameter no argument carries: `load::<OrderRow>` and
/// `load::<InvoiceRow>` run different code.
///
/// # Errors
/// idem's refusals.
#[idempotent(key = "id", idem = idem)]
pub async fn load<T: Row>(idem: &Idem, id: u64) -> Result<String, ServiceError> {
    let _ = idem;
    let run = LOADS_RAN[usize::from(T::KIND == "invoice")].fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("{} {id} #{run}", T::KIND))
}
/// How many times [`note`] ran.
pub static NOTES_RAN: AtomicUsize = AtomicUsize::new(0);

/// An `impl Trait` argument that says it is `Serialize`: keyed by its value, whatever its type.
///
/// # Errors
/// idem's refusals.
#[idempotent(key = "id", idem = idem)]
pub async fn note(idem: &Idem, id: impl Serialize + Send + Sync) -> Result<String, ServiceError> {
    let _ = idem;
    let run = NOTES_RAN.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("note #{run}"))
}

/// A plain free function, for the test that holds its owner's name to what rustc prints (a
/// function of its own: the counters of the others are asserted by tests running beside it).
///
/// # Errors
/// idem's refusals.
#[idempotent(key = "id", idem = idem)]
pub async fn named(idem: &Idem, id: u64) -> Result<String, ServiceError> {
    let _ = idem;
    Ok(format!("named {id}"))
}
