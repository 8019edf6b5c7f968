//! The `oncegate serve` harness the binary-level tests share.
#![allow(dead_code)] // each test crate uses a part of it

pub(crate) mod suite;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) fn oncegate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oncegate"))
}

/// `oncegate serve --config config` (with `env` set) that must refuse to start: its output,
/// standard output and error. Panics when it is still running after 20 s.
pub(crate) fn refused_start(config: &Path, env: &[(&str, &str)]) -> String {
    let mut child = oncegate()
        .args(["serve", "--config"])
        .arg(config)
        .env("ONCEGATE_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let said = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(!status.success(), "the gateway must not start: {said}");
            return said;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway started where it must refuse to");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `oncegate serve`, with its stderr collected.
pub(crate) struct Serve {
    pub(crate) child: Child,
    pub(crate) base: String,
    pub(crate) admin: String,
    /// The API's base URL, when callers are configured.
    pub(crate) api: Option<String>,
    /// The first line the gateway printed on stdout.
    pub(crate) banner: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    /// Starts the gateway on `dir/oncegate.toml` holding `config`, which must listen on
    /// loopback port 0 (the addresses are read from the first line it prints).
    pub(crate) fn start_with(dir: &Path, config: &str) -> Self {
        Self::start_logging(
            dir,
            config,
            &std::env::var("E2E_LOG").unwrap_or_else(|_| "warn".into()),
        )
    }

    /// `start_with`, logging at `level` (an `ONCEGATE_LOG` filter).
    pub(crate) fn start_logging(dir: &Path, config: &str, level: &str) -> Self {
        Self::start_command(dir, config, level, oncegate())
    }

    /// `start_with`, as `command` runs it (`oncegate` under a wrapper such as `faketime`).
    pub(crate) fn start_command(
        dir: &Path,
        config: &str,
        level: &str,
        mut command: Command,
    ) -> Self {
        let config_path = dir.join("oncegate.toml");
        std::fs::write(&config_path, config).expect("config");
        let config = config_path;
        let mut child = command
            .args(["serve", "--config"])
            .arg(&config)
            .current_dir(dir)
            .env("ONCEGATE_LOG", level)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start oncegate serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        {
            let lines = stderr.clone();
            let pipe = child.stderr.take().expect("stderr");
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().expect("stderr").push(line);
                }
            });
        }
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        reader.read_line(&mut line).expect("first line");
        let urls = banner_urls(&line);
        assert!(
            urls.len() >= 2,
            "first line {line:?}, stderr {:?}",
            stderr.lock()
        );
        std::thread::spawn(move || for _ in reader.lines() {});
        Self {
            child,
            base: urls[0].clone(),
            admin: urls[1].clone(),
            api: urls.get(2).cloned(),
            banner: line,
            stderr,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("{}/webhook/main", self.base)
    }

    pub(crate) fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_owned()
    }

    /// GETs `path` on the admin listener: the status and the body.
    pub(crate) async fn admin_get(&self, path: &str) -> (u16, String) {
        let response = client()
            .get(format!("{}{path}", self.admin))
            .send()
            .await
            .expect("admin request");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// Polls the admin `path` until `done` holds for its body, for at most 10 s.
    pub(crate) async fn admin_until(&self, path: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, body) = self.admin_get(path).await;
            if done(&body) {
                return body;
            }
            assert!(Instant::now() < deadline, "{path} never got there: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").join("\n")
    }

    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to end, at most `limit`; the exit status and how long it took.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, start.elapsed());
            }
            assert!(start.elapsed() < limit, "still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Posts `sealed` (its query and body) to the gateway's `/webhook/<source>`: the status and
/// body.
pub(crate) async fn post_sealed(
    gateway: &Serve,
    source: &str,
    sealed: &oncegate_core::SealedRequest,
) -> (u16, String) {
    let url = format!(
        "{}/webhook/{source}?{}",
        gateway.base,
        sealed.query.as_deref().unwrap_or_default()
    );
    let response = client()
        .post(url)
        .body(sealed.body.clone())
        .send()
        .await
        .expect("post");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// `oncegate <args>`: its output, or why it failed.
pub(crate) fn run(args: &[String]) -> Result<String, String> {
    let output = oncegate().args(args).output().expect("oncegate");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Posts `sealed` to `gateway`'s `/webhook/<path>` until it is answered `status`, `limit` at
/// most: how long that took (how long a change took to reach the gateway).
pub(crate) async fn until_answered(
    gateway: &Serve,
    path: &str,
    sealed: &oncegate_core::SealedRequest,
    status: u16,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let (got, body) = post_sealed(gateway, path, sealed).await;
        if got == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "still {got} ({body}) after {limit:?}; {}",
            gateway.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `N` gateways, each in a fresh directory (which lives as long as it is held) with the file
/// `config` writes for that directory: several gateways on one store.
pub(crate) fn start_in_dirs<const N: usize>(
    config: impl Fn(&Path) -> String,
) -> [(tempfile::TempDir, Serve); N] {
    std::array::from_fn(|_| {
        let dir = tempfile::tempdir().expect("dir");
        let serve = Serve::start_with(dir.path(), &config(dir.path()));
        (dir, serve)
    })
}

pub(crate) fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

pub(crate) async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A file route to `dir/events.jsonl`.
pub(crate) fn file_route(dir: &Path, extra: &str) -> String {
    format!(
        "[[route]]\nevents = [\"*\"]\nsink = \"file\"\npath = \"{}\"\n{extra}\n",
        dir.join("out/events.jsonl").display()
    )
}

/// The file sink's lines so far. Read while the gateway writes, the file can end in a line
/// not yet whole (CI met one): only lines ended by their newline are taken.
pub(crate) fn lines(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("out/events.jsonl")).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// The bound addresses in the gateway's first line on stdout (listen, admin, then the API's if
/// it has one): the plain banner, or the JSON one of `log.format = "json"`.
pub(crate) fn banner_urls(line: &str) -> Vec<String> {
    if let Ok(banner) = serde_json::from_str::<serde_json::Value>(line) {
        return ["listen", "admin", "api"]
            .iter()
            .filter_map(|field| banner[*field].as_str().map(str::to_owned))
            .collect();
    }
    line.split_whitespace()
        .filter(|w| w.starts_with("http://"))
        .map(|w| w.trim_end_matches(',').to_owned())
        .collect()
}

/// A Redis store section on the test Redis (`ONCEGATE_TEST_REDIS_URL`, started by
/// scripts/test) under a fresh prefix, with 4 partitions.
pub(crate) fn redis_store(prefix: &str) -> String {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}{}\"\npartitions = 4",
        fastrand::u32(..)
    )
}

/// The value of the unlabelled series `name` on the admin listener `admin`'s `/metrics` (0 when
/// it is not there yet).
pub(crate) async fn metric(admin: &str, name: &str) -> f64 {
    metrics_text(admin)
        .await
        .lines()
        .filter_map(|line| line.strip_prefix(name))
        .find_map(|rest| rest.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The head of a gateway's file with an API listener and one caller: the store, listeners on
/// loopback port 0, `[api]` and `[[api.caller]]` `name` with `token`.
pub(crate) fn with_api_caller(store: &str, name: &str, token: &str) -> String {
    format!(
        r#"[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "{name}"
token = "{token}"
"#
    )
}

/// The admin listener `admin`'s `/metrics`, whole.
pub(crate) async fn metrics_text(admin: &str) -> String {
    client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default()
}

/// The sum of `name`'s series on `admin`'s `/metrics` whose labels contain `label` (e.g.
/// `limit="app"`).
pub(crate) async fn metric_sum(admin: &str, name: &str, label: &str) -> f64 {
    metrics_text(admin)
        .await
        .lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
