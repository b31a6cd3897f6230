//! Tests of the whole config: each names the field its error must name.
//! Cluster settings and secrets (tokens, TLS, values never echoed) have
//! files of their own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ticketing_core::budget::BudgetConfig;
use ticketing_core::raft::RaftConfig;
use ticketing_core::server::ServerConfig;

use super::*;

mod cluster;
mod secrets;

fn args(argv: &[&str]) -> ServeArgs {
    let mut full = vec!["ticketing", "serve"];
    full.extend_from_slice(argv);
    match Cli::try_parse_from(full)
        .expect("valid command line")
        .command
    {
        Command::Serve(args) => args,
        other => panic!("not serve: {other:?}"),
    }
}

#[test]
fn durations_take_ms_s_and_m() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
    assert_eq!(parse_duration(".25s"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("0.5m"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("2.5ms"), Ok(Duration::from_micros(2_500)));
    for bad in ["", "5", "s", "5h", "-1s", "1.5.1s", ".s", "5 s"] {
        let error = parse_duration(bad).unwrap_err();
        // Every refusal says what is accepted, fractions included.
        assert!(error.contains("1.5s"), "{bad:?}: {error}");
    }
}

#[test]
fn lock_takes_the_command_after_the_separator() {
    let cli = Cli::try_parse_from([
        "ticketing",
        "lock",
        "k",
        "--addr",
        "127.0.0.1:1",
        "--wait",
        "0",
        "--",
        "echo",
        "--x",
    ])
    .unwrap();
    let Command::Lock(args) = cli.command else {
        panic!("not lock");
    };
    assert_eq!(args.key, "k");
    assert_eq!(args.addrs, ["127.0.0.1:1"]);
    assert_eq!(args.wait, Duration::ZERO);
    assert_eq!(args.lease, Duration::from_secs(30));
    assert_eq!(args.command, ["echo", "--x"]);
    assert!(Cli::try_parse_from(["ticketing", "lock", "k"]).is_err());
}

fn resolve_args(argv: &[&str]) -> Result<Config, ConfigError> {
    resolve(&FileConfig::default(), None, &args(argv), &Env::default())
}

fn field_of(result: Result<Config, ConfigError>) -> String {
    result.expect_err("config must be refused").field
}

#[test]
fn no_arguments_mean_loopback_5225_without_auth() {
    let config = resolve_args(&[]).unwrap();
    assert_eq!(config.settings.listen, DEFAULT_LISTEN.parse().unwrap());
    assert_eq!(config.auth, AuthMode::None);
    assert!(config.settings.server.client_tokens.is_no_auth());
    assert!(config.settings.tls.is_none());
    assert_eq!(config.log_filter, "info");
    let defaults = ServerConfig::default();
    assert_eq!(config.settings.server.lock, defaults.lock);
    assert_eq!(
        config.settings.server.connections_max,
        defaults.connections_max
    );
}

#[test]
fn bad_listen_address_names_listen() {
    let err = resolve_args(&["--listen", "localhost"]).unwrap_err();
    assert_eq!(err.field, "listen");
    assert!(err.message.contains("IP:PORT"), "{err}");
}

#[test]
fn log_format_is_text_unless_json_and_a_bad_one_is_named() {
    assert_eq!(resolve_args(&[]).unwrap().log_format, LogFormat::Text);
    let config = resolve_args(&["--log-format", "json"]).unwrap();
    assert_eq!(config.log_format, LogFormat::Json);
    let file = parse_file("log_format = \"json\"").unwrap();
    let config = resolve(
        &file,
        None,
        &args(&["--log-format", "text"]),
        &Env::default(),
    );
    assert_eq!(config.unwrap().log_format, LogFormat::Text, "the flag wins");
    let config = resolve(&file, None, &args(&[]), &Env::default());
    assert_eq!(config.unwrap().log_format, LogFormat::Json);
    assert_eq!(
        field_of(resolve_args(&["--log-format", "yaml"])),
        "log_format"
    );
}

#[test]
fn admin_listen_is_off_unless_set_and_a_bad_one_is_named() {
    assert_eq!(resolve_args(&[]).unwrap().settings.admin_listen, None);
    let config = resolve_args(&["--admin-listen", "127.0.0.1:9225"]).unwrap();
    assert_eq!(
        config.settings.admin_listen,
        Some("127.0.0.1:9225".parse().unwrap())
    );
    let file = parse_file("admin_listen = \"127.0.0.1:9226\"").unwrap();
    let config = resolve(&file, None, &args(&[]), &Env::default()).unwrap();
    assert_eq!(
        config.settings.admin_listen,
        Some("127.0.0.1:9226".parse().unwrap())
    );
    let err = resolve_args(&["--admin-listen", "localhost:9225"]).unwrap_err();
    assert_eq!(err.field, "admin_listen");
    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--admin-listen".to_owned(), "127.0.0.1:9227".to_owned()]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let config = resolve_args(&argv).unwrap();
    assert_eq!(
        config.cluster.unwrap().admin_listen,
        Some("127.0.0.1:9227".parse().unwrap())
    );
}

#[test]
fn limits_must_be_at_least_one_and_sane() {
    for (flag, field, max) in [
        ("--max-keys", "limits.max_keys", MAX_KEYS_MAX),
        (
            "--max-waiters-per-key",
            "limits.max_waiters_per_key",
            MAX_WAITERS_PER_KEY_MAX,
        ),
        (
            "--max-waiters-total",
            "limits.max_waiters_total",
            MAX_WAITERS_TOTAL_MAX,
        ),
        (
            "--max-connections",
            "limits.max_connections",
            MAX_CONNECTIONS_MAX,
        ),
        (
            "--max-in-flight-per-connection",
            "limits.max_in_flight_per_connection",
            MAX_IN_FLIGHT_PER_CONNECTION_MAX,
        ),
        (
            "--max-handshakes",
            "limits.max_handshakes",
            MAX_HANDSHAKES_MAX,
        ),
        (
            "--max-handshakes-per-source",
            "limits.max_handshakes_per_source",
            MAX_HANDSHAKES_MAX,
        ),
        (
            "--max-peer-handshakes",
            "limits.max_peer_handshakes",
            MAX_PEER_HANDSHAKES_MAX,
        ),
        (
            "--max-peer-handshakes-per-source",
            "limits.max_peer_handshakes_per_source",
            MAX_PEER_HANDSHAKES_MAX,
        ),
        (
            "--max-held-per-connection",
            "limits.max_held_per_connection",
            MAX_HELD_PER_CONNECTION_MAX,
        ),
    ] {
        let err = resolve_args(&[flag, "0"]).unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.message.contains(&format!("1..={max}")), "{err}");
        let too_big = (max + 1).to_string();
        assert_eq!(field_of(resolve_args(&[flag, &too_big])), field);
        assert!(resolve_args(&[flag, "1"]).is_ok());
        assert!(resolve_args(&[flag, &max.to_string()]).is_ok());
    }
}

#[test]
fn budget_defaults_follow_max_connections_and_fields_apply() {
    let config = resolve_args(&["--max-connections", "200"]).unwrap();
    let server = &config.settings.server;
    assert_eq!(server.budget, BudgetConfig::for_connections_max(200));
    assert_eq!(server.handshake_timeout, Duration::from_secs(3));
    let file = parse_file(
        "[limits]\nmax_handshakes = 40\nmax_held_per_connection = 7\n\
             max_release_misses_in_row = 0\nhandshake_timeout_ms = 500\n",
    )
    .unwrap();
    let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
    let server = &config.settings.server;
    assert_eq!(server.budget.handshakes_max, 40);
    assert_eq!(server.budget.handshakes_per_source_max, 20);
    assert_eq!(server.budget.held_per_connection_max, 7);
    assert_eq!(server.budget.release_misses_in_row_max, 0);
    assert_eq!(server.handshake_timeout, Duration::from_millis(500));
}

#[test]
fn release_misses_and_handshake_timeout_are_range_checked_by_name() {
    let too_many = (MAX_RELEASE_MISSES_IN_ROW_MAX + 1).to_string();
    assert_eq!(
        field_of(resolve_args(&["--max-release-misses-in-row", &too_many])),
        "limits.max_release_misses_in_row"
    );
    let err = resolve_args(&["--handshake-timeout-ms", "99"]).unwrap_err();
    assert_eq!(err.field, "limits.handshake_timeout_ms");
    assert!(err.message.contains("100..=60000"), "{err}");
    assert_eq!(
        field_of(resolve_args(&["--handshake-timeout-ms", "60001"])),
        "limits.handshake_timeout_ms"
    );
}

#[test]
fn wait_margin_is_0_to_900_ms() {
    let err = resolve_args(&["--wait-margin-ms", "901"]).unwrap_err();
    assert_eq!(err.field, "wait_margin_ms");
    assert!(err.message.contains("0..=900"), "{err}");
    let zero = resolve_args(&["--wait-margin-ms", "0"]).unwrap();
    assert_eq!(zero.settings.server.lock.wait_margin, Duration::ZERO);
    let max = resolve_args(&["--wait-margin-ms", "900"]).unwrap();
    assert_eq!(
        max.settings.server.lock.wait_margin,
        Duration::from_millis(900)
    );
}

#[test]
fn worker_threads_default_to_one_and_are_1_to_256() {
    assert_eq!(resolve_args(&[]).unwrap().worker_threads, 1);
    let err = resolve_args(&["--worker-threads", "0"]).unwrap_err();
    assert_eq!(err.field, "worker_threads");
    assert!(err.message.contains("1..=256"), "{err}");
    assert_eq!(
        field_of(resolve_args(&["--worker-threads", "257"])),
        "worker_threads"
    );
    assert_eq!(
        resolve_args(&["--worker-threads", "4"])
            .unwrap()
            .worker_threads,
        4
    );
    let file = parse_file("worker_threads = 2").unwrap();
    let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
    assert_eq!(config.worker_threads, 2);
}

#[test]
fn file_values_apply_and_flags_override_them() {
    let file = parse_file(
        r#"
            listen = "127.0.0.1:7000"
            log_level = "debug"
            wait_margin_ms = 250
            [limits]
            max_keys = 10
            max_waiters_per_key = 20
            max_waiters_total = 30
            max_connections = 40
            max_in_flight_per_connection = 50
            "#,
    )
    .unwrap();
    let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
    let server = &config.settings.server;
    assert_eq!(config.settings.listen, "127.0.0.1:7000".parse().unwrap());
    assert_eq!(config.log_filter, "debug");
    assert_eq!(server.lock.wait_margin, Duration::from_millis(250));
    assert_eq!(server.lock.limits.keys_max, 10);
    assert_eq!(server.lock.limits.waiters_per_key_max, 20);
    assert_eq!(server.lock.limits.waiters_total_max, 30);
    assert_eq!(server.connections_max, 40);
    assert_eq!(server.in_flight_per_connection_max, 50);

    let flags = args(&[
        "--listen",
        "127.0.0.1:7001",
        "--log-level",
        "WARN",
        "--wait-margin-ms",
        "5",
        "--max-keys",
        "11",
        "--max-connections",
        "41",
    ]);
    let config = resolve(&file, None, &flags, &Env::default()).unwrap();
    let server = &config.settings.server;
    assert_eq!(config.settings.listen, "127.0.0.1:7001".parse().unwrap());
    assert_eq!(config.log_filter, "warn");
    assert_eq!(server.lock.wait_margin, Duration::from_millis(5));
    assert_eq!(server.lock.limits.keys_max, 11);
    assert_eq!(server.lock.limits.waiters_per_key_max, 20);
    assert_eq!(server.connections_max, 41);
}

#[test]
fn file_limit_out_of_range_names_the_field() {
    let file = parse_file("[limits]\nmax_waiters_total = 0\n").unwrap();
    let err = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
    assert_eq!(err.field, "limits.max_waiters_total");
}

#[test]
fn unknown_fields_are_rejected_with_their_name() {
    for (text, field) in [
        ("listen_addr = \"127.0.0.1:1\"", "listen_addr"),
        ("[limits]\nmax_key = 1", "limits.max_key"),
        ("[tls]\ncertificate = \"x\"", "tls.certificate"),
        (
            "[[cluster.slots]]\nclient_addr = \"x\"",
            "cluster.slots[0].client_addr",
        ),
    ] {
        let err = parse_file(text).unwrap_err();
        assert_eq!(err.field, field, "{text}");
        assert!(err.message.contains("unknown field"), "{err}");
        assert!(err.message.contains("allowed here"), "{err}");
        assert!(!err.message.contains('\n'), "not one line: {err}");
    }
}

#[test]
fn log_level_is_checked_and_rust_log_is_used_below_the_flag() {
    assert_eq!(
        field_of(resolve_args(&["--log-level", "loud"])),
        "log_level"
    );
    let env = Env {
        client_tokens: None,
        rust_log: Some("ticketing_tokio=debug".to_owned()),
        ..Env::default()
    };
    let file = parse_file("log_level = \"error\"").unwrap();
    let config = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
    assert_eq!(config.log_filter, "ticketing_tokio=debug");
    let config = resolve(&file, None, &args(&["--log-level", "trace"]), &env).unwrap();
    assert_eq!(config.log_filter, "trace");
    let bad_file = parse_file("log_level = \"verbose\"").unwrap();
    let err = resolve(&bad_file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
    assert_eq!(err.field, "log_level");
}

#[test]
fn load_reports_a_missing_config_file() {
    let flags = args(&["--config", "/nonexistent/ticketing.toml"]);
    let err = load(&flags, &Env::default()).unwrap_err();
    assert_eq!(err.field, "--config");
    assert!(err.message.contains("/nonexistent/ticketing.toml"), "{err}");
}

#[test]
fn listen_backlog_defaults_to_1024_applies_to_both_modes_and_is_range_checked() {
    let backlog = |file: &FileConfig, argv: &[&str]| {
        resolve(file, None, &args(argv), &Env::default()).map(|c| c.settings.listen_backlog)
    };
    let none = FileConfig::default();
    assert_eq!(backlog(&none, &[]), Ok(1_024));
    let file = parse_file("listen_backlog = 4096").unwrap();
    assert_eq!(backlog(&file, &[]), Ok(4096));
    assert_eq!(backlog(&file, &["--listen-backlog", "1"]), Ok(1));
    for bad in ["0", "65536"] {
        let err = backlog(&none, &["--listen-backlog", bad]).unwrap_err();
        assert_eq!(err.field, "listen_backlog", "{err}");
        assert!(err.message.contains("1..=65535"), "{err}");
    }
    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--listen-backlog".to_owned(), "300".to_owned()]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    assert_eq!(
        resolve_args(&argv).unwrap().cluster.unwrap().listen_backlog,
        300
    );
}

const IDENTITY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

const SLOTS3: [&str; 6] = [
    "--slot",
    "127.0.0.1:5225,127.0.0.1:6225",
    "--slot",
    "127.0.0.1:5226,127.0.0.1:6226",
    "--slot",
    "127.0.0.1:5227,127.0.0.1:6227",
];

fn cluster_args(extra: &[&str]) -> Vec<String> {
    let mut argv = vec![
        "--cluster-identity",
        IDENTITY,
        "--self-slot",
        "1",
        "--peer-token",
        "peer-token-0123456789-abcdefghijk",
    ];
    argv.extend_from_slice(extra);
    argv.into_iter().map(str::to_owned).collect()
}
