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

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Writes `bytes` as lowercase hex.
pub(crate) fn write_hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
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

    #[test]
    fn random_bytes_differ() {
        assert_ne!(random::<16>(), random::<16>());
    }
}
