//! Two different handlers never share an operation (issue 26, item 1): `Orders::create` and
//! `Invoices::create`, both keyed on `id`, on two handles over one ledger and in two processes
//! over one SQLite file and one PostgreSQL database. Once both have been seen, both are refused,
//! whichever came first; a handler pinned with `name = "..."` is another tool and runs.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::Caller;
use idem_runtime::ledger::Token;
use idem_tests::owners::{
    InvoiceRow, Invoices, LETTERS_RAN, LOADS_RAN, Letters, NOTES_RAN, OrderRow, Orders, PARCELS_RAN, Parcels,
    PinnedInvoices, PinnedOrders, Receipts, ServiceError, Store,
};

/// A namespace of this run's own: the owners a shared database recorded in earlier runs (or
/// other tests) stay out of it.
fn fresh_namespace() -> String {
    format!("owners-{:016x}", Token::random().get())
}

fn refused(answer: &Result<String, ServiceError>) -> &str {
    match answer {
        Err(ServiceError::Refused { code, message }) if code == "duplicate_tool" => message,
        other => panic!("expected a duplicate_tool refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn two_handles_over_one_ledger_never_share_an_operation() {
    for (name, ledger) in idem_tests::every_ledger("two_handles_over_one_ledger_never_share_an_operation").await {
        let namespace = fresh_namespace();
        let handle = || {
            idem_tests::builder(ledger.clone())
                .namespace(namespace.clone())
                .local_caller(Caller::new("owners", "test"))
                .build()
                .unwrap()
        };
        let orders = Orders { idem: handle(), ran: AtomicUsize::new(0) };
        let invoices = Invoices { idem: handle(), ran: AtomicUsize::new(0) };
        let receipts = Receipts { idem: handle(), ran: AtomicUsize::new(0) };

        assert_eq!(orders.create("42".into()).await, Ok("order 42 #1".to_owned()), "{name}");
        // The invoice handler is another handler: it is refused, not handed the order's result.
        let answer = invoices.create("42".into()).await;
        let message = refused(&answer).to_owned();
        assert_eq!(invoices.ran.load(Ordering::SeqCst), 0, "{name}: the invoice handler never ran");
        for words in ["idem_tests::owners::Orders::create", "idem_tests::owners::Invoices::create", "name = \""] {
            assert!(message.contains(words), "{name}: the refusal names both handlers and the fix: {message}");
        }
        // And so is the first one from now on: the outcome does not hang on which came first.
        let answer = orders.create("43".into()).await;
        refused(&answer);
        assert_eq!(orders.ran.load(Ordering::SeqCst), 1, "{name}");
        // A handler pinned under another name is another tool.
        assert_eq!(receipts.create("42".into()).await, Ok("receipt 42 #1".to_owned()), "{name}");
    }
}

/// Issue 43, item 3: who serves an operation is the ledger's catalogue, which every handle over
/// the ledger shares — also handles given two clones of one ledger (a `SeaOrmLedger` cloned
/// into two services). Before, this process's record of owners was a static keyed by the
/// ledger's address: a clone was another ledger, the second handler was refused only once the
/// database named the first, and the first kept running beside it ("order 43 #2").
#[tokio::test]
async fn handles_over_clones_of_one_ledger_share_its_catalogue() {
    let dir = std::env::temp_dir().join(format!("idem-owners-clones-{:016x}", Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let ledger = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("open a SQLite file");
    let namespace = fresh_namespace();
    let handle = |ledger: idem_runtime::ledger::sea::SeaOrmLedger| {
        idem_tests::builder(ledger)
            .namespace(namespace.clone())
            .local_caller(Caller::new("owners", "test"))
            .build()
            .unwrap()
    };
    let orders = Orders { idem: handle(ledger.clone()), ran: AtomicUsize::new(0) };
    let invoices = Invoices { idem: handle(ledger), ran: AtomicUsize::new(0) };
    assert_eq!(orders.create("42".into()).await, Ok("order 42 #1".to_owned()));
    refused(&invoices.create("42".into()).await);
    assert_eq!(invoices.ran.load(Ordering::SeqCst), 0, "the invoice handler never ran");
    let answer = orders.create("43".into()).await;
    assert_eq!(orders.ran.load(Ordering::SeqCst), 1, "the order handler ran beside the invoice one: {answer:?}");
    refused(&answer);
}

/// Handles on `ledger` in a namespace of their own, calling as one local caller.
fn handles(ledger: &std::sync::Arc<dyn idem_runtime::ledger::Ledger>) -> impl Fn() -> idem_runtime::Idem {
    let namespace = fresh_namespace();
    let ledger = ledger.clone();
    move || {
        idem_tests::builder(ledger.clone())
            .namespace(namespace.clone())
            .local_caller(Caller::new("owners", "test"))
            .build()
            .unwrap()
    }
}

/// Issue 41, item 6 (a): one generic service, two instances. `Store<OrderRow>` and
/// `Store<InvoiceRow>` run different code; the invoice store is refused (its body never runs)
/// rather than handed the order's result — on one handle and on two.
#[tokio::test]
async fn two_instances_of_a_generic_service_never_share_an_operation() {
    for (name, ledger) in idem_tests::every_ledger("two_instances_of_a_generic_service_never_share").await {
        for two_handles in [false, true] {
            let handle = handles(&ledger);
            let orders = Store::<OrderRow>::new(handle());
            let invoices = Store::<InvoiceRow>::new(if two_handles { handle() } else { orders.idem.clone() });
            assert_eq!(orders.create(42).await, Ok("order 42 #1".to_owned()), "{name}");
            let answer = invoices.create(42).await;
            assert_eq!(invoices.ran.load(Ordering::SeqCst), 0, "{name}, two handles {two_handles}: {answer:?}");
            let message = refused(&answer).to_owned();
            for words in [
                "idem_tests::owners::Store<idem_tests::owners::OrderRow>::create",
                "idem_tests::owners::Store<idem_tests::owners::InvoiceRow>::create",
            ] {
                assert!(message.contains(words), "{name}: the refusal names both instances: {message}");
            }
            assert!(
                message.contains("instances of one generic handler"),
                "{name}: and how to tell them apart: {message}"
            );
            assert!(message.contains(".namespace("), "{name}: {message}");
            refused(&orders.create(43).await);
            assert_eq!(orders.ran.load(Ordering::SeqCst), 1, "{name}");
        }
    }
}

/// Issue 41, item 6 (a), the same for a generic free function whose type parameter no argument
/// carries: `load::<InvoiceRow>` is not handed `load::<OrderRow>`'s result.
#[tokio::test]
async fn two_instances_of_a_generic_function_never_share_an_operation() {
    let ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger> =
        std::sync::Arc::new(idem_runtime::MemoryLedger::new());
    let idem = handles(&ledger)();
    assert_eq!(idem_tests::owners::load::<OrderRow>(&idem, 42).await, Ok("order 42 #1".to_owned()));
    let answer = idem_tests::owners::load::<InvoiceRow>(&idem, 42).await;
    assert_eq!(LOADS_RAN[1].load(Ordering::SeqCst), 0, "the invoice loader never ran: {answer:?}");
    let message = refused(&answer);
    assert!(message.contains("idem_tests::owners::load::<idem_tests::owners::InvoiceRow>"), "{message}");
    assert!(message.contains("instances of one generic handler"), "{message}");
}

/// Issue 41, item 6 (b): two different handlers pinned with one name are refused across two
/// handles on one ledger as they are on one handle.
#[tokio::test]
async fn two_handlers_pinned_to_one_name_are_refused_on_any_handle() {
    for (name, ledger) in idem_tests::every_ledger("two_handlers_pinned_to_one_name_are_refused").await {
        for two_handles in [false, true] {
            let handle = handles(&ledger);
            let orders = PinnedOrders { idem: handle(), ran: AtomicUsize::new(0) };
            let invoices = PinnedInvoices {
                idem: if two_handles { handle() } else { orders.idem.clone() },
                ran: AtomicUsize::new(0),
            };
            assert_eq!(orders.create("42".into()).await, Ok("order 42 #1".to_owned()), "{name}");
            let answer = invoices.create("42".into()).await;
            assert_eq!(invoices.ran.load(Ordering::SeqCst), 0, "{name}, two handles {two_handles}: {answer:?}");
            let message = refused(&answer).to_owned();
            assert!(message.contains("tests/owners.rs"), "{name}: the refusal says where each is declared: {message}");
            refused(&orders.create("43".into()).await);
            assert_eq!(orders.ran.load(Ordering::SeqCst), 1, "{name}");
        }
    }
}

/// Issue 41, item 6 (c): two functions with no `self`, of one name, in one module, in impls
/// without `#[audit_idempotent]`, are two handlers on two handles as on one.
#[tokio::test]
async fn two_functions_of_one_name_in_unaudited_impls_never_share_an_operation() {
    let ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger> =
        std::sync::Arc::new(idem_runtime::MemoryLedger::new());
    let handle = handles(&ledger);
    let (first, second) = (handle(), handle());
    assert_eq!(Parcels::ship(&first, "42".into()).await, Ok("parcel 42 #1".to_owned()));
    let answer = Letters::ship(&second, "42".into()).await;
    assert_eq!(LETTERS_RAN.load(Ordering::SeqCst), 0, "the letter handler never ran: {answer:?}");
    let message = refused(&answer);
    for words in ["idem_tests::owners::Parcels::ship", "idem_tests::owners::Letters::ship"] {
        assert!(message.contains(words), "the refusal names both handlers: {message}");
    }
    assert!(!message.contains("instances of one generic handler"), "{message}");
    refused(&Parcels::ship(&first, "43".into()).await);
    assert_eq!(PARCELS_RAN.load(Ordering::SeqCst), 1);
}

/// Issue 41, item 6, the regression: an `impl Serialize + Send + Sync` argument compiles and is
/// keyed by its value — a `&str` and a `String` of the same text are one operation, as an
/// argument's type is no part of which handler runs.
#[tokio::test]
async fn an_impl_serialize_argument_is_keyed_by_its_value() {
    let ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger> =
        std::sync::Arc::new(idem_runtime::MemoryLedger::new());
    let idem = handles(&ledger)();
    assert_eq!(idem_tests::owners::note(&idem, "n-1").await, Ok("note #1".to_owned()));
    assert_eq!(idem_tests::owners::note(&idem, String::from("n-1")).await, Ok("note #1".to_owned()));
    assert_eq!(idem_tests::owners::note(&idem, "n-2").await, Ok("note #2".to_owned()));
    assert_eq!(NOTES_RAN.load(Ordering::SeqCst), 2);
}

/// One `owners_child` process: its line of output.
fn child(url: &str, namespace: &str, service: &str, id: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_owners_child"))
        .args([url, namespace, service, id])
        .output()
        .expect("run owners_child");
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(!stdout.starts_with("ERROR"), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// The ledgers `owners_child` processes share: a SQLite file, and PostgreSQL if it is there.
async fn shared_ledgers(test: &str) -> Vec<(&'static str, String)> {
    let dir = std::env::temp_dir().join(format!("idem-owners-{:016x}", Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let mut urls = vec![("sqlite", format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display()))];
    let (env, default) = idem_tests::POSTGRES;
    if let Some(postgres) = idem_tests::suite_database(test, env, default).await {
        urls.push(("postgres", postgres));
    }
    urls
}

#[tokio::test]
async fn two_processes_over_one_ledger_never_share_an_operation() {
    for (name, url) in shared_ledgers("two_processes_over_one_ledger_never_share_an_operation").await {
        let namespace = fresh_namespace();
        let first = child(&url, &namespace, "orders", "42");
        assert_eq!(first, "DONE order 42 #1 RAN 1", "{name}");
        // Another binary of the package (here: another process) with the other handler.
        let second = child(&url, &namespace, "invoices", "42");
        assert!(second.starts_with("REFUSED duplicate_tool") && second.ends_with("RAN 0"), "{name}: {second}");
        // A restarted orders process is refused too: both handlers, whichever started first.
        let third = child(&url, &namespace, "orders", "43");
        assert!(third.starts_with("REFUSED duplicate_tool") && third.ends_with("RAN 0"), "{name}: {third}");
    }
}

/// Issue 41, item 6 (a) and (c) across processes: the instances of a generic service, and two
/// functions of one name in unaudited impls, are told apart by the name each process records in
/// the ledger (the same in every process of one build).
#[tokio::test]
async fn two_processes_never_share_an_operation_of_two_instances_or_two_unaudited_functions() {
    let test = "two_processes_never_share_an_operation_of_two_instances_or_two_unaudited_functions";
    for (name, url) in shared_ledgers(test).await {
        for (first, second, answer) in
            [("store-orders", "store-invoices", "order 42 #1"), ("parcels", "letters", "parcel 42 #1")]
        {
            let namespace = fresh_namespace();
            assert_eq!(child(&url, &namespace, first, "42"), format!("DONE {answer} RAN 1"), "{name}");
            // A restart of the same build is the same handler: the repeat is replayed.
            assert_eq!(child(&url, &namespace, first, "42"), format!("DONE {answer} RAN 0"), "{name}");
            let refused = child(&url, &namespace, second, "42");
            assert!(refused.starts_with("REFUSED duplicate_tool") && refused.ends_with("RAN 0"), "{name}: {refused}");
            let again = child(&url, &namespace, first, "43");
            assert!(again.starts_with("REFUSED duplicate_tool") && again.ends_with("RAN 0"), "{name}: {again}");
        }
    }
}

/// What a plain free function records as its owner is its module's path and its name — what it
/// was before instances and unaudited functions were told apart — read from what rustc prints
/// for a closure's type at run time: a toolchain that printed it otherwise would change every
/// such handler's owner, and a ledger that knows the old one would refuse the tool after an
/// upgrade until `idem tools forget`. This holds the name to what rustc prints today.
#[tokio::test]
async fn a_plain_free_functions_owner_is_its_module_path_and_name() {
    use idem_runtime::ledger::Ledger;
    let ledger: std::sync::Arc<dyn Ledger> = std::sync::Arc::new(idem_runtime::MemoryLedger::new());
    let namespace = fresh_namespace();
    let idem = idem_tests::builder(ledger.clone())
        .namespace(namespace.clone())
        .local_caller(Caller::new("owners", "test"))
        .build()
        .unwrap();
    assert_eq!(idem_tests::owners::named(&idem, 7).await, Ok("named 7".to_owned()));
    let now = idem.admin().now_ms();
    let owners = ledger.tool_owners(&namespace, "named", "a probe", now, 0).await.expect("the owners");
    assert_eq!(owners, ["a probe".to_owned(), "idem_tests::owners::named".to_owned()], "the owners recorded");
}

/// Hangs the first statement that keeps a tool's facts.
struct HangFirstFacts(AtomicUsize);

impl idem_tests::tap::Tap for HangFirstFacts {
    fn before(&self, call: idem_tests::tap::Call) -> idem_tests::tap::Pass {
        if call == idem_tests::tap::Call::KeepToolFacts && self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return idem_tests::tap::Pass::Hang;
        }
        idem_tests::tap::Pass::Through
    }
}

static FACTS_ONCE: idem_runtime::Recipe = idem_runtime::Recipe::new("facts_once", &["id"]);

/// From the review of issue 43, item 3: a tool's first call, dropped by its caller while it
/// keeps the tool's facts (its result shape, what an operator's verdict is checked against),
/// leaves the next call to keep them. Before the fix the catalogue marked the tool checked
/// first, and no later call of the process kept them: verdicts on the tool went unchecked.
#[tokio::test]
async fn a_first_call_dropped_while_keeping_the_tools_facts_leaves_them_to_the_next() {
    use idem_runtime::ledger::Ledger;
    let memory: std::sync::Arc<dyn Ledger> = std::sync::Arc::new(idem_runtime::MemoryLedger::new());
    let tapped = idem_tests::tap::Tapped::new(std::sync::Arc::clone(&memory), HangFirstFacts(AtomicUsize::new(0)));
    let namespace = fresh_namespace();
    let idem = idem_tests::builder(tapped)
        .namespace(namespace.clone())
        .local_caller(Caller::new("owners", "test"))
        .build()
        .unwrap();
    let call = |id: u32| {
        let idem = idem.clone();
        async move {
            let arguments = serde_json::json!({ "id": id });
            idem.call(&FACTS_ONCE, None, &arguments, move || async move { Ok::<_, idem_runtime::mcp::ToolError>(id) })
                .await
        }
    };
    // Dropped well before the ledger timeout would have ended the hung statement.
    let first = tokio::time::timeout(std::time::Duration::from_millis(300), call(1)).await;
    assert!(first.is_err(), "the first call went past the hung statement: {first:?}");
    let second = call(2).await;
    assert_eq!(second.as_ref().ok().map(|served| served.value), Some(2), "{second:?}");
    let facts = memory.tool_facts(&namespace, "facts_once").await.expect("the ledger answers");
    assert!(facts.is_some(), "the tool's facts were never kept");
}
