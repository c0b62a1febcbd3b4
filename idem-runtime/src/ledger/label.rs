//! Who and what an operation was, for the operator: the tool, the tenant and the subject, sealed
//! under the server secret and kept with the record while the operation is unsettled.
//!
//! A reader of the ledger without the secret learns nothing from a label but its length (and,
//! like the tenant and subject tags beside it, which records share one): it is encrypted, not
//! merely hashed, because the operator who has the secret must read it back — `idem pending`
//! shows whose operation is stuck, and `idem resolve` needs its tenant.
//!
//! The construction is a deterministic authenticated encryption built from HMAC-SHA256 alone,
//! the SIV pattern: the IV is a MAC of the plaintext, the keystream is HMAC in counter mode
//! under that IV, and opening recomputes the MAC and compares. The same (tool, tenant, subject)
//! seals to the same bytes, which says no more than the equal tags already do; a tampered or
//! foreign label does not open.

use serde_json::Value;

use crate::secret::Secret;

/// The version byte a sealed label starts with.
const VERSION: u8 = 1;
/// Bytes of IV (the truncated MAC of the plaintext) after the version.
const IV: usize = 16;
/// The longest tool or subject name kept, in bytes; a longer one is cut (on a character
/// boundary) and ends with `…`. Bounds a record's size whatever a caller's identity looks like.
const MAX_NAME: usize = 128;
/// The longest tenant kept whole, in bytes: the tenant is what an operator names to reach the
/// record (`--tenant`), and a cut one names no tenant — so it is cut only past this, which no
/// real tenant name reaches, to keep a record's size bounded all the same.
const MAX_TENANT: usize = 1024;

/// The longest list of parts (as JSON) whose sealed label a secret remembers, in bytes.
const MAX_REMEMBERED: usize = 2048;

/// Who and what an operation was: what `seal` keeps and `open` gives back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Label {
    /// The tool's name.
    pub tool: String,
    /// The caller's tenant.
    pub tenant: String,
    /// The caller's subject, or `None` for an operation of the whole tenant (`scope = "tenant"`).
    pub subject: Option<String>,
    /// The namespace its key was derived in; `None` in a label sealed before labels kept it.
    pub namespace: Option<String>,
}

/// `label` sealed under `secret`, as [`seal`] seals it, sealed once per label and secret (the
/// secret remembers it): every call of a tool by a caller has the same label.
pub(crate) fn seal_remembered(
    secret: &Secret,
    namespace: &str,
    tool: &str,
    tenant: &str,
    subject: Option<&str>,
) -> Vec<u8> {
    // The parts as a JSON array: no two lists of parts share its text.
    let mut who = Vec::with_capacity(namespace.len() + tool.len() + tenant.len() + 32);
    for part in [Some(namespace), Some(tool), Some(tenant), subject] {
        match part {
            Some(part) => crate::canonical::write_canonical_str(part, &mut who),
            None => who.extend_from_slice(b"null"),
        }
        who.push(b',');
    }
    // A caller's names of unusual length are sealed afresh rather than kept: what is remembered
    // stays small whatever callers send.
    if who.len() > MAX_REMEMBERED {
        return seal(secret, namespace, tool, tenant, subject);
    }
    secret.sealed_label(&who, || seal(secret, namespace, tool, tenant, subject)).to_vec()
}

/// `label` sealed under `secret`.
pub(crate) fn seal(secret: &Secret, namespace: &str, tool: &str, tenant: &str, subject: Option<&str>) -> Vec<u8> {
    let plain = Value::Array(vec![
        Value::String(short(tool)),
        Value::String(if tenant.len() <= MAX_TENANT { tenant.to_owned() } else { cut(tenant, MAX_TENANT) }),
        subject.map_or(Value::Null, |subject| Value::String(short(subject))),
        Value::String(short(namespace)),
    ])
    .to_string();
    let iv = secret.mac("idem/v2/label-iv", &[plain.as_bytes()]);
    let mut sealed = Vec::with_capacity(1 + IV + plain.len());
    sealed.push(VERSION);
    sealed.extend_from_slice(&iv[..IV]);
    sealed.extend_from_slice(plain.as_bytes());
    keystream(secret, &iv[..IV], &mut sealed[1 + IV..]);
    sealed
}

/// The label `sealed` holds, if one of `secrets` sealed it (a label made before a rotation
/// opens under a previous secret).
pub(crate) fn open<'s>(secrets: impl IntoIterator<Item = &'s Secret>, sealed: &[u8]) -> Option<Label> {
    let (&version, rest) = sealed.split_first()?;
    if version != VERSION || rest.len() < IV {
        return None;
    }
    let (iv, cipher) = rest.split_at(IV);
    secrets.into_iter().find_map(|secret| {
        let mut plain = cipher.to_vec();
        keystream(secret, iv, &mut plain);
        let check = secret.mac("idem/v2/label-iv", &[&plain]);
        if !constant_eq(&check[..IV], iv) {
            return None;
        }
        let Value::Array(parts) = serde_json::from_slice(&plain).ok()? else { return None };
        let (tool, tenant, subject, namespace) = match parts.as_slice() {
            [Value::String(tool), Value::String(tenant), subject] => (tool, tenant, subject, None),
            [Value::String(tool), Value::String(tenant), subject, Value::String(namespace)] => {
                (tool, tenant, subject, Some(namespace.clone()))
            }
            _ => return None,
        };
        Some(Label {
            tool: tool.clone(),
            tenant: tenant.clone(),
            subject: subject.as_str().map(str::to_owned),
            namespace,
        })
    })
}

/// XORs `data` with HMAC-SHA256(secret, iv ‖ block counter), block by block.
fn keystream(secret: &Secret, iv: &[u8], data: &mut [u8]) {
    for (counter, chunk) in (0u32..).zip(data.chunks_mut(32)) {
        let block = secret.mac("idem/v2/label-stream", &[iv, &counter.to_be_bytes()]);
        for (byte, key) in chunk.iter_mut().zip(block) {
            *byte ^= key;
        }
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// `name`, cut to [`MAX_NAME`] bytes on a character boundary (marked with `…`).
fn short(name: &str) -> String {
    if name.len() <= MAX_NAME { name.to_owned() } else { cut(name, MAX_NAME) }
}

/// `name` cut to `max` bytes on a character boundary, ending with `…`.
fn cut(name: &str, max: usize) -> String {
    let mut end = max - '…'.len_utf8();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> Secret {
        Secret::new(u32::from(byte), &[byte; 32]).unwrap()
    }

    #[test]
    fn a_label_opens_under_its_secret_and_not_another() {
        let sealed = seal(&secret(1), "payments", "charge_card", "acme", Some("alice"));
        let label = open([&secret(1)], &sealed).unwrap();
        let expected = Label {
            tool: "charge_card".into(),
            tenant: "acme".into(),
            subject: Some("alice".into()),
            namespace: Some("payments".into()),
        };
        assert_eq!(label, expected);
        assert_eq!(open([&secret(2)], &sealed), None);
        // A rotation: the label opens under the previous secret still honoured.
        assert_eq!(open([&secret(2), &secret(1)], &sealed), Some(label));
    }

    #[test]
    fn a_label_says_nothing_in_the_clear_and_a_tampered_one_does_not_open() {
        let sealed = seal(&secret(1), "payments", "charge_card", "acme-corporation", None);
        for word in ["charge_card", "acme", "corporation"] {
            assert!(!sealed.windows(word.len()).any(|window| window == word.as_bytes()), "{word} in the clear");
        }
        for at in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[at] ^= 0x40;
            assert_eq!(open([&secret(1)], &tampered), None, "byte {at} flipped still opens");
        }
        assert_eq!(open([&secret(1)], &sealed[..sealed.len() - 1]), None);
        assert_eq!(open([&secret(1)], &[]), None);
        assert_eq!(open([&secret(1)], &sealed).unwrap().subject, None);
    }

    #[test]
    fn long_names_are_cut_on_a_character_boundary_but_the_tenant_is_kept_whole() {
        let long = "é".repeat(200);
        let label = open([&secret(1)], &seal(&secret(1), "ns", &long, &long, Some(&long))).unwrap();
        for cut in [&label.tool, label.subject.as_ref().unwrap()] {
            assert!(cut.len() <= MAX_NAME, "{}", cut.len());
            assert!(cut.ends_with('…') && cut.starts_with("éé"));
        }
        // The operator names the tenant to reach the record (`--tenant`): a cut one names none.
        assert_eq!(label.tenant, long);
        // Past any real tenant's length, it is cut all the same: a record's size stays bounded.
        let huge = "t".repeat(5000);
        let label = open([&secret(1)], &seal(&secret(1), "ns", "tool", &huge, None)).unwrap();
        assert!(label.tenant.len() <= MAX_TENANT && label.tenant.ends_with('…'), "{}", label.tenant.len());
    }

    /// A remembered label is the label sealed afresh: for parts that a plain join would confuse,
    /// with and without a subject, under another secret, and past the bound on what is kept.
    #[test]
    fn a_remembered_label_is_the_label() {
        let (one, two) = (secret(1), secret(2));
        let cases = [
            ("ns", "tool", "acme", Some("alice")),
            ("ns", "tool", "acme", None),
            ("ns", "tool", "acme:5", Some("alice")),
            ("ns", "tool5:", "acme", Some("alice")),
            ("ns-", "tool", "acme", None),
            ("ns", "tool", "acme-", None),
        ];
        for _ in 0..2 {
            for (namespace, tool, tenant, subject) in cases {
                for secret in [&one, &two] {
                    let remembered = seal_remembered(secret, namespace, tool, tenant, subject);
                    assert_eq!(
                        remembered,
                        seal(secret, namespace, tool, tenant, subject),
                        "{tool} {tenant} {subject:?}"
                    );
                }
            }
        }
        // Parts longer than what is remembered are sealed afresh, to the same bytes.
        let long = "t".repeat(MAX_REMEMBERED);
        assert_eq!(seal_remembered(&one, "ns", "tool", &long, None), seal(&one, "ns", "tool", &long, None));
        for i in 0..4200 {
            let tenant = format!("tenant-{i}");
            assert_eq!(seal_remembered(&one, "ns", "tool", &tenant, None), seal(&one, "ns", "tool", &tenant, None));
        }
    }
}
