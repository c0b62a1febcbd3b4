//! `window = "15m"`: how long a repeat counts as the same operation.

use std::fmt;
use std::time::Duration;

/// The longest window accepted: a year. Longer retention belongs to the downstream system.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// A window string that is not `<positive integer><unit>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid window `{}`: {}; write a positive whole number followed by one unit: \
             `s` seconds, `m` minutes, `h` hours or `d` days (e.g. \"30s\", \"15m\", \"24h\", \"7d\")",
            self.input, self.reason
        )
    }
}

impl std::error::Error for WindowError {}

/// Parses a window such as `"30s"`, `"15m"`, `"24h"` or `"7d"`.
///
/// Zero, negative, fractional, unit-less and over-a-year windows are errors: a zero window would
/// make every repeat a new operation, which is the failure idem exists to prevent.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idem_runtime::recipe::parse_window("15m").unwrap(), Duration::from_secs(900));
/// assert!(idem_runtime::recipe::parse_window("0s").is_err());
/// ```
pub fn parse_window(input: &str) -> Result<Duration, WindowError> {
    let err = |reason| WindowError { input: input.to_owned(), reason };
    let text = input.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(err(if text.starts_with('-') { "it is negative" } else { "it does not start with a number" }));
    }
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "" => return Err(err("it has no unit")),
        _ => return Err(err("the unit is not one of `s`, `m`, `h`, `d`")),
    };
    let count: u64 = digits.parse().map_err(|_| err("the number is too large"))?;
    if count == 0 {
        return Err(err("it is zero"));
    }
    let secs = count.checked_mul(unit_secs).ok_or_else(|| err("the number is too large"))?;
    let window = Duration::from_secs(secs);
    if window > MAX_WINDOW {
        return Err(err("it is longer than 366 days"));
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_each_unit() {
        assert_eq!(parse_window("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_window("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_window("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_window("7d"), Ok(Duration::from_secs(604_800)));
    }

    #[test]
    fn refuses_zero_negative_and_junk_with_the_accepted_form() {
        for bad in ["0s", "0d", "-5m", "5", "m", "", "1.5h", "5 minutes", "15M", "99999999999999999999d", "400d"] {
            let error = parse_window(bad).expect_err(bad).to_string();
            assert!(error.contains("`s` seconds, `m` minutes"), "{bad}: {error}");
        }
        assert!(parse_window("0s").unwrap_err().to_string().contains("it is zero"));
        assert!(parse_window("-5m").unwrap_err().to_string().contains("negative"));
    }
}
