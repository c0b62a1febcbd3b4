//! One process of `it::owners`: calls one service's `create` on a durable ledger and says what
//! happened.
//!
//! ```text
//! owners_child <ledger-url> <namespace> <orders|invoices|store-orders|store-invoices|parcels|letters> <id>
//! ```
//!
//! It prints `DONE <answer> RAN <n>` (n: how many times the handler ran in this process) or
//! `REFUSED <code> <message> RAN <n>`; on a setup error `ERROR <why>` with status 2.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_tests::owners::{
    InvoiceRow, Invoices, LETTERS_RAN, Letters, OrderRow, Orders, PARCELS_RAN, Parcels, ServiceError, Store,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, namespace, service, id] = args.as_slice() else {
        println!("ERROR usage: owners_child <url> <namespace> <service> <id>");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let line = runtime.block_on(async {
        let ledger = SeaOrmLedger::connect(url).await.map_err(|error| format!("ledger: {error}"))?;
        let idem = idem_tests::builder(ledger)
            .namespace(namespace.clone())
            .local_caller(idem_runtime::Caller::new("owners", "child"))
            .build()
            .unwrap();
        let (answer, ran) = match service.as_str() {
            "orders" => {
                let orders = Orders { idem, ran: AtomicUsize::new(0) };
                (orders.create(id.clone()).await, orders.ran.load(Ordering::SeqCst))
            }
            "invoices" => {
                let invoices = Invoices { idem, ran: AtomicUsize::new(0) };
                (invoices.create(id.clone()).await, invoices.ran.load(Ordering::SeqCst))
            }
            "store-orders" => {
                let store = Store::<OrderRow>::new(idem);
                (store.create(id.parse().map_err(|_| "a numeric id")?).await, store.ran.load(Ordering::SeqCst))
            }
            "store-invoices" => {
                let store = Store::<InvoiceRow>::new(idem);
                (store.create(id.parse().map_err(|_| "a numeric id")?).await, store.ran.load(Ordering::SeqCst))
            }
            "parcels" => (Parcels::ship(&idem, id.clone()).await, PARCELS_RAN.load(Ordering::SeqCst)),
            "letters" => (Letters::ship(&idem, id.clone()).await, LETTERS_RAN.load(Ordering::SeqCst)),
            other => return Err(format!("no service {other}")),
        };
        Ok(match answer {
            Ok(answer) => format!("DONE {answer} RAN {ran}"),
            Err(ServiceError::Refused { code, message }) => format!("REFUSED {code} {message} RAN {ran}"),
        })
    });
    match line {
        Ok(line) => println!("{line}"),
        Err(why) => {
            println!("ERROR {why}");
            std::process::exit(2);
        }
    }
}
