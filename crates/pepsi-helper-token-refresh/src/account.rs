//! The accounts whose tokens the helper keeps fresh: one `[token-<name>]` section each of
//! the pepsi configuration, read and checked at start. Pure over a loaded `Config`.

use std::path::PathBuf;
use std::time::Duration;

use pepsi_conf::config::{Config, ConfigError, Section, parse_duration};

use crate::grant::{Client, ClientAuth};

/// The prefix of an account's section: `[token-m365]` is the account `m365`.
pub const SECTION_PREFIX: &str = "token-";
/// `REFRESH_BEFORE` when unset: refresh a token once it expires within this time.
pub const DEFAULT_REFRESH_BEFORE: Duration = Duration::from_secs(10 * 60);
/// `TIMEOUT` when unset: one refresh request, connection and answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `TIMEOUT` taken.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a token is taken to be valid when the server does not say (`expires_in`).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// One account, as its section says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The `<name>` of `[token-<name>]`, in lower case.
    pub name: String,
    /// `TOKEN_ENDPOINT`: the authorisation server's token endpoint, `https://`.
    pub endpoint: String,
    /// `CLIENT_ID`, `CLIENT_SECRET` (from secrets.d) and `CLIENT_AUTH`.
    pub client: Client,
    /// `SCOPE`, sent with the refresh when set.
    pub scope: Option<String>,
    /// `REFRESH_TOKEN_FILE`: the refresh token, one line; replaced when the server
    /// rotates it.
    pub refresh_token_file: PathBuf,
    /// `TOKEN_FILE`: where the access token is written (`token_file`'s format).
    pub token_file: PathBuf,
    /// `REFRESH_BEFORE`.
    pub refresh_before: Duration,
    /// `TIMEOUT`.
    pub timeout: Duration,
    /// `TLS_CA_FILE`: the CAs the endpoint's certificate must chain to, instead of the web
    /// PKI's roots.
    pub ca_file: Option<PathBuf>,
}

/// `TOKEN_ENDPOINT`: an `https://` URL with a host, at most 2000 characters, no fragment.
/// A token endpoint is always reached over TLS (RFC 6749 §3.2): the refresh token and the
/// client's secret travel in the request.
pub fn check_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    let expected = || format!("an https:// URL of a token endpoint, not {text:?}");
    if text.len() > 2000 || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(expected());
    }
    let url = reqwest::Url::parse(text).map_err(|e| format!("{}: {e}", expected()))?;
    if url.scheme() != "https" || url.host_str().is_none_or(str::is_empty) {
        return Err(expected());
    }
    if url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{}: no fragment or user name in it (CLIENT_ID and CLIENT_SECRET say who asks)",
            expected()
        ));
    }
    Ok(text.to_owned())
}

/// A duration from 1 second to `max`.
fn bounded(max: Duration) -> impl Fn(&str) -> Result<Duration, String> {
    move |v| {
        let d = parse_duration(v)?;
        if d < Duration::from_secs(1) || d > max {
            return Err(format!("a duration from 1s to {}s", max.as_secs()));
        }
        Ok(d)
    }
}

fn account(s: &Section<'_>, name: String) -> Result<Account, ConfigError> {
    let auth = match s.choice_opt("CLIENT_AUTH", &["body", "basic"])?.as_deref() {
        Some("basic") => ClientAuth::Basic,
        _ => ClientAuth::Body,
    };
    Ok(Account {
        endpoint: s.parse("TOKEN_ENDPOINT", check_endpoint)?,
        client: Client {
            id: s.parse("CLIENT_ID", |v| {
                let v = v.trim();
                if v.is_empty() || v.chars().any(char::is_control) {
                    Err("the client id the provider registered".to_owned())
                } else {
                    Ok(v.to_owned())
                }
            })?,
            secret: s.string_opt("CLIENT_SECRET")?.filter(|v| !v.is_empty()),
            auth,
        },
        scope: s
            .string_opt("SCOPE")?
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|v| !v.is_empty()),
        refresh_token_file: s.path("REFRESH_TOKEN_FILE")?,
        token_file: s.path("TOKEN_FILE")?,
        refresh_before: s
            .parse_opt("REFRESH_BEFORE", bounded(Duration::from_secs(24 * 3600)))?
            .unwrap_or(DEFAULT_REFRESH_BEFORE),
        timeout: s
            .parse_opt("TIMEOUT", bounded(MAX_TIMEOUT))?
            .unwrap_or(DEFAULT_TIMEOUT),
        ca_file: s.path_opt("TLS_CA_FILE")?,
        name,
    })
}

/// Every `[token-<name>]` section of `cfg`, in name order.
pub fn accounts(cfg: &Config) -> Result<Vec<Account>, ConfigError> {
    let mut names: Vec<String> = cfg
        .sections()
        .filter_map(|s| {
            let lower = s.to_ascii_lowercase();
            lower
                .strip_prefix(SECTION_PREFIX)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let s = cfg.section(&format!("{SECTION_PREFIX}{name}"));
            account(&s, name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Account>, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        accounts(&cfg).map_err(|e| e.to_string())
    }

    const M365: &str = "[token-M365]\n\
        TOKEN_ENDPOINT = https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token\n\
        CLIENT_ID = 9e5f94bc-e8a4-4e73-b8be-63364c29d753\nCLIENT_SECRET = s3cret\n\
        SCOPE = https://outlook.office.com/SMTP.Send   offline_access\n\
        REFRESH_TOKEN_FILE = /var/lib/pepsi/tokens/m365.refresh\n\
        TOKEN_FILE = /var/lib/pepsi/tokens/m365.json\n";

    #[test]
    fn accounts_table() {
        assert_eq!(parse("[pepsi]\nHOSTNAME = x\n").unwrap(), vec![]);
        let all = parse(&format!(
            "{M365}[token-gmail]\nTOKEN_ENDPOINT = https://oauth2.googleapis.com/token\n\
             CLIENT_ID = 1234.apps.googleusercontent.com\nCLIENT_AUTH = Basic\n\
             REFRESH_TOKEN_FILE = /t/g.refresh\nTOKEN_FILE = /t/g.json\nREFRESH_BEFORE = 20m\n\
             TIMEOUT = 5s\nTLS_CA_FILE = /etc/ca.pem\n[token-]\nX = 1\n"
        ))
        .unwrap();
        let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["gmail", "m365"]);
        let (g, m) = (&all[0], &all[1]);
        assert_eq!(
            m.endpoint,
            "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token"
        );
        assert_eq!(m.client.secret.as_deref(), Some("s3cret"));
        assert_eq!(m.client.auth, ClientAuth::Body);
        assert_eq!(
            m.scope.as_deref(),
            Some("https://outlook.office.com/SMTP.Send offline_access")
        );
        assert_eq!(
            m.token_file,
            PathBuf::from("/var/lib/pepsi/tokens/m365.json")
        );
        assert_eq!(
            (m.refresh_before, m.timeout, m.ca_file.clone()),
            (DEFAULT_REFRESH_BEFORE, DEFAULT_TIMEOUT, None)
        );
        assert_eq!(g.client.auth, ClientAuth::Basic);
        assert_eq!((g.client.secret.clone(), g.scope.clone()), (None, None));
        assert_eq!(g.refresh_before, Duration::from_secs(1200));
        assert_eq!(g.timeout, Duration::from_secs(5));
        assert_eq!(g.ca_file, Some(PathBuf::from("/etc/ca.pem")));

        // Errors name the file, the line, the section and option, and what was expected.
        let check = |text: String, wanted: &[&str]| {
            let err = parse(&text).unwrap_err();
            for w in wanted {
                assert!(err.contains(w), "{text:?}: {err}");
            }
        };
        check(
            M365.replace("https://login", "http://login"),
            &["t.conf:2", "[token-M365] TOKEN_ENDPOINT", "an https:// URL"],
        );
        check(
            M365.replace(
                "https://login.microsoftonline.com",
                "https://u@login.example",
            ),
            &["t.conf:2", "no fragment or user name"],
        );
        check(
            M365.replace("TOKEN_FILE = /var/lib/pepsi/tokens/m365.json\n", ""),
            &["[token-M365] TOKEN_FILE is required"],
        );
        check(
            M365.replace("CLIENT_ID = 9e5f94bc-e8a4-4e73-b8be-63364c29d753\n", ""),
            &["CLIENT_ID is required"],
        );
        check(
            format!("{M365}TIMEOUT = 1h\n"),
            &["t.conf:8", "TIMEOUT", "from 1s to 300s"],
        );
        check(
            format!("{M365}CLIENT_AUTH = jwt\n"),
            &["t.conf:8", "CLIENT_AUTH", "basic"],
        );
    }
}
