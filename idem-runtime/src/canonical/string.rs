//! A JSON string as RFC 8785 writes it, and where the canonical writers write: below both the
//! encoder and the errors (which quote a member name in a path), so neither imports the other.

/// Where the encoder writes: a `Vec<u8>` for hashing, a `String` for error paths and keys.
pub(super) trait Out {
    fn push_str(&mut self, text: &str);
    fn push(&mut self, c: char);
}

impl Out for String {
    fn push_str(&mut self, text: &str) {
        String::push_str(self, text);
    }
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
}

impl Out for Vec<u8> {
    fn push_str(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
    fn push(&mut self, c: char) {
        let mut buffer = [0u8; 4];
        self.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
    }
}

/// RFC 8785 section 3.2.2.2: the short escapes, `\u00xx` (lowercase) for the
/// other controls, and everything else verbatim.
pub(super) fn write_string<O: Out>(s: &str, out: &mut O) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    if !needs_escape(s.as_bytes()) {
        // Nothing to escape: the usual case, in one copy.
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut start = 0;
    for (index, byte) in s.bytes().enumerate() {
        let short = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0c => "\\f",
            0x0d => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `index` is an ASCII byte, hence a char boundary.
        out.push_str(&s[start..index]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            out.push_str(short);
        }
        start = index + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Whether `bytes` hold a control character, `"` or `\\` (what a JSON string escapes), eight
/// bytes at a time: the usual string has none and is copied whole.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Whether any byte of `x` is below `n` (exact for n <= 0x80), or zero.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS != 0;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_ne_bytes(word);
        if below(x, 0x20) || below(x ^ (ONES * 0x22), 1) || below(x ^ (ONES * 0x5c), 1) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\')
}

#[cfg(test)]
mod tests {
    use super::needs_escape;

    /// Eight bytes at a time finds what one at a time finds: every byte value, at every place of
    /// strings around the word size, among bytes that need no escape (ASCII and UTF-8 alike).
    #[test]
    fn needs_escape_finds_every_byte_a_json_string_escapes() {
        let naive = |bytes: &[u8]| bytes.iter().any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\');
        for fill in [b'a', b'!', b'#', b'[', b'~', 0x7f, 0x80, 0xc3, 0xff, 0x21, 0x5b, 0x5d] {
            for len in 0..=24 {
                let plain = vec![fill; len];
                assert_eq!(needs_escape(&plain), naive(&plain), "fill {fill:#x}, length {len}");
                for at in 0..len {
                    for byte in 0..=255u8 {
                        let mut bytes = plain.clone();
                        bytes[at] = byte;
                        assert_eq!(needs_escape(&bytes), naive(&bytes), "{byte:#x} at {at} of {len}, fill {fill:#x}");
                    }
                }
            }
        }
    }
}
