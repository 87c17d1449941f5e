//! Random inputs for every parser that reads what a client, a peer or an operator wrote:
//! the SMTP command line, paths and ESMTP parameters, the DATA decoder, the header
//! functions the ingress applies, SMTP replies as the client reads them, the DSN request in
//! `state`, the configuration file, and migadu_counters' request validators.
//!
//! Each property holds for any input (no panic, and what the parser lets through keeps its
//! invariant); some compare two ways of getting the same answer (a message fed whole or in
//! pieces). proptest, not a coverage-guided fuzzer: it runs on the stable toolchain inside
//! `cargo test`, so CI runs every property on each change (PROPTEST_CASES, 256 by default),
//! and `make fuzz` runs each with many more cases (docs/security.md, "Fuzzing").

use proptest::prelude::*;

use pepsi_smtp::command::{Param, parse};
use pepsi_smtp::data::{DataDecoder, Feed};
use pepsi_smtp::params::{mail_params, rcpt_params, xtext_decode};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn has_control(s: &str) -> bool {
    s.bytes().any(|b| b < 0x20 || b == 0x7f)
}

/// Bytes that look like SMTP more often than uniform noise does.
fn smtp_bytes() -> impl Strategy<Value = Vec<u8>> {
    let words = prop::sample::select(vec![
        &b"MAIL FROM:<"[..],
        b"RCPT TO:<",
        b"EHLO ",
        b"BDAT ",
        b" LAST",
        b"> ",
        b"SIZE=",
        b"ORCPT=rfc822;",
        b"ENVID=",
        b"NOTIFY=",
        b"+0A",
        b"@",
        b"[IPv6:",
        b"\"",
        b"\\",
        b"\r",
        b"\n",
        b"\0",
        b"\t",
        b" ",
    ]);
    prop::collection::vec(
        prop_oneof![
            words.prop_map(|w| w.to_vec()),
            prop::collection::vec(any::<u8>(), 0..8)
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_command_parser_takes_any_line_and_refuses_control_characters(line in smtp_bytes()) {
        let parsed = parse(&line);
        if line.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            prop_assert!(parsed.is_err(), "{:?} parsed", String::from_utf8_lossy(&line));
        }
    }

    #[test]
    fn esmtp_parameters_never_decode_to_a_control_character(
        pairs in prop::collection::vec(("[A-Za-z]{1,8}", prop::option::of("[ -~]{0,40}")), 0..6),
    ) {
        let params: Vec<Param> = pairs
            .into_iter()
            .map(|(key, value)| Param { key: key.to_ascii_uppercase(), value })
            .collect();
        if let Ok(m) = mail_params(&params, true) {
            prop_assert!(!m.envid.as_deref().is_some_and(has_control));
        }
        if let Ok(r) = rcpt_params(&params) {
            prop_assert!(!r.orcpt.as_deref().is_some_and(has_control));
        }
    }

    #[test]
    fn xtext_round_trips_and_never_yields_a_control_character(text in "[ -~]{0,60}") {
        if let Some(decoded) = xtext_decode(&text) {
            prop_assert!(!has_control(&decoded));
        }
        let printable: String = text.chars().filter(|c| *c != ' ').collect();
        let encoded: String = printable
            .bytes()
            .map(|b| if b == b'+' || b == b'=' { format!("+{b:02X}") } else { (b as char).to_string() })
            .collect();
        prop_assert_eq!(xtext_decode(&encoded), Some(printable));
    }

    #[test]
    fn a_path_that_parses_holds_no_control_character(args in "[ -~\\t]{0,80}", null in any::<bool>()) {
        if let Ok((path, _rest)) = pepsi_smtp::address::parse_path(&args, null) {
            prop_assert!(!path.address.as_deref().is_some_and(has_control));
        }
    }

    #[test]
    fn dot_stuffed_data_decodes_to_its_lines_however_it_is_cut(
        lines in prop::collection::vec("[ -~]{0,50}", 0..20),
        cuts in prop::collection::vec(1usize..64, 1..10),
    ) {
        let mut wire = Vec::new();
        for l in &lines {
            if l.starts_with('.') {
                wire.push(b'.');
            }
            wire.extend_from_slice(l.as_bytes());
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b".\r\nNEXT COMMAND\r\n");
        let mut dec = DataDecoder::dot_stuffed(1 << 20, 1000);
        let mut at = 0;
        let mut cut = cuts.iter().cycle();
        let consumed_total = loop {
            let end = (at + cut.next().unwrap()).min(wire.len());
            match dec.feed(&wire[at..end]) {
                Feed::Done { consumed } => break at + consumed,
                Feed::More => {
                    prop_assert!(end < wire.len(), "the end of data was not seen");
                    at = end;
                }
            }
        };
        prop_assert_eq!(&wire[consumed_total..], b"NEXT COMMAND\r\n");
        prop_assert!(dec.problem().is_none());
        let want: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\r\n").into_bytes()).collect();
        prop_assert_eq!(dec.into_message(), want);
    }

    #[test]
    fn the_data_decoder_takes_any_bytes_the_same_whole_or_in_pieces(
        bytes in smtp_bytes(),
        cut in 1usize..16,
    ) {
        let whole = {
            let mut d = DataDecoder::dot_stuffed(4096, 100);
            let r = d.feed(&bytes);
            (matches!(r, Feed::Done { .. }), d.problem(), d.into_message())
        };
        let pieces = {
            let mut d = DataDecoder::dot_stuffed(4096, 100);
            let mut done = false;
            for chunk in bytes.chunks(cut) {
                if let Feed::Done { .. } = d.feed(chunk) {
                    done = true;
                    break;
                }
            }
            (done, d.problem(), d.into_message())
        };
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn the_ingress_header_functions_take_any_bytes(
        bytes in smtp_bytes(),
        id in "[a-z.]{1,20}",
    ) {
        let (headers, _body) = pepsi_contract::message::split(&bytes);
        let ours = [pepsi_ingress::config::DECRYPT_RESULT_HEADER.to_owned()];
        let once = pepsi_ingress::headers::strip_forged_results(headers, &id, &ours);
        let twice = pepsi_ingress::headers::strip_forged_results(&once, &id, &ours);
        prop_assert_eq!(&once, &twice, "stripping is idempotent");
        let _ = pepsi_ingress::headers::begins_with_continuation(&bytes);
        for a in pepsi_contract::message::from_addresses(headers) {
            prop_assert!(!a.contains('\n'));
        }
    }

    #[test]
    fn the_reply_parser_takes_any_lines(lines in prop::collection::vec("[ -~]{0,30}", 1..5)) {
        let _ = pepsi_smtp::reply::parse_reply(&lines);
        for l in &lines {
            let _ = pepsi_smtp::reply::parse_line(l);
        }
    }

    /// Whatever a server renders, the client reads back as the same reply.
    #[test]
    fn a_rendered_reply_parses_back(
        code in (prop::sample::select(vec![2u16, 4, 5]), 0u16..6, 0u16..10).prop_map(|(x, y, z)| x * 100 + y * 10 + z),
        detail in (0u16..8, 0u16..8),
        lines in prop::collection::vec("[ -~]{0,30}", 1..4),
    ) {
        let enhanced = format!("{}.{}.{}", code / 100, detail.0, detail.1);
        let reply = pepsi_smtp::Reply {
            code,
            enhanced: Some(enhanced),
            lines,
        };
        let wire = reply.render();
        let read: Vec<&str> = wire.split_terminator("\r\n").collect();
        let back = pepsi_smtp::reply::parse_reply(&read).expect("a rendered reply parses");
        prop_assert_eq!(back.code, reply.code);
        prop_assert_eq!(back.enhanced, reply.enhanced);
        prop_assert_eq!(back.lines.len(), reply.lines.len());
    }

    /// What a client writes is one line that a server parses back as the same command;
    /// a value with a CR, LF or NUL is refused instead of written.
    #[test]
    fn a_written_command_is_one_line_that_parses_back(
        address in "[a-z0-9+=_-]{1,12}@[a-z0-9]{1,10}\\.[a-z]{2,6}",
        value in "[ -~\r\n\0]{1,16}",
        mail in any::<bool>(),
    ) {
        let path = pepsi_smtp::address::Path::new(&address);
        let params = vec![Param { key: "ORCPT".into(), value: Some(value.replace(' ', "+")) }];
        let command = if mail {
            pepsi_smtp::Command::Mail { from: path, params }
        } else {
            pepsi_smtp::Command::Rcpt { to: path, params }
        };
        match command.to_line() {
            Ok(line) => {
                let text = line.strip_suffix("\r\n").expect("ends in CRLF");
                prop_assert!(!text.contains(['\r', '\n', '\0']));
                let parsed = parse(text.as_bytes());
                prop_assert_eq!(parsed, Ok(command));
            }
            Err(e) => prop_assert!(value.contains(['\r', '\n', '\0']), "{e}"),
        }
    }

    #[test]
    fn the_dsn_request_parser_takes_any_state(state in json_object(), rcpts in prop::collection::vec("[a-z@.]{0,12}", 0..4)) {
        let _ = pepsi_stage_bounce::request::parse(&state, &rcpts);
    }

    #[test]
    fn the_configuration_parser_takes_any_text(text in "[ -~\\n\\t]{0,300}") {
        if let Ok(cfg) = pepsi_conf::config::Config::from_str_named(&text, "fuzz.conf") {
            for name in cfg.sections().map(str::to_owned).collect::<Vec<_>>() {
                let _ = cfg.section(&name).string_opt("PROGRAM");
            }
        }
    }

    #[test]
    fn the_counters_validators_take_any_input(raw in "[ -~]{0,60}", body in json_object()) {
        use migadu_counters::validate::*;
        if let Ok(a) = normalize_address(&raw) {
            prop_assert_eq!(normalize_address(&a), Ok(a.clone()), "normalizing twice changes nothing");
        }
        if let Some(d) = normalize_domain(&raw) {
            prop_assert_eq!(normalize_domain(&d), Some(d.clone()));
        }
        let _ = normalize_login(&raw);
        let _ = parse_iso_date(&raw);
        let _ = sanitize_trace_id(&raw);
        let body = serde_json::Value::Object(body);
        let _ = trace_id_of(&body);
        // the bytes-level reading of the body, where it answers, answers as the JSON tree does
        let bytes = body.to_string();
        for route in [Route::Out, Route::In] {
            let tree = validate_count_request(route, &body);
            if let Some(direct) = accept_count_request(route, bytes.as_bytes()) {
                prop_assert_eq!(Ok(direct), tree);
            }
        }
    }
}

/// Small JSON objects whose keys are often the ones the parsers look for.
fn json_object() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[ -~]{0,16}".prop_map(serde_json::Value::from),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::btree_map(key(), value, 0..6).prop_map(|m| m.into_iter().collect())
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "bounce",
            "dsn",
            "rcpt",
            "notify",
            "orcpt",
            "ret",
            "envid",
            "kind",
            "status",
            "recipients",
            "from",
            "to",
            "login",
            "trace_id",
            "auth_user",
            "mail_from",
            "recipient",
            "junk",
            "domain",
            "org",
            "address",
            "enhanced_status",
            "diagnostic",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,8}",
    ]
}
