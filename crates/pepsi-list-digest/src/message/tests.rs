use mail_parser::{Message, MessageParser, MimeHeaders, PartType};

use super::*;

const LUNCH: &[u8] = b"Received: from x by y\r\nFrom: Bob <bob@example.net>\r\n\
    To: team@example.org\r\nDate: Sun, 6 Dec 2026 01:00:00 +0000\r\n\
    Subject: [team] lunch\r\nMessage-ID: <lunch@example.net>\r\n\
    List-Id: \"The Team\" <team.example.org>\r\nX-Loop: team@example.org\r\n";
const LUNCH_BODY: &[u8] = b"Noon at the usual place?\r\n\
    ------------------------------\r\nnot a separator\r\n-- \r\nThe Team mailing list\r\n";

/// A multipart post: a text part (quoted-printable, 8-bit text) and a PNG.
const PHOTO: &[u8] = b"From: =?utf-8?q?Zo=C3=AB?= <zoe@example.com>\r\n\
    Subject: =?utf-8?q?caf=C3=A9?= photo\r\nCc: Ann <ann@example.com>, eve@example.com\r\n\
    Keywords: food, photos\r\n\
    MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n";
const PHOTO_BODY: &[u8] = b"--b1\r\nContent-Type: text/plain; charset=utf-8\r\n\
    Content-Transfer-Encoding: quoted-printable\r\n\r\nthe caf=C3=A9 at noon\r\n\
    --b1\r\nContent-Type: image/png; name=\"cafe.png\"\r\n\
    Content-Disposition: attachment; filename=\"cafe.png\"\r\n\
    Content-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n--b1--\r\n";

/// A post in 8-bit UTF-8, without a subject.
const RAW8: &[u8] = b"From: ann@example.com\r\nContent-Type: text/plain; charset=utf-8\r\n\
    Content-Transfer-Encoding: 8bit\r\n";
const RAW8_BODY: &[u8] = "grüße\r\n".as_bytes();

fn issue() -> Issue<'static> {
    Issue {
        list: "team@example.org",
        display_name: "The Team",
        volume: 3,
        number: 12,
        date: 1_796_000_000,
        message_id: "digest.7.1@mx.example.org",
    }
}

fn posts() -> Vec<Post<'static>> {
    vec![
        Post {
            headers: LUNCH,
            body: LUNCH_BODY,
        },
        Post {
            headers: PHOTO,
            body: PHOTO_BODY,
        },
        Post {
            headers: RAW8,
            body: RAW8_BODY,
        },
    ]
}

fn header<'a>(m: &'a Message<'a>, name: &'a str) -> &'a str {
    m.header_raw(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .trim()
}

#[test]
fn subjects_and_names_table() {
    let cases: &[(&str, &str, i32, i32, &str)] = &[
        (
            "team@example.org",
            "The Team",
            1,
            1,
            "The Team Digest, Vol 1, Issue 1",
        ),
        (
            "team@example.org",
            "",
            2,
            30,
            "team@example.org Digest, Vol 2, Issue 30",
        ),
        (
            "team@example.org",
            "  Two\r\n lines ",
            1,
            2,
            "Two lines Digest, Vol 1, Issue 2",
        ),
    ];
    for (list, name, volume, number, want) in cases {
        let i = Issue {
            list,
            display_name: name,
            volume: *volume,
            number: *number,
            ..issue()
        };
        assert_eq!(subject(&i), *want);
    }
}

#[test]
fn rfc822_encodings_table() {
    let long = format!("Subject: x\r\n\r\n{}\r\n", "a".repeat(1000));
    let cases: &[(&[u8], &str)] = &[
        (b"Subject: x\r\n\r\nhello\r\n", "7bit"),
        ("Subject: x\r\n\r\nh\u{e9}llo\r\n".as_bytes(), "8bit"),
        (b"Subject: x\r\n\r\nnul \0 here\r\n", "binary"),
        (long.as_bytes(), "binary"),
        (b"", "7bit"),
    ];
    for (raw, want) in cases {
        assert_eq!(
            rfc822_encoding(raw),
            *want,
            "{:?}",
            String::from_utf8_lossy(raw)
        );
    }
}

#[test]
fn separators_in_text_table() {
    let cases: &[(&str, &str)] = &[
        ("plain\ntext", "plain\r\ntext"),
        (
            "------------------------------",
            " ------------------------------",
        ),
        (
            "a\r\n----------------------------------------x\r\nb",
            "a\r\n ----------------------------------------x\r\nb",
        ),
        (
            "-----------------------------",
            "-----------------------------",
        ),
        ("-- ", "-- "),
    ];
    for (text, want) in cases {
        assert_eq!(escape_separators(text), *want, "{text:?}");
    }
}

#[test]
fn splitting_a_written_message_table() {
    let cases: &[(&[u8], &[u8], &[u8])] = &[
        (
            b"A: 1\r\nB: 2\r\n\r\nbody\r\n",
            b"A: 1\r\nB: 2\r\n",
            b"body\r\n",
        ),
        (b"A: 1\r\n\r\n", b"A: 1\r\n", b""),
        (b"A: 1\r\n", b"A: 1\r\n", b""),
        (b"A: 1\r\n\r\nx\r\n\r\ny", b"A: 1\r\n", b"x\r\n\r\ny"),
    ];
    for (raw, headers, body) in cases {
        assert_eq!(split(raw), (*headers, *body));
    }
}

#[test]
fn a_post_without_a_final_crlf_in_its_header_block_stays_whole() {
    let p = Post {
        headers: b"Subject: x",
        body: b"y",
    };
    assert_eq!(p.raw(), b"Subject: x\r\n\r\ny");
}

/// The digest's own fields, as either digest carries them.
fn check_envelope(m: &Message<'_>) {
    assert_eq!(m.subject(), Some("The Team Digest, Vol 3, Issue 12"));
    assert_eq!(
        m.from().and_then(|a| a.first()).and_then(|a| a.address()),
        Some("team-request@example.org")
    );
    assert_eq!(
        m.to().and_then(|a| a.first()).and_then(|a| a.address()),
        Some("team@example.org")
    );
    assert_eq!(
        m.reply_to()
            .and_then(|a| a.first())
            .and_then(|a| a.address()),
        Some("team@example.org")
    );
    assert_eq!(m.message_id(), Some("digest.7.1@mx.example.org"));
    assert_eq!(header(m, "List-Id"), "\"The Team\" <team.example.org>");
    assert_eq!(header(m, "List-Post"), "<mailto:team@example.org>");
    assert_eq!(
        header(m, "List-Help"),
        "<mailto:team-request@example.org?subject=help>"
    );
    assert_eq!(
        header(m, "List-Subscribe"),
        "<mailto:team-join@example.org>"
    );
    // Each member's row carries its own (pepsi.list_fanout's p_member_fields).
    assert!(m.header_raw("List-Unsubscribe").is_none());
    assert_eq!(header(m, "List-Owner"), "<mailto:team-owner@example.org>");
    assert_eq!(header(m, "Precedence"), "list");
    assert_eq!(header(m, "X-Loop"), "team@example.org");
}

#[test]
fn the_mime_digest_holds_the_list_copies_byte_for_byte() {
    let raw = mime(&issue(), &posts());
    let m = MessageParser::default()
        .parse(&raw)
        .expect("the digest parses");
    check_envelope(&m);
    let root = m.root_part();
    assert!(root.is_content_type("multipart", "mixed"), "{root:?}");
    let PartType::Multipart(children) = &root.body else {
        panic!("not multipart")
    };
    assert_eq!(children.len(), 2);
    let contents = m.part(children[0]).unwrap();
    assert!(contents.is_content_type("text", "plain"));
    let text = contents.text_contents().unwrap();
    for want in [
        "To post to The Team, write to\r\n\tteam@example.org",
        "\tteam-leave@example.org",
        "Today's Topics:\r\n\r\n",
        "    1. [team] lunch (Bob)\r\n",
        "    2. caf\u{e9} photo (Zo\u{eb})\r\n",
        "    3. (no subject) (ann@example.com)\r\n",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let digest = m.part(children[1]).unwrap();
    assert!(digest.is_content_type("multipart", "digest"));
    let PartType::Multipart(inner) = &digest.body else {
        panic!("the digest part is not multipart")
    };
    assert_eq!(inner.len(), 3);
    let originals = posts();
    for (i, id) in inner.iter().enumerate() {
        let part = m.part(*id).unwrap();
        assert!(part.is_content_type("message", "rfc822"), "part {i}");
        let PartType::Message(post) = &part.body else {
            panic!("part {i} is not a message: {part:?}")
        };
        assert_eq!(
            post.raw_message(),
            originals[i].raw().as_slice(),
            "part {i}"
        );
        assert_eq!(
            part.content_transfer_encoding(),
            Some(rfc822_encoding(&originals[i].raw())),
            "part {i}"
        );
    }
    let PartType::Message(lunch) = &m.part(inner[0]).unwrap().body else {
        unreachable!()
    };
    assert_eq!(lunch.subject(), Some("[team] lunch"));
    assert!(
        lunch
            .body_text(0)
            .unwrap()
            .starts_with("Noon at the usual place?")
    );
    let PartType::Message(photo) = &m.part(inner[1]).unwrap().body else {
        unreachable!()
    };
    assert_eq!(
        photo.attachment(0).and_then(|a| a.attachment_name()),
        Some("cafe.png")
    );
    assert_eq!(rfc822_encoding(&originals[2].raw()), "8bit");
}

#[test]
fn the_plain_digest_follows_rfc_1153() {
    let raw = plain(&issue(), &posts());
    let m = MessageParser::default()
        .parse(&raw)
        .expect("the digest parses");
    check_envelope(&m);
    assert!(m.root_part().is_content_type("text", "plain"));
    assert_eq!(m.attachment_count(), 0);
    let text = m.body_text(0).unwrap().replace("\r\n", "\n");
    let expected_order = [
        "Today's Topics:\n\n    1. [team] lunch (Bob)\n    2. caf\u{e9} photo (Zo\u{eb})\n    3. (no subject) (ann@example.com)\n\n",
        &format!("{CONTENTS_SEPARATOR}\n\nMessage: 1\n"),
        "Date: Sun, 6 Dec 2026 01:00:00 +0000\nFrom: Bob <bob@example.net>\n\
         To: team@example.org\nSubject: [team] lunch\nMessage-ID: <lunch@example.net>\n\n\
         Noon at the usual place?\n ------------------------------\nnot a separator\n",
        &format!("\n{MESSAGE_SEPARATOR}\n\nMessage: 2\n"),
        "From: Zo\u{eb} <zoe@example.com>\nCc: Ann <ann@example.com>, eve@example.com\n\
         Subject: caf\u{e9} photo\nKeywords: food, photos\n\nthe caf\u{e9} at noon\n\n\
         [A part of type image/png \"cafe.png\" (8 bytes) is not in the plain digest.]\n",
        &format!("\n{MESSAGE_SEPARATOR}\n\nMessage: 3\nFrom: ann@example.com\n\ngr\u{fc}\u{df}e\n"),
        &format!(
            "\n{MESSAGE_SEPARATOR}\n\nEnd of The Team Digest, Vol 3, Issue 12\n{}\n",
            "*".repeat("End of The Team Digest, Vol 3, Issue 12".len())
        ),
    ];
    let mut at = 0;
    for want in expected_order {
        let found = text[at..]
            .find(want)
            .unwrap_or_else(|| panic!("{want:?} after byte {at} of:\n{text}"));
        at += found + want.len();
    }
    assert!(text.ends_with('\n') && at == text.len(), "{text}");
    // Fields RFC 1153 does not keep are left out.
    assert!(
        !text.contains("Received:") && !text.contains("List-Id:"),
        "{text}"
    );
    // The separators appear where RFC 1153 puts them and nowhere else.
    let separators = text.lines().filter(|l| *l == MESSAGE_SEPARATOR).count();
    assert_eq!(separators, 3, "{text}");
}

#[test]
fn an_empty_digest_is_still_a_message() {
    for raw in [mime(&issue(), &[]), plain(&issue(), &[])] {
        let m = MessageParser::default().parse(&raw).expect("parses");
        check_envelope(&m);
    }
}

#[test]
fn a_long_subject_is_cut_in_the_contents() {
    let headers = format!("From: a@example.com\r\nSubject: {}\r\n", "x".repeat(500));
    let e = entry(
        &Post {
            headers: headers.as_bytes(),
            body: b"",
        }
        .raw(),
    );
    assert_eq!(e.subject.chars().count(), MAX_CONTENTS_TEXT);
    assert!(e.subject.ends_with("..."));
    assert_eq!(e.from, "a@example.com");
}

#[test]
fn unsubscribe_fields_table() {
    let cases: &[(Option<&str>, &str)] = &[
        (
            None,
            "List-Unsubscribe: <mailto:team-leave@example.org>\r\n",
        ),
        (
            Some("https://lists.example.org"),
            "List-Unsubscribe: <https://lists.example.org/lists/unsubscribe/{token}>, \
             <mailto:team-leave@example.org>\r\n\
             List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n",
        ),
    ];
    for (web, want) in cases {
        assert_eq!(unsubscribe_fields("team@example.org", *web), *want);
    }
}
