//! A fake downstream that owns the side effect and lives outside any one process: a directory.
//!
//! It is shared by the crash child (which is SIGKILLed) and the test process (which retries,
//! reconciles and counts), so what it records survives the kill. It only uses `std`, so the
//! `crash_child` binary can use it without any dependency the test package does not already
//! have.
//!
//! - `attempts.log`: one line `<reference> <order>` per effect *attempt*, appended with a single
//!   `write` on an `O_APPEND` file — what a downstream that does not dedupe would have executed.
//! - `applied/<reference>`: the effect, applied at most once per reference (the forwarded
//!   idempotency key). Created atomically with `hard_link` (fails if it exists), so a second
//!   attempt with the same reference gets the first one's receipt back instead of a second effect.
//!   The file holds `<order> <receipt>`, so duplicates *per business operation* are visible even
//!   if the forwarded key were to change between attempts.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory-backed downstream that dedupes by the forwarded reference.
#[derive(Debug, Clone)]
pub struct FileDownstream {
    dir: PathBuf,
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl FileDownstream {
    /// Opens (creating) the downstream in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(dir.join("applied"))?;
        fs::create_dir_all(dir.join("tmp"))?;
        Ok(Self { dir })
    }

    /// The effect: charge `order` under `reference`. Every attempt is logged; the first attempt
    /// for a reference applies, later ones get the first receipt back.
    pub fn charge(&self, reference: &str, order: &str) -> io::Result<String> {
        let mut log = OpenOptions::new().create(true).append(true).open(self.dir.join("attempts.log"))?;
        log.write_all(format!("{reference} {order}\n").as_bytes())?;
        let receipt = format!(
            "rcpt-{}-{}-{}",
            &reference[..reference.len().min(12)],
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::SeqCst)
        );
        let tmp =
            self.dir.join("tmp").join(format!("{}-{}", std::process::id(), SEQUENCE.fetch_add(1, Ordering::SeqCst)));
        fs::write(&tmp, format!("{order} {receipt}"))?;
        let linked = fs::hard_link(&tmp, self.dir.join("applied").join(reference));
        fs::remove_file(&tmp)?;
        match linked {
            Ok(()) => Ok(receipt),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                self.lookup(reference)?.ok_or_else(|| io::Error::other("applied effect vanished"))
            }
            Err(error) => Err(error),
        }
    }

    /// What the downstream knows about `reference`: the receipt of its applied effect, if any.
    /// (A reconcile function or an operator asks this.)
    pub fn lookup(&self, reference: &str) -> io::Result<Option<String>> {
        match fs::read_to_string(self.dir.join("applied").join(reference)) {
            Ok(text) => Ok(text.split_once(' ').map(|(_, receipt)| receipt.to_owned())),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Effect attempts per order (what a non-deduping downstream would have executed).
    pub fn attempts_by_order(&self) -> io::Result<BTreeMap<String, usize>> {
        let text = match fs::read_to_string(self.dir.join("attempts.log")) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error),
        };
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            if let Some((_, order)) = line.split_once(' ') {
                *counts.entry(order.to_owned()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }

    /// The receipt of the one applied effect of `order`, found by the business operation rather
    /// than by a key the test recomputes: `None` if there is none, or more than one.
    pub fn receipt_of_order(&self, order: &str) -> io::Result<Option<String>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(self.dir.join("applied"))? {
            let text = fs::read_to_string(entry?.path())?;
            if let Some((applied, receipt)) = text.split_once(' ')
                && applied == order
            {
                found.push(receipt.to_owned());
            }
        }
        Ok(if found.len() == 1 { found.pop() } else { None })
    }

    /// Applied effects per order (a duplicate is a count above one).
    pub fn applied_by_order(&self) -> io::Result<BTreeMap<String, usize>> {
        let mut counts = BTreeMap::new();
        for entry in fs::read_dir(self.dir.join("applied"))? {
            let text = fs::read_to_string(entry?.path())?;
            if let Some((order, _)) = text.split_once(' ') {
                *counts.entry(order.to_owned()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }
}
