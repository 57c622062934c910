//! Text a plugin wrote, as the host shows it.

/// A plugin's text as the host shows it (a log line, an error message): cut to `max` bytes at
/// a character boundary, and on one line, since a newline would let a plugin forge log lines.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < text.len() { format!("... ({} bytes)", text.len()) } else { String::new() };
    // A plugin's text goes to terminals and log files: no control character of it gets there
    // raw (an escape sequence would recolour or rewrite the operator's screen).
    let mut out = String::with_capacity(end + cut.len());
    for c in text[..end].chars() {
        match c {
            '\n' | '\r' => out.push_str("\\n"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out + &cut
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_plugins_text_reaches_the_log_on_one_line_without_control_characters() {
        assert_eq!(one_line("second line\x1b[31mred\nforged\r", 100), "second line\\u{1b}[31mred\\nforged\\n");
        assert_eq!(one_line("tab\there", 100), "tab\\there");
        assert_eq!(one_line("héllo", 2), "h... (6 bytes)", "cut at a character boundary");
    }
}
