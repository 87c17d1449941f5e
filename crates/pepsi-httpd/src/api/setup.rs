//! The online setup's API (docs/setup.md, "The online setup"): the first administrator of a
//! new installation, the setup tasks the wizard's answers become, and their progress.
//!
//! pepsi-httpd never carries a task out: it validates the answers with
//! `pepsi_setup_model` and writes the tasks to `pepsi.setup_task` through the pool of
//! `CONFIG_DATABASE_URL` (the configuration role, the only one that may), and `pepsi-setup
//! apply`, as root, does the rest. Progress is read back from `pepsi.setup_task` and
//! `pepsi.setup_task_log` with the httpd role's SELECT. A typed mailbox password is hashed
//! here (Argon2id) before any task is made of it, so no password reaches the table.
//!
//! `GET /api/setup/dns-check` looks up what a mail domain publishes and says which record is
//! missing or wrong, with the record to publish (`pepsi_setup::dns_check`, the check of
//! `pepsi-setup check-dns`).
//!
//! `POST /api/setup/admin` needs no credential, and works only while there is no
//! administrator at all: it is how the first one is made from the browser.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use pepsi_admin::password;
use pepsi_setup_model::{Answers, Task};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, ClientAddr, Pairs, Principal};
use crate::{credentials, store};

/// The shortest password the first administrator may choose.
pub const MIN_ADMIN_PASSWORD: usize = 12;

/// How many recent tasks `GET /api/setup/tasks` shows, and log lines per task.
const TASKS_SHOWN: i64 = 50;
const LINES_PER_TASK: i64 = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirstAdmin {
    name: String,
    password: String,
}

/// `GET /api/setup`: whether the first administrator still has to be made (no credential:
/// the setup page asks before it knows who is there) and whether tasks can be written.
pub async fn status(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let admins = store::admin_count(&state.pool).await?;
    Ok(Json(json!({
        "administrator_exists": admins > 0,
        "tasks_writable": state.config_pool.is_some(),
    })))
}

/// `POST /api/setup/admin`: makes the first administrator and logs it in (the session
/// cookie, as `POST /api/login` sets it); 409 once any administrator exists.
pub async fn first_admin(
    State(state): State<AppState>,
    client: ClientAddr,
    Body(req): Body<FirstAdmin>,
) -> ApiResult<Response> {
    let name = req.name.trim().to_owned();
    if !credentials::valid_admin_name(&name) {
        return Err(ApiError::bad_request(format!(
            "administrator name {name:?} must be 1 to 64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"
        )));
    }
    if req.password.len() < MIN_ADMIN_PASSWORD || req.password.len() > password::MAX_PASSWORD_LEN {
        return Err(ApiError::bad_request(format!(
            "the password must be {MIN_ADMIN_PASSWORD} to {} bytes long",
            password::MAX_PASSWORD_LEN
        )));
    }
    if store::admin_count(&state.pool).await? > 0 {
        return Err(ApiError::conflict(
            "an administrator exists already: log in (POST /api/login)",
        ));
    }
    let typed = req.password.into_bytes();
    let hash = tokio::task::spawn_blocking(move || password::hash_password(&typed))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format!("cannot hash the password: {e}")))?;
    let actor = crate::extract::actor_named(&name);
    if !store::create_first_admin(&state.pool, &actor, &name, &hash)
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::conflict(
            "an administrator exists already: log in (POST /api/login)",
        ));
    }
    let (secret, set_cookie) =
        super::session::start_session(&state, &actor, &name, client.ip()).await?;
    let mut r = (
        StatusCode::CREATED,
        Json(json!({
            "name": name,
            "csrf_token": credentials::csrf_token(&secret),
        })),
    )
        .into_response();
    r.headers_mut().insert(header::SET_COOKIE, set_cookie);
    Ok(r)
}

/// One task as the page shows it: never its parameters (a secret may still be in them).
#[derive(Debug, Serialize)]
pub struct TaskShown {
    task_id: i64,
    kind: String,
    status: String,
    outcome: String,
    attempts: i32,
    created_at: chrono::DateTime<chrono::Utc>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    log: Vec<LogLine>,
}

#[derive(Debug, Serialize)]
pub struct LogLine {
    #[serde(skip)]
    task_id: i64,
    line_no: i32,
    at: chrono::DateTime<chrono::Utc>,
    stream: String,
    line: String,
}

/// `POST /api/setup/tasks`: the wizard's answers, validated and written as tasks for
/// `pepsi-setup apply`; 422 with every refused field, 409 without `CONFIG_DATABASE_URL`.
pub async fn submit(
    State(state): State<AppState>,
    who: Principal,
    Body(mut answers): Body<Answers>,
) -> ApiResult<Response> {
    let pool = state.config_pool.clone().ok_or_else(|| {
        ApiError::conflict(
            "setup tasks cannot be written here: [pepsi-httpd] CONFIG_DATABASE_URL (a \
             connection as the pepsi-config database role) is not set (docs/httpd.md)",
        )
    })?;
    if answers.mailboxes.len() > pepsi_setup_model::task::MAX_NAMES {
        return Err(ApiError::bad_request(format!(
            "more than {} mailboxes at once",
            pepsi_setup_model::task::MAX_NAMES
        )));
    }
    if answers
        .mailboxes
        .iter()
        .filter_map(|m| m.password.as_ref())
        .any(|p| p.is_empty() || p.len() > password::MAX_PASSWORD_LEN)
    {
        return Err(ApiError::bad_request(format!(
            "a mailbox password must be 1 to {} bytes long",
            password::MAX_PASSWORD_LEN
        )));
    }
    answers = tokio::task::spawn_blocking(move || {
        answers
            .hash_passwords(|p| password::hash_password(p.as_bytes()))
            .map(|()| answers)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| ApiError::internal(format!("cannot hash a password: {e}")))?;
    let tasks = match answers.tasks() {
        Ok(tasks) => tasks,
        Err(fields) => {
            return Ok((
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({
                    "error": format!(
                        "{} answer(s) refused: {}",
                        fields.len(),
                        fields.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
                    ),
                    "fields": fields,
                })),
            )
                .into_response());
        }
    };
    let mut tx = pool.begin().await?;
    let mut written = Vec::with_capacity(tasks.len());
    for task in &tasks {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.setup_task (kind, params) VALUES ($1, $2) RETURNING task_id",
        )
        .bind(task.kind())
        .bind(task.params())
        .fetch_one(&mut *tx)
        .await?;
        written.push(json!({"task_id": id, "kind": task.kind()}));
    }
    let kinds: Vec<&str> = tasks.iter().map(Task::kind).collect();
    pepsi_contract::audit::record(
        &mut tx,
        &who.actor(),
        "setup.tasks",
        None,
        json!({"kinds": kinds}),
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(json!({ "tasks": written }))).into_response())
}

/// `GET /api/setup/tasks[?after=ID]`: the most recent tasks (or those after ID), newest
/// last, each with its log.
pub async fn list(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let mut after: i64 = 0;
    for (key, value) in &pairs {
        match key.as_str() {
            "after" => {
                after = value.parse().map_err(|_| {
                    ApiError::bad_request(format!("after={value:?} is not a task id"))
                })?;
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?} (after)"
                )));
            }
        }
    }
    type TaskRow = (
        i64,
        String,
        String,
        String,
        i32,
        chrono::DateTime<chrono::Utc>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let rows: Vec<TaskRow> = sqlx::query_as(
        "SELECT * FROM (SELECT task_id, kind, status, outcome, attempts, created_at, finished_at \
         FROM pepsi.setup_task WHERE task_id > $1 ORDER BY task_id DESC LIMIT $2) t \
         ORDER BY task_id",
    )
    .bind(after)
    .bind(TASKS_SHOWN)
    .fetch_all(&state.pool)
    .await?;
    let mut tasks: Vec<TaskShown> = rows
        .into_iter()
        .map(
            |(task_id, kind, status, outcome, attempts, created_at, finished_at)| TaskShown {
                task_id,
                kind,
                status,
                outcome,
                attempts,
                created_at,
                finished_at,
                log: Vec::new(),
            },
        )
        .collect();
    let ids: Vec<i64> = tasks.iter().map(|t| t.task_id).collect();
    let lines: Vec<(i64, i32, chrono::DateTime<chrono::Utc>, String, String)> = sqlx::query_as(
        "SELECT task_id, line_no, at, stream, line FROM ( \
           SELECT *, row_number() OVER (PARTITION BY task_id ORDER BY line_no DESC) AS n \
           FROM pepsi.setup_task_log WHERE task_id = ANY($1)) l \
         WHERE n <= $2 ORDER BY task_id, line_no",
    )
    .bind(&ids)
    .bind(LINES_PER_TASK)
    .fetch_all(&state.pool)
    .await?;
    let lines = lines
        .into_iter()
        .map(|(task_id, line_no, at, stream, line)| LogLine {
            task_id,
            line_no,
            at,
            stream,
            line,
        });
    for line in lines {
        if let Some(t) = tasks.iter_mut().find(|t| t.task_id == line.task_id) {
            t.log.push(line);
        }
    }
    Ok(Json(json!({ "tasks": tasks })))
}

/// `GET /api/setup/dns-check?domain=D[&selector=S]`: the DNS records `D` publishes checked
/// against what it should publish with `[pepsi] HOSTNAME` as its MX, through `[pepsi]
/// DNS_SERVERS` (else the system's resolver). The DKIM key is read through the
/// configuration role's connection (the httpd role may not read the keys); without it the
/// DKIM record is reported unchecked.
pub async fn dns_check(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<pepsi_setup::dns_check::Report>> {
    let (mut domain, mut selector) = (None, None);
    for (key, value) in pairs {
        match key.as_str() {
            "domain" => domain = Some(value),
            "selector" => selector = Some(value),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?} (domain, selector)"
                )));
            }
        }
    }
    let domain = domain.ok_or_else(|| ApiError::bad_request("domain= is required"))?;
    let domain =
        pepsi_setup_model::name::check_name("domain", &domain).map_err(ApiError::bad_request)?;
    if let Some(s) = &selector {
        pepsi_setup_model::name::check_selector(s).map_err(ApiError::bad_request)?;
    }
    let pepsi = state.cfg.section("pepsi");
    let mx = state
        .cfg
        .name_option(&pepsi, "HOSTNAME")
        .map_err(|e| ApiError::conflict(format!("[pepsi] HOSTNAME: {e}")))?;
    let (servers, timeout) = pepsi_setup::dns_check::resolver_options(&state.cfg)
        .map_err(|e| ApiError::conflict(e.to_string()))?;
    let reports = format!("postmaster@{domain}");
    let mut conn = match &state.config_pool {
        Some(pool) => Some(pool.acquire().await?),
        None => None,
    };
    let expected = pepsi_setup::dns_check::expected(
        conn.as_deref_mut(),
        domain,
        mx,
        selector.as_deref(),
        reports,
    )
    .await
    .map_err(ApiError::internal)?;
    drop(conn);
    let report = pepsi_setup::dns_check::run(&servers, timeout, &expected)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(report))
}
