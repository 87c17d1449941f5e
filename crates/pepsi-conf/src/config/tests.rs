//! Tests of loading (syntax, includes, secrets.d, location) and of the typed getters as seen
//! through a whole `Config`; the pure parsers and the overlay have their own tables.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;

/// Renders a configuration as `[SECTION] OPTION = "value" @ origin` lines, values unexpanded.
fn dump(config: &Config) -> String {
    let mut out = String::new();
    for section in config.sections.values() {
        for entry in section.options.values() {
            out.push_str(&format!(
                "[{}] {} = {:?} @ {}\n",
                section.name, entry.name, entry.value, entry.origin
            ));
        }
    }
    out
}

/// Parses `input` as `t.conf` and compares the dump, or `error: <message>`, with `expected`.
fn check(input: &str, expected: &str) {
    let actual = match Config::from_str_named(input, "t.conf") {
        Ok(config) => dump(&config),
        Err(error) => format!("error: {error}\n"),
    };
    assert_eq!(actual, expected, "input:\n{input}");
}

#[test]
fn parsing_table() {
    let cases: &[(&str, &str)] = &[
        ("", ""),
        ("# only a comment\n; another\n\n   \n", ""),
        ("[s]\nA = 1\n", "[s] A = \"1\" @ t.conf:2\n"),
        // Names are case-insensitive; the first spelling of a section and the last of an
        // option are kept for messages.
        (
            "[Stage-Init]\nParallelism = 2\n[STAGE-INIT]\nPARALLELISM = 3\n",
            "[Stage-Init] PARALLELISM = \"3\" @ t.conf:4\n",
        ),
        (
            "[s]\nA = 1\nB = 2\nA = 3\n",
            "[s] A = \"3\" @ t.conf:4\n[s] B = \"2\" @ t.conf:3\n",
        ),
        (
            "[s]\n  A   =   spaced value   \n",
            "[s] A = \"spaced value\" @ t.conf:2\n",
        ),
        (
            "[s]\nA = \"  kept  \"\n",
            "[s] A = \"  kept  \" @ t.conf:2\n",
        ),
        ("[s]\nA = \"\"\n", "[s] A = \"\" @ t.conf:2\n"),
        ("[s]\nA =\n", "[s] A = \"\" @ t.conf:2\n"),
        ("[s]\nA = x = y\n", "[s] A = \"x = y\" @ t.conf:2\n"),
        // A # inside a value is data (passwords), only a leading one starts a comment.
        (
            "[s]\nA = p#ss ; not a comment\n",
            "[s] A = \"p#ss ; not a comment\" @ t.conf:2\n",
        ),
        (
            "[s]\n  # indented comment\nA=1\n",
            "[s] A = \"1\" @ t.conf:3\n",
        ),
        ("[ spaced ]\nA = 1\n", "[spaced] A = \"1\" @ t.conf:2\n"),
        ("[empty]\n", ""),
        ("\u{feff}[s]\r\nA = 1\r\n", "[s] A = \"1\" @ t.conf:2\n"),
        (
            "[s]\nURL = postgres://u:$$@h/db\n",
            "[s] URL = \"postgres://u:$$@h/db\" @ t.conf:2\n",
        ),
        (
            "A = 1\n",
            "error: t.conf:1: cannot parse \"A = 1\": an option must follow a [SECTION] header\n",
        ),
        (
            "[s\n",
            "error: t.conf:1: cannot parse \"[s\": a section header ends with ]\n",
        ),
        (
            "[]\n",
            "error: t.conf:1: cannot parse \"[]\": the section name is empty\n",
        ),
        (
            "[a]b]\n",
            "error: t.conf:1: cannot parse \"[a]b]\": a section name cannot contain [ or ]\n",
        ),
        (
            "[s]\njust words\n",
            "error: t.conf:2: cannot parse \"just words\": expected [SECTION], OPTION = value, \
             a comment starting with # or ;, or @inline@ <path>\n",
        ),
        (
            "[s]\n= 1\n",
            "error: t.conf:2: cannot parse \"= 1\": the option name before = is empty\n",
        ),
        (
            "[s]\nTWO WORDS = 1\n",
            "error: t.conf:2: cannot parse \"TWO WORDS = 1\": an option name cannot contain spaces\n",
        ),
        (
            "[s]\nA = \"open\n",
            "error: t.conf:2: cannot parse \"A = \\\"open\": a value that starts with \" must end with \"\n",
        ),
        (
            "[s]\n@inline-matching@ *.conf\n",
            "error: t.conf:2: cannot parse \"@inline-matching@ *.conf\": unknown directive \
             (only @inline@ <path> is supported)\n",
        ),
        (
            "@inline\n",
            "error: t.conf:1: cannot parse \"@inline\": a directive looks like @inline@ <path>\n",
        ),
        (
            "@inline@\n",
            "error: t.conf:1: cannot parse \"@inline@\": @inline@ needs a file name\n",
        ),
    ];
    for (input, expected) in cases {
        check(input, expected);
    }
}

#[test]
fn sections_and_options_are_listed_case_insensitively() {
    let config =
        Config::from_str_named("[b]\nx = 1\n[A]\nY = 2\nX = 3\n[paths]\n", "t.conf").unwrap();
    assert_eq!(config.sections().collect::<Vec<_>>(), ["A", "b", "paths"]);
    assert!(config.has_section("B") && config.has_section("a") && config.has_section("PATHS"));
    assert!(!config.has_section("c"));
    let a = config.section("a");
    assert_eq!(a.name(), "A");
    assert_eq!(a.options().collect::<Vec<_>>(), ["X", "Y"]);
    assert!(a.has("x") && a.has("Y") && !a.has("z"));
    let missing = config.section("Nowhere");
    assert_eq!(missing.name(), "Nowhere");
    assert_eq!(missing.options().count(), 0);
    assert_eq!(missing.string_opt("X").unwrap(), None);
}

/// A scratch directory with files written relative to it.
struct Tree(tempfile::TempDir);

impl Tree {
    fn new() -> Tree {
        Tree(tempfile::tempdir().unwrap())
    }

    fn path(&self, relative: &str) -> std::path::PathBuf {
        self.0.path().join(relative)
    }

    fn write(&self, relative: &str, text: &str) -> &Tree {
        self.write_mode(relative, text, 0o640)
    }

    fn write_mode(&self, relative: &str, text: &str, mode: u32) -> &Tree {
        let path = self.path(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        self
    }

    /// Loads `pepsi.conf` and renders it like [`check`], with the directory shown as `<dir>`.
    fn load(&self) -> String {
        let rendered = match Config::load(&self.path("pepsi.conf")) {
            Ok(config) => dump(&config),
            Err(error) => format!("error: {error}\n"),
        };
        rendered.replace(&self.0.path().display().to_string(), "<dir>")
    }
}

#[test]
fn includes() {
    let tree = Tree::new();
    tree.write(
        "pepsi.conf",
        "[PATHS]\nSUB = conf.d\n[main]\nA = before\n@inline@ $SUB/extra.conf\nB = after include\n",
    )
    .write(
        "conf.d/extra.conf",
        "[main]\nA = from include\n@inline@ \"deeper/more.conf\"\n",
    )
    .write("conf.d/deeper/more.conf", "[other]\nC = 3\n");
    assert_eq!(
        tree.load(),
        "\
[main] A = \"from include\" @ <dir>/conf.d/extra.conf:2
[main] B = \"after include\" @ <dir>/pepsi.conf:6
[other] C = \"3\" @ <dir>/conf.d/deeper/more.conf:2
[PATHS] SUB = \"conf.d\" @ <dir>/pepsi.conf:2
"
    );
}

#[test]
fn an_included_file_starts_outside_any_section() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[main]\n@inline@ part.conf\n")
        .write("part.conf", "A = 1\n");
    assert_eq!(
        tree.load(),
        "error: <dir>/part.conf:1: cannot parse \"A = 1\": an option must follow a [SECTION] header\n"
    );
}

#[test]
fn include_errors() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\n@inline@ missing.conf\n");
    assert_eq!(
        tree.load(),
        "error: <dir>/pepsi.conf:2: cannot read included file <dir>/missing.conf: \
         No such file or directory (os error 2)\n"
    );

    tree.write(
        "pepsi.conf",
        "[s]\n@inline@ $NO_SUCH_PEPSI_VARIABLE/x.conf\n",
    );
    assert_eq!(
        tree.load(),
        "error: <dir>/pepsi.conf:2: @inline@ $NO_SUCH_PEPSI_VARIABLE/x.conf: variable \
         NO_SUCH_PEPSI_VARIABLE is not set in [PATHS] or the environment and has no default\n"
    );

    tree.write("pepsi.conf", "[s]\nA = 1\n@inline@ a.conf\n")
        .write("a.conf", "@inline@ sub/b.conf\n")
        .write("sub/b.conf", "# back to the top\n@inline@ ../pepsi.conf\n");
    assert_eq!(
        tree.load(),
        "error: <dir>/sub/b.conf:2: @inline@ <dir>/sub/../pepsi.conf would include itself \
         (<dir>/pepsi.conf -> <dir>/a.conf -> <dir>/sub/b.conf -> <dir>/pepsi.conf)\n"
    );

    tree.write("pepsi.conf", "[s]\n@inline@ pepsi.conf\n");
    assert_eq!(
        tree.load(),
        "error: <dir>/pepsi.conf:2: @inline@ <dir>/pepsi.conf would include itself \
         (<dir>/pepsi.conf -> <dir>/pepsi.conf)\n"
    );
}

#[test]
fn the_same_file_may_be_included_twice_in_sequence() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\n@inline@ x.conf\n[t]\n@inline@ x.conf\n")
        .write("x.conf", "[x]\nN = 1\n");
    assert_eq!(tree.load(), "[x] N = \"1\" @ <dir>/x.conf:2\n");
}

#[test]
fn secrets_override_in_name_order() {
    let tree = Tree::new();
    tree.write(
        "pepsi.conf",
        "[database]\nURL = postgres:///pepsi\nPASSWORD = none\n[s]\nKEEP = yes\n",
    )
    .write_mode(
        "secrets.d/20-db.conf",
        "[database]\nPASSWORD = second\n",
        0o600,
    )
    .write_mode(
        "secrets.d/10-db.conf",
        "[DATABASE]\npassword = first\nEXTRA = 1\n",
        0o640,
    )
    .write_mode(
        "secrets.d/README",
        "not a fragment, and readable by all\n",
        0o644,
    )
    .write_mode(
        "secrets.d/30-off.conf.disabled",
        "[database]\nPASSWORD = disabled\n",
        0o600,
    );
    assert_eq!(
        tree.load(),
        "\
[database] EXTRA = \"1\" @ <dir>/secrets.d/10-db.conf:3
[database] PASSWORD = \"second\" @ <dir>/secrets.d/20-db.conf:2
[database] URL = \"postgres:///pepsi\" @ <dir>/pepsi.conf:2
[s] KEEP = \"yes\" @ <dir>/pepsi.conf:5
"
    );
}

#[test]
fn a_world_readable_secret_is_refused() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\nA = 1\n")
        .write_mode("secrets.d/10-ok.conf", "[s]\nB = 2\n", 0o600)
        .write_mode("secrets.d/20-open.conf", "[s]\nC = 3\n", 0o644);
    assert_eq!(
        tree.load(),
        "error: <dir>/secrets.d/20-open.conf: secrets fragment is readable by every user \
         (mode 0644); run `chmod o-r <dir>/secrets.d/20-open.conf` and restart\n"
    );
}

#[test]
fn a_file_included_from_a_secret_is_held_to_the_same_rule() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\nA = 1\n")
        .write_mode("secrets.d/10.conf", "@inline@ ../keys/key.conf\n", 0o600)
        .write_mode("keys/key.conf", "[s]\nKEY = k\n", 0o604);
    assert_eq!(
        tree.load(),
        "error: <dir>/secrets.d/../keys/key.conf: secrets fragment is readable by every user \
         (mode 0604); run `chmod o-r <dir>/secrets.d/../keys/key.conf` and restart\n"
    );
}

#[test]
fn secrets_dir_from_paths() {
    let tree = Tree::new();
    tree.write(
        "pepsi.conf",
        "[PATHS]\nETC = private\nSECRETS_DIR = ${ETC}/keys\n[s]\nA = 1\n",
    )
    .write_mode("private/keys/a.conf", "[s]\nA = 2\n", 0o600)
    .write_mode("secrets.d/a.conf", "[s]\nA = not read\n", 0o600);
    assert!(
        tree.load()
            .contains("[s] A = \"2\" @ <dir>/private/keys/a.conf:2\n")
    );
}

#[test]
fn a_missing_secrets_directory_is_fine() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\nA = 1\n");
    assert_eq!(tree.load(), "[s] A = \"1\" @ <dir>/pepsi.conf:2\n");
}

#[test]
fn secret_values_are_never_shown() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "[s]\nA = 1\n").write_mode(
        "secrets.d/x.conf",
        "[s]\nPORT = hunter2\n",
        0o600,
    );
    let config = Config::load(&tree.path("pepsi.conf")).unwrap();
    let error = config
        .section("s")
        .number::<u16>("port")
        .unwrap_err()
        .to_string();
    assert!(!error.contains("hunter2"), "{error}");
    assert!(error.ends_with(
        "secrets.d/x.conf:2: [s] PORT = (value from a secrets fragment, not shown): expected a whole number"
    ));
    assert!(!format!("{config:?}").contains("hunter2"));
}

#[test]
fn main_file_errors_name_the_path() {
    let tree = Tree::new();
    assert_eq!(
        tree.load(),
        "error: <dir>/pepsi.conf: No such file or directory (os error 2)\n"
    );
    tree.write_mode("pepsi.conf", "[s]\n", 0o000);
    // Root reads any file, so only assert the refusal when the permission bits bind.
    if fs::read(tree.path("pepsi.conf")).is_err() {
        assert_eq!(
            tree.load(),
            "error: <dir>/pepsi.conf: Permission denied (os error 13)\n"
        );
    }
}

#[test]
fn default_location() {
    let explicit = Path::new("/srv/x.conf");
    let cases: &[(Option<&Path>, Option<&str>, &str, &str)] = &[
        (
            Some(explicit),
            Some("/env.conf"),
            "/srv/x.conf",
            "given with -c/--config",
        ),
        (
            None,
            Some("/env.conf"),
            "/env.conf",
            "named by the PEPSI_CONFIG environment variable",
        ),
        (
            None,
            Some(""),
            "/etc/pepsi/pepsi.conf",
            "the default location; use -c/--config or PEPSI_CONFIG to choose another",
        ),
        (
            None,
            None,
            "/etc/pepsi/pepsi.conf",
            "the default location; use -c/--config or PEPSI_CONFIG to choose another",
        ),
    ];
    for (explicit, env, path, how) in cases {
        let (chosen, why) = choose_location(*explicit, env.map(Into::into));
        assert_eq!((chosen.to_str().unwrap(), why), (*path, *how));
    }
}

#[test]
fn load_default_names_a_missing_explicit_file() {
    let tree = Tree::new();
    let path = tree.path("absent.conf");
    assert_eq!(
        Config::load_default(Some(&path)).unwrap_err().to_string(),
        format!(
            "configuration file {} does not exist (given with -c/--config)",
            path.display()
        )
    );
    tree.write("pepsi.conf", "[s]\nA = 1\n");
    let config = Config::load_default(Some(&tree.path("pepsi.conf"))).unwrap();
    assert_eq!(config.section("s").string("a").unwrap(), "1");
    assert_eq!(config.file(), tree.path("pepsi.conf"));
}

const GETTERS: &str = "\
[PATHS]
BASE = /var/lib/pepsi
[g]
TEXT = \"  hello  \"
EXPANDED = $BASE/queue
N = 42
BAD_N = many
NEG = -3
YES = On
BAD_BOOL = maybe
WAIT = 1h 30m
BARE_WAIT = 90
BAD_WAIT = soon
LIMIT = 10 MiB
BAD_LIMIT = 10 MB/s
DIR = ${BASE}/spool
EMPTY =
ITEMS = a, b  c,,d
MODE = RELAXED
BAD_MODE = loose
UNSET = ${PEPSI_SURELY_UNSET_VARIABLE}/x
";

/// Calls the getter `kind` on option `option` of section `[g]` above and renders its result
/// as `ok <debug>` or `err <message>`.
fn get(kind: &str, option: &str) -> String {
    let config = Config::from_str_named(GETTERS, "/etc/pepsi/pepsi.conf").unwrap();
    let g = config.section("G");
    fn show<T: fmt::Debug>(result: Result<T, ConfigError>) -> String {
        match result {
            Ok(value) => format!("ok {value:?}"),
            Err(error) => format!("err {error}"),
        }
    }
    match kind {
        "string" => show(g.string(option)),
        "string_opt" => show(g.string_opt(option)),
        "number" => show(g.number::<u32>(option)),
        "number_opt" => show(g.number_opt::<u32>(option)),
        "bool" => show(g.bool(option)),
        "bool_opt" => show(g.bool_opt(option)),
        "duration" => show(g.duration(option)),
        "duration_opt" => show(g.duration_opt(option)),
        "size" => show(g.size(option)),
        "size_opt" => show(g.size_opt(option)),
        "path" => show(g.path(option)),
        "path_opt" => show(g.path_opt(option)),
        "list" => show(g.list(option)),
        "list_opt" => show(g.list_opt(option)),
        "choice" => show(g.choice(option, &["strict", "relaxed", "off"])),
        "choice_opt" => show(g.choice_opt(option, &["strict", "relaxed", "off"])),
        _ => unreachable!("unknown getter {kind}"),
    }
}

#[test]
fn getters_table() {
    let f = "/etc/pepsi/pepsi.conf";
    let cases: &[(&str, &str, String)] = &[
        ("string", "TEXT", "ok \"  hello  \"".into()),
        ("string", "text", "ok \"  hello  \"".into()),
        ("string", "EXPANDED", "ok \"/var/lib/pepsi/queue\"".into()),
        ("string", "EMPTY", "ok \"\"".into()),
        ("string_opt", "TEXT", "ok Some(\"  hello  \")".into()),
        ("string_opt", "ABSENT", "ok None".into()),
        (
            "string",
            "ABSENT",
            format!("err {f}: [g] ABSENT is required but missing"),
        ),
        ("number", "N", "ok 42".into()),
        ("number_opt", "N", "ok Some(42)".into()),
        ("number_opt", "ABSENT", "ok None".into()),
        (
            "number",
            "BAD_N",
            format!("err {f}:7: [g] BAD_N = \"many\": expected a whole number"),
        ),
        (
            "number_opt",
            "BAD_N",
            format!("err {f}:7: [g] BAD_N = \"many\": expected a whole number"),
        ),
        (
            "number",
            "NEG",
            format!("err {f}:8: [g] NEG = \"-3\": expected a whole number from 0 to 4294967295"),
        ),
        (
            "number",
            "ABSENT",
            format!("err {f}: [g] ABSENT is required but missing"),
        ),
        ("bool", "YES", "ok true".into()),
        ("bool_opt", "ABSENT", "ok None".into()),
        (
            "bool",
            "BAD_BOOL",
            format!(
                "err {f}:10: [g] BAD_BOOL = \"maybe\": expected yes or no (also true/false, on/off, 1/0)"
            ),
        ),
        ("duration", "WAIT", "ok 5400s".into()),
        ("duration", "BARE_WAIT", "ok 90s".into()),
        ("duration_opt", "ABSENT", "ok None".into()),
        (
            "duration",
            "BAD_WAIT",
            format!(
                "err {f}:13: [g] BAD_WAIT = \"soon\": expected a duration such as 250ms, 30s, 5m, 2h, \
                 1d or 1h30m (a bare number is seconds)"
            ),
        ),
        ("size", "LIMIT", "ok 10485760".into()),
        ("size", "N", "ok 42".into()),
        ("size_opt", "ABSENT", "ok None".into()),
        (
            "size",
            "BAD_LIMIT",
            format!(
                "err {f}:15: [g] BAD_LIMIT = \"10 MB/s\": expected a size such as 4096, 64k, 10M or 2GiB \
                 (k, M, G and T are multiples of 1024)"
            ),
        ),
        ("path", "DIR", "ok \"/var/lib/pepsi/spool\"".into()),
        ("path_opt", "ABSENT", "ok None".into()),
        (
            "path",
            "EMPTY",
            format!("err {f}:17: [g] EMPTY = \"\": expected a path"),
        ),
        ("path", "EXPANDED", "ok \"/var/lib/pepsi/queue\"".into()),
        ("list", "ITEMS", "ok [\"a\", \"b\", \"c\", \"d\"]".into()),
        ("list", "EMPTY", "ok []".into()),
        ("list_opt", "ABSENT", "ok None".into()),
        ("choice", "MODE", "ok \"relaxed\"".into()),
        ("choice_opt", "ABSENT", "ok None".into()),
        (
            "choice",
            "BAD_MODE",
            format!("err {f}:20: [g] BAD_MODE = \"loose\": expected one of strict, relaxed, off"),
        ),
        (
            "choice",
            "ABSENT",
            format!("err {f}: [g] ABSENT is required but missing"),
        ),
        (
            "number",
            "EXPANDED",
            format!(
                "err {f}:5: [g] EXPANDED = \"$BASE/queue\" (expanded to \"/var/lib/pepsi/queue\"): \
                 expected a whole number"
            ),
        ),
        (
            "string",
            "UNSET",
            format!(
                "err {f}:21: [g] UNSET: variable PEPSI_SURELY_UNSET_VARIABLE is not set in [PATHS] \
                 or the environment and has no default"
            ),
        ),
        (
            "string_opt",
            "UNSET",
            format!(
                "err {f}:21: [g] UNSET: variable PEPSI_SURELY_UNSET_VARIABLE is not set in [PATHS] \
                 or the environment and has no default"
            ),
        ),
    ];
    for (kind, option, expected) in cases {
        assert_eq!(&get(kind, option), expected, "{kind}({option})");
    }
}

#[test]
fn expansion_reads_the_environment() {
    // PATH is set in every environment tests run in; no test changes the environment.
    let config = Config::from_str_named(
        "[PATHS]\nP = ${PATH}\n[s]\nA = $P\nB = ${PATH:-x}\n",
        "e.conf",
    )
    .unwrap();
    let path = std::env::var("PATH").unwrap();
    assert_eq!(config.section("s").string("A").unwrap(), path);
    assert_eq!(config.section("s").string("B").unwrap(), path);
}

#[test]
fn paths_shadow_the_environment() {
    let config =
        Config::from_str_named("[PATHS]\nPATH = /mine\n[s]\nA = $PATH/bin\n", "e.conf").unwrap();
    assert_eq!(config.section("s").string("A").unwrap(), "/mine/bin");
}

#[test]
fn the_missing_option_message_names_the_main_file_not_an_include() {
    let tree = Tree::new();
    tree.write("pepsi.conf", "@inline@ db.conf\n")
        .write("db.conf", "[database]\nPOOL = 4\n");
    let config = Config::load(&tree.path("pepsi.conf")).unwrap();
    assert_eq!(
        config
            .section("database")
            .string("URL")
            .unwrap_err()
            .to_string(),
        format!(
            "{}: [database] URL is required but missing",
            tree.path("pepsi.conf").display()
        )
    );
}

#[test]
fn debug_output_lists_names_and_origins_only() {
    let config = Config::from_str_named("[s]\nPASSWORD = hunter2\n", "d.conf").unwrap();
    assert_eq!(format!("{config:?}"), "{[s] PASSWORD: d.conf:2}");
}
