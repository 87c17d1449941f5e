//! pepsi-stage-detect-language as a stage worker against a real PostgreSQL (the language of
//! each message's text, with its confidence, in state; HTML-only mail; mail with no text),
//! and the same executable as the `pepsi-detect-language` command through a symlink of that
//! name (the multi-call binary): output, JSON, exit status and refused options.

use std::io::Write as _;
use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::{self, Run};

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-detect-language");

pub const GERMAN: &str = "Sehr geehrte Damen und Herren, vielen Dank für Ihre Nachricht. Wir \
werden die Unterlagen bis zum Ende der Woche prüfen und uns dann wieder bei Ihnen melden. Mit \
freundlichen Grüßen";
pub const FRENCH: &str = "Bonjour à tous, je vous écris pour confirmer notre réunion de jeudi \
prochain. Merci de bien vouloir apporter les documents dont nous avons parlé la semaine \
dernière. Cordialement";
pub const ENGLISH: &str = "Hello team, thank you for the quick reply. I have attached the report \
we discussed on Monday, and I would appreciate your comments before the end of the week. Best \
regards";
pub const RUSSIAN: &str = "Здравствуйте, спасибо за ваше письмо. Мы рассмотрим документы до конца \
недели и сразу же свяжемся с вами. С уважением";

fn message(ctype: &str, body: &str) -> (String, String) {
    (
        format!(
            "From: a@example.org\r\nSubject: x\r\nMIME-Version: 1.0\r\nContent-Type: {ctype}\r\n"
        ),
        format!("{body}\r\n"),
    )
}

async fn running(db: &TestDb, headers: &str, body: &str) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@example.org', ARRAY['b@example.test'], $1::bytea, $2::bytea, '{}', NULL)",
    )
    .bind(headers.as_bytes())
    .bind(body.as_bytes())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'language' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

#[tokio::test]
async fn the_stage_records_the_language_and_its_confidence_in_state() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n[stage-language]\nPROGRAM = pepsi-stage-detect-language\nNEXT_STAGE = done\n",
            db.url
        ),
    )
    .unwrap();
    let (h, b) = message(
        "text/plain; charset=utf-8",
        &format!("{GERMAN}\r\n\r\n> {ENGLISH}\r\n-- \r\n{ENGLISH}"),
    );
    let german = running(&db, &h, &b).await;
    let (h, b) = message(
        "text/html; charset=utf-8",
        &format!("<html><body><p>{FRENCH}</p></body></html>"),
    );
    let french = running(&db, &h, &b).await;
    let (h, b) = message("text/plain", "Thanks!");
    let short = running(&db, &h, &b).await;
    let lines = support::run_ids(STAGE, &cfg, &[german, french, short]).await;
    assert_eq!(lines, ["0"; 3]);
    let state = |id: i64| {
        let pool = db.pool.clone();
        async move {
            let (stage, language): (String, Value) = sqlx::query_as(
                "SELECT stage, state->'language' FROM pepsi.workqueue WHERE workqueue_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(stage, "done");
            language
        }
    };
    let de = state(german).await;
    assert_eq!(
        (de["code"].as_str(), de["name"].as_str()),
        (Some("de"), Some("German")),
        "{de}"
    );
    assert!(de["confidence"].as_f64().unwrap() >= 0.5, "{de}");
    // The quoted English and the signature were not judged: exactly the German letters.
    let german_letters = GERMAN.chars().filter(|c| c.is_alphabetic()).count();
    assert_eq!(de["letters"], german_letters, "{de}");
    let fr = state(french).await;
    assert_eq!(fr["code"], "fr", "{fr}");
    let und = state(short).await;
    assert_eq!(und["code"], Value::Null, "{und}");
    assert_eq!(und["letters"], 6, "{und}");
}

fn command(dir: &std::path::Path, args: &[&str], input: &str) -> Run {
    let link = dir.join("pepsi-detect-language");
    if !link.exists() {
        std::os::unix::fs::symlink(STAGE, &link).unwrap();
    }
    let mut child = Command::new(&link)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that refuses its options exits before it reads: a broken pipe is its answer.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    Run::of(child.wait_with_output().unwrap())
}

#[test]
fn the_command_names_the_language_of_a_message_on_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let text = |body: &str| {
        let (h, b) = message("text/plain; charset=utf-8", body);
        format!("{h}\r\n{b}")
    };
    let r = command(dir.path(), &[], &text(RUSSIAN));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.starts_with("ru ") && r.stdout.trim_end().ends_with(" Russian"),
        "{r:?}"
    );
    let r = command(dir.path(), &["--json"], &text(ENGLISH));
    let doc = r.json();
    assert_eq!(doc["code"], "en", "{doc}");
    // Among the languages given only: English text judged between German and French is
    // not English.
    let r = command(dir.path(), &["--languages", "de,fr"], &text(ENGLISH));
    assert!(!r.stdout.starts_with("en "), "{r:?}");
    let r = command(dir.path(), &["--languages", "de,fr"], &text(FRENCH));
    assert!(r.stdout.starts_with("fr "), "{r:?}");
    // One language would call everything that language: refused.
    let r = command(dir.path(), &["--languages", "de,DE"], &text(FRENCH));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("name at least two"), "{r:?}");
    // A message all quotes still has its language judged.
    let r = command(dir.path(), &[], &text(&format!("> {RUSSIAN}")));
    assert!(r.stdout.starts_with("ru "), "{r:?}");
    // Too little text: und, exit 1.
    let r = command(dir.path(), &[], &text("Ok."));
    assert_eq!((r.code, r.stdout.as_str()), (1, "und 0.00\n"), "{r:?}");
    // A code this build does not know is refused, naming it.
    let r = command(dir.path(), &["--languages", "de,xx"], &text(GERMAN));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("\"xx\" is not an ISO 639-1 code"),
        "{r:?}"
    );
    // Under its own name the executable is the stage worker.
    let r = Run::of(Command::new(STAGE).arg("--help").output().unwrap());
    assert!(r.stdout.contains("state.language"), "{r:?}");
}
