//! Issue 11: what a reader of the ledger can learn, which operations can share a key, and who
//! may read whose operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection, key::Fingerprint, ledger::Ledger,
    ledger::State, secret::Secret,
};
use sea_orm::{ConnectionTrait, Statement};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

#[derive(Debug, Serialize, Deserialize)]
enum Error {
    Idem(String),
}

impl IdempotentError for Error {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.code().to_owned())
    }
}

static CHARGE: Recipe = Recipe::new("charge", &["card", "amount_cents"]);

const CARD: &str = "4111111111111111";
const AMOUNT: u64 = 734_519;

/// The fingerprint and argument tags of the one stored row.
async fn stored_row(ledger: &SeaOrmLedger) -> (Vec<u8>, Vec<u8>) {
    let db = ledger.connection();
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT fingerprint, arg_tags FROM idem_records",
        ))
        .await
        .unwrap()
        .expect("one record");
    (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap())
}

/// What a reader without the secret can compute: the public, unkeyed digest of the canonical
/// arguments, and the 2-byte FNV tag of a value.
fn unkeyed_candidate(amount: u64) -> [u8; 32] {
    Sha256::digest(format!("{{\"amount_cents\":{amount},\"card\":\"{CARD}\"}}").as_bytes()).into()
}

fn fnv16(bytes: &[u8]) -> [u8; 2] {
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let folded = (hash >> 16) ^ (hash & 0xffff);
    [(folded >> 8) as u8, (folded & 0xff) as u8]
}

/// A reader of a stored row (a backup, a replica, a BI export) who knows the card cannot
/// brute-force the amount from the tags and the fingerprint without the server's secret.
#[tokio::test]
async fn a_ledger_reader_without_the_secret_cannot_brute_force_an_amount() {
    let ledger = SeaOrmLedger::connect("sqlite::memory:").await.unwrap();
    let idem = Idem::new(ledger.clone());
    let caller = Caller::new("acme", "alice");
    let args = json!({ "card": CARD, "amount_cents": AMOUNT });
    idem.call(&CHARGE, Some(&caller), &args, || async { Ok::<_, Error>("charged".to_owned()) }).await.unwrap();
    let (fingerprint, tags) = stored_row(&ledger).await;

    // Without the secret: narrow by the value tag, confirm by the fingerprint.
    let amount_tag = tags.chunks_exact(4).next().map(|tag| [tag[2], tag[3]]).unwrap();
    let found: Vec<u64> = (0..1_000_000u64)
        .filter(|amount| fnv16(amount.to_string().as_bytes()) == amount_tag)
        .filter(|amount| unkeyed_candidate(*amount)[..] == fingerprint[..])
        .collect();
    assert_eq!(found, Vec::<u64>::new(), "a reader without the secret recovered the amount");
}

/// The same search with the secret succeeds: the row does determine the amount, so the search
/// above fails for want of the secret and nothing else.
#[tokio::test]
async fn with_the_secret_the_same_search_finds_the_amount() {
    let ledger = SeaOrmLedger::connect("sqlite::memory:").await.unwrap();
    let secret = Secret::new(1, &[0x17; 32]).unwrap();
    let idem = Idem::builder(ledger.clone()).secret(secret.clone()).build().unwrap();
    let args = json!({ "card": CARD, "amount_cents": AMOUNT });
    idem.call(&CHARGE, Some(&alice()), &args, || async { Ok::<_, Error>("charged".to_owned()) }).await.unwrap();
    let (fingerprint, tags) = stored_row(&ledger).await;
    // Narrow by the value tag (HMAC of "idem/v2/argument-value", NUL, name, NUL, value), confirm
    // by the fingerprint.
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(&[0x17; 32]);
    let inner =
        Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(b"idem/v2/argument-value\0amount_cents\0");
    let outer = Sha256::new().chain_update(block.map(|b| b ^ 0x5c));
    let found: Vec<u64> = (0..1_000_000u64)
        .filter(|amount| {
            let digest = inner.clone().chain_update(amount.to_string()).finalize();
            outer.clone().chain_update(digest).finalize()[..2] == tags[2..4]
        })
        .filter(|amount| {
            let candidate = json!({ "card": CARD, "amount_cents": amount });
            Fingerprint::of(&secret, candidate.as_object().unwrap(), &[]).unwrap().digest()[..] == fingerprint[..]
        })
        .collect();
    assert_eq!(found, vec![AMOUNT]);
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn secret(version: u32, byte: u8) -> Secret {
    Secret::new(version, &[byte; 32]).unwrap()
}

/// Runs a charge on `idem`, counting runs in `runs`; `hold` keeps the handler running a while.
async fn charge(idem: &Idem, args: &serde_json::Value, runs: &AtomicUsize, hold: Duration) -> Result<String, Error> {
    idem.call(&CHARGE, Some(&alice()), args, || async {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(hold).await;
        Ok::<_, Error>(format!("receipt-{n}"))
    })
    .await
    .map(|served| served.value)
}

/// A rotation never turns a repeat into a second execution: an operation recorded under the
/// previous secret is replayed (or answered in flight) by a handle on the new one, its status
/// is still found, and new operations are keyed with the new secret.
#[tokio::test]
async fn a_rotated_secret_still_finds_operations_made_under_the_previous_one() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let (v1, v2) = (secret(1, 0x11), secret(2, 0x22));
    let before = Idem::builder(Arc::clone(&ledger)).secret(v1.clone()).build().unwrap();
    let after = Idem::builder(Arc::clone(&ledger)).secret(v2.clone()).previous_secret(v1.clone()).build().unwrap();
    let runs = AtomicUsize::new(0);
    let args = json!({ "card": CARD, "amount_cents": 1250 });

    assert_eq!(charge(&before, &args, &runs, Duration::ZERO).await.unwrap(), "receipt-1");
    assert_eq!(charge(&after, &args, &runs, Duration::ZERO).await.unwrap(), "receipt-1", "replayed across a rotation");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let old_ref = before.admin().key_of(&CHARGE, &alice(), &args).unwrap().reference().to_string();
    let status = after.status(&alice(), &old_ref).await.unwrap().expect("found under the previous secret");
    assert_eq!(status.state, State::Completed);

    // In flight under the old secret: the new handle answers in flight, it does not run.
    let slow = json!({ "card": CARD, "amount_cents": 990 });
    let first = charge(&before, &slow, &runs, Duration::from_millis(300));
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        charge(&after, &slow, &runs, Duration::ZERO).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), "receipt-2");
    assert!(matches!(second, Err(Error::Idem(ref code)) if code == "in_flight"), "{second:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A new operation is keyed with the new secret, and the keys differ.
    let new = json!({ "card": CARD, "amount_cents": 1 });
    assert_eq!(charge(&after, &new, &runs, Duration::ZERO).await.unwrap(), "receipt-3");
    assert_ne!(
        after.admin().key_of(&CHARGE, &alice(), &new).unwrap(),
        before.admin().key_of(&CHARGE, &alice(), &new).unwrap()
    );

    // Without the previous secret, the same repeat would run again (a second charge): a handle
    // configured so refuses to serve while operations made under the old secret live, and runs
    // nothing (issue 41, item 2).
    let forgot = Idem::builder(Arc::clone(&ledger)).secret(v2).build().unwrap();
    let refused = charge(&forgot, &args, &runs, Duration::ZERO).await;
    assert!(matches!(refused, Err(Error::Idem(ref code)) if code == "ledger_unavailable"), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "the repeat ran again under the new secret alone");
}

/// During a rolling rotation, two replicas key the same operation under different secrets at
/// the same moment: it still runs at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_mid_rotation_never_both_run_one_operation() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let (v1, v2) = (secret(1, 0x11), secret(2, 0x22));
    let old = Idem::builder(Arc::clone(&ledger)).secret(v1.clone()).previous_secret(v2.clone()).build().unwrap();
    let new = Idem::builder(Arc::clone(&ledger)).secret(v2).previous_secret(v1).build().unwrap();
    for amount in 0..200u64 {
        let runs = Arc::new(AtomicUsize::new(0));
        let args = json!({ "card": CARD, "amount_cents": amount });
        let tasks = [old.clone(), new.clone()].map(|idem| {
            let (runs, args) = (Arc::clone(&runs), args.clone());
            tokio::spawn(async move { charge(&idem, &args, &runs, Duration::from_millis(2)).await })
        });
        for task in tasks {
            let _ = task.await.unwrap();
        }
        assert!(runs.load(Ordering::SeqCst) <= 1, "amount {amount} ran {} times", runs.load(Ordering::SeqCst));
    }
}

/// The embedded default needs no setup: a secret is generated once, kept beside the ledger
/// file, owner-only, and reused after a restart (so the restarted process replays).
#[tokio::test]
async fn the_sqlite_default_keeps_its_own_secret_beside_the_file() {
    let dir = std::env::temp_dir().join(format!("idem-security-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let runs = AtomicUsize::new(0);
    let args = json!({ "card": CARD, "amount_cents": 5 });
    let first = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    first.admin().check_secret().await.expect("zero setup");
    assert_eq!(charge(&first, &args, &runs, Duration::ZERO).await.unwrap(), "receipt-1");
    let secret_file = dir.join("ledger.sqlite3.secret");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret_file).expect("the secret file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only");
    }
    let restarted = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    assert_eq!(charge(&restarted, &args, &runs, Duration::ZERO).await.unwrap(), "receipt-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// PostgreSQL and MySQL are shared by replicas: without a configured secret, the handle says how
/// to set one, and no call runs.
#[tokio::test]
async fn a_shared_database_without_a_secret_refuses_and_says_how_to_set_one() {
    for (backend, (env, default)) in [("postgres", idem_tests::POSTGRES), ("mysql", idem_tests::MYSQL)] {
        let test = format!("security::a_shared_database_without_a_secret::{backend}");
        let Some(url) = idem_tests::suite_database(&test, env, default).await else { continue };
        let ledger = SeaOrmLedger::connect(&url).await.expect("connect to the suite's database");
        let idem = Idem::new(ledger);
        let error = idem.admin().check_secret().await.expect_err("no secret on a shared database").to_string();
        assert!(error.contains("IDEM_SECRET=1:") && error.contains("every replica"), "{backend}: {error}");
        let runs = AtomicUsize::new(0);
        let refused = charge(&idem, &json!({ "card": CARD, "amount_cents": 7 }), &runs, Duration::ZERO).await;
        assert!(matches!(refused, Err(Error::Idem(ref code)) if code == "ledger_unavailable"), "{refused:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        let keyed = Idem::builder(Arc::clone(idem.admin().ledger())).secret(idem_tests::test_secret()).build().unwrap();
        keyed.admin().check_secret().await.expect("configured in code");
    }
}

// ---------------------------------------------------------------------------------------------
// Item 2: no two tools share keys by accident.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum CommandError {
    Refused { code: String, message: String },
}

impl IdempotentError for CommandError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

static SHOP: std::sync::OnceLock<Idem> = std::sync::OnceLock::new();

/// One handle for the module-level handlers below (not `Idem::install`: tests run in parallel).
fn shop() -> &'static Idem {
    SHOP.get_or_init(|| Idem::builder(MemoryLedger::new()).local_caller(alice()).build().unwrap())
}

static ORDERS_CANCELLED: AtomicUsize = AtomicUsize::new(0);
static SUBSCRIPTIONS_CANCELLED: AtomicUsize = AtomicUsize::new(0);

mod orders {
    use super::*;

    #[idem_runtime::idempotent(key = "id", idem = super::shop())]
    pub async fn cancel(id: String) -> Result<String, CommandError> {
        ORDERS_CANCELLED.fetch_add(1, Ordering::SeqCst);
        Ok(format!("order {id} cancelled"))
    }
}

mod subscriptions {
    use super::*;

    #[idem_runtime::idempotent(key = "id", idem = super::shop())]
    pub async fn cancel(id: String) -> Result<String, CommandError> {
        SUBSCRIPTIONS_CANCELLED.fetch_add(1, Ordering::SeqCst);
        Ok(format!("subscription {id} cancelled"))
    }
}

/// `orders::cancel` and `subscriptions::cancel` under one handle: the second is refused (and
/// says how to fix it) rather than handed the first one's result.
#[tokio::test]
async fn two_handlers_with_one_name_never_replay_each_other() {
    assert_eq!(orders::cancel("7".into()).await.unwrap(), "order 7 cancelled");
    let second = subscriptions::cancel("7".into()).await;
    assert_eq!(SUBSCRIPTIONS_CANCELLED.load(Ordering::SeqCst), 0, "not run: {second:?}");
    let Err(CommandError::Refused { code, message }) = second else { panic!("replayed: {second:?}") };
    assert_eq!(code, "duplicate_tool");
    assert!(message.contains("name = "), "{message}");
    assert_eq!(ORDERS_CANCELLED.load(Ordering::SeqCst), 1);
}

/// The command-handler pattern: one trait, one method name, many commands.
trait Handler {
    async fn handle(&self, order_id: String) -> Result<String, CommandError>;
}

struct Commands {
    idem: Idem,
    placed: AtomicUsize,
    cancelled: AtomicUsize,
}

struct PlaceOrder<'a>(&'a Commands);
struct CancelOrder<'a>(&'a Commands);
struct CancelOrderRenamed<'a>(&'a Commands);

impl idem_runtime::HasIdem for PlaceOrder<'_> {
    fn idem(&self) -> &Idem {
        &self.0.idem
    }
}
impl idem_runtime::HasIdem for CancelOrder<'_> {
    fn idem(&self) -> &Idem {
        &self.0.idem
    }
}
impl idem_runtime::HasIdem for CancelOrderRenamed<'_> {
    fn idem(&self) -> &Idem {
        &self.0.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Handler for PlaceOrder<'_> {
    #[idem_runtime::idempotent(key = "order_id")]
    async fn handle(&self, order_id: String) -> Result<String, CommandError> {
        self.0.placed.fetch_add(1, Ordering::SeqCst);
        Ok(format!("placed {order_id}"))
    }
}

#[idem_runtime::audit_idempotent]
impl Handler for CancelOrder<'_> {
    #[idem_runtime::idempotent(key = "order_id")]
    async fn handle(&self, order_id: String) -> Result<String, CommandError> {
        self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        Ok(format!("cancelled {order_id}"))
    }
}

#[idem_runtime::audit_idempotent]
impl Handler for CancelOrderRenamed<'_> {
    #[idem_runtime::idempotent(key = "order_id", name = "cancel_order")]
    async fn handle(&self, order_id: String) -> Result<String, CommandError> {
        self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        Ok(format!("cancelled {order_id}"))
    }
}

#[tokio::test]
async fn command_handlers_sharing_a_method_name_never_replay_each_other() {
    let commands = Commands {
        idem: Idem::builder(MemoryLedger::new()).local_caller(alice()).build().unwrap(),
        placed: AtomicUsize::new(0),
        cancelled: AtomicUsize::new(0),
    };
    assert_eq!(PlaceOrder(&commands).handle("o-7".into()).await.unwrap(), "placed o-7");
    let cancelled = CancelOrder(&commands).handle("o-7".into()).await;
    assert_ne!(cancelled, Ok("placed o-7".to_owned()), "CancelOrder got PlaceOrder's result");
    assert!(matches!(&cancelled, Err(CommandError::Refused { code, .. }) if code == "duplicate_tool"), "{cancelled:?}");
    assert_eq!(commands.cancelled.load(Ordering::SeqCst), 0);
    // `name =` is the way out: a name of its own is a key of its own.
    assert_eq!(CancelOrderRenamed(&commands).handle("o-7".into()).await.unwrap(), "cancelled o-7");
    assert_eq!((commands.placed.load(Ordering::SeqCst), commands.cancelled.load(Ordering::SeqCst)), (1, 1));
}

static CREATE: Recipe = Recipe::new("create", &["id"]);

/// Two MCP servers on one ledger both have `create`: their namespaces keep them apart.
#[tokio::test]
async fn two_servers_on_one_ledger_never_share_keys() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let server = |namespace: &str| {
        Idem::builder(Arc::clone(&ledger)).secret(idem_tests::test_secret()).namespace(namespace).build().unwrap()
    };
    let (orders, billing) = (server("orders"), server("billing"));
    let runs = AtomicUsize::new(0);
    let create = |idem: Idem, made: &'static str| {
        let runs = &runs;
        async move {
            let args = json!({ "id": "42" });
            let served = idem
                .call(&CREATE, Some(&alice()), &args, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(made.to_owned())
                })
                .await
                .unwrap();
            served.value
        }
    };
    assert_eq!(create(orders.clone(), "order 42").await, "order 42");
    assert_eq!(create(billing, "invoice 42").await, "invoice 42", "not the other server's result");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // In one namespace they are one tool: the same call is a repeat (so the test can fail).
    assert_eq!(create(server("orders"), "order again").await, "order 42");
}

struct Keyed(Idem);

impl idem_runtime::HasIdem for Keyed {
    fn idem(&self) -> &Idem {
        &self.0
    }
}

#[idem_runtime::audit_idempotent]
impl Keyed {
    #[idem_runtime::idempotent(key = "id")]
    async fn create(&self, id: String) -> Result<String, Error> {
        let _ = id;
        Ok(idem_runtime::current_operation().unwrap().ledger_key().to_string())
    }
}

/// `#[idempotent]` keys a handler in its package's namespace (stable across module moves and
/// refactors); `Builder::namespace` replaces it for every tool of a handle.
#[tokio::test]
async fn the_default_namespace_is_the_declaring_package() {
    let idem = Idem::builder(MemoryLedger::new()).local_caller(alice()).build().unwrap();
    let key = Keyed(idem.clone()).create("42".into()).await.unwrap();
    let expected =
        idem.admin().key_of(&Recipe::new("create", &["id"]).namespace("idem-tests"), &alice(), &json!({ "id": "42" }));
    assert_eq!(key, expected.unwrap().to_string());
    let named =
        Idem::builder(Arc::clone(idem.admin().ledger())).local_caller(alice()).namespace("shop").build().unwrap();
    let key = Keyed(named.clone()).create("42".into()).await.unwrap();
    assert_eq!(key, named.admin().key_of(&CREATE, &alice(), &json!({ "id": "42" })).unwrap().to_string());
}

// ---------------------------------------------------------------------------------------------
// Item 3: status is scoped to the subject.
// ---------------------------------------------------------------------------------------------

static TEAM_INVOICE: Recipe = Recipe::new("pay_invoice", &["invoice"]).scope(idem_runtime::ScopeRule::Tenant);
static PRIVATE_NOTE: Recipe = Recipe::new("write_note", &["note"]);

/// Two subjects of one tenant: a record made under the caller's scope is visible to that caller
/// alone; a record made with `scope = "tenant"` to the whole tenant.
#[tokio::test]
async fn status_shows_a_callers_operation_to_that_caller_alone() {
    let idem = Idem::new(MemoryLedger::new());
    let (alice, bob) = (alice(), Caller::new("acme", "bob"));
    let private = json!({ "note": "alice's diagnosis" });
    let made = idem.call(&PRIVATE_NOTE, Some(&alice), &private, || async { Ok::<_, Error>("secret".to_owned()) }).await;
    let reference = made.unwrap().reference.to_string();
    assert!(idem.status(&alice, &reference).await.unwrap().is_some(), "the caller sees its own");
    assert_eq!(idem.status(&bob, &reference).await.unwrap(), None, "a colleague does not");

    let shared = json!({ "invoice": "inv-9" });
    let paid = idem.call(&TEAM_INVOICE, Some(&alice), &shared, || async { Ok::<_, Error>("paid".to_owned()) }).await;
    let reference = paid.unwrap().reference.to_string();
    let seen = idem.status(&bob, &reference).await.unwrap().expect("a tenant-scoped record is the tenant's");
    assert_eq!(seen.result.as_deref(), Some(&br#"{"ok":"paid"}"#[..]));
    assert_eq!(idem.status(&Caller::new("globex", "alice"), &reference).await.unwrap(), None);
}

// ---------------------------------------------------------------------------------------------
// Items 3, 4 and 5 over a real rmcp server: the request context as the HTTP transport fills it.
// ---------------------------------------------------------------------------------------------

mod over_mcp {
    use std::sync::Mutex;

    use idem_runtime::{HasIdem, audit_idempotent, idempotent};
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::{ServiceExt, tool, tool_handler, tool_router};
    use serde_json::Value;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    impl rmcp::model::IntoContents for CommandError {
        fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
            let Self::Refused { message, .. } = self;
            vec![rmcp::model::ContentBlock::text(message)]
        }
    }

    #[derive(Serialize, Deserialize, schemars::JsonSchema)]
    struct Checkout {
        order_id: String,
        sku: String,
    }

    /// How the next request arrives: over stdio (no HTTP parts), or over HTTP with the caller
    /// an auth middleware put into the request's extensions (or none).
    #[derive(Clone)]
    enum Arrival {
        Stdio,
        Http(Option<Caller>),
    }

    #[derive(Clone)]
    struct Warehouse {
        idem: Idem,
        /// What the stock system really reserved: (sku, reservation).
        reserved: Arc<Mutex<Vec<String>>>,
        next: Arc<Mutex<Arrival>>,
        router: ToolRouter<Self>,
    }

    impl HasIdem for Warehouse {
        fn idem(&self) -> &Idem {
            &self.idem
        }
    }

    #[audit_idempotent]
    #[tool_router]
    impl Warehouse {
        fn new(idem: Idem) -> Self {
            let router = Self::tool_router() + idem_runtime::mcp::status_tool();
            Self { idem, reserved: Arc::default(), next: Arc::new(Mutex::new(Arrival::Stdio)), router }
        }

        #[idempotent(key = "order_id")]
        #[tool(description = "Check an order out: reserves its stock through an idempotent step")]
        async fn checkout(&self, Parameters(checkout): Parameters<Checkout>) -> Result<String, CommandError> {
            let reservation = self.reserve(checkout.sku).await?;
            Ok(format!("{} checked out with {reservation}", checkout.order_id))
        }

        /// An idempotent step inside a tool: not a tool itself, so it has no request context.
        #[idempotent(key = "sku")]
        async fn reserve(&self, sku: String) -> Result<String, CommandError> {
            let mut reserved = self.reserved.lock().unwrap();
            reserved.push(sku.clone());
            Ok(format!("reservation-{} of {sku}", reserved.len()))
        }
    }

    #[tool_handler(router = self.router)]
    impl rmcp::ServerHandler for Warehouse {
        async fn call_tool(
            &self,
            request: rmcp::model::CallToolRequestParams,
            mut context: rmcp::service::RequestContext<rmcp::RoleServer>,
        ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
            // What rmcp's streamable HTTP transport does: the request's parts, with whatever the
            // auth middleware inserted, go into the context's extensions.
            if let Arrival::Http(caller) = self.next.lock().unwrap().clone() {
                let (mut parts, ()) = http::Request::builder().uri("/mcp").body(()).unwrap().into_parts();
                if let Some(caller) = caller {
                    parts.extensions.insert(caller);
                }
                context.extensions.insert(parts);
            }
            let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
            self.router.call(call).await
        }
    }

    struct Wire {
        writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
        next: Arc<Mutex<Arrival>>,
        id: u64,
    }

    impl Wire {
        async fn connect(server: Warehouse) -> Self {
            let next = Arc::clone(&server.next);
            let (client, end) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let running = server.serve(tokio::io::split(end)).await.expect("the server starts");
                let _ = running.waiting().await;
            });
            let (reader, writer) = tokio::io::split(client);
            let mut wire = Self { writer, lines: BufReader::new(reader).lines(), next, id: 0 };
            let init = json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "idem-security", "version": "0.0.0" }
            });
            wire.request("initialize", init).await;
            wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await;
            wire
        }

        async fn send(&mut self, message: Value) {
            let mut line = serde_json::to_vec(&message).unwrap();
            line.push(b'\n');
            self.writer.write_all(&line).await.unwrap();
        }

        async fn request(&mut self, method: &str, params: Value) -> Value {
            self.id += 1;
            let id = self.id;
            self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
            loop {
                let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                    .await
                    .expect("the server answers")
                    .unwrap()
                    .expect("the pipe stays open");
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == json!(id) {
                    return message["result"].clone();
                }
            }
        }

        /// Calls `tool` as `arrival`; the tool result.
        async fn call(&mut self, arrival: Arrival, tool: &str, arguments: Value) -> Value {
            *self.next.lock().unwrap() = arrival;
            self.request("tools/call", json!({ "name": tool, "arguments": arguments })).await
        }
    }

    fn text(result: &Value) -> String {
        result.pointer("/content/0/text").and_then(Value::as_str).unwrap_or_default().to_owned()
    }

    fn code(result: &Value) -> Option<&str> {
        result.pointer("/_meta/dev.idem~1outcome/code").and_then(Value::as_str)
    }

    fn warehouse() -> Warehouse {
        // A local identity is configured, as for stdio (the quickstart does the same).
        Warehouse::new(Idem::builder(MemoryLedger::new()).local_caller(Caller::new("local", "user")).build().unwrap())
    }

    /// Item 4: an HTTP request without an authenticated caller is refused — by tools and by the
    /// status tool — even though a local identity is configured; over stdio the local identity
    /// is the caller.
    #[tokio::test]
    async fn an_http_request_without_a_caller_never_gets_the_local_identity() {
        let server = warehouse();
        let reserved = Arc::clone(&server.reserved);
        let mut wire = Wire::connect(server).await;
        let args = json!({ "order_id": "o-1", "sku": "sku-1" });
        let refused = wire.call(Arrival::Http(None), "checkout", args.clone()).await;
        assert_eq!(code(&refused), Some("no_caller"), "{refused}");
        assert!(reserved.lock().unwrap().is_empty(), "nothing ran");

        let local = wire.call(Arrival::Stdio, "checkout", args).await;
        assert_eq!(text(&local), "o-1 checked out with reservation-1 of sku-1", "{local}");
        let reference = local.pointer("/_meta/dev.idem~1outcome/ref").and_then(Value::as_str).unwrap().to_owned();
        let status = wire.call(Arrival::Http(None), "idem_status", json!({ "ref": reference })).await;
        assert_eq!(code(&status), Some("no_caller"), "the status tool too: {status}");
        let own = wire.call(Arrival::Stdio, "idem_status", json!({ "ref": reference })).await;
        assert_eq!(own.pointer("/structuredContent/state").and_then(Value::as_str), Some("completed"), "{own}");
    }

    /// Item 3 over MCP: the status tool never returns another subject's stored result.
    #[tokio::test]
    async fn the_status_tool_never_shows_a_colleagues_result() {
        let mut wire = Wire::connect(warehouse()).await;
        let (alice, bob) = (Caller::new("acme", "alice"), Caller::new("acme", "bob"));
        let done =
            wire.call(Arrival::Http(Some(alice.clone())), "checkout", json!({ "order_id": "o-9", "sku": "s" })).await;
        let reference = done.pointer("/_meta/dev.idem~1outcome/ref").and_then(Value::as_str).expect("a ref").to_owned();
        let theirs = wire.call(Arrival::Http(Some(bob)), "idem_status", json!({ "ref": reference })).await;
        assert_eq!(code(&theirs), Some("not_found"), "{theirs}");
        assert!(!theirs.to_string().contains("checked out"), "{theirs}");
        let own = wire.call(Arrival::Http(Some(alice)), "idem_status", json!({ "ref": reference })).await;
        assert_eq!(
            own.pointer("/structuredContent/result").and_then(Value::as_str),
            Some("o-9 checked out with reservation-1 of s")
        );
    }

    /// Item 6: a broken ledger's raw error (here SQLite's "no such table: idem_records") goes to
    /// the log, not to the agent, who is told nothing ran, a retry is safe, and an incident ref.
    #[tokio::test]
    async fn raw_database_errors_never_reach_the_agent() {
        let ledger = SeaOrmLedger::connect("sqlite::memory:").await.unwrap();
        ledger.connection().execute_unprepared("DROP TABLE idem_records").await.unwrap();
        let idem = Idem::builder(ledger).local_caller(Caller::new("local", "user")).build().unwrap();
        let (args, runs) = (json!({ "card": CARD, "amount_cents": 3 }), AtomicUsize::new(0));
        let Err(Error::Idem(refused)) = charge(&idem, &args, &runs, Duration::ZERO).await else {
            panic!("expected a refusal")
        };
        assert_eq!(refused, "ledger_unavailable");
        let mut wire = Wire::connect(Warehouse::new(idem)).await;
        let refused = wire.call(Arrival::Stdio, "checkout", json!({ "order_id": "o-1", "sku": "s" })).await;
        assert_eq!(code(&refused), Some("ledger_unavailable"), "{refused}");
        let said = text(&refused);
        assert!(!said.contains("idem_records") && !said.contains("no such table"), "raw error sent: {said}");
        assert!(said.contains("nothing was executed") && said.contains("safe to retry"), "{said}");
        let incident = refused.pointer("/_meta/dev.idem~1outcome/incident").and_then(Value::as_str).unwrap_or_default();
        assert!(said.contains(incident) && incident.len() == 16, "an incident ref to correlate: {refused}");
        let status = wire.call(Arrival::Stdio, "idem_status", json!({ "ref": "0123456789abcdef" })).await;
        assert!(!status.to_string().contains("idem_records"), "raw error sent by the status tool: {status}");
        assert_eq!(code(&status), Some("ledger_unavailable"), "{status}");
    }

    /// A free function `checkout` beside the rmcp tool `checkout`, on one handle.
    #[idempotent(key = "order_id", idem = handle)]
    async fn checkout(handle: &Idem, order_id: String) -> Result<String, CommandError> {
        Ok(format!("free checkout of {order_id}"))
    }

    /// Item 2: a free function and an rmcp tool with one name on one handle do not share keys:
    /// the second to run is refused, not handed the first one's result.
    #[tokio::test]
    async fn a_free_function_and_a_tool_with_one_name_never_replay_each_other() {
        let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("local", "user")).build().unwrap();
        let mut wire = Wire::connect(Warehouse::new(idem.clone())).await;
        let tool = wire.call(Arrival::Stdio, "checkout", json!({ "order_id": "o-1", "sku": "s" })).await;
        assert_eq!(text(&tool), "o-1 checked out with reservation-1 of s", "{tool}");
        let free = checkout(&idem, "o-1".to_owned()).await;
        assert!(matches!(&free, Err(CommandError::Refused { code, .. }) if code == "duplicate_tool"), "{free:?}");
    }

    /// Item 5: an idempotent step inside a tool runs as the tool's caller. Two tenants check
    /// out the same sku: each gets a reservation of its own, never the other tenant's.
    #[tokio::test]
    async fn a_nested_operation_runs_as_the_outer_operations_caller() {
        let server = warehouse();
        let reserved = Arc::clone(&server.reserved);
        let mut wire = Wire::connect(server).await;
        let (alice, bob) = (Caller::new("acme", "alice"), Caller::new("globex", "bob"));
        let args = json!({ "order_id": "o-1", "sku": "sku-1" });
        let first = wire.call(Arrival::Http(Some(alice)), "checkout", args.clone()).await;
        assert_eq!(text(&first), "o-1 checked out with reservation-1 of sku-1", "{first}");
        let second = wire.call(Arrival::Http(Some(bob)), "checkout", args).await;
        assert_eq!(text(&second), "o-1 checked out with reservation-2 of sku-1", "bob got alice's step: {second}");
        assert_eq!(reserved.lock().unwrap().len(), 2);
    }
}

/// Item 6: the example's demo bearer tokens take any `tenant:subject` at its word, so the example
/// refuses to serve them on an address other machines can reach.
#[test]
fn the_demo_tokens_refuse_a_non_loopback_address() {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(std::path::Path::parent).unwrap();
    let server = profile.join("examples").join(format!("mcp_server{}", std::env::consts::EXE_SUFFIX));
    assert!(server.is_file(), "build the example first: cargo build --example mcp_server");
    let dir = std::env::temp_dir().join(format!("idem-demo-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    for address in ["0.0.0.0:0", "[::]:0"] {
        let mut child = std::process::Command::new(&server)
            .args(["--http", address])
            .current_dir(&dir)
            .env("IDEM_DATABASE_URL", "sqlite::memory:")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let status = status.unwrap_or_else(|| panic!("the demo server served on {address}: {stderr}"));
        assert!(!status.success(), "{address}: {stderr}");
        assert!(stderr.contains("loopback"), "{address}: says why and what to do: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stand-in for an AEAD under a key from a KMS: reversible, and the plain bytes are not in the
/// sealed ones.
struct Reversed;

impl idem_runtime::settings::ResultSeal for Reversed {
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String> {
        Ok(b"sealed:".iter().copied().chain(plain.iter().rev().map(|b| b ^ 0x55)).collect())
    }
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, String> {
        let body = sealed.strip_prefix(b"sealed:").ok_or("not sealed by this seal")?;
        Ok(body.iter().rev().map(|b| b ^ 0x55).collect())
    }
}

/// Item 6: results are stored as the handler returned them unless the server seals them; a
/// sealed result is stored sealed, and replayed and shown by status opened.
#[tokio::test]
async fn a_result_seal_keeps_stored_results_from_a_ledger_reader() {
    let ledger = SeaOrmLedger::connect("sqlite::memory:").await.unwrap();
    let idem = Idem::builder(ledger.clone()).secret(idem_tests::test_secret()).result_seal(Reversed).build().unwrap();
    let args = json!({ "card": CARD, "amount_cents": 12 });
    let runs = AtomicUsize::new(0);
    let handler = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(format!("charged card {CARD}"))
    };
    let first = idem.call(&CHARGE, Some(&alice()), &args, handler).await.unwrap();
    let db = ledger.connection();
    let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), "SELECT result FROM idem_records"));
    let stored: Vec<u8> = row.await.unwrap().unwrap().try_get_by_index(0).unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains(CARD), "stored in the clear");
    let again = idem.call(&CHARGE, Some(&alice()), &args, handler).await.unwrap();
    assert_eq!((again.value, again.replayed, runs.load(Ordering::SeqCst)), (first.value.clone(), true, 1));
    let status = idem.status(&alice(), &first.reference.to_string()).await.unwrap().unwrap();
    assert_eq!(status.result, Some(format!(r#"{{"ok":"charged card {CARD}"}}"#).into_bytes()));
    // A handle without the seal cannot read it, and does not run the handler again either.
    let unsealed = Idem::builder(ledger).secret(idem_tests::test_secret()).build().unwrap();
    let refused = unsealed.call(&CHARGE, Some(&alice()), &args, handler).await;
    assert!(matches!(refused, Err(Error::Idem(ref code)) if code == "unreadable_result"), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
