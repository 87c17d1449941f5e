//! The text a message's language is judged by, apart from the detector: its text parts
//! (text/plain; an HTML part converted to text when the message has no plain one), decoded,
//! without quoted lines (`>`, another author's words) and without the signature (after a
//! `-- ` line), whitespace collapsed, and cut to a bounded number of characters. Pure.

/// The text of `message` (headers, empty line, body), at most `max_chars` characters.
pub fn text_of(message: &[u8], max_chars: usize) -> String {
    let Some(parsed) = mail_parser::MessageParser::default().parse(message) else {
        return String::new();
    };
    let mut out = String::new();
    let mut chars = 0usize;
    let parts = if parsed.text_body.is_empty() {
        parsed.html_body.len()
    } else {
        parsed.text_body.len()
    };
    for i in 0..parts {
        // body_text converts an HTML part to text (and takes the plain parts as they are).
        let Some(part) = parsed.body_text(i) else {
            continue;
        };
        for line in part.lines() {
            let line = line.trim_end();
            // The signature delimiter `-- ` (its trailing space trimmed above).
            if line == "--" {
                break;
            }
            if line.trim_start().starts_with('>') {
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
                text_of(&message, max),
                want,
                "{}",
                String::from_utf8_lossy(&message)
            );
        }
        assert!(text_of(b"\xff\xfe not a message", 100).chars().count() <= 100);
    }

    #[test]
    fn letters_count() {
        assert_eq!(letters("ab 12 ç!"), 3);
    }
}
