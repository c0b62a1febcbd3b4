//! The `Idempotency-Key` header as the IETF draft defines it: one Structured Field String
//! (RFC 9651: `"` printable ASCII `"`, with `\"` and `\\` as the only escapes), not empty, at
//! most [`MAX_KEY_CHARS`] characters. Anything else is refused (400) before anything is claimed.

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

/// The client's key from `headers`.
pub(super) fn client_key(headers: &HeaderMap) -> Result<String, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let text = value.to_str().map_err(|_| KeyError::Malformed("it holds bytes that are not visible ASCII"))?;
    parse_sf_string(text.trim_matches(' '))
}

/// An RFC 9651 String: `"…"` with `\"` and `\\` escapes and printable ASCII inside.
fn parse_sf_string(text: &str) -> Result<String, KeyError> {
    let inner = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|_| text.len() >= 2)
        .ok_or(KeyError::Malformed("it must be a quoted string, like \"8e03978e-40d5-43e8-bc93-6894a57f9324\""))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Result<String, KeyError> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value.parse().unwrap());
        client_key(&headers)
    }

    #[test]
    fn a_structured_field_string_is_a_key() {
        assert_eq!(key(r#""8e03978e-40d5""#), Ok("8e03978e-40d5".to_owned()));
        assert_eq!(key(r#""a \"quoted\" \\ key""#), Ok(r#"a "quoted" \ key"#.to_owned()));
        assert_eq!(key(&format!("\"{}\"", "k".repeat(255))).map(|key| key.len()), Ok(255));
    }

    #[test]
    fn anything_else_is_refused() {
        assert_eq!(client_key(&HeaderMap::new()), Err(KeyError::Missing));
        for bad in ["8e03978e", "42", "?1", r#""""#, r#"""#, r#""a\b""#, r#""a"b""#] {
            assert!(matches!(key(bad), Err(KeyError::Malformed(_))), "{bad:?}: {:?}", key(bad));
        }
        assert!(matches!(key(&format!("\"{}\"", "k".repeat(256))), Err(KeyError::Malformed(_))));
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, "\"a\"".parse().unwrap());
        headers.append(IDEMPOTENCY_KEY, "\"b\"".parse().unwrap());
        assert_eq!(client_key(&headers), Err(KeyError::Repeated));
    }
}
