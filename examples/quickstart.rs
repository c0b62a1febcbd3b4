//! Quickstart: one charge, repeated every way an agent repeats a call.
//!
//! Run with `cargo run --example quickstart`. It drives the runtime directly on the in-memory
//! ledger and prints what each call got and how many charges the (fake) processor really made.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection, Served, current_operation,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

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

/// A fake card processor that, like a real one, dedupes by the reference it is given.
#[derive(Default)]
struct Processor {
    charges: AtomicUsize,
}

impl Processor {
    async fn charge(&self, reference: &str, amount_cents: u64) -> Receipt {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Receipt { charge_id: format!("ch_{n}_{}", &reference[..8]), amount_cents }
    }
}

static CHARGE_CARD: Recipe = Recipe::new("charge_card", &["card", "amount_cents"]).window(Duration::from_secs(15 * 60));

async fn charge_card(
    idem: &Idem,
    processor: &Processor,
    caller: &Caller,
    args: serde_json::Value,
) -> Result<Served<Receipt>, ChargeError> {
    let amount = args["amount_cents"].as_u64().unwrap_or(0);
    idem.call(&CHARGE_CARD, Some(caller), &args, || async move {
        // The key travels downstream, so the processor can dedupe too.
        let key = current_operation().map(|op| op.key().to_string()).unwrap_or_default();
        if amount > 1_000_000 {
            return Err(ChargeError::Declined);
        }
        Ok(processor.charge(&key, amount).await)
    })
    .await
}

fn show(what: &str, answer: &Result<Served<Receipt>, ChargeError>, processor: &Processor) {
    let got = match answer {
        Ok(served) if served.replayed => format!("replayed {} (ref {})", served.value.charge_id, served.reference),
        Ok(served) => format!("ran: {} (ref {})", served.value.charge_id, served.reference),
        Err(ChargeError::Idem { code, .. }) => format!("refused: {code}"),
        Err(other) => format!("error: {other:?}"),
    };
    println!("| {what:<34} | {got:<46} | {:>7} |", processor.charges.load(Ordering::SeqCst));
}

#[tokio::main]
async fn main() {
    let idem = Idem::new(MemoryLedger::new());
    let processor = Arc::new(Processor::default());
    let alice = Caller::new("acme", "alice");
    let args = json!({ "card": "tok_visa", "amount_cents": 1250, "note": "order 17" });

    println!("| {:<34} | {:<46} | {:>7} |", "call", "answer", "charges");
    println!("|{:-<36}|{:-<48}|{:->9}|", "", "", "");

    let first = charge_card(&idem, &processor, &alice, args.clone()).await;
    show("first call", &first, &processor);

    let repeat = charge_card(&idem, &processor, &alice, args.clone()).await;
    show("sequential repeat", &repeat, &processor);

    let racing = json!({ "card": "tok_visa", "amount_cents": 990, "note": "order 18" });
    let (a, b) = tokio::join!(
        charge_card(&idem, &processor, &alice, racing.clone()),
        charge_card(&idem, &processor, &alice, racing.clone()),
    );
    show("concurrent repeat (a)", &a, &processor);
    show("concurrent repeat (b)", &b, &processor);

    let changed = json!({ "card": "tok_visa", "amount_cents": 1250, "note": "order 99" });
    let conflict = charge_card(&idem, &processor, &alice, changed).await;
    show("same key, different note", &conflict, &processor);
    if let Err(ChargeError::Idem { message, .. }) = &conflict {
        println!("\n  what the agent is told: {message}\n");
    }

    let bob = Caller::new("acme", "bob");
    let other = charge_card(&idem, &processor, &bob, args.clone()).await;
    show("same arguments, another caller", &other, &processor);
}
