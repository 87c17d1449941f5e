//! `GET /setup`: the browser's setup of a new installation (docs/setup.md, "The online
//! setup"). Three states, decided on each request:
//!
//! - no administrator yet: the form that makes the first one (`POST /api/setup/admin`),
//!   which anyone who reaches the server may use once — the page says so;
//! - an administrator exists and the visitor has no session: the login form (401);
//! - an administrator's session: the interview (host name, mail domains, certificate, DKIM,
//!   relay, local delivery, a first mailbox) posted as one answer set to `POST
//!   /api/setup/tasks`, and below it every task's progress, live from `GET
//!   /api/setup/tasks` (`ui/setup.js`), and the check of a mail domain's DNS records (`GET
//!   /api/setup/dns-check`): which are missing or wrong, with the record to publish.
//!
//! Like every page, it acts only through the JSON API and runs no inline script.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::credentials;
use crate::extract::{AppState, Via};
use crate::pages::{Viewer, frame, login_markup, page};
use crate::store;

/// `GET /setup`.
pub async fn setup_page(State(state): State<AppState>, Viewer(who): Viewer) -> Response {
    let who = match who {
        Ok(Some(p)) => p,
        Ok(None) => {
            return match store::admin_count(&state.pool).await {
                Ok(0) => page(StatusCode::OK, first_admin_markup()),
                Ok(_) => page(StatusCode::UNAUTHORIZED, login_markup(None)),
                Err(e) => crate::error::ApiError::from(e).into_response(),
            };
        }
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            return page(StatusCode::UNAUTHORIZED, login_markup(Some(&e.message)));
        }
        Err(e) => return e.into_response(),
    };
    let csrf = match &who.via {
        Via::Session { secret } => credentials::csrf_token(secret),
        Via::Token { .. } => String::new(),
    };
    page(
        StatusCode::OK,
        wizard_markup(&who.name, &csrf, state.config_pool.is_some()),
    )
}

fn first_admin_markup() -> Markup {
    frame(
        "Set up",
        "setup.js",
        html! {
            main.login #first-admin {
                h1 { "Set up Pepsi" }
                p { "This server has no administrator yet. The first one is made here; after that, this form is gone and the setup needs that administrator's login." }
                form #admin-form {
                    label { "Administrator name" input #admin-name name="name" autocomplete="username" required autofocus; }
                    label { "Password (at least 12 characters)" input #admin-password name="password" type="password" autocomplete="new-password" minlength="12" required; }
                    button #admin-submit type="submit" { "Make the administrator" }
                    p #admin-message role="alert" {}
                }
            }
        },
    )
}

fn text_field(id: &str, label: &str, value: &str, hint: &str) -> Markup {
    html! {
        label for=(id) { (label) }
        input #(id) name=(id) value=(value);
        @if !hint.is_empty() { small.hint { (hint) } }
        span.field-error data-field=(id) role="alert" {}
    }
}

fn wizard_markup(name: &str, csrf: &str, writable: bool) -> Markup {
    let selector = chrono::Utc::now().format("s%Y%m").to_string();
    frame(
        "Set up",
        "setup.js",
        html! {
            header.bar {
                h1 { "Set up Pepsi" }
                span.who { "logged in as " b { (name) } }
            }
            main #setup data-csrf=(csrf) {
                @if !writable {
                    p.problem role="alert" { "Tasks cannot be written: [pepsi-httpd] CONFIG_DATABASE_URL (a connection as the pepsi-config database role) is not set." }
                }
                p { "The answers become setup tasks; " code { "pepsi-setup apply" } ", running as root, carries them out and reports each step below. Nothing changes until it does." }
                form #setup-form {
                    fieldset {
                        legend { "This server" }
                        (text_field("hostname", "Host name (the MX)", "", "e.g. mail.example.org"))
                        (text_field("domains", "Mail domains", "", "separated by spaces; the first is the primary one"))
                    }
                    fieldset {
                        legend { "TLS certificate" }
                        label { input type="radio" name="certificate" value="acme" checked; " Obtain one over ACME (Let's Encrypt)" }
                        label { input type="radio" name="certificate" value="files"; " Files already on this host" }
                        div data-when="certificate=acme" {
                            (text_field("acme-email", "Contact address at the ACME server", "", ""))
                            (text_field("acme-directory", "ACME directory URL", "https://acme-v02.api.letsencrypt.org/directory", ""))
                            (text_field("acme-ca-file", "CA file for a private ACME server (optional)", "", ""))
                        }
                        div data-when="certificate=files" {
                            (text_field("tls-certificate", "Certificate chain (PEM)", "", "an absolute path"))
                            (text_field("tls-key", "Private key (PEM)", "", "an absolute path"))
                        }
                        span.field-error data-field="certificate" role="alert" {}
                    }
                    fieldset {
                        legend { "DKIM" }
                        (text_field("dkim-selector", "Selector", &selector, "one key per mail domain under this selector"))
                        label for="dkim-algorithm" { "Algorithm" }
                        select #dkim-algorithm { option value="rsa" selected { "RSA 2048" } option value="ed25519" { "Ed25519" } }
                        span.field-error data-field="dkim" role="alert" {}
                    }
                    fieldset {
                        legend { "Outbound mail" }
                        label { input type="radio" name="relay" value="direct" checked; " Straight to each domain's MX hosts" }
                        label { input type="radio" name="relay" value="smarthost"; " Through a smarthost, with a password" }
                        label { input type="radio" name="relay" value="oauth2"; " Through a smarthost, with OAuth 2.0 (Microsoft 365, Gmail)" }
                        div data-when="relay=smarthost|oauth2" {
                            (text_field("smarthost-server", "Smarthost (host:port)", "", "e.g. smtp.provider.example:587"))
                            label for="smarthost-tls" { "TLS" }
                            select #smarthost-tls { option value="verify" selected { "STARTTLS, certificate verified" } option value="encrypt" { "STARTTLS, certificate not checked" } }
                            (text_field("smarthost-username", "User name", "", ""))
                        }
                        div data-when="relay=smarthost" {
                            label for="smarthost-password" { "Password" }
                            input #smarthost-password type="password" autocomplete="off";
                        }
                        div data-when="relay=oauth2" {
                            (text_field("oauth-token-endpoint", "Token endpoint", "", "the provider's, https://"))
                            (text_field("oauth-client-id", "Client id", "", ""))
                            label for="oauth-client-secret" { "Client secret (empty for a public client)" }
                            input #oauth-client-secret type="password" autocomplete="off";
                            label for="oauth-refresh-token" { "Refresh token" }
                            input #oauth-refresh-token type="password" autocomplete="off";
                        }
                        span.field-error data-field="relay" role="alert" {}
                    }
                    fieldset {
                        legend { "Local delivery" }
                        label { input type="radio" name="delivery" value="maildir" checked; " Maildirs on this host" }
                        label { input type="radio" name="delivery" value="lmtp"; " LMTP to a mailbox server (Dovecot)" }
                        div data-when="delivery=maildir" {
                            (text_field("maildir-root", "Maildir root", "/var/lib/pepsi/mail", ""))
                        }
                        div data-when="delivery=lmtp" {
                            (text_field("lmtp-server", "LMTP server (host:port)", "127.0.0.1:24", ""))
                        }
                        span.field-error data-field="delivery" role="alert" {}
                    }
                    fieldset {
                        legend { "Optional features" }
                        label { input #feature-vacation type="checkbox" checked; " Out-of-office replies (the vacation stage)" }
                        label { input #feature-whitelist type="checkbox" checked; " Sender whitelists (the whitelist stage)" }
                        label { input #feature-language type="checkbox"; " Language blocks for local mail (language detection and blocking)" }
                        label { input #feature-encryption type="checkbox"; " Encrypt outgoing mail to recipients with published keys" }
                        (text_field("feature-milter", "Content filter (milter) for inbound mail (optional)", "", "inet:HOST:PORT or unix:/path, e.g. rspamd's inet:127.0.0.1:11332"))
                        small.hint { "an unchecked feature's stages are taken out of the path; checked again, they go back" }
                        span.field-error data-field="features" role="alert" {}
                    }
                    fieldset {
                        legend { "First mailbox (optional)" }
                        (text_field("mailbox-address", "Address", "", "in one of the mail domains"))
                        label for="mailbox-password" { "Password" }
                        input #mailbox-password type="password" autocomplete="new-password";
                        span.field-error data-field="mailboxes" role="alert" {}
                    }
                    button #setup-submit type="submit" disabled[!writable] { "Write the setup tasks" }
                    p #setup-message role="alert" {}
                }
                section #dns-check {
                    h2 { "DNS records" }
                    p { "What a mail domain publishes, looked up now: each record missing or wrong is named with the exact record to publish." }
                    form #check-form {
                        label for="check-domain" { "Mail domain" }
                        input #check-domain name="check-domain" required;
                        button #check-submit type="submit" { "Check" }
                        p #check-message role="alert" {}
                    }
                    table #dns-checks {
                        thead { tr { th { "record" } th { "name" } th { "status" } th { "found" } th { "what to publish, or why" } } }
                        tbody {}
                    }
                }
                section #progress {
                    h2 { "Tasks" }
                    table #tasks {
                        thead { tr { th { "task" } th { "kind" } th { "status" } th { "outcome" } } }
                        tbody {}
                    }
                    div #task-logs {}
                }
            }
        },
    )
}
