//! The user's crate shadows the prelude's names at module level; the generated code still
//! compiles, because it names everything by its full path.

#![allow(dead_code, non_camel_case_types)]

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, idempotent};
use serde::{Deserialize, Serialize};

type Result<T> = ::core::result::Result<T, ShopError>;
struct Ok;
struct Err;
struct Box;
struct Option;
struct Some;
struct None;
struct Vec;
struct String;
struct Send;
struct Sync;
struct Fn;
struct FnOnce;
struct Future;
struct Clone;
struct Default;
struct Into;
struct From;
struct Drop;
struct Sized;
struct Iterator;
struct Pin;
struct Duration;
struct Arguments;
struct Recipe;
struct core;
struct std;

#[derive(Debug, Serialize, Deserialize)]
struct ShopError(::std::string::String);

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(::std::string::ToString::to_string(&rejection))
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: u64,
    note: ::std::option::Option<::std::string::String>,
}

#[idempotent(key = "order_id", window = "15m", ignore = "note", stale = "takeover", scope = "tenant")]
async fn place(order: Order) -> Result<u64> {
    ::core::result::Result::Ok(order.order_id)
}

#[idempotent(key = "order_id", within = "conversation", ignore = "note")]
async fn confirm(order_id: u64, conversation: u64, note: ::std::string::String) -> Result<u64> {
    let _ = (conversation, note);
    ::core::result::Result::Ok(order_id)
}

struct Shop {
    idem: Idem,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[::idem_runtime::audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id", caller = ::idem_runtime::Caller::new("acme", "ops"))]
    async fn cancel(&self, order_id: u64) -> Result<u64> {
        ::core::result::Result::Ok(order_id)
    }
}

fn main() {
    let _ = place;
    let _ = confirm;
    let _ = Shop::cancel;
}
