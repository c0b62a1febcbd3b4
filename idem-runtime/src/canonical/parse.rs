//! The strict parser: JSON *text* to a `serde_json::Value` ([`parse_strict`]), for callers who
//! hold text.
//!
//! idem itself never parses text: rmcp hands a tool the arguments already parsed by serde_json,
//! and `#[idempotent]` serialises Rust values with the strict serializer. A server that takes a
//! JSON body itself (an HTTP endpoint, a queue message) and calls
//! [`Idem::call`](crate::Idem::call) can parse it here first, for two things `serde_json` does
//! not give:
//!
//! * **Duplicate member names are refused.** serde_json keeps the last of them. That is
//!   consistent (the key and the handler see the same value), but a body with `"amount"` twice
//!   is a client bug worth refusing: RFC 8259 leaves which one counts to each parser, so a
//!   proxy or a log reader may have seen the other.
//! * **Numbers are correctly rounded, whatever serde_json's features.** serde_json's default
//!   float parsing is best-effort and can be a few units in the last place off, so two
//!   spellings of one number could get different keys and canonical output would not always
//!   parse back to itself. (idem-runtime turns on serde_json's `float_roundtrip`, which makes
//!   serde_json exact in any build that includes idem; this parser does not rely on it.)
//!   Integer literals keep their exact digits where a `Value` can hold them, and beyond that
//!   must name one double exactly.
//!
//! Besides these, nesting is bounded by [`MAX_DEPTH`](super::MAX_DEPTH) (recursion checks the
//! bound before each descent, so hostile text cannot overflow the stack), and whatever it
//! returns, the encoder accepts: parsing canonical output gives back the same value.

use serde_json::{Map, Number, Value};

use super::encode::{float_value, write_finite};
use super::enter;
use super::error::{CanonicalError, Path};

/// Parse raw JSON text (RFC 8259) strictly into a `Value`.
///
/// Unlike `serde_json::from_str`: a member name twice in one object is
/// [`CanonicalError::DuplicateKey`] (serde_json silently keeps the last),
/// nesting beyond [`MAX_DEPTH`](super::MAX_DEPTH) is [`CanonicalError::TooDeep`], and numbers
/// with a fraction or exponent become the correctly rounded double (so every
/// spelling of a number gives the same key; serde_json's default parser can
/// be one unit in the last place off). Integer literals in the 64-bit range
/// are kept exactly, as `u64`/`i64`; beyond it they must name a double
/// exactly or be its canonical text, otherwise they are
/// [`CanonicalError::InexactInteger`] rather than being rounded onto some
/// other integer's key (see [Numbers](crate::canonical#numbers)). A number beyond the
/// double range (`1e400`), lone
/// surrogate escapes, unescaped control characters, a byte-order mark and
/// anything after the value are [`CanonicalError::Invalid`].
///
/// Whatever this returns, [`write_canonical`](super::write_canonical) accepts, and parsing
/// canonical output gives back the same value.
///
/// For servers that hold the arguments as JSON text (an HTTP body, a queue message) and want
/// these refusals before [`Idem::call`](crate::Idem::call). An rmcp tool's arguments arrive
/// already parsed by serde_json, which keeps the last of a repeated member name; the key and the
/// handler then see the same value.
pub fn parse_strict(json: &str) -> Result<Value, CanonicalError> {
    let mut parser = Parser { text: json, pos: 0 };
    parser.skip_whitespace();
    let value = parser.value(&Path::Root, 0)?;
    parser.skip_whitespace();
    if parser.pos < json.len() {
        return Err(parser.invalid("unexpected characters after the JSON value"));
    }
    Ok(value)
}

/// A recursive-descent parser over the text; recursion is bounded by
/// [`MAX_DEPTH`](super::MAX_DEPTH), checked before each descent.
struct Parser<'t> {
    text: &'t str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn skip_digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// A malformed-JSON error at the current position.
    fn invalid(&self, what: &str) -> CanonicalError {
        let before = self.text.as_bytes().get(..self.pos).unwrap_or_default();
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |newline| newline + 1);
        // Count characters, not bytes: skip UTF-8 continuation bytes.
        let column = 1 + before[line_start..].iter().filter(|&&b| b & 0xc0 != 0x80).count();
        CanonicalError::Invalid { message: format!("malformed JSON at line {line} column {column}: {what}") }
    }

    /// One value; leading whitespace has been skipped.
    fn value(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        match self.peek() {
            Some(b'{') => self.object(path, depth),
            Some(b'[') => self.array(path, depth),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(path),
            Some(_) => Err(self.invalid("expected a JSON value")),
            None => Err(self.invalid("unexpected end of input; expected a JSON value")),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, CanonicalError> {
        if self.text.as_bytes()[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.invalid("expected a JSON value"))
        }
    }

    fn array(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        let depth = enter(path, depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            let item = self.value(&Path::Index(path, items.len()), depth)?;
            items.push(item);
            self.skip_whitespace();
            if self.eat(b']') {
                return Ok(Value::Array(items));
            }
            if !self.eat(b',') {
                return Err(self.invalid("expected `,` or `]` after an array element"));
            }
        }
    }

    fn object(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        let depth = enter(path, depth)?;
        self.pos += 1; // '{'
        let mut members = Map::new();
        self.skip_whitespace();
        if self.eat(b'}') {
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_whitespace();
            let key = self.member_name(path, &members)?;
            self.skip_whitespace();
            if !self.eat(b':') {
                return Err(self.invalid("expected `:` after a member name"));
            }
            self.skip_whitespace();
            let member = self.value(&Path::Key(path, &key), depth)?;
            members.insert(key, member);
            self.skip_whitespace();
            if self.eat(b'}') {
                return Ok(Value::Object(members));
            }
            if !self.eat(b',') {
                return Err(self.invalid("expected `,` or `}` after an object member"));
            }
        }
    }

    /// A member name, refused if the object already has it.
    fn member_name(&mut self, path: &Path<'_>, members: &Map<String, Value>) -> Result<String, CanonicalError> {
        if self.peek() != Some(b'"') {
            return Err(self.invalid("expected a member name in double quotes"));
        }
        let key = self.string()?;
        if members.contains_key(&key) {
            return Err(CanonicalError::DuplicateKey { path: path.render(), key });
        }
        Ok(key)
    }

    /// A string literal, unescaped; `pos` is at the opening quote.
    fn string(&mut self) -> Result<String, CanonicalError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(byte) = self.peek() {
                if byte == b'"' || byte == b'\\' || byte < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Both ends sit next to ASCII bytes (or the end), so on char boundaries.
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                Some(_) => {
                    return Err(self.invalid("control character in a string; escape it"));
                }
                None => return Err(self.invalid("unterminated string")),
            }
        }
    }

    /// The character an escape stands for; `pos` is just past the backslash.
    fn escape(&mut self) -> Result<char, CanonicalError> {
        let Some(byte) = self.peek() else {
            return Err(self.invalid("unterminated string"));
        };
        self.pos += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => {
                self.pos -= 1;
                return Err(self.invalid("unknown escape in a string"));
            }
        })
    }

    /// `\uXXXX`, joining a surrogate pair; lone surrogates are refused
    /// because a Rust string (and RFC 8785) cannot hold them.
    fn unicode_escape(&mut self) -> Result<char, CanonicalError> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return Err(self.invalid("lone surrogate in a \\u escape"));
                }
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(self.invalid("lone surrogate in a \\u escape"));
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(self.invalid("lone surrogate in a \\u escape")),
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.invalid("invalid \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32, CanonicalError> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or_else(|| self.invalid("expected four hex digits after \\u"))?;
            code = code * 16 + digit;
            self.pos += 1;
        }
        Ok(code)
    }

    /// A number per the RFC 8259 grammar.
    fn number(&mut self, path: &Path<'_>) -> Result<Value, CanonicalError> {
        let start = self.pos;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.skip_digits();
            }
            _ => return Err(self.invalid("expected a digit")),
        }
        let mut integral = true;
        if self.eat(b'.') {
            integral = false;
            if self.skip_digits() == 0 {
                return Err(self.invalid("expected a digit after the decimal point"));
            }
        }
        if self.eat(b'e') || self.eat(b'E') {
            integral = false;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if self.skip_digits() == 0 {
                return Err(self.invalid("expected a digit in the exponent"));
            }
        }
        let literal = &self.text[start..self.pos];
        if integral { self.integer(literal, path) } else { self.double(literal, path).map(Value::Number) }
    }

    /// An integer literal (no fraction or exponent). In the 64-bit range it is
    /// kept exactly, as a `u64` or `i64`. Beyond it, it must name exactly one
    /// double: either by being exactly equal to it, or by being that double's
    /// canonical text, which is how RFC 8785 itself prints large doubles
    /// (`295147905179352830000`): refusing those would make canonical output
    /// unparseable. Any other literal, such as `18446744073709551617`, would
    /// silently share a key with a different integer and is
    /// [`CanonicalError::InexactInteger`]. `-0` is the double -0, as in
    /// serde_json.
    fn integer(&self, literal: &str, path: &Path<'_>) -> Result<Value, CanonicalError> {
        if literal == "-0" {
            return float_value(-0.0, path);
        }
        if let Ok(n) = literal.parse::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        if let Ok(n) = literal.parse::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        let number = self.double(literal, path)?;
        let names_one_double = number.as_f64().is_some_and(|f| {
            let exact = format!("{:.0}", f.abs()) == literal.trim_start_matches('-');
            let mut canonical = String::new();
            write_finite(f, &mut canonical);
            exact || canonical == literal
        });
        if names_one_double {
            Ok(Value::Number(number))
        } else {
            Err(CanonicalError::InexactInteger { path: path.render(), value: literal.to_owned() })
        }
    }

    /// The correctly rounded double for a literal (std's parser is exact,
    /// unlike serde_json's default), refusing overflow to infinity.
    fn double(&self, literal: &str, path: &Path<'_>) -> Result<Number, CanonicalError> {
        literal.parse::<f64>().ok().and_then(Number::from_f64).ok_or_else(|| self.out_of_range(literal, path))
    }

    fn out_of_range(&self, literal: &str, path: &Path<'_>) -> CanonicalError {
        let place = match path.render() {
            at if at.is_empty() => String::new(),
            at => format!(" in argument `{at}`"),
        };
        CanonicalError::Invalid {
            message: format!(
                "number {literal}{place} is beyond the range of an IEEE-754 double; \
                 send a smaller number or a string"
            ),
        }
    }
}
