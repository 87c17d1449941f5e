//! `pepsi-setup apply`: carries out the rows of `pepsi.setup_task`, as root.
//!
//! One applier at a time (an advisory lock for the life of the process). Each pending task
//! is taken in order, marked running, checked — written by the configuration role, and a
//! task of its kind by `pepsi_setup_model::Task::from_row` — and carried out by its
//! [`plan::Plan`]: the steps before (idempotent), then every edit of `pepsi.conf` in one
//! atomic replacement after the candidate file has passed every program's parser (the
//! `pepsi-config check` of the candidate), then the steps after. Each step writes a line
//! to `pepsi.setup_task_log`; the task ends done, failed or refused with a line for a
//! person in `outcome`, and its secrets replaced by `(redacted)`.
//!
//! A failed task changes nothing in force: the configuration is replaced only at its last
//! step, a file a step before it wrote or removed (a secrets fragment, a refresh token) is
//! put back as it was (`Kept`), and a step before it that stays (a key stored) is one a
//! second run finds in place. A step that needs the new configuration before it is in
//! force (the first OAuth 2.0 access token) runs against the checked candidate. When the
//! applier dies during a task, the next one finds it running, logs that and runs it again
//! (at most [`MAX_ATTEMPTS`] times).

pub mod acme;
pub mod features;
pub mod plan;
pub mod programs;

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use anyhow::{Context as _, anyhow, bail};
use pepsi_conf::config::Config;
use pepsi_conf::config::edit::{self, Edit};
use pepsi_contract::audit::Actor;
use pepsi_setup_model::task::{KeyAlgorithm, Task};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::schema::{self, Roles};
use plan::{Layout, Plan, Step};

/// How many times a task is started before one that keeps stopping the applier is failed.
pub const MAX_ATTEMPTS: i32 = 3;

/// Longest line kept in the task log (the column's bound).
const MAX_LINE: usize = 2000;

/// The `[pepsi-setup]` options of `apply`.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// `CHECK_PROGRAM`: runs every program's parser over a candidate configuration
    /// (`<program> -c <candidate> check`); default `pepsi-config` beside this program.
    pub check_program: PathBuf,
    /// `RELOAD_COMMAND`: run (without a shell) after the configuration changed, so the
    /// services read it; default `systemctl try-reload-or-restart pepsi.target`, empty for
    /// none.
    pub reload_command: Vec<String>,
    /// `SECRETS_GROUP`: the group that may read what apply writes to `secrets.d/` (0640
    /// root:group); default `pepsi`.
    pub secrets_group: String,
    /// How certbot runs for a `tls_acme` task (`CERTBOT`, `ACME_*`).
    pub acme: acme::AcmeOptions,
    /// `TOKEN_REFRESH_PROGRAM`: gets an OAuth 2.0 credential's first access token
    /// (`<program> -c <candidate> once --force <account>`); default
    /// `pepsi-helper-token-refresh` beside this program.
    pub token_refresh_program: PathBuf,
    /// `TOKEN_USER`: the account that owns the refresh tokens and runs
    /// `TOKEN_REFRESH_PROGRAM`, as its timer does; default `pepsi-token`. It must exist when
    /// a task needs it.
    pub token_user: String,
    /// `DATABASE_ACCOUNT`: when apply runs as root and the database URL is a Unix socket,
    /// the account its connections are made as, so that peer authentication gives that
    /// account's role — the server's superuser, as `pepsi-setup db` runs under `runuser -u
    /// postgres` — and the account `CHECK_PROGRAM` runs as (with `SECRETS_GROUP`);
    /// default `postgres`, empty for none (connect as root).
    pub database_account: Option<String>,
}

impl ApplyOptions {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let s = cfg.section("pepsi-setup");
        let beside = |program: &str| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join(program)))
                .unwrap_or_else(|| PathBuf::from(program))
        };
        Ok(Self {
            check_program: s
                .path_opt("CHECK_PROGRAM")?
                .unwrap_or_else(|| beside("pepsi-config")),
            reload_command: match s.string_opt("RELOAD_COMMAND")? {
                Some(text) => text.split_whitespace().map(str::to_owned).collect(),
                None => ["systemctl", "try-reload-or-restart", "pepsi.target"]
                    .map(str::to_owned)
                    .to_vec(),
            },
            secrets_group: s
                .string_opt("SECRETS_GROUP")?
                .unwrap_or_else(|| "pepsi".into()),
            acme: acme::AcmeOptions::from_config(cfg)?,
            token_refresh_program: s
                .path_opt("TOKEN_REFRESH_PROGRAM")?
                .unwrap_or_else(|| beside("pepsi-helper-token-refresh")),
            token_user: s
                .string_opt("TOKEN_USER")?
                .unwrap_or_else(|| "pepsi-token".into()),
            database_account: match s.string_opt("DATABASE_ACCOUNT")? {
                Some(name) if name.trim().is_empty() => None,
                Some(name) => Some(name.trim().to_owned()),
                None => Some("postgres".into()),
            },
        })
    }
}

/// What one run of the applier did.
#[derive(Debug, Default)]
pub struct Summary {
    pub done: usize,
    pub failed: usize,
    pub refused: usize,
}

/// The applier: the database, the configuration file it edits and its options.
pub struct Applier {
    pool: PgPool,
    /// How each connection is made: the URL's options, with the account's role when the
    /// connections are made as `DATABASE_ACCOUNT`.
    connect: sqlx::postgres::PgConnectOptions,
    /// `DATABASE_ACCOUNT`, when the connections are made as it.
    db_account: Option<pepsi_conf::privilege::Account>,
    roles: Roles,
    config_path: PathBuf,
    options: ApplyOptions,
    /// Holds the advisory lock that makes this the only applier.
    _lock: sqlx::pool::PoolConnection<sqlx::Postgres>,
}

/// The advisory lock key of `apply` (`hashtext('pepsi-setup apply')` would do as well; a
/// constant is plainer in `pg_locks`).
const APPLY_LOCK: i64 = 0x7065_7073_6961_7079;

impl Applier {
    pub async fn open(url: &str, config_path: &Path) -> anyhow::Result<Applier> {
        let cfg = Config::load(config_path)?;
        let roles = Roles::from_config(&cfg)?;
        let options = ApplyOptions::from_config(&cfg)?;
        let mut connect = schema::connect_options(url)?;
        let socket = connect.get_socket().is_some() || connect.get_host().starts_with('/');
        let db_account = match &options.database_account {
            Some(name) if socket && pepsi_conf::privilege::is_root() => {
                let account = pepsi_conf::privilege::account(name)
                    .with_context(|| {
                        format!("cannot look the account {name} (DATABASE_ACCOUNT) up")
                    })?
                    .ok_or_else(|| {
                        anyhow!("the account {name} (DATABASE_ACCOUNT) does not exist")
                    })?;
                // A URL naming no user names root's role here: the account's instead.
                if connect.get_username() == "root" {
                    connect = connect.username(name);
                }
                Some(account)
            }
            _ => None,
        };
        // Every connection of the pool is opened now, as the account, and kept: one
        // reopened later would be root's.
        let pool = {
            let _as = switch(db_account.as_ref())?;
            let pool = PgPoolOptions::new()
                .max_connections(3)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(connect.clone())
                .await
                .with_context(|| match &db_account {
                    Some(a) => format!("cannot connect to the database as the account {}", a.name),
                    None => "cannot connect to the database".to_owned(),
                })?;
            let (a, b, c) = tokio::join!(pool.acquire(), pool.acquire(), pool.acquire());
            drop((a?, b?, c?));
            pool
        };
        let mut lock = pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(APPLY_LOCK)
            .fetch_one(&mut *lock)
            .await?;
        if !locked {
            bail!("another pepsi-setup apply is running on this database");
        }
        Ok(Applier {
            pool,
            connect,
            db_account,
            roles,
            config_path: config_path.to_owned(),
            options,
            _lock: lock,
        })
    }

    /// Tasks a stopped applier left running are pending again, each with a log line.
    pub async fn recover(&self) -> anyhow::Result<()> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "UPDATE pepsi.setup_task SET status = 'pending' WHERE status = 'running' \
             RETURNING task_id",
        )
        .fetch_all(&self.pool)
        .await?;
        for id in ids {
            TaskLog::open(&self.pool, id)
                .await?
                .step("the applier stopped while this task ran; it runs again")
                .await?;
        }
        Ok(())
    }

    /// Carries out every pending task, oldest first.
    pub async fn drain(&self, summary: &mut Summary) -> anyhow::Result<()> {
        while let Some(row) = self.take().await? {
            let id = row.0;
            let (status, outcome, params) = self.run(row).await?;
            match status {
                "done" => summary.done += 1,
                "failed" => summary.failed += 1,
                _ => summary.refused += 1,
            }
            println!("task {id}: {status}: {outcome}");
            sqlx::query(
                "UPDATE pepsi.setup_task SET status = $2, outcome = $3, finished_at = now(), \
                 params = COALESCE($4, params) WHERE task_id = $1",
            )
            .bind(id)
            .bind(status)
            .bind(clip(&outcome, 4000))
            .bind(params)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// Waits for the `setup_task` notification and drains, until the process is stopped.
    pub async fn follow(&self, summary: &mut Summary) -> anyhow::Result<()> {
        let mut listener = {
            let _as = switch(self.db_account.as_ref())?;
            sqlx::postgres::PgListener::connect_with(&self.pool).await?
        };
        listener.listen("setup_task").await?;
        loop {
            self.drain(summary).await?;
            // A notification, or a look every minute in case one was missed.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), listener.recv()).await;
        }
    }

    /// The next pending task, marked running.
    async fn take(&self) -> anyhow::Result<Option<(i64, String, Value, String, i32)>> {
        Ok(sqlx::query_as(
            "UPDATE pepsi.setup_task SET status = 'running', attempts = attempts + 1, \
             started_at = now() \
             WHERE task_id = (SELECT task_id FROM pepsi.setup_task WHERE status = 'pending' \
                              ORDER BY task_id LIMIT 1) \
             RETURNING task_id, kind, params, written_by::text, attempts",
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// One task: its status, outcome and, when carried out, its redacted parameters.
    async fn run(
        &self,
        (id, kind, params, written_by, attempts): (i64, String, Value, String, i32),
    ) -> anyhow::Result<(&'static str, String, Option<Value>)> {
        let mut log = TaskLog::open(&self.pool, id).await?;
        if written_by != self.roles.config {
            let why = format!(
                "refused: written by the database role {written_by}, not the configuration role {}",
                self.roles.config
            );
            log.error(&why).await?;
            return Ok(("refused", why, None));
        }
        let task = match Task::from_row(&kind, &params) {
            Ok(task) if task.is_redacted() => {
                let why = "refused: its secret was removed when a task was carried out from \
                           these parameters; write a new task"
                    .to_owned();
                log.error(&why).await?;
                return Ok(("refused", why, None));
            }
            Ok(task) => task,
            Err(e) => {
                let why = format!("refused: {e}");
                log.error(&why).await?;
                return Ok(("refused", why, None));
            }
        };
        if attempts > MAX_ATTEMPTS {
            let why = format!(
                "failed: the applier stopped {} times while this task ran; look at the log \
                 and write a new task",
                attempts - 1
            );
            log.error(&why).await?;
            return Ok(("failed", why, None));
        }
        log.step(&format!("{kind}: started (attempt {attempts})"))
            .await?;
        match self.carry(&task, &mut log).await {
            Ok(outcome) => {
                log.step(&format!("done: {outcome}")).await?;
                Ok(("done", outcome, Some(task.redacted())))
            }
            Err(e) => {
                let why = format!("failed: {e:#}");
                log.error(&why).await?;
                Ok(("failed", why, None))
            }
        }
    }

    async fn carry(&self, task: &Task, log: &mut TaskLog) -> anyhow::Result<String> {
        let cfg = Config::load(&self.config_path)?;
        let plan: Plan = plan::plan(task, &Layout::of(&cfg)).map_err(|e| anyhow!(e))?;
        let mut kept = Vec::new();
        let changed = match self.prepare_and_replace(&plan, &cfg, &mut kept, log).await {
            Ok(changed) => changed,
            Err(e) => {
                for k in kept.into_iter().rev() {
                    if let Err(undone) = k.put_back(log).await {
                        log.error(&format!("{undone:#}")).await?;
                    }
                }
                return Err(e);
            }
        };
        for k in kept {
            k.forget();
        }
        for step in &plan.after {
            self.step(step, &cfg, None, log).await?;
        }
        if changed {
            self.reload(log).await?;
        }
        Ok(match (task, changed) {
            (Task::Database(_), _) => "the database is current".into(),
            (Task::Mailbox(m), _) => format!("mailbox {} ready", m.address),
            (_, true) => format!("{} changed", self.config_path.display()),
            (_, false) => format!("{} already said so", self.config_path.display()),
        })
    }

    /// The steps before, each file they change kept in `kept`, and the edits with the
    /// steps against the candidate. Whether the configuration changed.
    async fn prepare_and_replace(
        &self,
        plan: &Plan,
        cfg: &Config,
        kept: &mut Vec<Kept>,
        log: &mut TaskLog,
    ) -> anyhow::Result<bool> {
        for step in &plan.before {
            self.step(step, cfg, Some(&mut *kept), log).await?;
        }
        if plan.edits.is_empty() {
            for step in &plan.candidate {
                self.candidate_step(step, &self.config_path, log).await?;
            }
            return Ok(false);
        }
        self.replace_config(&plan.edits, &plan.candidate, log).await
    }

    /// One step; a file it replaces or removes is kept in `kept` when given.
    async fn step(
        &self,
        step: &Step,
        cfg: &Config,
        mut kept: Option<&mut Vec<Kept>>,
        log: &mut TaskLog,
    ) -> anyhow::Result<()> {
        let mut keep = |path: &Path| -> anyhow::Result<()> {
            if let Some(kept) = kept.as_mut() {
                kept.push(Kept::aside(path)?);
            }
            Ok(())
        };
        match step {
            Step::Database => {
                log.step("applying the schema, procedures, roles and grants")
                    .await?;
                let report = {
                    use sqlx::Connection as _;
                    let mut conn = {
                        let _as = switch(self.db_account.as_ref())?;
                        sqlx::PgConnection::connect_with(&self.connect).await?
                    };
                    schema::setup(&mut conn, &self.roles).await?
                };
                for line in report.render().lines() {
                    log.output(line).await?;
                }
            }
            Step::Acme(request) => acme::obtain(request, &self.options.acme, log).await?,
            Step::CheckTls { certificate, key } => {
                check_tls_files(certificate, key)?;
                log.step(&format!(
                    "{} holds a certificate and {} a private key",
                    certificate.display(),
                    key.display()
                ))
                .await?;
            }
            Step::DkimKey {
                domain,
                selector,
                algorithm,
            } => {
                let made = self.dkim_key(domain, selector, *algorithm).await?;
                log.step(&if made {
                    format!("made a DKIM key for {domain}, selector {selector}, in pepsi.signing_key")
                } else {
                    format!("pepsi.signing_key already holds the key of {domain}, selector {selector}: kept")
                })
                .await?;
            }
            Step::Secret {
                file,
                section,
                option,
                value,
            } => {
                let path = self.secrets_dir(cfg)?.join(file);
                let text = edit::apply(
                    "# Written by pepsi-setup apply; replaced by the next setup task.\n",
                    &[Edit::set(section, option, value.clone())],
                )?;
                let group = &self.options.secrets_group;
                let gid = pepsi_conf::privilege::group_id(group)?
                    .ok_or_else(|| anyhow!("the group {group} (SECRETS_GROUP) does not exist"))?;
                keep(&path)?;
                write_replacing(&path, &text, 0o640, None, Some(gid))?;
                log.step(&format!(
                    "wrote [{section}] {option} to {} (0640, group {})",
                    path.display(),
                    self.options.secrets_group
                ))
                .await?;
            }
            Step::RemoveSecret { file } => {
                let path = self.secrets_dir(cfg)?.join(file);
                keep(&path)?;
                match fs::remove_file(&path) {
                    Ok(()) => {
                        log.step(&format!("removed {}", path.display())).await?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => bail!("cannot remove {}: {e}", path.display()),
                }
            }
            Step::RefreshToken { path, value } => {
                let user = self.token_user()?;
                let dir = path.parent().unwrap_or(Path::new("/"));
                let gid = token_dir(dir, &user)?;
                keep(path)?;
                write_replacing(
                    path,
                    &format!("{value}\n"),
                    0o600,
                    Some(user.uid),
                    Some(gid),
                )?;
                log.step(&format!(
                    "wrote the refresh token to {} (0600, {})",
                    path.display(),
                    user.name
                ))
                .await?;
            }
            Step::FirstToken { .. } => {
                bail!("the first access token is asked for with the candidate configuration only")
            }
            Step::Mailbox {
                address,
                password_hash,
            } => {
                let actor = Actor::local("pepsi-setup");
                match pepsi_admin::admin::create_account(
                    &self.pool,
                    &actor,
                    address,
                    Some(password_hash),
                    true,
                )
                .await
                {
                    Ok(()) => {
                        log.step(&format!("made the mailbox {address}")).await?;
                    }
                    Err(pepsi_admin::admin::AdminError::Exists(_)) => {
                        pepsi_admin::admin::set_account_password(
                            &self.pool,
                            &actor,
                            address,
                            password_hash,
                        )
                        .await?;
                        log.step(&format!("the mailbox {address} exists: its password set"))
                            .await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// A step against `config`, the checked candidate (or the file, when it is what the
    /// candidate would be).
    async fn candidate_step(
        &self,
        step: &Step,
        config: &Path,
        log: &mut TaskLog,
    ) -> anyhow::Result<()> {
        let Step::FirstToken { account } = step else {
            bail!("only the first access token is asked for with the candidate configuration");
        };
        let program = &self.options.token_refresh_program;
        let user = self.token_user()?;
        log.step(&format!(
            "asking for the first access token: {} -c {} once --force {account}, as {}",
            program.display(),
            config.display(),
            user.name
        ))
        .await?;
        let mut command = tokio::process::Command::new(program);
        command
            .arg("-c")
            .arg(config)
            .args(["once", "--force", account])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if pepsi_conf::privilege::current().uid != user.uid {
            let groups = group_list(&user)?;
            let (uid, gid) = (user.uid, user.gid);
            // SAFETY: between fork and exec the closure makes only async-signal-safe system
            // calls, on values made before the fork; it allocates nothing.
            unsafe {
                command.pre_exec(move || become_account(uid, gid, &groups));
            }
        }
        let out = command
            .output()
            .await
            .with_context(|| format!("cannot run {}", program.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        for line in text.lines().filter(|l| !l.trim().is_empty()).take(50) {
            log.output(line).await?;
        }
        if !out.status.success() {
            let last = text.lines().rfind(|l| !l.trim().is_empty());
            bail!(
                "no first access token ({}): {}",
                out.status,
                last.unwrap_or("(the program printed nothing)")
            );
        }
        Ok(())
    }

    /// `TOKEN_USER`, from the password database.
    fn token_user(&self) -> anyhow::Result<pepsi_conf::privilege::Account> {
        let name = &self.options.token_user;
        pepsi_conf::privilege::account(name)
            .with_context(|| format!("cannot look the account {name} (TOKEN_USER) up"))?
            .ok_or_else(|| anyhow!("the account {name} (TOKEN_USER) does not exist"))
    }

    fn secrets_dir(&self, cfg: &Config) -> anyhow::Result<PathBuf> {
        let dir = cfg
            .section("PATHS")
            .path_opt("SECRETS_DIR")?
            .unwrap_or_else(|| PathBuf::from("secrets.d"));
        let base = self.config_path.parent().unwrap_or(Path::new("/"));
        let dir = base.join(dir);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(dir)
    }

    /// Stores a new key unless the domain has one under the selector; whether it made one.
    async fn dkim_key(
        &self,
        domain: &str,
        selector: &str,
        algorithm: KeyAlgorithm,
    ) -> anyhow::Result<bool> {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pepsi.signing_key WHERE domain = $1 AND selector = $2)",
        )
        .bind(domain)
        .bind(selector)
        .fetch_one(&self.pool)
        .await?;
        if exists {
            return Ok(false);
        }
        let (pem, _) = crate::generate_key(match algorithm {
            KeyAlgorithm::Rsa => crate::dns::Algorithm::Rsa,
            KeyAlgorithm::Ed25519 => crate::dns::Algorithm::Ed25519,
        })?;
        let inserted = sqlx::query(
            "INSERT INTO pepsi.signing_key (domain, selector, private_key) VALUES ($1, $2, $3) \
             ON CONFLICT (domain, selector) DO NOTHING",
        )
        .bind(domain)
        .bind(selector)
        .bind(pem)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    /// Makes the edits in a candidate beside the configuration file, checks it with every
    /// program's parser, keeps the old file as `<name>.bak-<task>` and renames the
    /// candidate over it; the `candidate` steps run between the check and the rename.
    /// Whether anything changed.
    async fn replace_config(
        &self,
        edits: &[Edit],
        candidate_steps: &[Step],
        log: &mut TaskLog,
    ) -> anyhow::Result<bool> {
        let path = &self.config_path;
        let old =
            fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let new = edit::apply(&old, edits)?;
        if new == old {
            log.step(&format!("{} already says so", path.display()))
                .await?;
            for step in candidate_steps {
                self.candidate_step(step, path, log).await?;
            }
            return Ok(false);
        }
        for e in edits {
            log.step(&format!("edit: {e}")).await?;
        }
        let name = path
            .file_name()
            .ok_or_else(|| anyhow!("{} names no file", path.display()))?
            .to_string_lossy()
            .into_owned();
        let candidate = path.with_file_name(format!(".{name}.setup-new"));
        let mode = fs::metadata(path)?.permissions().mode() & 0o7777;
        write_new(&candidate, &new, mode)?;
        let mut checked = self.check_candidate(&candidate, edits, log).await;
        for step in candidate_steps {
            if checked.is_err() {
                break;
            }
            checked = self.candidate_step(step, &candidate, log).await;
        }
        if let Err(e) = checked {
            let _ = fs::remove_file(&candidate);
            return Err(e);
        }
        let backup = path.with_file_name(format!("{name}.bak-{}", task_id_of(log)));
        write_new(&backup, &old, mode)?;
        log.step(&format!("kept the previous file as {}", backup.display()))
            .await?;
        fs::rename(&candidate, path).with_context(|| {
            format!(
                "cannot rename {} to {}",
                candidate.display(),
                path.display()
            )
        })?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir).and_then(|d| d.sync_all()).ok();
        }
        log.step(&format!("{} replaced", path.display())).await?;
        Ok(true)
    }

    /// The candidate loads, every edited value is the one in force (no include or secrets
    /// fragment sets it again after), and every program's parser takes it.
    async fn check_candidate(
        &self,
        candidate: &Path,
        edits: &[Edit],
        log: &mut TaskLog,
    ) -> anyhow::Result<()> {
        let cfg = Config::load(candidate).with_context(|| {
            format!(
                "the edited configuration does not load ({})",
                candidate.display()
            )
        })?;
        for e in edits {
            if let Edit::Set {
                section,
                option,
                value,
            } = e
                && cfg
                    .section(section)
                    .string_opt(option)
                    .ok()
                    .flatten()
                    .as_deref()
                    != Some(value.as_str())
            {
                let origin = cfg
                    .section(section)
                    .origin(option)
                    .map(|o| o.to_string())
                    .unwrap_or_default();
                bail!(
                    "[{section}] {option} is set again after the line written ({origin}): \
                     change it there"
                );
            }
        }
        log.step(&format!(
            "checking the edited configuration with {} check",
            self.options.check_program.display()
        ))
        .await?;
        let mut command = tokio::process::Command::new(&self.options.check_program);
        command
            .arg("-c")
            .arg(candidate)
            .arg("check")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(account) = &self.db_account {
            // The check reads the overrides from the database as apply does, and
            // secrets.d/ with the secrets group, as `pepsi-setup db` runs in the postinst.
            let mut groups = group_list(account)?;
            if let Some(gid) = pepsi_conf::privilege::group_id(&self.options.secrets_group)? {
                groups.push(gid);
            }
            let (uid, gid) = (account.uid, account.gid);
            // SAFETY: between fork and exec the closure makes only async-signal-safe system
            // calls, on values made before the fork; it allocates nothing.
            unsafe {
                command.pre_exec(move || become_account(uid, gid, &groups));
            }
        }
        let out = command
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.options.check_program.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        for line in text.lines().filter(|l| !l.trim().is_empty()).take(50) {
            log.output(line).await?;
        }
        if !out.status.success() {
            let last = text.lines().rfind(|l| !l.trim().is_empty());
            bail!(
                "a program would refuse the edited configuration: {}",
                last.unwrap_or("(the check printed nothing)")
            );
        }
        Ok(())
    }

    async fn reload(&self, log: &mut TaskLog) -> anyhow::Result<()> {
        let Some((program, args)) = self.options.reload_command.split_first() else {
            log.step("no RELOAD_COMMAND: the services read the change when they restart")
                .await?;
            return Ok(());
        };
        log.step(&format!(
            "running {}",
            self.options.reload_command.join(" ")
        ))
        .await?;
        let out = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("cannot run {program}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        for line in text.lines().filter(|l| !l.trim().is_empty()).take(50) {
            log.output(line).await?;
        }
        if !out.status.success() {
            // The new configuration is in force on disk; the services did not take it yet.
            log.error(&format!(
                "{} failed ({}): restart the services to read the new configuration",
                self.options.reload_command.join(" "),
                out.status
            ))
            .await?;
        }
        Ok(())
    }
}

/// The lines of one task in `pepsi.setup_task_log`.
pub struct TaskLog {
    pool: PgPool,
    task_id: i64,
    next: i32,
}

fn task_id_of(log: &TaskLog) -> i64 {
    log.task_id
}

impl TaskLog {
    async fn open(pool: &PgPool, task_id: i64) -> anyhow::Result<TaskLog> {
        let last: Option<i32> =
            sqlx::query_scalar("SELECT max(line_no) FROM pepsi.setup_task_log WHERE task_id = $1")
                .bind(task_id)
                .fetch_one(pool)
                .await?;
        Ok(TaskLog {
            pool: pool.clone(),
            task_id,
            next: last.unwrap_or(0) + 1,
        })
    }

    async fn line(&mut self, stream: &str, line: &str) -> anyhow::Result<&mut Self> {
        tracing::info!(task = self.task_id, "{line}");
        sqlx::query(
            "INSERT INTO pepsi.setup_task_log (task_id, line_no, stream, line) VALUES ($1, $2, $3, $4)",
        )
        .bind(self.task_id)
        .bind(self.next)
        .bind(stream)
        .bind(clip(line, MAX_LINE))
        .execute(&self.pool)
        .await?;
        self.next += 1;
        Ok(self)
    }

    async fn step(&mut self, line: &str) -> anyhow::Result<&mut Self> {
        self.line("step", line).await
    }

    async fn output(&mut self, line: &str) -> anyhow::Result<&mut Self> {
        self.line("output", line).await
    }

    async fn error(&mut self, line: &str) -> anyhow::Result<&mut Self> {
        self.line("error", line).await
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn clip(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Both files hold what their names say: a PEM certificate chain, a PEM private key.
fn check_tls_files(certificate: &Path, key: &Path) -> anyhow::Result<()> {
    let pem = fs::read(certificate)
        .with_context(|| format!("cannot read the certificate {}", certificate.display()))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not PEM", certificate.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", certificate.display());
    }
    let pem = fs::read(key).with_context(|| format!("cannot read the key {}", key.display()))?;
    if rustls_pemfile::private_key(&mut pem.as_slice())
        .with_context(|| format!("{} is not PEM", key.display()))?
        .is_none()
    {
        bail!("{} holds no PEM private key", key.display());
    }
    Ok(())
}

/// Writes `text` to a new file at `path` (replacing a leftover), with `mode`, synced.
fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Replaces `path` with `text` atomically (a new file renamed over it), with `mode` and,
/// when given, that owner and group.
fn write_replacing(
    path: &Path,
    text: &str,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
) -> anyhow::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // Not *.conf: a secrets directory reads only those, and this one is not ready yet.
    let temp = path.with_file_name(format!(".{name}.setup-new"));
    write_new(&temp, text, mode)?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(&temp, uid, gid).with_context(|| {
            format!("cannot give {} to uid {uid:?} gid {gid:?}", temp.display())
        })?;
        fs::set_permissions(&temp, fs::Permissions::from_mode(mode))?;
    }
    fs::rename(&temp, path)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), path.display()))?;
    Ok(())
}

/// A file a step before the configuration change replaced or removed, and a hard link to
/// what it held (none when there was no file): put back when the task fails before the
/// configuration is replaced, so that a secrets fragment or a refresh token in force stays
/// as it was (a fragment naming half a `[token-setup]` section would stop the token
/// helper's every run).
struct Kept {
    path: PathBuf,
    saved: Option<PathBuf>,
}

impl Kept {
    /// Links what `path` holds to `.<name>.setup-old` beside it (not `*.conf`: a secrets
    /// directory does not read it).
    fn aside(path: &Path) -> anyhow::Result<Kept> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let saved = path.with_file_name(format!(".{name}.setup-old"));
        let _ = fs::remove_file(&saved);
        match fs::hard_link(path, &saved) {
            Ok(()) => Ok(Kept {
                path: path.to_owned(),
                saved: Some(saved),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kept {
                path: path.to_owned(),
                saved: None,
            }),
            Err(e) => bail!(
                "cannot keep {} aside as {}: {e}",
                path.display(),
                saved.display()
            ),
        }
    }

    async fn put_back(self, log: &mut TaskLog) -> anyhow::Result<()> {
        let path = &self.path;
        match &self.saved {
            Some(saved) => {
                fs::rename(saved, path).with_context(|| {
                    format!(
                        "cannot put {} back from {}",
                        path.display(),
                        saved.display()
                    )
                })?;
                log.step(&format!("put {} back as it was", path.display()))
                    .await?;
            }
            None => match fs::remove_file(path) {
                Ok(()) => {
                    log.step(&format!("removed {}, which the task wrote", path.display()))
                        .await?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => bail!("cannot remove {}: {e}", path.display()),
            },
        }
        Ok(())
    }

    fn forget(self) {
        if let Some(saved) = self.saved {
            let _ = fs::remove_file(saved);
        }
    }
}

/// The directory of the refresh tokens, made when missing (0750, the account's, its group;
/// as the package makes it): the group given the token files.
fn token_dir(dir: &Path, user: &pepsi_conf::privilege::Account) -> anyhow::Result<u32> {
    if !dir.exists() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
            .with_context(|| format!("cannot give {} to {}", dir.display(), user.name))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o750))?;
    }
    Ok(fs::metadata(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .gid())
}

/// The account's groups, its own and those the group database makes it a member of, as
/// its timer's `User=` gives them (`getgrouplist`).
fn group_list(user: &pepsi_conf::privilege::Account) -> anyhow::Result<Vec<libc::gid_t>> {
    let name = std::ffi::CString::new(user.name.as_str())?;
    let mut groups: Vec<libc::gid_t> = vec![0; 32];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `name` is NUL-terminated, `groups` holds `n` entries, and getgrouplist
        // writes at most `n` of them (and the count it needs into `n`).
        let rc =
            unsafe { libc::getgrouplist(name.as_ptr(), user.gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return Ok(groups);
        }
        if groups.len() >= 65536 {
            bail!("the account {} is in too many groups", user.name);
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
}

/// Between fork and exec: every uid and gid the account's, `groups` the supplementary
/// ones, so the program it runs is that account's and cannot become root again.
/// Async-signal-safe: three system calls, no allocation.
fn become_account(uid: u32, gid: u32, groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: plain system calls on values we own.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// While the guard lives, the process's effective ids are `account`'s (none: unchanged):
/// a Unix-socket connection opened meanwhile is that account's to peer authentication.
/// apply does one thing at a time, so nothing else runs under the switch.
fn switch(
    account: Option<&pepsi_conf::privilege::Account>,
) -> anyhow::Result<Option<pepsi_conf::privilege::Switched>> {
    account
        .map(|a| {
            pepsi_conf::privilege::switch_to(pepsi_conf::privilege::Identity {
                uid: a.uid,
                gid: a.gid,
            })
            .with_context(|| format!("cannot act as the account {} (DATABASE_ACCOUNT)", a.name))
        })
        .transpose()
}

/// Entry point of `pepsi-setup apply`.
pub async fn command(config: &Path, url: &str, follow: bool) -> anyhow::Result<ExitCode> {
    let applier = Applier::open(url, config).await?;
    applier.recover().await?;
    let mut summary = Summary::default();
    if follow {
        applier.follow(&mut summary).await?;
    } else {
        applier.drain(&mut summary).await?;
    }
    println!(
        "{} done, {} failed, {} refused",
        summary.done, summary.failed, summary.refused
    );
    Ok(if summary.failed + summary.refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
