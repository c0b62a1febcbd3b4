//! Random bytes and hex, each in one place: every random value idem makes (tokens, incident
//! refs, `requestState` nonces, scratch file names, jitter) comes from the operating system's
//! generator here, and every byte string it prints or reads as hex goes through here.

use std::fmt;

/// `N` bytes from the operating system's generator.
///
/// # Panics
/// If the operating system has no randomness to give: nothing idem would make without it
/// (a secret, a fencing token, a nonce) could be trusted.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    #[allow(clippy::expect_used)]
    try_random().expect("the OS random number generator failed")
}

/// `N` bytes from the operating system's generator, or `None` if it has none to give (for
/// what can do without, such as jitter).
pub(crate) fn try_random<const N: usize>() -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).ok().map(|()| bytes)
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `byte`.
const fn digits(byte: u8) -> [u8; 2] {
    [DIGITS[(byte >> 4) as usize], DIGITS[(byte & 0x0f) as usize]]
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    for &byte in bytes {
        let [high, low] = digits(byte);
        text.push(char::from(high));
        text.push(char::from(low));
    }
    text
}

/// Writes `bytes` as lowercase hex.
pub(crate) fn write_hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut buffer = [0u8; 64];
    for chunk in bytes.chunks(buffer.len() / 2) {
        for (pair, &byte) in buffer.chunks_exact_mut(2).zip(chunk) {
            pair.copy_from_slice(&digits(byte));
        }
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&buffer[..2 * chunk.len()]).map_err(|_| fmt::Error)?)?;
    }
    Ok(())
}

/// The value of one hex digit, either case.
pub(crate) const fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Exactly `2 × N` hex digits as `N` bytes.
pub(crate) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut bytes = [0u8; N];
    for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
        *byte = (hex_value(pair[0])? << 4) | hex_value(pair[1])?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_goes_both_ways() {
        let bytes: [u8; 4] = [0x00, 0x7f, 0xa5, 0xff];
        assert_eq!(hex(&bytes), "007fa5ff");
        assert_eq!(unhex::<4>("007FA5ff"), Some(bytes));
        assert_eq!(unhex::<4>("007fa5f"), None);
        assert_eq!(unhex::<2>("0g00"), None);
    }

    /// Every byte, and a run longer than the buffer `write_hex` fills, as `{:02x}` writes them.
    #[test]
    fn hex_is_what_format_writes() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255).collect();
        let formatted: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(hex(&bytes), formatted);
        struct Written<'a>(&'a [u8]);
        impl fmt::Display for Written<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_hex(self.0, f)
            }
        }
        assert_eq!(Written(&bytes).to_string(), formatted);
        assert_eq!(Written(&[]).to_string(), "");
    }

    #[test]
    fn random_bytes_differ() {
        assert_ne!(random::<16>(), random::<16>());
    }
}
