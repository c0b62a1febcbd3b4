//! Quickstart: one charge, repeated every way an agent repeats a call.
//!
//! Run with `cargo run --example quickstart`. The ledger is the embedded default: a SQLite file
//! `idem/quickstart/ledger.sqlite3` in your data directory (`~/.local/share` on Linux), or
//! `IDEM_DATABASE_URL`. The program prints what each call got and how many charges the fake
//! processor really made, then restarts itself and repeats the first call from the new process:
//! the stored result survives. idem's log (the ledger it opened, replays, conflicts) goes to
//! stderr; `RUST_LOG=debug` shows every claim.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, ErrorClass, HasIdem, Idem, IdempotentError, Rejection, current_operation, idempotent};
use serde::{Deserialize, Serialize};

/// This program's name, for good: its default ledger (and secret) is `idem/quickstart/` in the user's
/// data directory whatever the executable file is called. A package of one program passes
/// `env!("CARGO_PKG_NAME")`; this package holds several examples, each with a ledger of its own.
const PROGRAM: &str = "quickstart";

/// The tool's errors, each saying what it means for a repeat.
#[derive(Debug, Serialize, Deserialize)]
enum ChargeError {
    /// The processor declined the card: the final answer, replayed to repeats.
    Declined,
    /// idem answered without running the handler.
    Idem { code: String, message: String },
}

impl IdempotentError for ChargeError {
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

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

/// A payments service whose `charge_card` is safe to repeat.
struct Payments {
    idem: Idem,
    /// What the (fake) card processor really did.
    charges: AtomicUsize,
}

impl HasIdem for Payments {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Payments {
    #[idempotent(key = "order_id, amount_cents", window = "15m")]
    async fn charge_card(
        &self,
        order_id: String,
        card: String,
        amount_cents: u64,
        note: String,
    ) -> Result<Receipt, ChargeError> {
        // The key travels downstream so the processor can dedupe too (its reference field).
        let reference = current_operation().map(|op| op.idempotency_key()).unwrap_or_default();
        let _ = (order_id, card, note);
        if amount_cents > 1_000_000 {
            return Err(ChargeError::Declined);
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // the processor is slow
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Receipt { charge_id: format!("ch_{n}_{}", &reference[..8]), amount_cents })
    }
}

fn row(what: &str, answer: &Result<Receipt, ChargeError>, charges: usize) {
    let got = match answer {
        Ok(receipt) => receipt.charge_id.clone(),
        Err(ChargeError::Idem { code, .. }) => format!("refused: {code}"),
        Err(other) => format!("error: {other:?}"),
    };
    println!("| {what:<36} | {got:<24} | {charges:>17} |");
}

#[tokio::main]
async fn main() {
    // Logs to stderr, so stdout stays the program's own output (on an MCP stdio server, the
    // protocol's).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let ledger = match SeaOrmLedger::from_env(PROGRAM).await {
        Ok(ledger) => ledger,
        Err(error) => {
            eprintln!("cannot open the ledger: {error}");
            std::process::exit(1);
        }
    };
    let alice = Caller::new("acme", "alice");
    let idem = Idem::builder(ledger).local_caller(alice).build().expect("the default lease and timeouts work together");
    if let Err(error) = idem.admin().check_secret().await {
        eprintln!("cannot key operations: {error}");
        std::process::exit(1);
    }
    let payments = Payments { idem, charges: AtomicUsize::new(0) };
    let charge = |order: &str, amount: u64, note: &str| {
        payments.charge_card(order.to_owned(), "tok_visa".to_owned(), amount, note.to_owned())
    };

    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--after-restart") {
        let order = args.next().unwrap_or_default();
        let answer = charge(&order, 1250, "order 17").await;
        row("after a restart: same call again", &answer, payments.charges.load(Ordering::SeqCst));
        return;
    }

    // A fresh order id per run, so each run starts with a first call.
    let order = format!("o-{}", idem_runtime::ledger::Token::random().get() % 1_000_000);
    println!("| {:<36} | {:<24} | {:>17} |", "call", "answer", "charges (process)");
    println!("|{:-<38}|{:-<26}|{:->19}|", "", "", "");
    let count = || payments.charges.load(Ordering::SeqCst);

    row("first call", &charge(&order, 1250, "order 17").await, count());
    row("sequential repeat (replayed)", &charge(&order, 1250, "order 17").await, count());

    let racing = format!("{order}-b");
    let (a, b) = tokio::join!(charge(&racing, 990, "order 18"), charge(&racing, 990, "order 18"));
    row("concurrent repeat, one of two", &a, count());
    row("concurrent repeat, other of two", &b, count());

    let conflict = charge(&order, 1250, "order 99").await;
    row("same key, different note", &conflict, count());

    let bob = Caller::new("acme", "bob");
    let other = idem_runtime::run_as(bob, charge(&order, 1250, "order 17")).await;
    row("same call, another caller", &other, count());

    // Restart: a new process opens the same ledger file and repeats the first call.
    let output = std::env::current_exe().and_then(|exe| Command::new(exe).args(["--after-restart", &order]).output());
    match output {
        Ok(output) => print!("{}", String::from_utf8_lossy(&output.stdout)),
        Err(error) => eprintln!("could not restart: {error}"),
    }

    if let Err(ChargeError::Idem { message, .. }) = &conflict {
        println!("\nWhat the agent is told on the conflict:\n  {message}");
    }
}
