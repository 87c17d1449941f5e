//! Test support: each test gets its own fresh PostgreSQL database with the real
//! `pepsi-0001.sql` and `procedures.sql` applied by `pepsi-setup`'s own code.
//!
//! The server comes from `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`;
//! `scripts/test.sh` points it at a private server when none answers). A test database is
//! dropped when its `TestDb` is dropped, except after a panic: a failed test keeps its
//! database for a post-mortem, and the panic message names it.
//!
//! `programs` says where a test finds the programs it executes (`PEPSI_BIN_DIR`); `keys`
//! makes private keys with `openssl`.

pub mod gpg;
pub mod keys;
pub mod pg_cluster;
pub mod pki;
pub mod programs;
pub mod proxy;

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

/// The server URL tests use.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database with the Pepsi schema applied.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    admin: PgConnectOptions,
}

impl TestDb {
    /// Creates the database on the test server and applies the schema, procedures, roles
    /// and grants.
    pub async fn new() -> TestDb {
        TestDb::on(&server_url()).await
    }

    /// The same on the server at `server` (a URL naming any database there), e.g. a
    /// [`pg_cluster::PgCluster`] behind a [`proxy::Proxy`].
    pub async fn on(server: &str) -> TestDb {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "pepsi_test_{}_{}_{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let admin: PgConnectOptions = server
            .parse()
            .expect("DATABASE_URL is not a PostgreSQL URL");
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {server} (set DATABASE_URL): {e}"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let url = database_url(server, &name);
        let mut conn = PgConnection::connect_with(&options)
            .await
            .expect("connect to test database");
        pepsi_setup::schema::setup(&mut conn, &pepsi_setup::schema::Roles::default())
            .await
            .expect("apply the schema to the test database");
        conn.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("pool on test database");
        TestDb {
            name,
            url,
            pool,
            admin,
        }
    }
}

/// The URL of database `name` on the server of URL `base`.
fn database_url(base: &str, name: &str) -> String {
    match base.rfind('/') {
        Some(slash) if base[..slash].contains("//") && !base[slash..].contains('@') => {
            let query = base[slash..]
                .find('?')
                .map(|q| &base[slash + q..])
                .unwrap_or("");
            format!("{}/{name}{query}", &base[..slash])
        }
        _ => format!("{base}/{name}"),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test database kept for inspection: {}", self.url);
            return;
        }
        let name = self.name.clone();
        let admin = self.admin.clone();
        // Drop may run inside a runtime whose thread this blocks, so the cleanup gets a
        // runtime of its own, and FORCE ends the pool's connections server-side.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let mut conn = PgConnection::connect_with(&admin).await.ok()?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await
                .ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}
