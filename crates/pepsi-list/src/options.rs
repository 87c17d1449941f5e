//! A list's options: the columns of `pepsi.mailing_list` that `pepsi-list configure` may
//! change (a fixed allow-list, `OPTIONS`), what each takes, its default and its meaning; the
//! parsing of `NAME=VALUE` into a checked value; the one rule between two options
//! (`reply_goes_to` and `reply_to_address`); and the reading back of stored values.
//!
//! Pure, no I/O. Every value is checked here against what the schema's CHECK allows
//! (pepsi-0016.sql) and a sensible range, so an UPDATE never meets a constraint it could
//! have been told about. The SQL fragments (`set_sql`, `select_sql`) are made of the table's
//! own column names and placeholders only, never of input.

use std::fmt::Write as _;

use serde::{Serialize, Serializer};

/// What a post from a sender does (`member_action`, `nonmember_action`).
pub const ACTIONS: &[&str] = &["accept", "hold", "reject", "discard", "defer"];

const DAY: u64 = 86_400;
const HOUR: u64 = 3_600;

/// What an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text of at most `max` characters; control characters refused, but for newlines and
    /// tabs where `lines`.
    Text { max: usize, lines: bool },
    /// yes/no/true/false.
    Bool,
    /// One of the words (the column's CHECK).
    Choice(&'static [&'static str]),
    /// A whole number in the range.
    Int { min: i64, max: i64 },
    /// Bytes, written as the configuration writes sizes (`1M`, `30k`, `4096`).
    Size { min: u64, max: u64 },
    /// A score with at most two decimals, above 0 and below 10000 (`numeric(6,2)`).
    Score,
    /// A duration in whole seconds within the range (`7d`, `1h30m`), stored as an interval.
    Duration { min: u64, max: u64 },
    /// An address, or `none`.
    Address,
}

/// One configurable column of `pepsi.mailing_list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListOption {
    /// The column's name, which is the option's.
    pub name: &'static str,
    pub kind: Kind,
    /// The schema's default, as `configure` writes it.
    pub default: &'static str,
    /// What it means, one sentence for `--help` and docs/lists.md.
    pub meaning: &'static str,
}

const fn text(max: usize, lines: bool) -> Kind {
    Kind::Text { max, lines }
}

const fn days(min: u64, max_days: u64) -> Kind {
    Kind::Duration {
        min,
        max: max_days * DAY,
    }
}

/// Every option `configure` accepts, in the order `show` prints them.
pub const OPTIONS: &[ListOption] = &[
    ListOption {
        name: "display_name",
        kind: text(200, false),
        default: "",
        meaning: "The list's name as people read it (the list pages, the list of lists).",
    },
    ListOption {
        name: "description",
        kind: text(4000, true),
        default: "",
        meaning: "What the list is about, for its page and the list of lists.",
    },
    ListOption {
        name: "subject_prefix",
        kind: text(60, false),
        default: "",
        meaning: "Put before a post's subject unless it is there already, e.g. `[team] `.",
    },
    ListOption {
        name: "advertised",
        kind: Kind::Bool,
        default: "yes",
        meaning: "Whether the list is shown on the public list pages and in the list of lists.",
    },
    ListOption {
        name: "member_action",
        kind: Kind::Choice(ACTIONS),
        default: "accept",
        meaning: "What a post from a member does (a member's own --action wins).",
    },
    ListOption {
        name: "nonmember_action",
        kind: Kind::Choice(ACTIONS),
        default: "hold",
        meaning: "What a post from anyone else does (a nonmember row's --action wins).",
    },
    ListOption {
        name: "subscription_policy",
        kind: Kind::Choice(&["confirm", "confirm_then_approve", "closed"]),
        default: "confirm",
        meaning: "Subscribing: confirmed by mail (double opt-in), then also approved by a \
                  moderator, or closed (only owners add members).",
    },
    ListOption {
        name: "reply_goes_to",
        kind: Kind::Choice(&["sender", "list", "explicit"]),
        default: "sender",
        meaning: "Where replies go: the sender, the list, or reply_to_address \
                  (explicit needs it; another value drops it).",
    },
    ListOption {
        name: "reply_to_address",
        kind: Kind::Address,
        default: "none",
        meaning: "The Reply-To of posts under reply_goes_to=explicit; none otherwise.",
    },
    ListOption {
        name: "dmarc_mitigation",
        kind: Kind::Choice(&["munge_from", "wrap", "none"]),
        default: "munge_from",
        meaning: "When the sender's domain publishes DMARC p=reject or p=quarantine: rewrite \
                  the From, wrap the post in a message of the list's, or leave it.",
    },
    ListOption {
        name: "max_message_size",
        kind: Kind::Size {
            min: 1,
            max: 1 << 40,
        },
        default: "1M",
        meaning: "The largest post accepted, in bytes (`512k`, `1M`); larger ones are held.",
    },
    ListOption {
        name: "archive_policy",
        kind: Kind::Choice(&["public", "private", "none"]),
        default: "private",
        meaning: "Who may read the archive: everyone, members only, nobody (not archived).",
    },
    ListOption {
        name: "bounce_score_threshold",
        kind: Kind::Score,
        default: "5.0",
        meaning: "The bounce score at which a member's delivery is disabled (a hard bounce \
                  scores 1, a soft one 0.5 a day).",
    },
    ListOption {
        name: "bounce_info_stale_after",
        kind: days(HOUR, 365),
        default: "7d",
        meaning: "A score not added to for this long starts again from 0.",
    },
    ListOption {
        name: "bounce_warnings",
        kind: Kind::Int { min: 0, max: 100 },
        default: "3",
        meaning: "Warnings sent to a member disabled by bounces before the member is removed.",
    },
    ListOption {
        name: "bounce_warning_interval",
        kind: days(HOUR, 365),
        default: "7d",
        meaning: "The time between two of those warnings.",
    },
    ListOption {
        name: "digests_enabled",
        kind: Kind::Bool,
        default: "yes",
        meaning: "Whether members may take the posts as digests.",
    },
    ListOption {
        name: "digest_size_threshold",
        kind: Kind::Size {
            min: 1024,
            max: 1 << 30,
        },
        default: "30k",
        meaning: "A digest goes out once its posts reach this many bytes, or digest_period \
                  after its first post.",
    },
    ListOption {
        name: "digest_period",
        kind: days(HOUR, 365),
        default: "1d",
        meaning: "A digest goes out this long after its first post, or earlier at \
                  digest_size_threshold.",
    },
    ListOption {
        name: "confirm_limit_per_address",
        kind: Kind::Int { min: 1, max: 1000 },
        default: "3",
        meaning: "Confirmation requests one address may be sent within confirm_window \
                  (against subscription bombing); more are refused.",
    },
    ListOption {
        name: "confirm_limit_per_client",
        kind: Kind::Int {
            min: 1,
            max: 100_000,
        },
        default: "10",
        meaning: "Confirmation requests one client (IP address or API token) may cause \
                  within confirm_window.",
    },
    ListOption {
        name: "confirm_window",
        kind: days(60, 7),
        default: "1h",
        meaning: "The window of the two limits above.",
    },
    ListOption {
        name: "pending_lifetime",
        kind: days(HOUR, 365),
        default: "3d",
        meaning: "How long an emailed confirmation waits for its answer.",
    },
    ListOption {
        name: "held_lifetime",
        kind: days(HOUR, 365),
        default: "14d",
        meaning: "How long a held post waits for a moderator before it expires.",
    },
    ListOption {
        name: "emergency",
        kind: Kind::Bool,
        default: "no",
        meaning: "Emergency moderation: every post is held, members' too.",
    },
    ListOption {
        name: "fanout_batch",
        kind: Kind::Int { min: 1, max: 1000 },
        default: "100",
        meaning: "The most recipients one queue row of a post's delivery carries.",
    },
    ListOption {
        name: "personalize",
        kind: Kind::Choice(&["none", "individual"]),
        default: "none",
        meaning: "individual: a plain-text post's footer names the member and carries their \
                  own unsubscribe link (one stored body per member); none: one footer for all.",
    },
];

/// A checked value, as `configure` stores it and `show` reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Bool(bool),
    Int(i64),
    /// Hundredths.
    Score(u32),
    Seconds(u64),
    /// SQL NULL (`reply_to_address=none`).
    None,
}

/// `--json` writes a value as its natural JSON: text, true/false, a number, a duration in
/// the syntax `configure` takes (`"7d"`), null.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Text(t) => s.serialize_str(t),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(n) => s.serialize_i64(*n),
            Value::Score(h) => s.serialize_f64(f64::from(*h) / 100.0),
            Value::Seconds(secs) => s.serialize_str(&duration_text(*secs)),
            Value::None => s.serialize_none(),
        }
    }
}

impl Value {
    /// The value as one line for people: yes/no, `7d`, `none`, `5.00`.
    pub fn display(&self) -> String {
        match self {
            Value::Text(t) if t.is_empty() => "(empty)".into(),
            Value::Text(t) => t.clone(),
            Value::Bool(true) => "yes".into(),
            Value::Bool(false) => "no".into(),
            Value::Int(n) => n.to_string(),
            Value::Score(h) => score_text(*h),
            Value::Seconds(s) => duration_text(*s),
            Value::None => "none".into(),
        }
    }

    /// The text bound for the option's placeholder (`set_sql` casts it); `None` binds NULL.
    pub fn sql_text(&self) -> Option<String> {
        match self {
            Value::Text(t) => Some(t.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Int(n) => Some(n.to_string()),
            Value::Score(h) => Some(score_text(*h)),
            Value::Seconds(s) => Some(s.to_string()),
            Value::None => None,
        }
    }
}

/// `1d2h3m4s` (the units that are not zero; `0s` for nothing): what
/// `pepsi_conf::config::parse_duration` reads back to the same number of seconds.
pub fn duration_text(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut rest = secs;
    for (unit, size) in [("d", DAY), ("h", HOUR), ("m", 60), ("s", 1)] {
        if rest >= size {
            let _ = write!(out, "{}{unit}", rest / size);
            rest %= size;
        }
    }
    out
}

fn score_text(hundredths: u32) -> String {
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

/// The option called `name` (case ignored, `-` read as `_`).
pub fn find(name: &str) -> Option<&'static ListOption> {
    let wanted = name.trim().to_ascii_lowercase().replace('-', "_");
    OPTIONS.iter().find(|o| o.name == wanted)
}

fn names() -> String {
    OPTIONS
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Kind {
    /// What the option takes, for messages and the help: `one of accept, hold, ...`.
    pub fn expected(self) -> String {
        match self {
            Kind::Text { max, lines: false } => {
                format!("text of at most {max} characters, on one line")
            }
            Kind::Text { max, lines: true } => format!("text of at most {max} characters"),
            Kind::Bool => "yes, no, true or false".into(),
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
            Kind::Int { min, max } => format!("a whole number from {min} to {max}"),
            Kind::Size { min, max } => format!(
                "a size in bytes from {min} to {} (such as 512k, 10M; k, M, G are multiples of 1024)",
                size_text(max)
            ),
            Kind::Score => "a number above 0 and below 10000, at most two decimals".into(),
            Kind::Duration { min, max } => format!(
                "a duration from {} to {} (such as 90m, 12h, 7d, 1d12h)",
                duration_text(min),
                duration_text(max)
            ),
            Kind::Address => "an address, or none".into(),
        }
    }

    /// Checks `text` as this kind's value; the error says what the kind takes.
    pub fn parse(self, text: &str) -> Result<Value, String> {
        let fail = || Err(self.expected());
        match self {
            Kind::Text { max, lines } => {
                let bad = text
                    .chars()
                    .any(|c| c.is_control() && !(lines && (c == '\n' || c == '\t')));
                if bad || text.chars().count() > max {
                    return fail();
                }
                Ok(Value::Text(text.to_owned()))
            }
            Kind::Bool => match text.trim().to_ascii_lowercase().as_str() {
                "yes" | "true" => Ok(Value::Bool(true)),
                "no" | "false" => Ok(Value::Bool(false)),
                _ => fail(),
            },
            Kind::Choice(words) => {
                let t = text.trim().to_ascii_lowercase();
                match words.iter().find(|w| **w == t) {
                    Some(w) => Ok(Value::Text((*w).to_owned())),
                    None => fail(),
                }
            }
            Kind::Int { min, max } => match text.trim().parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Value::Int(n)),
                _ => fail(),
            },
            Kind::Size { min, max } => match pepsi_conf::config::parse_size(text) {
                Ok(n) if (min..=max).contains(&n) => Ok(Value::Int(n as i64)),
                _ => fail(),
            },
            Kind::Score => match parse_hundredths(text.trim()) {
                Some(h) if (1..=999_999).contains(&h) => Ok(Value::Score(h)),
                _ => fail(),
            },
            Kind::Duration { min, max } => match pepsi_conf::config::parse_duration(text) {
                Ok(d) if d.subsec_nanos() == 0 && (min..=max).contains(&d.as_secs()) => {
                    Ok(Value::Seconds(d.as_secs()))
                }
                _ => fail(),
            },
            Kind::Address => {
                let t = text.trim();
                if t.is_empty() || t.eq_ignore_ascii_case("none") {
                    return Ok(Value::None);
                }
                crate::names::member_address(t)
                    .map(Value::Text)
                    .map_err(|_| self.expected())
            }
        }
    }

    /// The stored value as `select_sql` reads it (text, NULL as `None`) turned back into a
    /// value; text that does not read as the kind stays text.
    pub fn read(self, stored: Option<&str>) -> Value {
        let Some(t) = stored else {
            return Value::None;
        };
        let text = || Value::Text(t.to_owned());
        match self {
            Kind::Text { .. } | Kind::Choice(_) | Kind::Address => text(),
            Kind::Bool => match t {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => text(),
            },
            Kind::Int { .. } | Kind::Size { .. } => t.parse().map_or_else(|_| text(), Value::Int),
            Kind::Score => parse_hundredths(t).map_or_else(text, Value::Score),
            Kind::Duration { .. } => t.parse().map_or_else(|_| text(), Value::Seconds),
        }
    }

    /// The SQL expression that stores placeholder `$n` (bound as text) in a column of this
    /// kind.
    pub fn set_sql(self, n: usize) -> String {
        match self {
            Kind::Text { .. } | Kind::Choice(_) | Kind::Address => format!("${n}"),
            Kind::Bool => format!("${n}::boolean"),
            Kind::Int { .. } => format!("${n}::integer"),
            Kind::Size { .. } => format!("${n}::bigint"),
            Kind::Score => format!("${n}::numeric"),
            // An interval of days, hours, minutes and seconds, as the schema's defaults are
            // written ('7 days', not '168:00:00').
            Kind::Duration { .. } => {
                format!("justify_hours(make_interval(secs => ${n}::double precision))")
            }
        }
    }

    /// The SQL expression that reads `column` of this kind as text (`read` takes it).
    pub fn select_sql(self, column: &str) -> String {
        match self {
            Kind::Duration { .. } => format!("EXTRACT(EPOCH FROM {column})::bigint::text"),
            _ => format!("{column}::text"),
        }
    }
}

fn size_text(bytes: u64) -> String {
    for (unit, size) in [
        ("T", 1u64 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("k", 1 << 10),
    ] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// `5`, `2.5`, `0.25` in hundredths; `None` for anything else (more decimals, a sign, an
/// exponent).
fn parse_hundredths(t: &str) -> Option<u32> {
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || frac.len() > 2 || whole.len() > 6 {
        return None;
    }
    let whole: u32 = whole.parse().ok()?;
    let frac: u32 = format!("{frac:0<2}").parse().ok()?;
    whole.checked_mul(100)?.checked_add(frac)
}

/// One change `configure` makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub option: &'static ListOption,
    pub value: Value,
}

/// `NAME=VALUE` arguments checked: each name known and given once, each value valid for
/// its option. The error names the argument and what was expected.
pub fn parse_assignments(args: &[String]) -> Result<Vec<Change>, String> {
    if args.is_empty() {
        return Err(format!(
            "give one or more NAME=VALUE; the options are: {}",
            names()
        ));
    }
    let mut out: Vec<Change> = Vec::new();
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!(
                "{arg:?}: give NAME=VALUE; the options are: {}",
                names()
            ));
        };
        let Some(option) = find(name) else {
            return Err(format!(
                "unknown option {name:?}; the options are: {}",
                names()
            ));
        };
        if out.iter().any(|c| c.option.name == option.name) {
            return Err(format!("option {} is given twice", option.name));
        }
        let value = option.kind.parse(value).map_err(|expected| {
            format!("option {}: {value:?} is not valid: {expected}", option.name)
        })?;
        out.push(Change { option, value });
    }
    Ok(out)
}

fn option(name: &str) -> &'static ListOption {
    find(name).expect("an option of the table")
}

/// The changes with the rule between `reply_goes_to` and `reply_to_address` applied, given
/// the list's current values of both (the schema's CHECK: an address exactly when replies
/// go to it): `explicit` needs an address; an address needs `explicit`; moving
/// `reply_goes_to` away from `explicit` drops the stored address.
pub fn settle(
    mut changes: Vec<Change>,
    goes_to: &str,
    reply_to: Option<&str>,
) -> Result<Vec<Change>, String> {
    let given = |changes: &[Change], name: &str| {
        changes
            .iter()
            .find(|c| c.option.name == name)
            .map(|c| c.value.clone())
    };
    let new_goes_to = match given(&changes, "reply_goes_to") {
        Some(Value::Text(t)) => t,
        _ => goes_to.to_owned(),
    };
    let address_given = given(&changes, "reply_to_address");
    let new_reply_to = match &address_given {
        Some(v) => v.clone(),
        None => reply_to.map_or(Value::None, |a| Value::Text(a.to_owned())),
    };
    match (new_goes_to == "explicit", &new_reply_to, &address_given) {
        (true, Value::None, _) => {
            Err("reply_goes_to=explicit needs reply_to_address=ADDRESS (where replies go)".into())
        }
        (false, Value::Text(_), Some(_)) => Err(format!(
            "reply_to_address is used only with reply_goes_to=explicit (it is {new_goes_to}): \
             give reply_goes_to=explicit as well"
        )),
        (false, Value::Text(_), None) => {
            changes.push(Change {
                option: option("reply_to_address"),
                value: Value::None,
            });
            Ok(changes)
        }
        _ => Ok(changes),
    }
}

/// The help's and the docs' table of options: name, what it takes, default, meaning.
pub fn help() -> String {
    let mut out = String::from("Options (NAME=VALUE), with their defaults:\n");
    for o in OPTIONS {
        let _ = writeln!(
            out,
            "  {} (default {})\n      {} Takes {}.",
            o.name,
            if o.default.is_empty() {
                "empty"
            } else {
                o.default
            },
            o.meaning,
            o.kind.expected()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn check(arg: &str, want: Result<Value, &str>) {
        let got = parse_assignments(&[arg.to_owned()]).map(|mut c| c.remove(0).value);
        match (got, want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{arg}"),
            (Err(e), Err(w)) => assert!(e.contains(w), "{arg}: {e:?} lacks {w:?}"),
            (g, w) => panic!("{arg}: {g:?}, wanted {w:?}"),
        }
    }

    #[test]
    fn assignments_are_parsed_and_checked_per_kind() {
        let text = |t: &str| Ok(Value::Text(t.into()));
        let cases: Vec<(&str, Result<Value, &str>)> = vec![
            ("member_action=hold", text("hold")),
            ("member_action=HOLD", text("hold")),
            (
                "member_action=maybe",
                Err(
                    "option member_action: \"maybe\" is not valid: one of accept, hold, reject, discard, defer",
                ),
            ),
            (
                "subscription_policy=confirm_then_approve",
                text("confirm_then_approve"),
            ),
            (
                "subscription_policy=open",
                Err("one of confirm, confirm_then_approve, closed"),
            ),
            ("Archive-Policy=public", text("public")),
            ("emergency=yes", Ok(Value::Bool(true))),
            ("emergency=False", Ok(Value::Bool(false))),
            ("emergency=1", Err("yes, no, true or false")),
            ("advertised=", Err("option advertised")),
            ("fanout_batch=1000", Ok(Value::Int(1000))),
            ("fanout_batch=0", Err("a whole number from 1 to 1000")),
            ("fanout_batch=1001", Err("from 1 to 1000")),
            ("fanout_batch=ten", Err("a whole number")),
            (
                "personalize=individual",
                Ok(Value::Text("individual".into())),
            ),
            ("personalize=full", Err("one of none, individual")),
            ("bounce_warnings=0", Ok(Value::Int(0))),
            ("max_message_size=2M", Ok(Value::Int(2 << 20))),
            ("max_message_size=4096", Ok(Value::Int(4096))),
            ("max_message_size=0", Err("a size in bytes from 1 to 1T")),
            ("max_message_size=lots", Err("a size in bytes")),
            ("digest_size_threshold=512", Err("from 1024")),
            ("bounce_score_threshold=2.5", Ok(Value::Score(250))),
            ("bounce_score_threshold=7", Ok(Value::Score(700))),
            ("bounce_score_threshold=0.25", Ok(Value::Score(25))),
            ("bounce_score_threshold=0", Err("above 0")),
            ("bounce_score_threshold=1.234", Err("at most two decimals")),
            ("bounce_score_threshold=10000", Err("below 10000")),
            ("bounce_score_threshold=-1", Err("above 0")),
            ("pending_lifetime=7d", Ok(Value::Seconds(7 * DAY))),
            ("pending_lifetime=1d12h", Ok(Value::Seconds(36 * HOUR))),
            ("pending_lifetime=90m", Ok(Value::Seconds(90 * 60))),
            ("pending_lifetime=30m", Err("a duration from 1h to 365d")),
            ("pending_lifetime=400d", Err("from 1h to 365d")),
            ("pending_lifetime=1500ms", Err("a duration")),
            ("pending_lifetime=soon", Err("a duration")),
            ("confirm_window=1m", Ok(Value::Seconds(60))),
            ("confirm_window=8d", Err("from 1m to 7d")),
            ("subject_prefix=[team] ", text("[team] ")),
            ("subject_prefix=", text("")),
            ("subject_prefix=a\nb", Err("on one line")),
            ("description=line one\nline two", text("line one\nline two")),
            ("display_name=Team = all of us", text("Team = all of us")),
            (
                "reply_to_address=Replies@Example.ORG",
                text("replies@example.org"),
            ),
            ("reply_to_address=none", Ok(Value::None)),
            (
                "reply_to_address=not an address",
                Err("an address, or none"),
            ),
            (
                "colour=blue",
                Err("unknown option \"colour\"; the options are: display_name"),
            ),
            ("address=x@example.org", Err("unknown option \"address\"")),
            ("list_id=3", Err("unknown option")),
            ("updated_at=now", Err("unknown option")),
            ("emergency", Err("\"emergency\": give NAME=VALUE")),
        ];
        for (arg, want) in cases {
            check(arg, want);
        }
        let long = format!("display_name={}", "x".repeat(201));
        check(&long, Err("at most 200 characters"));
    }

    #[test]
    fn an_option_is_given_once_and_at_least_one_is_given() {
        let args = ["emergency=yes".to_owned(), "EMERGENCY=no".to_owned()];
        assert_eq!(
            parse_assignments(&args).unwrap_err(),
            "option emergency is given twice"
        );
        assert!(
            parse_assignments(&[])
                .unwrap_err()
                .starts_with("give one or more NAME=VALUE")
        );
    }

    #[test]
    fn the_reply_rule_is_the_schemas_check() {
        let changes = |args: &[&str]| {
            parse_assignments(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).unwrap()
        };
        let shown = |c: &[Change]| {
            c.iter()
                .map(|c| format!("{}={}", c.option.name, c.value.display()))
                .collect::<Vec<_>>()
        };
        // (arguments, current reply_goes_to, current reply_to_address, result)
        type Case<'a> = (
            &'a [&'a str],
            &'a str,
            Option<&'a str>,
            Result<&'a [&'a str], &'a str>,
        );
        let cases: &[Case] = &[
            (
                &["reply_goes_to=explicit", "reply_to_address=r@example.org"],
                "sender",
                None,
                Ok(&["reply_goes_to=explicit", "reply_to_address=r@example.org"]),
            ),
            (
                &["reply_goes_to=explicit"],
                "sender",
                None,
                Err("needs reply_to_address"),
            ),
            (
                &["reply_goes_to=explicit"],
                "sender",
                Some("r@example.org"),
                Ok(&["reply_goes_to=explicit"]),
            ),
            (
                &["reply_to_address=r@example.org"],
                "list",
                None,
                Err("used only with reply_goes_to=explicit (it is list)"),
            ),
            (
                &["reply_to_address=s@example.org"],
                "explicit",
                Some("r@example.org"),
                Ok(&["reply_to_address=s@example.org"]),
            ),
            (
                &["reply_to_address=none"],
                "explicit",
                Some("r@example.org"),
                Err("needs reply_to_address"),
            ),
            // Leaving `explicit` drops the address with it.
            (
                &["reply_goes_to=list"],
                "explicit",
                Some("r@example.org"),
                Ok(&["reply_goes_to=list", "reply_to_address=none"]),
            ),
            (
                &["reply_goes_to=list", "reply_to_address=none"],
                "explicit",
                Some("r@example.org"),
                Ok(&["reply_goes_to=list", "reply_to_address=none"]),
            ),
            (&["emergency=yes"], "sender", None, Ok(&["emergency=yes"])),
        ];
        for (args, goes_to, reply_to, want) in cases {
            let got = settle(changes(args), goes_to, *reply_to);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(shown(&g), *w, "{args:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{args:?}: {e}"),
                (g, w) => panic!("{args:?}: {g:?}, wanted {w:?}"),
            }
        }
    }

    #[test]
    fn durations_are_written_as_parse_duration_reads_them() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3600, "1h"),
            (5400, "1h30m"),
            (DAY, "1d"),
            (7 * DAY, "7d"),
            (DAY + HOUR + 61, "1d1h1m1s"),
        ];
        for (secs, want) in cases {
            assert_eq!(duration_text(secs), want);
            assert_eq!(
                pepsi_conf::config::parse_duration(want).unwrap(),
                Duration::from_secs(secs),
                "{want}"
            );
        }
    }

    #[test]
    fn stored_values_read_back_per_kind() {
        let cases = [
            ("advertised", Some("true"), Value::Bool(true)),
            ("fanout_batch", Some("100"), Value::Int(100)),
            ("max_message_size", Some("1048576"), Value::Int(1 << 20)),
            ("bounce_score_threshold", Some("5.00"), Value::Score(500)),
            ("held_lifetime", Some("1209600"), Value::Seconds(14 * DAY)),
            ("reply_to_address", None, Value::None),
            ("member_action", Some("hold"), Value::Text("hold".into())),
        ];
        for (name, stored, want) in cases {
            assert_eq!(option(name).kind.read(stored), want, "{name}");
        }
    }

    /// The default of `option` as a value.
    fn default_value(option: &ListOption) -> Value {
        option
            .kind
            .parse(option.default)
            .expect("every default is a valid value of its option")
    }

    #[test]
    fn every_default_is_a_valid_value_and_every_option_is_a_column_once() {
        for o in OPTIONS {
            let v = default_value(o);
            // What `show` prints of a default reads back as the same value.
            if let Value::Seconds(_) | Value::Score(_) | Value::Bool(_) = v {
                assert_eq!(o.kind.parse(&v.display()).unwrap(), v, "{}", o.name);
            }
            assert_eq!(
                OPTIONS.iter().filter(|p| p.name == o.name).count(),
                1,
                "{}",
                o.name
            );
            assert!(
                o.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}: a column name goes into SQL text",
                o.name
            );
        }
        assert!(help().contains("fanout_batch (default 100)"));
    }

    /// The table `pepsi.mailing_list` as pepsi-0016.sql creates it.
    const SCHEMA: &str = include_str!("../../pepsi-setup/db/pepsi-0016.sql");
    /// The patch that adds columns to it.
    const SCHEMA_0017: &str = include_str!("../../pepsi-setup/db/pepsi-0017.sql");

    /// Each column of `mailing_list`: (name, the rest of its definition), those of
    /// pepsi-0016.sql's CREATE TABLE and then those pepsi-0017.sql adds.
    fn schema_columns() -> Vec<(String, String)> {
        let mut out = created_columns();
        // `ALTER TABLE pepsi.mailing_list ADD COLUMN name definition` up to its `;`.
        for statement in SCHEMA_0017.split(';') {
            let text: String = statement
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            if let Some(rest) = text
                .split("ALTER TABLE pepsi.mailing_list ADD COLUMN ")
                .nth(1)
            {
                let rest = rest.trim_start_matches("IF NOT EXISTS ");
                let (name, def) = rest.split_once(' ').expect("a column and its definition");
                out.push((name.to_owned(), def.trim().to_owned()));
            }
        }
        out
    }

    /// Each column line of pepsi-0016.sql's `mailing_list`: (name, the rest of its
    /// definition).
    fn created_columns() -> Vec<(String, String)> {
        let table = SCHEMA
            .split("CREATE TABLE pepsi.mailing_list (")
            .nth(1)
            .and_then(|t| t.split("\n);").next())
            .expect("mailing_list in pepsi-0016.sql");
        let mut out: Vec<(String, String)> = Vec::new();
        // An item (a column, the table's CHECK) starts at four spaces; a deeper line
        // continues the one above.
        let mut in_column = false;
        for raw in table.lines() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with("--") {
                continue;
            }
            let indent = raw.len() - raw.trim_start().len();
            if indent <= 4 {
                let (first, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
                in_column = first != "CHECK";
                if in_column {
                    out.push((first.to_owned(), rest.to_owned()));
                }
            } else if in_column && let Some(last) = out.last_mut() {
                last.1.push(' ');
                last.1.push_str(line);
            }
        }
        out
    }

    /// A DEFAULT as the schema writes it, read as the kind's value.
    fn schema_value(kind: Kind, literal: &str) -> Value {
        let unquoted = literal.trim_matches('\'');
        match kind {
            Kind::Duration { .. } => {
                let (n, unit) = unquoted.split_once(' ').expect("N unit");
                let n: u64 = n.parse().unwrap();
                Value::Seconds(match unit.trim_end_matches('s') {
                    "day" => n * DAY,
                    "hour" => n * HOUR,
                    "minute" => n * 60,
                    other => panic!("unit {other}"),
                })
            }
            Kind::Text { .. } | Kind::Choice(_) => Value::Text(unquoted.to_owned()),
            _ => kind.read(Some(unquoted)),
        }
    }

    /// The allow-list is the table: every column but the key, the address and the
    /// timestamps is an option, with the schema's default and, for a choice, exactly the
    /// words of its CHECK.
    #[test]
    fn the_options_are_the_columns_of_the_schema_with_its_defaults() {
        let columns = schema_columns();
        let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        let mut options: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        options.extend(["list_id", "address", "created_at", "updated_at"]);
        let mut sorted_names = names.clone();
        sorted_names.sort();
        options.sort();
        assert_eq!(sorted_names, options);
        for o in OPTIONS {
            let def = &columns.iter().find(|(n, _)| n == o.name).unwrap().1;
            let literal = def.split(" DEFAULT ").nth(1).map(|d| {
                d.split(" CHECK")
                    .next()
                    .unwrap()
                    .trim()
                    .trim_end_matches(',')
            });
            let want = match literal {
                Some(l) => schema_value(o.kind, l),
                None => Value::None,
            };
            assert_eq!(default_value(o), want, "{}: {def}", o.name);
            if let Kind::Choice(words) = o.kind {
                let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
                assert!(
                    def.contains(&format!("IN ({})", quoted.join(", "))),
                    "{}: {def}",
                    o.name
                );
            }
        }
    }

    /// docs/lists.md's table of options names every option with its default, in order.
    #[test]
    fn the_documented_options_are_these_with_their_defaults() {
        let docs = include_str!("../../../docs/lists.md");
        let rows: Vec<(String, String)> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let name = cells[0].strip_suffix('`')?;
                find(name)?;
                Some((name.to_owned(), cells.get(2)?.to_string()))
            })
            .collect();
        let want: Vec<(String, String)> = OPTIONS
            .iter()
            .map(|o| {
                let d = if o.default.is_empty() {
                    "empty"
                } else {
                    o.default
                };
                (o.name.to_owned(), d.to_owned())
            })
            .collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn values_serialize_as_their_natural_json() {
        let cases = [
            (Value::Text("hold".into()), "\"hold\""),
            (Value::Bool(false), "false"),
            (Value::Int(3), "3"),
            (Value::Score(250), "2.5"),
            (Value::Seconds(7 * DAY), "\"7d\""),
            (Value::None, "null"),
        ];
        for (v, want) in cases {
            assert_eq!(serde_json::to_string(&v).unwrap(), want);
        }
    }
}
