//! The sending side: a message made into the DATA payload (dot-stuffed, CRLF line ends)
//! or a BDAT chunk. Pure, no I/O.

/// The DATA payload for `message`, terminator included.
///
/// Every line that starts with `.` gets a second one (RFC 5321 §4.5.2); CRLF line ends are
/// sent as they are; a bare LF is sent as CRLF, as Postfix does, so that the peer cannot
/// read a line end (and an end of data) where this client saw none — the SMTP smuggling
/// hole. A message that does not end with CRLF gets one, then `.` CRLF ends the data.
pub fn dot_stuff(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + message.len() / 64 + 5);
    let mut line_start = true;
    for (i, &b) in message.iter().enumerate() {
        if line_start && b == b'.' {
            out.push(b'.');
        }
        if b == b'\n' && (i == 0 || message[i - 1] != b'\r') {
            out.push(b'\r');
        }
        out.push(b);
        line_start = b == b'\n';
    }
    if !out.is_empty() && !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// The message with every bare LF made CRLF, as [`dot_stuff`] sends it but without the
/// stuffing and the terminator: the payload of `BDAT`, whose length delimits it.
pub fn crlf_line_ends(message: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let bare = message
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || message[i - 1] != b'\r'));
    if !bare {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut out = Vec::with_capacity(message.len() + message.len() / 32);
    for (i, &b) in message.iter().enumerate() {
        if b == b'\n' && (i == 0 || message[i - 1] != b'\r') {
            out.push(b'\r');
        }
        out.push(b);
    }
    std::borrow::Cow::Owned(out)
}

/// True when the message has a byte outside 7-bit ASCII (it needs BODY=8BITMIME).
pub fn is_8bit(message: &[u8]) -> bool {
    message.iter().any(|&b| b >= 0x80)
}

/// True when the header block of `message` has 8-bit bytes that are valid UTF-8 (RFC 6532
/// header fields).
pub fn has_utf8_headers(message: &[u8]) -> bool {
    let (headers, _) = crate::message::split(message);
    is_8bit(headers) && std::str::from_utf8(headers).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(message: &str, wire: &str) {
        assert_eq!(
            String::from_utf8(dot_stuff(message.as_bytes())).unwrap(),
            wire,
            "dot_stuff({message:?})"
        );
    }

    #[test]
    fn dot_stuffing_table() {
        check("A: 1\r\n\r\nbody\r\n", "A: 1\r\n\r\nbody\r\n.\r\n");
        check(".starts\r\n", "..starts\r\n.\r\n");
        check("a\r\n.\r\nb\r\n", "a\r\n..\r\nb\r\n.\r\n");
        check("a\r\n..two\r\n", "a\r\n...two\r\n.\r\n");
        check("a\r\nend.\r\n", "a\r\nend.\r\n.\r\n");
        // the final CRLF is ensured
        check("no newline", "no newline\r\n.\r\n");
        check("a\r\n.", "a\r\n..\r\n.\r\n");
        // bare LF becomes CRLF, so `\n.\n` cannot end the data early at the peer
        check("a\n.\nb\n", "a\r\n..\r\nb\r\n.\r\n");
        check("a\r\n.\nb", "a\r\n..\r\nb\r\n.\r\n");
        // a bare CR is not a line end
        check("a\r.b\r\n", "a\r.b\r\n.\r\n");
        check("", ".\r\n");
    }

    /// Undoing the stuffing gives back the message (with CRLF ends): what a server stores.
    #[test]
    fn unstuffing_restores_the_message() {
        let msg = b"Subject: dots\r\n\r\n.\r\n..\r\n.x\r\nmiddle . dot\r\n";
        let wire = dot_stuff(msg);
        let text = std::str::from_utf8(&wire).unwrap();
        let body = text.strip_suffix(".\r\n").unwrap();
        let unstuffed: String = body
            .split_inclusive("\r\n")
            .map(|l| l.strip_prefix('.').unwrap_or(l))
            .collect();
        assert_eq!(unstuffed.as_bytes(), msg);
    }

    #[test]
    fn bdat_payload_gets_crlf_line_ends_only() {
        let same = b"a\r\n.b\r\n";
        assert!(matches!(
            crlf_line_ends(same),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(&*crlf_line_ends(b"\na\nb\r\n.\n"), b"\r\na\r\nb\r\n.\r\n");
        assert_eq!(&*crlf_line_ends(b"no end"), b"no end");
    }

    #[test]
    fn xtext_and_8bit() {
        assert_eq!(
            crate::encoding::xtext_encode("a+b=c d@x"),
            "a+2Bb+3Dc+20d@x"
        );
        assert_eq!(crate::encoding::xtext_encode("rfc822;ü"), "rfc822;+C3+BC");
        assert!(is_8bit("ü".as_bytes()));
        assert!(!is_8bit(b"plain\r\n"));
    }
}
