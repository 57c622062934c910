//! An error and its causes on one line, each said once.
//!
//! Many of the drivers' errors put their OS error in their own message (`... was refused
//! (Operation not permitted (os error 1)): run as root ...`) because that is where it reads
//! best, and also keep it as their `source`; anyhow's `{:#}` would then print it twice.

use std::fmt;

/// Displays `e: cause: cause...`, leaving out a cause whose text the line already holds.
pub struct ErrorText<'a>(pub &'a anyhow::Error);

impl fmt::Display for ErrorText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = String::new();
        for cause in self.0.chain() {
            let text = cause.to_string();
            if line.is_empty() {
                line = text;
            } else if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("creating TAP \"t0\": {source}")]
    struct Creating {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let os = || std::io::Error::from_raw_os_error(1);
        let e = anyhow::Error::from(Creating { source: os() });
        assert_eq!(format!("{e:#}"), format!("creating TAP \"t0\": {0}: {0}", os()), "anyhow repeats it");
        assert_eq!(ErrorText(&e).to_string(), format!("creating TAP \"t0\": {}", os()));
    }

    #[test]
    fn causes_not_in_the_message_are_kept_in_order() {
        let e = anyhow::anyhow!("disk on fire").context("reading the config").context("reload refused");
        assert_eq!(ErrorText(&e).to_string(), "reload refused: reading the config: disk on fire");
    }
}
