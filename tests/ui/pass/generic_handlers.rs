//! Generic handlers of every shape compile, each instance its own handler (issue 41, item 6): a
//! method of a generic service (pinned or not), a function with no `self` in a generic impl
//! without the audit, and functions whose type or const parameters no argument carries.

use std::marker::PhantomData;

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct StoreError(String);

impl IdempotentError for StoreError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

trait Row: Send + Sync + 'static {
    const KIND: &'static str;
}

struct Order;

impl Row for Order {
    const KIND: &'static str = "order";
}

struct Store<T> {
    idem: Idem,
    rows: PhantomData<T>,
}

impl<T> HasIdem for Store<T> {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
impl<T: Row> Store<T> {
    #[idempotent(key = "id")]
    async fn create(&self, id: u64) -> Result<String, StoreError> {
        Ok(format!("{} {id}", T::KIND))
    }

    #[idempotent(key = "id", name = "pinned_create")]
    async fn pinned(&self, id: u64) -> Result<String, StoreError> {
        Ok(format!("{} {id}", T::KIND))
    }

    #[idempotent(key = "id")]
    async fn tagged<U: Row>(&self, id: u64) -> Result<String, StoreError> {
        Ok(format!("{} {} {id}", T::KIND, U::KIND))
    }
}

struct Loader<T>(PhantomData<T>);

impl<T: Row> Loader<T> {
    #[idempotent(key = "id", idem = idem)]
    async fn load(idem: &Idem, id: u64) -> Result<String, StoreError> {
        let _ = idem;
        Ok(format!("{} {id}", T::KIND))
    }
}

#[idempotent(key = "id")]
async fn batch<T: Row, const N: usize>(id: u64) -> Result<String, StoreError> {
    Ok(format!("{} {id} x{N}", T::KIND))
}

fn main() {
    let idem = Idem::new(idem_runtime::MemoryLedger::new());
    let store = Store::<Order> { idem: idem.clone(), rows: PhantomData };
    let _ = store.create(1);
    let _ = store.pinned(1);
    let _ = store.tagged::<Order>(1);
    let _ = Loader::<Order>::load(&idem, 1);
    let _ = batch::<Order, 3>(1);
}
