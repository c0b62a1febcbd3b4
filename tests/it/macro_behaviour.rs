//! `#[idempotent]` handlers on the in-memory ledger, counting executions on the far side.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Rejection, current_operation, idempotent, run_as,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ShopError {
    Declined,
    Idem { code: String, message: String },
}

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Declined => ErrorClass::Final,
            Self::Idem { .. } => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

impl ShopError {
    fn code(&self) -> &str {
        match self {
            Self::Idem { code, .. } => code,
            Self::Declined => "declined",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: Customer,
    amount_cents: u64,
    note: String,
}

/// A user type that shares its name with one of rmcp's extractors: an argument all the same.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    priority: u8,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Customer {
    id: u64,
}

struct Shop {
    idem: Idem,
    placed: AtomicUsize,
    forwarded: std::sync::Mutex<Vec<String>>,
    release: tokio::sync::Notify,
    hold: bool,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Shop {
    fn new(hold: bool) -> Self {
        Shop {
            idem: Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap(),
            placed: AtomicUsize::new(0),
            forwarded: std::sync::Mutex::default(),
            release: tokio::sync::Notify::new(),
            hold,
        }
    }

    #[idempotent(key = "order_id, customer.id", window = "1h")]
    async fn place(&self, order: Order) -> Result<String, ShopError> {
        let key = current_operation().expect("inside the handler").idempotency_key();
        self.forwarded.lock().unwrap().push(key.clone());
        if self.hold {
            self.release.notified().await;
        }
        let n = self.placed.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("placed #{n} for {} ({} cents)", order.order_id, order.amount_cents))
    }
}

#[idem_runtime::audit_idempotent]
impl Shop {
    #[idempotent(key = "note_id")]
    async fn annotate(&self, note_id: String, meta: Meta) -> Result<usize, ShopError> {
        let _ = (note_id, meta);
        Ok(self.placed.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(key = "tags")]
    async fn tag(&self, tags: BTreeSet<String>) -> Result<String, ShopError> {
        let key = current_operation().expect("inside the handler").idempotency_key();
        self.forwarded.lock().unwrap().push(key);
        self.placed.fetch_add(1, Ordering::SeqCst);
        Ok(tags.into_iter().collect::<Vec<_>>().join(","))
    }

    #[idempotent(key = "order_id")]
    async fn place_shared(self: Arc<Self>, order_id: String) -> Result<usize, ShopError> {
        let _ = order_id;
        Ok(self.placed.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

/// A handle taken by value (`self`).
#[derive(Clone)]
struct Desk(Arc<Shop>);

impl HasIdem for Desk {
    fn idem(&self) -> &Idem {
        &self.0.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Desk {
    #[idempotent(key = "order_id")]
    async fn place(self, order_id: String) -> Result<usize, ShopError> {
        let _ = order_id;
        Ok(self.0.placed.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

fn order(id: &str, amount_cents: u64, note: &str) -> Order {
    Order { order_id: id.into(), customer: Customer { id: 7 }, amount_cents, note: note.into() }
}

#[tokio::test]
async fn sequential_repeat_executes_once_with_the_identical_result() {
    let shop = Shop::new(false);
    let first = shop.place(order("o-1", 100, "n")).await.unwrap();
    let second = shop.place(order("o-1", 100, "n")).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(shop.placed.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_calls_execute_once() {
    let shop = Arc::new(Shop::new(true));
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..50 {
        let (shop, barrier, tx) = (Arc::clone(&shop), Arc::clone(&barrier), tx.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            tx.send(shop.place(order("o-2", 100, "n")).await).unwrap();
        });
    }
    for _ in 0..49 {
        let error = rx.recv().await.unwrap().unwrap_err();
        assert_eq!(error.code(), "in_flight", "{error:?}");
    }
    shop.release.notify_one();
    assert!(rx.recv().await.unwrap().is_ok());
    assert_eq!(shop.placed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn changed_non_key_argument_is_a_conflict_naming_it() {
    let shop = Shop::new(false);
    shop.place(order("o-3", 100, "n")).await.unwrap();
    let error = shop.place(order("o-3", 250, "n")).await.unwrap_err();
    let ShopError::Idem { code, message } = &error else { panic!("{error:?}") };
    assert_eq!(code, "conflict");
    assert!(message.contains("differing: amount_cents"), "{message}");
    // The ref is 16 random hex digits, which may well contain "250": look past it.
    let words: Vec<&str> = message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !(word.len() == 16 && word.chars().all(|c| c.is_ascii_hexdigit())))
        .collect();
    assert!(!words.iter().any(|word| word.contains("250")), "values never leak: {message}");
    assert_eq!(shop.placed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn changed_key_argument_is_a_second_execution() {
    let shop = Shop::new(false);
    shop.place(order("o-4", 100, "n")).await.unwrap();
    shop.place(order("o-5", 100, "n")).await.unwrap();
    assert_eq!(shop.placed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_handler_read_its_key() {
    let shop = Shop::new(false);
    shop.place(order("o-6", 100, "n")).await.unwrap();
    shop.place(order("o-6", 100, "n")).await.unwrap();
    let forwarded = shop.forwarded.lock().unwrap().clone();
    assert_eq!(forwarded.len(), 1, "the replay did not reach the handler");
    assert_eq!(forwarded[0].len(), 64);
}

static CHARGES: AtomicUsize = AtomicUsize::new(0);

/// A free function: arguments by name, the ledger from `Idem::install`.
#[idempotent(key = "card, amount_cents", ignore = "memo", window = "15m", stale = "takeover")]
async fn charge(card: String, amount_cents: u64, memo: Option<String>) -> Result<u64, ShopError> {
    let _ = (card, memo);
    if amount_cents > 1_000_000 {
        return Err(ShopError::Declined);
    }
    Ok(CHARGES.fetch_add(1, Ordering::SeqCst) as u64 + 1)
}

#[tokio::test]
async fn free_functions_use_the_installed_handle_and_the_caller_in_scope() {
    let _installed = crate::INSTALLED_HANDLE.lock().await;
    Idem::new(MemoryLedger::new()).install();
    let bob = Caller::new("acme", "bob");
    let before = CHARGES.load(Ordering::SeqCst);
    let no_caller = charge("tok".into(), 5, None).await.unwrap_err();
    assert_eq!(no_caller.code(), "no_caller");
    let a = run_as(bob.clone(), charge("tok".into(), 5, Some("first".into()))).await.unwrap();
    let b = run_as(bob.clone(), charge("tok".into(), 5, Some("second".into()))).await.unwrap();
    assert_eq!(a, b, "memo is ignored: a replay, not a conflict");
    assert_eq!(CHARGES.load(Ordering::SeqCst) - before, 1);
    let declined = run_as(bob.clone(), charge("tok".into(), 2_000_000, None)).await.unwrap_err();
    assert_eq!(declined, ShopError::Declined);
    let replayed = run_as(bob, charge("tok".into(), 2_000_000, None)).await.unwrap_err();
    assert_eq!(replayed, ShopError::Declined, "a final error is replayed");
    assert_eq!(CHARGES.load(Ordering::SeqCst) - before, 1);
}

#[tokio::test]
async fn a_user_type_named_like_an_extractor_is_part_of_the_fingerprint() {
    let shop = Shop::new(false);
    assert_eq!(shop.annotate("n-1".into(), Meta { priority: 1 }).await, Ok(1));
    let error = shop.annotate("n-1".into(), Meta { priority: 2 }).await.unwrap_err();
    let ShopError::Idem { code, message } = &error else { panic!("{error:?}") };
    assert_eq!(code, "conflict", "a changed `meta` is not the same call: {message}");
    assert!(message.contains("differing: meta"), "{message}");
    assert_eq!(shop.placed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_btreeset_argument_keys_identically_whatever_order_it_arrives_in() {
    let shop = Shop::new(false);
    // Sets deserialised from differently ordered JSON arrays, as two retries of one call arrive.
    let first: BTreeSet<String> = serde_json::from_str(r#"["red", "green", "blue", "cyan"]"#).unwrap();
    let again: BTreeSet<String> = serde_json::from_str(r#"["cyan", "blue", "red", "green"]"#).unwrap();
    let a = shop.tag(first).await.unwrap();
    let b = shop.tag(again).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(shop.placed.load(Ordering::SeqCst), 1, "the second call is a replay");
    let other: BTreeSet<String> = serde_json::from_str(r#"["red"]"#).unwrap();
    shop.tag(other).await.unwrap();
    let keys = shop.forwarded.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "a different set is a different key");
}

#[tokio::test]
async fn arc_and_by_value_receivers_find_the_handle() {
    let shop = Arc::new(Shop::new(false));
    assert_eq!(Arc::clone(&shop).place_shared("o-1".into()).await, Ok(1));
    assert_eq!(Arc::clone(&shop).place_shared("o-1".into()).await, Ok(1), "replayed");
    let desk = Desk(Arc::clone(&shop));
    assert_eq!(desk.clone().place("o-2".into()).await, Ok(2));
    assert_eq!(desk.place("o-2".into()).await, Ok(2), "replayed");
    assert_eq!(shop.placed.load(Ordering::SeqCst), 2);
}

/// Shapes of a single arguments struct: destructured by a struct pattern, unwrapped by a newtype
/// pattern, or through a renamed `Parameters` import — a key names its fields in each, and a
/// wildcard parameter is neither keyed nor fingerprinted.
struct Body<T>(T);

#[idempotent(key = "order_id", window = "1h")]
async fn place_destructured(Order { order_id, amount_cents, .. }: Order) -> Result<String, ShopError> {
    Ok(format!("placed {order_id} ({amount_cents} cents), run {}", PLACED_SHAPES.fetch_add(1, Ordering::SeqCst) + 1))
}

#[idempotent(key = "order_id", window = "1h")]
async fn place_newtype(Body(order): Body<Order>) -> Result<String, ShopError> {
    Ok(format!("placed {}, run {}", order.order_id, PLACED_SHAPES.fetch_add(1, Ordering::SeqCst) + 1))
}

#[idempotent(key = "order_id", window = "1h")]
async fn place_renamed(Params(order): Params<Order>, _: u64) -> Result<String, ShopError> {
    Ok(format!("placed {}, run {}", order.order_id, PLACED_SHAPES.fetch_add(1, Ordering::SeqCst) + 1))
}

use rmcp::handler::server::wrapper::Parameters as Params;

static PLACED_SHAPES: AtomicUsize = AtomicUsize::new(0);

#[tokio::test]
async fn a_single_arguments_struct_may_be_destructured_and_keyed_by_its_fields() {
    let _installed = crate::INSTALLED_HANDLE.lock().await;
    Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap().install();
    let runs = || PLACED_SHAPES.load(Ordering::SeqCst);
    let before = runs();
    let first = place_destructured(order("s-1", 100, "n")).await.unwrap();
    assert_eq!(place_destructured(order("s-1", 100, "n")).await.unwrap(), first, "a repeat is a replay");
    let conflict = place_destructured(order("s-1", 200, "n")).await.unwrap_err();
    assert_eq!(conflict.code(), "conflict", "the same order with another amount: {conflict:?}");
    place_destructured(order("s-2", 100, "n")).await.unwrap();
    assert_eq!(runs() - before, 2, "one run per order_id");

    let before = runs();
    let first = place_newtype(Body(order("s-3", 100, "n"))).await.unwrap();
    assert_eq!(place_newtype(Body(order("s-3", 100, "n"))).await.unwrap(), first);
    assert_eq!(place_newtype(Body(order("s-3", 300, "n"))).await.unwrap_err().code(), "conflict");
    assert_eq!(runs() - before, 1);

    let before = runs();
    let first = place_renamed(Params(order("s-4", 100, "n")), 1).await.unwrap();
    // The wildcard changes: not part of the operation, so the repeat is a replay, not a conflict.
    assert_eq!(place_renamed(Params(order("s-4", 100, "n")), 2).await.unwrap(), first);
    assert_eq!(place_renamed(Params(order("s-4", 400, "n")), 3).await.unwrap_err().code(), "conflict");
    assert_eq!(runs() - before, 1);
}

static SUMMARIES: AtomicUsize = AtomicUsize::new(0);

/// A tool without arguments: the call itself is the operation.
#[idempotent(key = "()", window = "1h")]
async fn send_daily_summary() -> Result<usize, ShopError> {
    Ok(SUMMARIES.fetch_add(1, Ordering::SeqCst) + 1)
}

/// `key = "()"`: once per caller and window — a repeat by the same caller is a replay, another
/// caller's call is its own operation.
#[tokio::test]
async fn a_tool_without_arguments_runs_once_per_caller_and_window() {
    let _installed = crate::INSTALLED_HANDLE.lock().await;
    Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap().install();
    let before = SUMMARIES.load(Ordering::SeqCst);
    let first = send_daily_summary().await.unwrap();
    assert_eq!(send_daily_summary().await.unwrap(), first, "the same caller's repeat is a replay");
    let bob = run_as(Caller::new("acme", "bob"), send_daily_summary()).await.unwrap();
    assert_ne!(bob, first, "another caller's call runs");
    assert_eq!(run_as(Caller::new("acme", "bob"), send_daily_summary()).await.unwrap(), bob);
    assert_eq!(SUMMARIES.load(Ordering::SeqCst) - before, 2, "once per caller");
}
