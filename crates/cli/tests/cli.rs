//! The `oncegate` binary, run as a user runs it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admission, Claim, DedupStore, Event, EventQueue, key_for};
use oncegate_embedded::{EmbeddedConfig, EmbeddedStore};
use oncegate_journal::JournalConfig;

fn oncegate(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(args)
        .env_remove("ONCEGATE_CONFIG")
        .output()
        .expect("run oncegate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `oncegate serve` on `config`, which must refuse to start: its exit code and stderr
/// (killed after 20 s, so that a gateway that starts after all fails the test, not hangs it).
fn serve_refused(config: &std::path::Path) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("ONCEGATE_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run oncegate serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_example_configuration_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/oncegate.toml");
    let (code, out, err) = oncegate(&["check-config", example]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok (1 source, embedded store, 0 warnings)"),
        "{out}"
    );
}

#[test]
fn a_bad_configuration_names_each_problem_and_fails() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[dedup]\nretention = \"2h\"\n[lease]\nduration = \"1m\"\nrenew_every = \"5m\"\n",
    )
    .expect("write");
    let (code, out, _) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("error: dedup.retention: 2h is shorter than the platform's retry span"),
        "{out}"
    );
    assert!(out.contains("error: lease.renew_every"), "{out}");
    assert!(out.contains("2 errors, 1 warning"), "{out}");
    // A file without sources or callers serves nothing, and says so.
    assert!(
        out.contains("warning: source: no [[source]] and no [[api.caller]]"),
        "{out}"
    );

    std::fs::write(&file, "[store]\nbackend = \"mongo\"\n").expect("write");
    let (code, _, err) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 2);
    assert!(err.contains("mongo") && err.contains("embedded"), "{err}");

    let (code, _, err) = oncegate(&["check-config", "/no/such/file.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /no/such/file.toml"), "{err}");
    // The OS's reason once, not again as the cause's.
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
    let (code, _, err) = oncegate(&["serve", "--config", "/no/such/file.toml"]);
    assert_eq!(code, 2);
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
}

/// check-config takes its file as every other command does too: `--config FILE` or
/// ONCEGATE_CONFIG; without any, it says how to name one.
#[test]
fn check_config_takes_the_file_as_the_other_commands_do() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/oncegate.toml");
    let (code, out, err) = oncegate(&["check-config", "--config", example]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok (1 source"), "{out}");
    let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .arg("check-config")
        .env("ONCEGATE_CONFIG", example)
        .output()
        .expect("run oncegate");
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("ok (1 source"), "{out}");
    // The file named on the command line wins over the environment's.
    let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["check-config", "/no/such/file.toml"])
        .env("ONCEGATE_CONFIG", example)
        .output()
        .expect("run oncegate");
    assert_eq!(output.status.code(), Some(2));
    let (code, _, err) = oncegate(&["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--config FILE"), "{err}");
}

/// check-config tries what serve would meet on this machine: a port another process holds (a
/// warning: the gateway that runs with the file holds it too) and a store folder that cannot be
/// written (an error; /sys refuses files even to root, as CI runs).
#[test]
fn check_config_tries_the_ports_and_the_store_folder() {
    let dir = tempfile::tempdir().expect("dir");
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = held.local_addr().expect("addr").port();
    let file = dir.path().join("machine.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
             [store]\npath = \"/sys/oncegate-store\"\n"
        ),
    )
    .expect("write");
    let (code, out, _) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "warning: server.listen: 127.0.0.1:{port} is in use by another process"
        )),
        "{out}"
    );
    assert!(
        out.contains("error: store.path: /sys cannot be written by this user"),
        "{out}"
    );
    // A port nobody holds (port 0: a port given back may be taken at once by a parallel
    // test), a writable folder: nothing to say.
    drop(held);
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
             [store]\npath = \"{}\"\n",
            dir.path().join("store").display()
        ),
    )
    .expect("write");
    let (code, out, _) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{out}");
    // The one warning: it has no sources.
    assert!(out.contains("1 warning"), "{out}");
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").count() == 1,
        "the probe file was left behind"
    );
}

/// What `serve` refuses at once, `check-config` refuses too, each named: a WeCom EncodingAESKey
/// of 5 characters (built as serve builds the source), a store and a file sink under a file,
/// two callers with one token; and a route after a catch-all is named as never matching. And
/// `serve` does refuse the file (its first refusal).
#[test]
fn check_config_refuses_what_serve_would_refuse() {
    let dir = tempfile::tempdir().expect("dir");
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "not a folder").expect("write");
    let file = dir.path().join("refused.toml");
    let config = format!(
        r#"[store]
backend = "embedded"
path = "{blocker}/store"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "a"
token = "one-token-for-two"

[[api.caller]]
name = "b"
token = "one-token-for-two"

[[source]]
name = "corp"
platform = "wecom"
corp_id = "ww1"
agent_id = 1000002
token = "callback-token"
encoding_aes_key = "abcde"

[[route]]
events = ["*"]
sink = "file"
path = "{blocker}/events.jsonl"

[[route]]
events = ["message.*"]
sink = "stdout"
"#,
        blocker = blocker.display()
    );
    std::fs::write(&file, &config).expect("write");
    let (code, out, _) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    for said in [
        "error: source[corp]: bad EncodingAESKey: an EncodingAESKey has 43 characters, this one has 5",
        &format!(
            "error: store.path: {} is a file, not a folder",
            blocker.display()
        ),
        &format!(
            "error: route[0].path: {} is a file, not a folder",
            blocker.display()
        ),
        "error: api.caller[1].token: the same token as caller \"a\"",
        "warning: route[1].events: never matches: route[0]",
        "4 errors, 1 warning",
    ] {
        assert!(out.contains(said), "{said:?} in:\n{out}");
    }
    assert!(
        !out.contains("one-token-for-two"),
        "a token is never said: {out}"
    );
    assert!(
        !out.contains("source \"corp\": "),
        "the source named once: {out}"
    );
    // serve refuses the same file.
    let (code, said) = serve_refused(&file);
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("same token as caller"), "{said}");
}

/// `check-config --effective` prints what serve runs with: the file over the defaults, the
/// ONCEGATE_* variables applied, and no secret's value.
#[test]
fn check_config_prints_the_effective_configuration_without_secrets() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/oncegate.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["check-config", "--effective", example])
        .env_remove("ONCEGATE_CONFIG")
        .env("ONCEGATE_SERVER__LISTEN", "127.0.0.1:7878")
        .output()
        .expect("run");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}");
    // The TOML: after the heading line, up to the problems and the verdict.
    let body: Vec<&str> = out
        .lines()
        .skip(1)
        .take_while(|l| {
            !l.starts_with("warning:") && !l.starts_with("error:") && !l.contains(": ok (")
        })
        .collect();
    let effective: toml::Table = body
        .join("\n")
        .parse()
        .unwrap_or_else(|e| panic!("TOML after the first line ({e}): {out}"));
    assert_eq!(
        effective["server"]["listen"].as_str(),
        Some("127.0.0.1:7878"),
        "the variable"
    );
    assert_eq!(
        effective["server"]["max_connections"].as_integer(),
        Some(1024),
        "a default"
    );
    let file = std::fs::read_to_string(example).expect("example");
    let secret = file
        .lines()
        .find_map(|l| l.strip_prefix("encrypt_key = \""))
        .and_then(|rest| rest.split('"').next())
        .expect("the example's encrypt key");
    assert!(!out.contains(secret), "a secret printed: {out}");
    assert!(
        out.contains("encrypt_key = \"<hidden: written in the file>\""),
        "{out}"
    );
}

/// A reader that has gone (`oncegate check-config --effective FILE | head -1`, `oncegate
/// defaults | head`): the command ends quietly, no panic, no error.
#[test]
fn output_to_a_reader_that_went_away_ends_quietly() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/oncegate.toml");
    for args in [&["check-config", "--effective", example][..], &["defaults"]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // Closed before the command writes a byte: its first write fails, every time.
        drop(reader);
        let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .args(args)
            .env_remove("ONCEGATE_CONFIG")
            .stdout(writer)
            .output()
            .expect("run");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && said.is_empty(),
            "{args:?}: {:?} {said}",
            output.status
        );
    }
}

/// With a stdout route, stdout is the events' stream: the banner goes to stderr.
#[test]
fn a_stdout_routes_stream_holds_no_banner() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("stdout.toml");
    std::fs::write(
        &file,
        "[store]\nbackend = \"memory\"\n\n[server]\nlisten = \"127.0.0.1:0\"\n\
         admin_listen = \"127.0.0.1:0\"\n\n[[route]]\nevents = [\"*\"]\nsink = \"stdout\"\n",
    )
    .expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["serve", "--config"])
        .arg(&file)
        .env_remove("ONCEGATE_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let banner = stderr
        .lines()
        .map_while(Result::ok)
        .find(|line| line.contains("oncegate listening"));
    let _ = child.kill();
    let output = child.wait_with_output().expect("output");
    assert!(banner.is_some(), "no banner on stderr");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "",
        "stdout is the events'"
    );
}

/// `oncegate ready` (the image's healthcheck) fails when no gateway answers: exit 2, saying so.
#[test]
fn ready_fails_when_no_gateway_answers() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let admin = format!("http://127.0.0.1:{closed}");
    let (code, out, err) = oncegate(&["ready", "--admin", &admin]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("no answer from the gateway"), "{err}");
}

fn event(id: &str) -> Event {
    Event {
        platform: Arc::from("feishu"),
        app: Arc::from("cli_x"),
        tenant: None,
        event_id: Arc::from(id),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: 0,
        order_key: Some("oc_chat".into()),
        payload: Bytes::from_static(b"{}"),
    }
}

/// Three events admitted, the first claimed and completed, the second dead-lettered.
fn fill<S: DedupStore + EventQueue>(store: &S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        for id in ["e1", "e2", "e3"] {
            let key = key_for("feishu", "cli_x", "event_id", id);
            let admitted = store
                .admit(event(id), &[key], Duration::from_secs(86_400))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
        let key = key_for("feishu", "cli_x", "event_id", "e1");
        let partition = event("e1").partition(store.partitions());
        let Claim::Acquired(lease) = store
            .claim(&key, partition, Duration::from_secs(60))
            .await
            .expect("claim")
        else {
            panic!("claim");
        };
        store
            .complete(&lease, Duration::from_secs(86_400), None)
            .await
            .expect("complete");
        // One chat: e1 is handed out first, then (acked) e2, which dies.
        let first = store.pull(partition, 1).await.expect("pull");
        assert!(store.ack(first[0].id).await.expect("ack"));
        let second = store.pull(partition, 1).await.expect("pull");
        assert_eq!(&*second[0].event.event_id, "e2");
        assert!(
            store
                .dead_letter(second[0].id, "gave up")
                .await
                .expect("dead")
        );
    });
}

/// What `inspect` shows of a store `fill` filled.
fn inspect_shows_the_filled_store(path: &std::path::Path) {
    let path_text = path.to_str().expect("utf-8");
    let (code, out, err) = oncegate(&["inspect", "--store", path_text, "stats"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pending      2"), "{out}");
    assert!(out.contains("completed    1"), "{out}");
    assert!(out.contains("queued       1"), "{out}");
    assert!(out.contains("dead letters 1"), "{out}");

    let (code, out, _) = oncegate(&[
        "inspect",
        "--store",
        path_text,
        "record",
        "--platform",
        "feishu",
        "--app",
        "cli_x",
        "--id",
        "e1",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("completed (no outcome)"), "{out}");
    assert_eq!(
        out.lines().count(),
        1,
        "one record, in its chat's partition: {out}"
    );
    let (_, out, _) = oncegate(&[
        "inspect",
        "--store",
        path_text,
        "record",
        "--platform",
        "feishu",
        "--app",
        "cli_x",
        "--id",
        "e9",
    ]);
    assert!(out.contains("not seen"), "{out}");
    let (_, out, _) = oncegate(&["inspect", "--store", path_text, "queue"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains("im.message.receive_v1  e3  chat=oc_chat"),
        "{out}"
    );
    let (_, out, _) = oncegate(&["inspect", "--store", path_text, "dead-letters"]);
    assert!(out.contains("e2  attempts=1  reason: gave up"), "{out}");
    let (_, out, _) = oncegate(&["inspect", "--store", path_text, "records"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    let (code, _, err) = oncegate(&["inspect", "--store", path_text, "record", "--key", "xyz"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a key hash"), "{err}");
}

#[test]
fn inspect_reads_a_store_while_its_gateway_holds_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("store");
    let store = oncegate_journal::open(JournalConfig::at(&path)).expect("open");
    fill(&store);
    inspect_shows_the_filled_store(&path);
    drop(store);
}

/// An empty store's listings say they are empty, rather than print nothing.
#[test]
fn inspect_says_when_a_listing_is_empty() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("store");
    drop(oncegate_journal::open(JournalConfig::at(&path)).expect("open"));
    let path_text = path.to_str().expect("utf-8");
    for (what, said) in [
        ("queue", "no events queued"),
        ("dead-letters", "no dead letters"),
        ("records", "no records"),
    ] {
        let (code, out, err) = oncegate(&["inspect", "--store", path_text, what]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with(said), "{what}: {out:?}");
    }
    let (_, out, _) = oncegate(&["inspect", "--store", path_text, "stats"]);
    assert!(
        out.contains("pending      0  (admitted, not handled yet"),
        "{out}"
    );
}

#[test]
fn a_store_file_of_the_earlier_format_is_refused_then_migrated_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let old = dir.path().join("oncegate.redb");
    let run_before = {
        let store = EmbeddedStore::open(EmbeddedConfig::at(&old)).expect("open");
        fill(&store);
        drop(store);
        oncegate_embedded::StoreReader::open(&old)
            .expect("reader")
            .run()
            .expect("run")
    };
    // It can still be inspected as it is.
    inspect_shows_the_filled_store(&old);
    // A gateway refuses to start beside it, whether the path names the file or the folder the
    // earlier default now names: it says what to run.
    for configured in [old.clone(), dir.path().join("oncegate")] {
        let config = dir.path().join("c.toml");
        std::fs::write(
            &config,
            format!("[store]\npath = \"{}\"\n", configured.display()),
        )
        .expect("config");
        let (code, err) = serve_refused(&config);
        assert_ne!(code, 0);
        assert!(
            err.contains("earlier embedded format") && err.contains("oncegate migrate-store"),
            "{err}"
        );
        assert!(!dir.path().join("oncegate").exists(), "nothing was created");
    }
    let new = dir.path().join("oncegate");
    let (code, out, err) = oncegate(&[
        "migrate-store",
        old.to_str().expect("utf-8"),
        new.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("oncegate.redb.migrated"), "{out}");
    assert!(!old.exists() && dir.path().join("oncegate.redb.migrated").is_file());
    inspect_shows_the_filled_store(&new);
    // The moved store remembers every key, and its tokens are above the old file's.
    let store = oncegate_journal::open(JournalConfig::at(&new)).expect("open the new folder");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        for id in ["e1", "e2", "e3"] {
            let key = key_for("feishu", "cli_x", "event_id", id);
            let again = store
                .admit(event(id), &[key], Duration::from_secs(86_400))
                .await
                .expect("admit");
            assert!(
                matches!(again, Admission::Duplicate { .. }),
                "{id}: {again:?}"
            );
        }
        let key = key_for("feishu", "cli_x", "event_id", "e3");
        let partition = event("e3").partition(store.partitions());
        let Claim::Acquired(lease) = store
            .claim(&key, partition, Duration::from_secs(60))
            .await
            .expect("claim")
        else {
            panic!("e3 is pending");
        };
        assert!(
            lease.token.run() > run_before,
            "{lease:?} vs run {run_before}"
        );
        let dead = store.dead_letters(10).await.expect("dead");
        assert_eq!(dead.len(), 1);
        assert_eq!(&*dead[0].event.event_id, "e2");
        assert!(
            store
                .replay_dead_letter(dead[0].id)
                .await
                .expect("replay")
                .is_some()
        );
    });
    // Migrating again has nothing to move.
    let (code, _, err) = oncegate(&[
        "migrate-store",
        old.to_str().expect("utf-8"),
        new.to_str().expect("utf-8"),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("not a store file"), "{err}");
}

/// `simulate` against a gateway that is not there fails (it exited 0 when every request
/// failed), saying what to check.
#[test]
fn simulate_fails_when_nothing_is_accepted() {
    let dir = tempfile::tempdir().expect("dir");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let config = dir.path().join("oncegate.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"memory\"\n\n[server]\nlisten = \"127.0.0.1:{closed}\"\n\
             admin_listen = \"127.0.0.1:{closed}\"\n\n[[source]]\nname = \"bot\"\n\
             platform = \"feishu\"\napp_id = \"cli_sim\"\nencrypt_key = \"sim-encrypt-key\"\n"
        ),
    )
    .expect("config");
    let config = config.to_string_lossy().into_owned();
    let (code, stdout, stderr) =
        oncegate(&["simulate", "--quiet", "--events", "3", "--config", &config]);
    assert_ne!(code, 0, "{stdout}{stderr}");
    assert!(stderr.contains("no request was accepted"), "{stderr}");
}
