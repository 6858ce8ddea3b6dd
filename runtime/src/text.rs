//! Text a plugin or a model server controls, made safe to store and show:
//! control characters escaped, length bounded.

use std::borrow::Cow;
use std::fmt::Write;

/// Longest error text recorded on a job or an attempt, in bytes.
pub const MAX_ERROR_BYTES: usize = 4096;

/// `s` with every control character (NUL, ESC, CR, LF, BEL, DEL and the C1
/// range) written as a `\u{..}` escape, so that it can neither break a
/// database's text type nor drive a terminal.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut escaped = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(escaped, "\\u{{{:x}}}", u32::from(c));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// [`escape_controls`], then cut to at most `max` bytes on a character
/// boundary, ending with `…` when anything was cut.
pub fn bounded(s: &str, max: usize) -> String {
    // Escaping at most multiplies the length by eight: look at no more.
    let head = &s[..floor_char_boundary(s, max)];
    let mut text = escape_controls(head).into_owned();
    if text.len() > max || head.len() < s.len() {
        let cut = floor_char_boundary(&text, max.saturating_sub('…'.len_utf8()));
        text.truncate(cut);
        text.push('…');
    }
    text
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            escape_controls("a\0b\u{1b}[31mc\né"),
            "a\\u{0}b\\u{1b}[31mc\\u{a}é"
        );
        assert!(matches!(escape_controls("plain text"), Cow::Borrowed(_)));
    }

    #[test]
    fn bounded_text_is_cut_on_a_character_boundary_and_marked() {
        let long = "é".repeat(5000);
        let cut = bounded(&long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short", 100), "short");
        let escapes = bounded(&"\0".repeat(100), 50);
        assert!(escapes.len() <= 50 && escapes.ends_with('…'), "{escapes}");
        assert!(!escapes.contains('\0'));
    }
}
