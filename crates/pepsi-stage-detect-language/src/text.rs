//! The text a message's language is judged by, apart from the detector: its text parts
//! (text/plain; an HTML part converted to text when the message has no plain one), decoded,
//! without quoted lines (`>`, another author's words) and without the signature (after a
//! `-- ` line), whitespace collapsed, and cut to a bounded number of characters. Pure.

/// The most of a message parsed: its text comes first, and a large attachment after it
/// must not cost its decoding.
pub const MAX_PARSED: usize = 256 * 1024;

/// The text of `message` (headers, empty line, body; at most [`MAX_PARSED`] bytes of it are
/// read), at most `max_chars` characters. With `strip`, quoted lines and the signature are
/// left out.
pub fn text_of(message: &[u8], max_chars: usize, strip: bool) -> String {
    let message = &message[..message.len().min(MAX_PARSED)];
    let Some(parsed) = mail_parser::MessageParser::default().parse(message) else {
        return String::new();
    };
    let mut out = String::new();
    let mut chars = 0usize;
    // text_body lists the text parts; an HTML part stands there when a message has no plain
    // one, and body_text converts it to text.
    for i in 0..parsed.text_body.len() {
        let Some(part) = parsed.body_text(i) else {
            continue;
        };
        for line in part.lines() {
            let line = line.trim_end();
            // The signature delimiter `-- ` (its trailing space trimmed above).
            if strip && line == "--" {
                break;
            }
            if strip && line.trim_start().starts_with('>') {
                continue;
            }
            for word in line.split_whitespace() {
                let n = word.chars().count();
                if chars + n + 1 > max_chars {
                    let room = max_chars.saturating_sub(chars + usize::from(chars > 0));
                    if room > 0 {
                        if chars > 0 {
                            out.push(' ');
                        }
                        out.extend(word.chars().take(room));
                    }
                    return out;
                }
                if chars > 0 {
                    out.push(' ');
                    chars += 1;
                }
                out.push_str(word);
                chars += n;
            }
        }
    }
    out
}

/// The text judged: `text_of` with quotes and signature left out, unless that leaves fewer
/// than `min_letters` letters (a message all quotes, or starting with `-- `), when the whole
/// text is judged instead, so a sender cannot hide a message's language behind a `>`.
pub fn judged_text(message: &[u8], max_chars: usize, min_letters: usize) -> String {
    let stripped = text_of(message, max_chars, true);
    if letters(&stripped) >= min_letters {
        stripped
    } else {
        text_of(message, max_chars, false)
    }
}

/// How many letters `text` holds: a text with too few says nothing about its language.
pub fn letters(text: &str) -> usize {
    text.chars().filter(|c| c.is_alphabetic()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(ctype: &str, body: &str) -> Vec<u8> {
        format!("From: a@b.test\r\nSubject: s\r\nContent-Type: {ctype}\r\n\r\n{body}").into_bytes()
    }

    #[test]
    fn texts_table() {
        for (message, max, want) in [
            (
                mail("text/plain", "Hallo  Welt,\r\nwie geht es?\r\n"),
                100,
                "Hallo Welt, wie geht es?",
            ),
            (
                mail(
                    "text/plain",
                    "Meine Antwort.\r\n> quoted words\r\n>> older\r\nEnde\r\n-- \r\nSig Nature\r\n",
                ),
                100,
                "Meine Antwort. Ende",
            ),
            (mail("text/plain", "eins zwei drei vier"), 9, "eins zwei"),
            (mail("text/plain", "abcdefghijkl"), 5, "abcde"),
            (
                mail(
                    "text/html",
                    "<html><body><p>Bonjour <b>tout</b> le monde</p></body></html>",
                ),
                100,
                "Bonjour tout le monde",
            ),
            (
                mail(
                    "text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable",
                    "Gr=C3=BC=C3=9Fe",
                ),
                100,
                "Grüße",
            ),
            (mail("text/plain", ""), 100, ""),
        ] {
            assert_eq!(
                text_of(&message, max, true),
                want,
                "{}",
                String::from_utf8_lossy(&message)
            );
        }
        assert!(
            text_of(b"\xff\xfe not a message", 100, true)
                .chars()
                .count()
                <= 100
        );
        // Quotes and signature are judged when nothing else is left.
        let hidden = mail(
            "text/plain",
            "-- \r\nDas ist der eigentliche Text dieser Nachricht\r\n",
        );
        assert_eq!(
            judged_text(&hidden, 100, 20),
            "-- Das ist der eigentliche Text dieser Nachricht"
        );
        let quoted = mail(
            "text/plain",
            "> nur zitierte Worte in dieser Nachricht hier\r\n",
        );
        assert_eq!(
            judged_text(&quoted, 100, 20),
            "> nur zitierte Worte in dieser Nachricht hier"
        );
        let normal = mail(
            "text/plain",
            "Eigene Worte in der Antwort hier\r\n> zitiert\r\n",
        );
        assert_eq!(
            judged_text(&normal, 100, 20),
            "Eigene Worte in der Antwort hier"
        );
        // Only the first MAX_PARSED bytes are read.
        let big = mail("text/plain", &format!("{}\r\n", "wort ".repeat(MAX_PARSED)));
        assert!(text_of(&big, 1_000_000, true).len() < MAX_PARSED);
    }

    #[test]
    fn letters_count() {
        assert_eq!(letters("ab 12 ç!"), 3);
    }
}
