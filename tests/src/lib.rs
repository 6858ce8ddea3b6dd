//! Shared set-up for the integration tests: a fresh SQLite database in a
//! temporary folder, the real plugin host, the compiled plugins, and checks
//! of the demo pipeline's invariants.

pub mod events;
pub mod fleet;
pub mod nats;
mod old_schema;
pub mod research;
pub mod serve;
mod store_fixtures;

pub use old_schema::{database_at_version, finish_live_run, sqlite_at_version};
pub use store_fixtures::{claim, completion, job_claim, put_stand_in_plugin, stages};

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use ratchet_runtime::audit::{AuditReport, audit_deliveries, audit_store};
use ratchet_runtime::bundled::PLUGIN_DIR;
use ratchet_runtime::clock::{Clock, SystemClock};
use ratchet_runtime::llm::{ModelBackend, StochasticModel};
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::plugin::{Caps, HostConfig, PluginHost};
use ratchet_runtime::registry;
use ratchet_runtime::scheduler::{Scheduler, SchedulerConfig};
use ratchet_runtime::store::{self, JobState, RunState, Store};
use ratchet_runtime::worker::{self, WorkerOptions};
use serde_json::Value;

/// The longest any single wait in a test may take before it fails.
pub const BOUND: Duration = Duration::from_secs(120);

pub const DEMO_PLUGINS: [&str; 4] = ["draft", "verify", "publish", "prepare-next"];

/// The compiled component of a plugin under `plugins/`.
pub fn plugin_path(name: &str) -> PathBuf {
    PathBuf::from(PLUGIN_DIR).join(format!("{}.wasm", name.replace('-', "_")))
}

/// Precompiled components shared by every test process, as workers on one
/// machine would share them; files are keyed by digest and engine settings.
pub fn shared_component_cache() -> PathBuf {
    std::env::temp_dir().join("ratchet-test-components")
}

pub struct Harness {
    _dir: tempfile::TempDir,
    pub url: String,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub host: Arc<PluginHost>,
}

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The server the Postgres tests use: `RATCHET_TEST_POSTGRES`, or the
/// project machines' default. Each harness gets a schema of its own.
pub fn postgres_base_url() -> Option<String> {
    match std::env::var("RATCHET_TEST_POSTGRES") {
        Ok(url) if url == "off" => None,
        Ok(url) => Some(url),
        Err(_) => Some(DEFAULT_POSTGRES.to_string()),
    }
}

const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A fresh schema on the test server, or `None` (with a note on stderr) when
/// Postgres is not available here. Under `CI=true` an unreachable server is
/// a failure, never a skip.
pub async fn postgres_schema_url() -> Option<String> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let Some(base) = postgres_base_url() else {
        assert!(!ci, "RATCHET_TEST_POSTGRES=off is not allowed in CI");
        eprintln!("skipping a Postgres test: RATCHET_TEST_POSTGRES=off");
        return None;
    };
    let admin = match sqlx::PgPool::connect(&base).await {
        Ok(pool) => pool,
        Err(e) if !ci => {
            eprintln!(
                "skipping a Postgres test: cannot connect to {base} ({e}); set RATCHET_TEST_POSTGRES=postgres://USER@HOST:PORT/DB to run it"
            );
            return None;
        }
        Err(e) => panic!("CI=true and Postgres at {base} is unreachable: {e}"),
    };
    let schema = format!("ratchet_test_{}", uuid_like());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .expect("create test schema");
    admin.close().await;
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!(
        "{base}{sep}options=-c%20search_path%3D{schema}&application_name={schema}"
    ))
}

fn uuid_like() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock)).await
    }

    pub async fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::on(Backend::Sqlite, clock)
            .await
            .expect("sqlite is always available")
    }

    /// A harness on `backend`, or `None` when that backend is unavailable
    /// here (Postgres outside CI).
    pub async fn on(backend: Backend, clock: Arc<dyn Clock>) -> Option<Self> {
        let config = HostConfig {
            cache_dir: Some(shared_component_cache()),
            pooling: Some(32),
            ..HostConfig::default()
        };
        Self::configured(backend, clock, Arc::new(StochasticModel), config).await
    }

    /// A SQLite harness whose plugin host has `config`.
    pub async fn with_host_config(config: HostConfig) -> Self {
        Self::configured(
            Backend::Sqlite,
            Arc::new(SystemClock),
            Arc::new(StochasticModel),
            config,
        )
        .await
        .expect("sqlite is always available")
    }

    /// A harness with its own model backend and host configuration.
    pub async fn configured(
        backend: Backend,
        clock: Arc<dyn Clock>,
        model: Arc<dyn ModelBackend>,
        config: HostConfig,
    ) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = match backend {
            Backend::Sqlite => format!("sqlite://{}", dir.path().join("ratchet.db").display()),
            Backend::Postgres => postgres_schema_url().await?,
        };
        Some(Self::at(dir, url, clock, model, config).await)
    }

    /// A harness on the database at `url` (a schema from
    /// [`postgres_schema_url`], changed by the test), with the default host.
    pub async fn at_url(url: String, clock: Arc<dyn Clock>) -> Self {
        let config = HostConfig {
            cache_dir: Some(shared_component_cache()),
            ..HostConfig::default()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        Self::at(dir, url, clock, Arc::new(StochasticModel), config).await
    }

    async fn at(
        dir: tempfile::TempDir,
        url: String,
        clock: Arc<dyn Clock>,
        model: Arc<dyn ModelBackend>,
        config: HostConfig,
    ) -> Self {
        let store = store::open(&url).await.expect("open store");
        let host = Arc::new(
            PluginHost::new(store.clone(), model, clock.clone(), config).expect("plugin host"),
        );
        Self {
            _dir: dir,
            url,
            store,
            clock,
            host,
        }
    }

    /// Replaces the plugin host with a new one on the same database, as a
    /// restarted worker (or one under another policy) would have.
    pub fn rehost(&mut self, config: HostConfig) {
        self.host = Arc::new(
            PluginHost::new(
                self.store.clone(),
                Arc::new(StochasticModel),
                self.clock.clone(),
                config,
            )
            .expect("plugin host"),
        );
    }

    pub async fn register(&self, names: &[&str]) {
        for name in names {
            let bytes = std::fs::read(plugin_path(name)).expect("compiled plugin");
            registry::plugin_register(self.store.as_ref(), &self.host, bytes, self.clock.as_ref())
                .await
                .unwrap_or_else(|e| panic!("register {name}: {e}"));
        }
    }

    pub async fn submit(&self, pipeline: &str, input: &[u8]) -> String {
        let pipeline = Pipeline::parse("test.toml", pipeline).expect("valid pipeline");
        registry::run_submit(
            self.store.as_ref(),
            &pipeline,
            input.to_vec(),
            None,
            &Caps::default(),
            self.clock.as_ref(),
        )
        .await
        .expect("submit")
        .run_id()
        .to_string()
    }

    pub async fn submit_demo(&self) -> String {
        self.submit(ratchet_runtime::bundled::DEMO_PIPELINE, b"a test release")
            .await
    }

    pub fn scheduler(&self, worker: &str, lease_ms: i64) -> Scheduler {
        let mut config = SchedulerConfig::new(worker);
        config.lease_ms = lease_ms;
        Scheduler::new(
            self.store.clone(),
            self.host.clone(),
            self.clock.clone(),
            config,
        )
    }

    /// Runs in-process workers until nothing is ready or running.
    pub async fn run_until_idle(&self, concurrency: usize) {
        let sched = Arc::new(self.scheduler("test-worker", 30_000));
        let opts = WorkerOptions {
            concurrency,
            until_idle: true,
            poll: Duration::from_millis(20),
            ..WorkerOptions::default()
        };
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        tokio::time::timeout(
            BOUND,
            worker::run(self.store.clone(), sched, self.clock.clone(), opts, stopped),
        )
        .await
        .expect("worker finished within the bound")
        .expect("worker ran");
    }

    /// Runs `statements` on the harness's database, outside Ratchet (for
    /// tampering with it, or installing a trigger).
    pub async fn raw_sql(&self, statements: &str) {
        let statements = sqlx::AssertSqlSafe(statements.to_string());
        if self.url.starts_with("sqlite:") {
            let pool = sqlx::SqlitePool::connect(&self.url).await.expect("sqlite");
            sqlx::raw_sql(statements)
                .execute(&pool)
                .await
                .expect("raw sql");
            pool.close().await;
        } else {
            let pool = sqlx::PgPool::connect(&self.url).await.expect("postgres");
            sqlx::raw_sql(statements)
                .execute(&pool)
                .await
                .expect("raw sql");
            pool.close().await;
        }
    }

    /// `running`, `succeeded` or `failed`.
    pub async fn run_state(&self, run: &str) -> String {
        self.store
            .run_get(run)
            .await
            .expect("read run")
            .expect("run exists")
            .state
            .to_string()
    }

    /// The audit of every run, and of every delivery's event.
    pub async fn audit(&self) -> AuditReport {
        let mut report = audit_store(self.store.as_ref(), None, &mut |_| {})
            .await
            .expect("audit");
        audit_deliveries(self.store.as_ref(), None, None, &mut report)
            .await
            .expect("audit of deliveries");
        report
    }

    pub async fn json(&self, run: &str, stage: &str, output: &str) -> Value {
        let a = self
            .store
            .artifact_get(run, stage, output)
            .await
            .expect("read artifact")
            .unwrap_or_else(|| panic!("{stage}.{output} missing"));
        serde_json::from_slice(&a.bytes).expect("json artifact")
    }

    /// Every stage succeeded exactly once, one canonical artifact per output,
    /// every downstream digest is the canonical draft's, one outbox event,
    /// and the audit is clean. Returns the canonical draft digest.
    pub async fn assert_demo_run_converged(&self, run: &str) -> String {
        let run_row = self
            .store
            .run_get(run)
            .await
            .expect("run")
            .expect("run exists");
        assert_eq!(
            run_row.state,
            RunState::Succeeded,
            "run {run} did not succeed"
        );
        let jobs = self.store.job_list(run).await.expect("jobs");
        assert_eq!(jobs.len(), 4);
        let attempts = self.store.attempt_list(run).await.expect("attempts");
        for job in &jobs {
            assert_eq!(job.state, JobState::Succeeded, "stage {}", job.stage);
            let wins = attempts
                .iter()
                .filter(|a| a.job_id == job.id && a.outcome == "succeeded")
                .count();
            assert_eq!(wins, 1, "stage {} succeeded {wins} times", job.stage);
        }
        let artifacts = self.store.artifact_list(run).await.expect("artifacts");
        assert_eq!(
            artifacts.len(),
            5,
            "input + one artifact per declared output: {artifacts:?}"
        );
        let draft = artifacts
            .iter()
            .find(|a| a.stage == "draft")
            .expect("draft artifact")
            .digest
            .clone();
        assert_eq!(
            self.json(run, "verify", "report").await["draft_sha256"],
            draft.as_str()
        );
        assert_eq!(
            self.json(run, "publish", "receipt").await["draft_sha256"],
            draft.as_str()
        );
        assert_eq!(
            self.json(run, "prepare-next", "next").await["published_sha256"],
            draft.as_str()
        );
        let events = self.store.outbox_list(Some(run)).await.expect("outbox");
        let published: Vec<_> = events
            .iter()
            .filter(|e| e.event == "draft.published")
            .collect();
        assert_eq!(published.len(), 1, "exactly one draft.published event");
        assert!(
            published[0].payload.contains(&draft),
            "event carries the canonical digest"
        );
        // This run's rows only: a test checking hundreds of runs would
        // otherwise read every run once per run.
        let report = audit_store(self.store.as_ref(), Some(run), &mut |_| {})
            .await
            .expect("audit");
        assert!(report.is_clean(), "audit: {:#?}", report.violations);
        draft
    }
}

/// Declares one test per backend from one body:
/// `backend_tests!(name => body)` gives `name_on_sqlite` and
/// `name_on_postgres`, each calling `body(Backend)`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident => $body:ident;)*) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_sqlite() {
                super::$body($crate::Backend::Sqlite).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_postgres() {
                super::$body($crate::Backend::Postgres).await;
            }
        }
    )*};
}

/// Two stages, `a` (`noop`) then `b` (`pass`, consuming `a.out`).
pub const TWO_STAGES: &str = r#"
name = "two"
[[stage]]
name = "a"
plugin = "noop@^1"
[[stage]]
name = "b"
plugin = "pass@^1"
inputs = { in = "a.out" }
"#;

/// A pipeline of one stage, `stage`, running `plugin` (any 1.x version),
/// with `header` lines (e.g. `max_attempts = 1`) before it.
pub fn one_stage_pipeline(stage: &str, plugin: &str, header: &str) -> String {
    format!(
        "name = \"{stage}\"\n{header}\n[[stage]]\nname = \"{stage}\"\nplugin = \"{plugin}@^1\"\n"
    )
}

/// Serves `app` on a free port of 127.0.0.1 until the test ends; returns
/// its address.
pub async fn serve_http(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A `ratchet` child process on this harness's database.
pub fn ratchet(bin: &str, url: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--db")
        .arg(url)
        .env("RATCHET_LOG", "error")
        .env("RATCHET_CACHE_DIR", shared_component_cache())
        .env_remove("FAILPOINTS")
        .env_remove("RATCHET_POLICY")
        .env_remove("RATCHET_SINKS")
        .env_remove("RATCHET_MODEL")
        .kill_on_drop(true);
    cmd
}

/// Runs the command to its end, failing the test past [`BOUND`].
pub async fn output(mut cmd: tokio::process::Command) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ratchet");
    tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("the process ended within the bound")
        .expect("wait for the process")
}
