//! The `Idempotency-Key` header as clients send it: the IETF draft's Structured Field String
//! (RFC 9651: `"` printable ASCII `"`, with `\"` and `\\` as the only escapes), or — unless the
//! layer is built [`strict_keys`](super::IdempotencyLayer::strict_keys) — a bare token of
//! visible ASCII as Stripe-style clients send it (`Idempotency-Key: 4f1c…`), the same key as its
//! quoted form. Not empty, at most [`MAX_KEY_CHARS`] characters. Anything else is refused (400)
//! before anything is claimed. The handler reads the key decoded through [`IdempotencyKey`].

use http::HeaderMap;

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest key accepted, in characters (what Stripe and most APIs allow).
pub const MAX_KEY_CHARS: usize = 255;

/// Why a request's key is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum KeyError {
    /// No `Idempotency-Key` header.
    Missing,
    /// More than one.
    Repeated,
    /// Not a Structured Field String, empty, or too long: what is wrong.
    Malformed(&'static str),
}

/// The client's key from `headers`, decoded: a quoted string's escapes undone; a bare token
/// (visible ASCII, no quote) as it is, unless `strict`.
pub(super) fn client_key(headers: &HeaderMap, strict: bool) -> Result<String, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let text = value.to_str().map_err(|_| KeyError::Malformed("it holds bytes that are not visible ASCII"))?;
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    if text.starts_with('"') {
        return parse_sf_string(text);
    }
    if strict {
        return Err(KeyError::Malformed(
            "this endpoint takes the draft's quoted string only, like \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        ));
    }
    parse_bare(text)
}

/// A bare token: visible ASCII (`!` to `~`) without a quote or a backslash, as Stripe-style
/// clients send a key.
fn parse_bare(text: &str) -> Result<String, KeyError> {
    if text.is_empty() {
        return Err(KeyError::Malformed("it is empty"));
    }
    if let Some(c) = text.chars().find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\\')) {
        return Err(KeyError::Malformed(match c {
            ' ' | '\t' => "a key with spaces must be sent quoted, like \"order 42\"",
            '"' | '\\' => "a key with a quote or a backslash must be sent as a quoted string, escaped (\\\" or \\\\)",
            _ => "it holds characters that are not visible ASCII",
        }));
    }
    if text.chars().count() > MAX_KEY_CHARS {
        return Err(KeyError::Malformed("it is longer than 255 characters"));
    }
    Ok(text.to_owned())
}

/// An RFC 9651 String: `"…"` with `\"` and `\\` escapes and printable ASCII inside.
fn parse_sf_string(text: &str) -> Result<String, KeyError> {
    let inner = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|_| text.len() >= 2)
        .ok_or(KeyError::Malformed("a key that starts with a quote must end with one, like \"order-42\""))?;
    let mut key = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => key.push(escaped),
                _ => return Err(KeyError::Malformed("a backslash may only escape \" or \\")),
            },
            '"' => return Err(KeyError::Malformed("a quote inside the key must be escaped as \\\"")),
            ' '..='~' => key.push(c),
            _ => return Err(KeyError::Malformed("it holds characters that are not printable ASCII")),
        }
    }
    if key.is_empty() {
        return Err(KeyError::Malformed("it is empty"));
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(KeyError::Malformed("it is longer than 255 characters"));
    }
    Ok(key)
}

/// The client's `Idempotency-Key`, decoded (`"ord\"er"` is `ord"er`; a bare `order-42` is
/// `order-42`), as the handler of a protected request reads it: in the request's extensions,
/// and with the `http` feature (not `http-tower` alone) an axum extractor. This is the client's own key — what the client quotes back and what a
/// receipt may show; to forward a key downstream, use the operation's
/// ([`current_operation`](crate::current_operation), [`ForwardKeyLayer`](super::ForwardKeyLayer)),
/// which is kept apart per principal.
///
/// ```
/// # #[cfg(feature = "http")] {
/// use idem_runtime::http::IdempotencyKey;
///
/// async fn charge(IdempotencyKey(key): IdempotencyKey) -> String {
///     format!("charged under {key}")
/// }
/// # let _: axum::routing::MethodRouter = axum::routing::post(charge);
/// # }
/// ```
///
/// Extracting it in a handler the layer does not protect is refused with a 500 that says so.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(pub String);

impl IdempotencyKey {
    /// The key as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(feature = "http")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdempotencyKey {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(parts: &mut http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().cloned().ok_or((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "IdempotencyKey is read in a handler the IdempotencyLayer does not protect: name its route with \
             IdempotencyLayer::route, or read the header yourself",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Result<String, KeyError> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value.parse().unwrap());
        client_key(&headers, false)
    }

    fn strict(value: &str) -> Result<String, KeyError> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value.parse().unwrap());
        client_key(&headers, true)
    }

    #[test]
    fn a_structured_field_string_is_a_key() {
        assert_eq!(key(r#""8e03978e-40d5""#), Ok("8e03978e-40d5".to_owned()));
        assert_eq!(key(r#""a \"quoted\" \\ key""#), Ok(r#"a "quoted" \ key"#.to_owned()));
        assert_eq!(key(&format!("\"{}\"", "k".repeat(255))).map(|key| key.len()), Ok(255));
    }

    /// A Stripe-style bare token is the same key as its quoted form (issue 42, item 7).
    #[test]
    fn a_bare_token_is_the_key_it_spells() {
        for bare in ["8e03978e-40d5-43e8-bc93-6894a57f9324", "42", "?1", "ord_er:1/2+3=", "~!#$%&'()*,.;<>@[]^`{|}"] {
            assert_eq!(key(bare), Ok(bare.to_owned()));
            assert_eq!(key(&format!("\"{bare}\"")), key(bare));
        }
        assert_eq!(key(&"k".repeat(255)).map(|key| key.len()), Ok(255));
    }

    #[test]
    fn anything_else_is_refused() {
        assert_eq!(client_key(&HeaderMap::new(), false), Err(KeyError::Missing));
        for bad in [r#""""#, r#"""#, r#""a\b""#, r#""a"b""#, r#""abc"#, "a\\b", "a\"b", "a b", "\"\""] {
            assert!(matches!(key(bad), Err(KeyError::Malformed(_))), "{bad:?}: {:?}", key(bad));
        }
        assert!(matches!(key(&format!("\"{}\"", "k".repeat(256))), Err(KeyError::Malformed(_))));
        assert!(matches!(key(&"k".repeat(256)), Err(KeyError::Malformed(_))));
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, "\"a\"".parse().unwrap());
        headers.append(IDEMPOTENCY_KEY, "b".parse().unwrap());
        assert_eq!(client_key(&headers, false), Err(KeyError::Repeated));
    }

    /// Built `strict`, the layer takes the draft's quoted String only.
    #[test]
    fn strict_keys_are_quoted_strings_only() {
        assert_eq!(strict(r#""a \"b\"""#), Ok(r#"a "b""#.to_owned()));
        for bad in ["8e03978e", "42", "?1"] {
            assert!(matches!(strict(bad), Err(KeyError::Malformed(why)) if why.contains("quoted")), "{bad}");
        }
    }
}
