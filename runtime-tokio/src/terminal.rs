//! Text from the network, made safe to print on an operator's terminal.
//!
//! A lock key is up to 128 bytes chosen by any client: it may hold ESC,
//! BEL or a C1 control, which a terminal would obey (move the cursor,
//! rewrite the screen, set the window title, ring). The CLI passes every
//! key, and every other text a server sent, through [`terminal_safe`]
//! before it prints it in a table or a message, and its `--json` output
//! through [`terminal_safe_json`].

use std::fmt::Write as _;

/// `bytes` as text that cannot drive a terminal, and that names them
/// exactly:
///
/// - printable characters (non-ASCII ones too) as they are;
/// - `\` as `\\`, so that an escape below is never a key's own text;
/// - C0 controls, DEL, and each byte that is not part of valid UTF-8 as
///   `\xNN` (two lowercase hex digits: the byte);
/// - C1 controls (U+0080–U+009F), the bidirectional formatting characters
///   that reorder what follows them on the line (U+200E, U+200F,
///   U+202A–U+202E, U+2066–U+2069) and the line and paragraph separators
///   (U+2028, U+2029) as `\u{NNNN}` (the code point).
///
/// Distinct inputs give distinct outputs.
pub fn terminal_safe(bytes: &[u8]) -> String {
    let mut safe = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => safe.push_str("\\\\"),
                // C0 and DEL: one byte each, so the byte escape is exact.
                c if c.is_ascii_control() => {
                    let _ = write!(safe, "\\x{:02x}", u32::from(c));
                }
                c if is_hidden_control(c) => {
                    let _ = write!(safe, "\\u{{{:04x}}}", u32::from(c));
                }
                c => safe.push(c),
            }
        }
        for &byte in chunk.invalid() {
            let _ = write!(safe, "\\x{byte:02x}");
        }
    }
    safe
}

/// JSON `text` (as `serde_json` writes it) with the characters a terminal
/// could obey that `serde_json` leaves raw, DEL and those
/// [`terminal_safe`] writes as `\u{…}`, written as JSON `\uNNNN` escapes.
/// `serde_json` already escapes C0 controls, `"` and `\`. Outside strings
/// JSON text is ASCII punctuation, digits and letters, so every character
/// replaced is inside a string, and the JSON still decodes to exactly the
/// same value.
pub fn terminal_safe_json(text: &str) -> String {
    let mut safe = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{7f}' || is_hidden_control(c) {
            // Every such character is in the Basic Multilingual Plane, so
            // one four-digit escape is the whole character.
            let _ = write!(safe, "\\u{:04x}", u32::from(c));
        } else {
            safe.push(c);
        }
    }
    safe
}

/// C1 controls, and the format characters that change how the rest of the
/// line is laid out.
fn is_hidden_control(c: char) -> bool {
    matches!(
        c,
        '\u{80}'..='\u{9f}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_printable_text_is_kept() {
        assert_eq!(terminal_safe(b"jobs/7"), "jobs/7");
        assert_eq!(terminal_safe("caf\u{e9}/\u{65e5}".as_bytes()), "café/日");
        assert_eq!(terminal_safe(b"a\x1b]0;owned\x07b"), "a\\x1b]0;owned\\x07b");
        assert_eq!(terminal_safe(b"\x00\x09\x1f\x7f"), "\\x00\\x09\\x1f\\x7f");
        // C1 CSI and NEL as characters, a bidi override, a line separator.
        assert_eq!(
            terminal_safe("\u{9b}2J\u{85}\u{202e}x\u{2028}".as_bytes()),
            "\\u{009b}2J\\u{0085}\\u{202e}x\\u{2028}"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_escaped_one_by_one() {
        // A lone C1 byte, a truncated sequence, an overlong encoding.
        assert_eq!(terminal_safe(b"k\x9b1m"), "k\\x9b1m");
        assert_eq!(terminal_safe(b"\xe6\x97"), "\\xe6\\x97");
        assert_eq!(terminal_safe(b"\xc0\xaf."), "\\xc0\\xaf.");
    }

    #[test]
    fn the_backslash_is_escaped_so_no_two_keys_print_alike() {
        assert_eq!(terminal_safe(b"a\\b"), "a\\\\b");
        // The text of an escape and the byte it names stay apart.
        assert_ne!(terminal_safe(b"\\x1b"), terminal_safe(b"\x1b"));
        let mut seen = std::collections::HashMap::new();
        let samples: [&[u8]; 10] = [
            b"\x1b",
            b"\\x1b",
            b"\\\x1b",
            b"\\\\x1b",
            b"\xc2\x9b",
            b"\x9b",
            b"\\u{009b}",
            b"\\",
            b"\\\\",
            b"",
        ];
        for sample in samples {
            let shown = terminal_safe(sample);
            assert!(shown.chars().all(|c| !c.is_control()), "{shown:?}");
            if let Some(other) = seen.insert(shown.clone(), sample) {
                panic!("{other:?} and {sample:?} both print as {shown:?}");
            }
        }
    }

    #[test]
    fn json_keeps_the_exact_key_with_no_raw_control() {
        let key = "a\u{1b}[31m\u{7}\u{7f}\u{9b}\u{202e}\\\"z";
        let text = terminal_safe_json(&serde_json::json!({ "key": key }).to_string());
        assert!(
            text.chars()
                .all(|c| !c.is_control() && !is_hidden_control(c)),
            "{text:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["key"], key);
    }
}
