//! Tests of the whole config: each names the field its error must name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ticketing_core::budget::BudgetConfig;
use ticketing_core::raft::RaftConfig;
use ticketing_core::server::ServerConfig;

use super::*;

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

fn cluster_field(argv: &[String]) -> String {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    field_of(resolve_args(&argv))
}

#[test]
fn cluster_flags_give_the_slot_addresses_and_profile() {
    let mut argv = cluster_args(&SLOTS3);
    argv.extend([
        "--profile".to_owned(),
        "fast".to_owned(),
        "--bootstrap".to_owned(),
    ]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let config = resolve_args(&argv).unwrap();
    let cluster = config.cluster.expect("cluster mode");
    assert_eq!(cluster.client_listen, "127.0.0.1:5226".parse().unwrap());
    assert_eq!(cluster.peer_listen, "127.0.0.1:6226".parse().unwrap());
    assert_eq!(cluster.peer_addrs.len(), 3);
    assert_eq!(cluster.node.slot_count, 3);
    assert_eq!(cluster.node.id.slot, 1);
    assert_eq!(cluster.node.raft, RaftConfig::fast());
    assert!(cluster.bootstrap);
    assert_eq!(config.settings.listen, cluster.client_listen);
}

#[test]
fn cluster_slot_count_must_be_3_or_5() {
    let four = [
        SLOTS3.as_slice(),
        &["--slot", "127.0.0.1:5228,127.0.0.1:6228"],
    ]
    .concat();
    assert_eq!(cluster_field(&cluster_args(&four)), "cluster.slots");
    let err = {
        let argv = cluster_args(&four);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        resolve_args(&argv).unwrap_err()
    };
    assert!(err.message.contains("even"), "{err}");
    assert_eq!(cluster_field(&cluster_args(&SLOTS3[..4])), "cluster.slots");
}

#[test]
fn cluster_errors_name_their_field() {
    let mut bad_identity = cluster_args(&SLOTS3);
    bad_identity[1] = IDENTITY.to_uppercase();
    assert_eq!(cluster_field(&bad_identity), "cluster.identity");
    let mut bad_slot = cluster_args(&SLOTS3);
    bad_slot[3] = "3".to_owned();
    assert_eq!(cluster_field(&bad_slot), "cluster.self_slot");
    let mut short_token = cluster_args(&SLOTS3);
    short_token[5] = "short".to_owned();
    assert_eq!(cluster_field(&short_token), "cluster.peer_tokens[0]");
    let mut dup = cluster_args(&SLOTS3);
    let last = dup.len() - 1;
    dup[last] = "127.0.0.1:5225,127.0.0.1:6227".to_owned();
    assert_eq!(cluster_field(&dup), "cluster.slots[2].client");
    let mut profile = cluster_args(&SLOTS3);
    profile.extend(["--profile".to_owned(), "turbo".to_owned()]);
    assert_eq!(cluster_field(&profile), "cluster.profile");
    assert_eq!(
        cluster_field(&cluster_args(&[
            "--slot", "x", "--slot", "y", "--slot", "z"
        ])),
        "cluster.slots[0]"
    );
}

#[test]
fn slot_admin_addresses_come_from_the_flags_or_the_file_and_a_bad_one_is_named() {
    let mut argv = cluster_args(&SLOTS3);
    for port in [9225, 9226, 9227] {
        argv.extend([
            "--slot-admin".to_owned(),
            format!("node{port}.example:{port}"),
        ]);
    }
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let node = resolve_args(&argv_ref).unwrap().cluster.unwrap().node;
    let expected: Vec<Box<str>> = [
        "node9225.example:9225",
        "node9226.example:9226",
        "node9227.example:9227",
    ]
    .into_iter()
    .map(Box::from)
    .collect();
    assert_eq!(node.admin_addresses, expected);
    // None given: none known.
    let argv_ref: Vec<String> = cluster_args(&SLOTS3);
    let argv_ref: Vec<&str> = argv_ref.iter().map(String::as_str).collect();
    assert!(
        resolve_args(&argv_ref)
            .unwrap()
            .cluster
            .unwrap()
            .node
            .admin_addresses
            .is_empty()
    );
    // Too few flags, and a port that is not one.
    let mut short = cluster_args(&SLOTS3);
    short.extend(["--slot-admin".to_owned(), "a:1".to_owned()]);
    assert_eq!(cluster_field(&short), "--slot-admin");
    let mut bad = cluster_args(&SLOTS3);
    for admin in ["a:1", "b:x", "c:3"] {
        bad.extend(["--slot-admin".to_owned(), admin.to_owned()]);
    }
    assert_eq!(cluster_field(&bad), "--slot-admin[1]");
    // The file: every slot or none, and the field is named.
    let file = |admins: [&str; 3]| {
        parse_file(&format!(
            r#"
                client_tokens = ["client-token-0123456789"]
                [cluster]
                identity = "{IDENTITY}"
                self_slot = 0
                peer_tokens = ["peer-token-0123456789-abcdefghijk"]
                slots = [
                  {{ client = "10.0.0.1:5225", peer = "10.0.0.1:6225" {} }},
                  {{ client = "10.0.0.2:5225", peer = "10.0.0.2:6225" {} }},
                  {{ client = "10.0.0.3:5225", peer = "10.0.0.3:6225" {} }},
                ]
                "#,
            admins[0], admins[1], admins[2]
        ))
        .unwrap()
    };
    let all = file([
        r#", admin = "10.0.0.1:9225""#,
        r#", admin = "10.0.0.2:9225""#,
        r#", admin = "10.0.0.3:9225""#,
    ]);
    let config = resolve(&all, None, &args(&[]), &Env::default()).unwrap();
    assert_eq!(
        config.cluster.unwrap().node.admin_addresses[2].as_ref(),
        "10.0.0.3:9225"
    );
    let missing = file([
        r#", admin = "10.0.0.1:9225""#,
        "",
        r#", admin = "10.0.0.3:9225""#,
    ]);
    let err = resolve(&missing, None, &args(&[]), &Env::default()).unwrap_err();
    assert_eq!(err.field, "cluster.slots[1].admin");
}

#[test]
fn cluster_table_in_the_file_is_read() {
    let file = parse_file(&format!(
        r#"
            client_tokens = ["client-token-0123456789"]
            [cluster]
            identity = "{IDENTITY}"
            self_slot = 0
            peer_tokens = ["peer-token-0123456789-abcdefghijk", "old-peer-token-0123456789-abcdefghijk"]
            profile = "default"
            slots = [
              {{ client = "10.0.0.1:5225", peer = "10.0.0.1:6225" }},
              {{ client = "10.0.0.2:5225", peer = "10.0.0.2:6225" }},
              {{ client = "10.0.0.3:5225", peer = "10.0.0.3:6225" }},
            ]
            "#
    ))
    .unwrap();
    let config = resolve(&file, None, &args(&[]), &Env::default()).unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.client_listen, "10.0.0.1:5225".parse().unwrap());
    assert_eq!(cluster.node.raft, RaftConfig::default());
    assert!(!cluster.bootstrap, "bootstrap is a command-line flag only");
    let missing_peer = parse_file(&format!(
        "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 0\npeer_tokens = [\"peer-token-0123456789-abcdefghijk\"]\nslots = [{{ client = \"127.0.0.1:1\" }}]\n"
    ))
    .unwrap();
    assert_eq!(
        field_of(resolve(&missing_peer, None, &args(&[]), &Env::default())),
        "cluster.slots[0].peer"
    );
}

#[test]
fn peer_tokens_come_from_flags_then_env_then_file() {
    let cluster_file = |tokens: &str| {
        parse_file(&format!(
            "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n{tokens}"
        ))
        .unwrap()
    };
    let short_file = cluster_file("peer_tokens = [\"x\"]\n");
    let slots = args(&SLOTS3);
    let err = resolve(&short_file, None, &slots, &Env::default()).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tokens[0]");
    assert!(err.message.contains("the config file"), "{err}");

    let env = Env {
        peer_tokens: Some(
            " env-peer-token-0123456-abcdefghijk, ,env-peer-token-abcdefg-abcdefghijk".to_owned(),
        ),
        ..Env::default()
    };
    assert!(resolve(&short_file, None, &slots, &env).is_ok());
    let env_short = Env {
        peer_tokens: Some("env-peer-token-0123456-abcdefghijk,tiny".to_owned()),
        ..Env::default()
    };
    let err = resolve(&short_file, None, &slots, &env_short).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tokens[1]");
    assert!(err.message.contains("4 bytes"), "{err}");
    assert!(err.message.contains("at least 32"), "{err}");
    assert!(err.message.contains("`ticketing token`"), "{err}");
    assert!(err.message.contains(ENV_PEER_TOKENS), "{err}");
    assert!(
        !err.to_string().contains("tiny"),
        "a secret was printed: {err}"
    );

    let with_flag = |token: &str| args(&[SLOTS3.as_slice(), &["--peer-token", token]].concat());
    let good_flag = with_flag("flag-peer-token-0123-abcdefghijklm");
    assert!(resolve(&short_file, None, &good_flag, &env_short).is_ok());
    let err = resolve(&short_file, None, &with_flag("x"), &env).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tokens[0]");
    assert!(err.message.contains("--peer-token"), "{err}");

    // 31 bytes pass a client token's minimum but not a peer token's.
    let one_short = "0123456789abcdef0123456789abcde";
    let err = resolve(&short_file, None, &with_flag(one_short), &env).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tokens[0]");
    assert!(err.message.contains("31 bytes"), "{err}");
    assert!(
        !err.to_string().contains(one_short),
        "a secret was printed: {err}"
    );
    let just_long_enough = "0123456789abcdef0123456789abcdef";
    assert!(resolve(&short_file, None, &with_flag(just_long_enough), &env).is_ok());

    let no_tokens = cluster_file("");
    assert_eq!(
        field_of(resolve(&no_tokens, None, &slots, &Env::default())),
        "cluster.peer_tokens"
    );
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
fn admin_tokens_come_from_the_token_file_else_the_env_else_the_file_list() {
    let none = resolve_args(&[]).unwrap();
    assert!(none.settings.admin_tokens.is_empty());
    let file = parse_file("admin_tokens = [\"file-admin-token-0123\", \"file-admin-token-4567\"]")
        .unwrap();
    let listed = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
    assert!(
        listed
            .settings
            .admin_tokens
            .accepts(b"file-admin-token-4567")
    );
    let env = Env {
        admin_tokens: Some("env-admin-token-0123456".to_owned()),
        ..Env::default()
    };
    let from_env = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
    assert!(
        from_env
            .settings
            .admin_tokens
            .accepts(b"env-admin-token-0123456")
    );
    assert!(
        !from_env
            .settings
            .admin_tokens
            .accepts(b"file-admin-token-0123")
    );

    let dir = std::env::temp_dir().join(format!("ticketing-admin-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokens");
    std::fs::write(&path, "# admin\n\nflag-admin-token-0123456\n").unwrap();
    let flagged = args(&["--admin-token-file", path.to_str().unwrap()]);
    let from_flag = resolve(&file, None, &flagged, &env).unwrap();
    assert!(
        from_flag
            .settings
            .admin_tokens
            .accepts(b"flag-admin-token-0123456")
    );
    assert!(!from_flag.settings.admin_tokens.accepts(b"# admin"));
    std::fs::write(&path, "flag-admin-token-0123456\nshort\n").unwrap();
    let err = resolve(&file, None, &flagged, &env).unwrap_err();
    assert_eq!(err.field, "admin_tokens[1]");
    assert!(!err.message.contains("short"), "never echo a token: {err}");
    std::fs::write(&path, "# nothing\n").unwrap();
    assert_eq!(
        resolve(&file, None, &flagged, &env).unwrap_err().field,
        "--admin-token-file"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let short = parse_file("admin_tokens = [\"tiny\"]").unwrap();
    let err = resolve(&short, None, &ServeArgs::default(), &Env::default()).unwrap_err();
    assert_eq!(err.field, "admin_tokens[0]");
}

#[test]
fn a_non_loopback_admin_listener_needs_an_admin_token_or_the_insecure_flag() {
    let err = resolve_args(&["--admin-listen", "0.0.0.0:9225"]).unwrap_err();
    assert_eq!(err.field, "admin_listen");
    assert!(err.message.contains("insecure_admin_no_auth"), "{err}");
    assert!(resolve_args(&["--admin-listen", "127.0.0.1:9225"]).is_ok());
    assert!(resolve_args(&["--admin-listen", "[::1]:9225"]).is_ok());
    assert!(resolve_args(&["--admin-listen", "0.0.0.0:9225", "--insecure-admin-no-auth"]).is_ok());
    let file =
        parse_file("admin_listen = \"0.0.0.0:9225\"\nadmin_tokens = [\"file-admin-token-0123\"]")
            .unwrap();
    assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
    let file =
        parse_file("admin_listen = \"0.0.0.0:9225\"\ninsecure_admin_no_auth = true").unwrap();
    assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
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
fn listen_rule_is_loopback_or_tokens_or_explicit_insecure() {
    let public: SocketAddr = "0.0.0.0:5225".parse().unwrap();
    let err = check_listen_auth(public, false, false).unwrap_err();
    assert_eq!(err.field, "listen");
    assert!(err.message.contains("insecure_no_auth"), "{err}");
    assert!(check_listen_auth(public, true, false).is_ok());
    assert!(check_listen_auth(public, false, true).is_ok());
    for loopback in [
        "127.0.0.1:1",
        "127.3.4.5:1",
        "[::1]:1",
        "[::ffff:127.0.0.1]:1",
    ] {
        assert!(check_listen_auth(loopback.parse().unwrap(), false, false).is_ok());
    }
    assert!(check_listen_auth("[::]:1".parse().unwrap(), false, false).is_err());
    assert!(check_listen_auth("10.0.0.1:1".parse().unwrap(), false, false).is_err());
}

#[test]
fn non_loopback_without_tokens_is_refused_unless_insecure() {
    assert_eq!(
        field_of(resolve_args(&["--listen", "0.0.0.0:5225"])),
        "listen"
    );
    let config = resolve_args(&["--listen", "0.0.0.0:5225", "--insecure-no-auth"]).unwrap();
    assert_eq!(config.auth, AuthMode::None);
    let file = parse_file("listen = \"0.0.0.0:1\"\ninsecure_no_auth = true\n").unwrap();
    assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
}

#[test]
fn non_loopback_with_tokens_is_allowed() {
    let config = resolve_args(&[
        "--listen",
        "0.0.0.0:5225",
        "--client-token",
        "0123456789abcdef",
    ])
    .unwrap();
    assert_eq!(config.auth, AuthMode::Tokens(1));
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
fn short_token_names_its_index_and_source() {
    let err = resolve_args(&[
        "--client-token",
        "0123456789abcdef",
        "--client-token",
        "short",
    ])
    .unwrap_err();
    assert_eq!(err.field, "client_tokens[1]");
    assert!(err.message.contains("5 bytes"), "{err}");
    assert!(err.message.contains("16"), "{err}");
    assert!(
        !err.to_string().contains("short"),
        "a secret was printed: {err}"
    );
}

#[test]
fn tokens_come_from_flags_then_env_then_file() {
    let file = parse_file("client_tokens = [\"file-token-0123456789\"]").unwrap();
    let env = Env {
        client_tokens: Some("env-token-0123456789, env-token-abcdefghij,".to_owned()),
        rust_log: None,
        ..Env::default()
    };
    let from_env = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
    assert_eq!(from_env.auth, AuthMode::Tokens(2));
    let from_file = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
    assert_eq!(from_file.auth, AuthMode::Tokens(1));
    let flags = args(&["--client-token", "x"]);
    let err = resolve(&file, None, &flags, &env).unwrap_err();
    assert_eq!(err.field, "client_tokens[0]");
    assert!(err.message.contains("--client-token"), "{err}");
    let env_short = Env {
        client_tokens: Some("fine-token-0123456789,tiny".to_owned()),
        rust_log: None,
        ..Env::default()
    };
    let err = resolve(&file, None, &ServeArgs::default(), &env_short).unwrap_err();
    assert_eq!(err.field, "client_tokens[1]");
    assert!(err.message.contains(ENV_CLIENT_TOKENS), "{err}");
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

/// Looks like a token: it must never appear in an error, whichever field
/// it was put in by mistake.
const PASTED: &str = "tok3n-5ecret-0123456789abcdef";

#[test]
fn a_value_of_the_wrong_kind_names_its_field_and_line_but_not_the_value() {
    let cases = [
        (
            format!("[limits]\nmax_hold_limit_s = \"{PASTED}\""),
            "limits.max_hold_limit_s",
            "expected a whole number of seconds, got a string (at line 2)",
        ),
        (
            format!("wait_margin_ms = \"{PASTED}\""),
            "wait_margin_ms",
            "expected a whole number of milliseconds, got a string (at line 1)",
        ),
        (
            "worker_threads = -3".to_owned(),
            "worker_threads",
            "expected a whole number, got a negative integer (at line 1)",
        ),
        (
            format!("insecure_no_auth = \"{PASTED}\""),
            "insecure_no_auth",
            "expected true or false, got a string (at line 1)",
        ),
        (
            "listen = 5".to_owned(),
            "listen",
            "expected a string, got an integer (at line 1)",
        ),
        (
            format!("admin_allowed_hosts = \"{PASTED}\""),
            "admin_allowed_hosts",
            "expected a list, got a string (at line 1)",
        ),
        (
            format!("limits = \"{PASTED}\""),
            "limits",
            "expected a table, got a string (at line 1)",
        ),
        (
            format!(
                "[cluster]\npeer_tls = {{ server_name = 7 }}\n[[cluster.slots]]\npeer = \"{PASTED}\""
            ),
            "cluster.peer_tls.server_name",
            "expected a string, got an integer (at line 2)",
        ),
        (
            format!(
                "[[cluster.slots]]\nclient = \"127.0.0.1:1\"\n[[cluster.slots]]\nadmin = [\"{PASTED}\"]"
            ),
            "cluster.slots[1].admin",
            "expected a string, got a list (at line 4)",
        ),
    ];
    for (text, field, message) in cases {
        let err = parse_file(&text).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(PASTED), "a value was printed: {shown}");
        assert!(!shown.contains("-3"), "a value was printed: {shown}");
        assert_eq!(err.field, field, "{text}");
        assert_eq!(err.message, message, "{text}");
    }
}

#[test]
fn text_that_is_not_toml_names_the_field_of_its_line_but_not_the_value() {
    for (text, field, line) in [
        (
            format!("[limits]\nmax_keys = 0x{PASTED}"),
            "limits.max_keys",
            2,
        ),
        (format!("listen = \"{PASTED}"), "listen", 1),
        (
            format!(
                "[[cluster.slots]]\nclient = \"a\"\n[[cluster.slots]]\npeer = [\n  {PASTED}\n]"
            ),
            "cluster.slots[1].peer",
            5,
        ),
        // No key to name: the file.
        (PASTED.to_owned(), "--config", 1),
    ] {
        let err = parse_file(&text).unwrap_err();
        let shown = err.to_string();
        assert_eq!(err.field, field, "{text}: {shown}");
        assert!(
            err.message
                .starts_with(&format!("invalid TOML at line {line}: ")),
            "{shown}"
        );
        assert!(!shown.contains(PASTED), "a value was printed: {shown}");
    }
}

#[test]
fn a_bad_flag_value_names_the_flag_but_not_the_value() {
    for (argv, flag, wanted) in [
        (
            vec!["serve", "--max-hold-limit-s", PASTED],
            "--max-hold-limit-s",
            "a whole number of seconds",
        ),
        (
            vec!["serve", "--handshake-timeout-ms", PASTED],
            "--handshake-timeout-ms",
            "a whole number of milliseconds",
        ),
        (
            vec!["serve", "--max-keys", PASTED],
            "--max-keys",
            "a whole number",
        ),
        (
            vec!["lock", "k", "--wait", PASTED, "--", "true"],
            "--wait",
            "a number with a unit",
        ),
        (
            vec!["bench", "--threads", PASTED],
            "--threads",
            "a whole number",
        ),
        (
            vec!["bench", "--threads", "999"],
            "--threads",
            "a whole number in 1..=256",
        ),
        (
            vec!["lock", "k", "--cluster-identity", PASTED, "--", "true"],
            "--cluster-identity",
            "64 lowercase hex digits",
        ),
    ] {
        let mut full = vec!["ticketing"];
        full.extend(argv);
        let error = Cli::try_parse_from(&full).unwrap_err();
        let message = flag_value_error(&error).expect("a value error");
        assert!(!message.contains(PASTED), "a value was printed: {message}");
        assert!(
            message.starts_with(&format!("flag `{flag}`: expected ")),
            "{message}"
        );
        assert!(message.contains(wanted), "{full:?}: {message}");
    }
    // Not about a value: clap's message is kept.
    let error = Cli::try_parse_from(["ticketing", "serve", "--no-such-flag"]).unwrap_err();
    assert_eq!(flag_value_error(&error), None);
}

#[test]
fn a_bad_environment_value_names_the_variable_but_not_the_value() {
    let short = "tok3n-5ecret";
    let env = Env {
        client_tokens: Some(format!("{PASTED},{short}")),
        ..Env::default()
    };
    let err = resolve(&FileConfig::default(), None, &ServeArgs::default(), &env).unwrap_err();
    let shown = err.to_string();
    assert_eq!(err.field, "client_tokens[1]");
    assert!(shown.contains(ENV_CLIENT_TOKENS), "{shown}");
    assert!(!shown.contains(short), "a value was printed: {shown}");
    let env = Env {
        rust_log: Some(format!("ticketing=\"{PASTED}")),
        ..Env::default()
    };
    let err = resolve(&FileConfig::default(), None, &ServeArgs::default(), &env).unwrap_err();
    let shown = err.to_string();
    assert_eq!(err.field, "RUST_LOG");
    assert!(!shown.contains(PASTED), "a value was printed: {shown}");
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
fn tls_needs_both_files() {
    let err = resolve_args(&["--tls-cert", "a.pem"]).unwrap_err();
    assert_eq!(err.field, "tls.key");
    let err = resolve_args(&["--tls-key", "a.pem"]).unwrap_err();
    assert_eq!(err.field, "tls.cert");
    let file = parse_file("[tls]\ncert = \"a.pem\"").unwrap();
    let err = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
    assert_eq!(err.field, "tls.key");
}

#[test]
fn tls_files_must_be_readable_and_parseable() {
    let dir = std::env::temp_dir().join(format!("ticketing-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not pem at all\n").unwrap();
    let missing = dir.join("missing.pem");

    let err = resolve_args(&[
        "--tls-cert",
        missing.to_str().unwrap(),
        "--tls-key",
        garbage.to_str().unwrap(),
    ])
    .unwrap_err();
    assert_eq!(err.field, "tls.cert");
    assert!(err.message.contains("cannot read"), "{err}");

    let err = resolve_args(&[
        "--tls-cert",
        garbage.to_str().unwrap(),
        "--tls-key",
        garbage.to_str().unwrap(),
    ])
    .unwrap_err();
    assert_eq!(err.field, "tls.cert");
    assert!(err.message.contains("no PEM certificate"), "{err}");

    // Relative paths in the file resolve against the file's folder.
    let file = parse_file("[tls]\ncert = \"missing.pem\"\nkey = \"garbage.pem\"").unwrap();
    let err = resolve(&file, Some(&dir), &ServeArgs::default(), &Env::default()).unwrap_err();
    assert_eq!(err.field, "tls.cert");
    assert!(err.message.contains(&*missing.to_string_lossy()), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn peer_tls_errors_name_their_field() {
    let dir = std::env::temp_dir().join(format!("ticketing-peer-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("garbage.pem"), "not pem at all\n").unwrap();
    let resolve_peer_tls = |table: &str| {
        let file = parse_file(&format!(
            "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n\
                 peer_tokens = [\"peer-token-0123456789-abcdefghijk\"]\n[cluster.peer_tls]\n{table}"
        ))
        .unwrap();
        resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default())
    };
    let all = "cert = \"missing.pem\"\nkey = \"garbage.pem\"\nca = \"garbage.pem\"\n";
    assert_eq!(
        field_of(resolve_peer_tls("cert = \"a.pem\"\nca = \"c.pem\"\n")),
        "cluster.peer_tls.key"
    );
    assert_eq!(
        field_of(resolve_peer_tls(all)),
        "cluster.peer_tls.server_name"
    );
    let err = resolve_peer_tls(&format!("{all}server_name = \"not a name\"\n")).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tls.server_name");
    // Relative paths resolve against the file's folder.
    let err = resolve_peer_tls(&format!("{all}server_name = \"peers\"\n")).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tls.cert");
    assert!(err.message.contains("cannot read"), "{err}");
    assert!(
        err.message
            .contains(&*dir.join("missing.pem").to_string_lossy()),
        "{err}"
    );
    let err = resolve_peer_tls(
        "cert = \"garbage.pem\"\nkey = \"garbage.pem\"\nca = \"garbage.pem\"\nserver_name = \"peers\"\n",
    )
    .unwrap_err();
    assert_eq!(err.field, "cluster.peer_tls.cert");
    assert!(err.message.contains("no PEM certificate"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_key_and_pair_errors_name_their_table() {
    let dir = std::env::temp_dir().join(format!("ticketing-tls-pair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let leaf = rcgen::generate_simple_self_signed(["peers".to_owned()]).unwrap();
    std::fs::write(dir.join("cert.pem"), leaf.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), leaf.signing_key.serialize_pem()).unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(dir.join("other.pem"), other.serialize_pem()).unwrap();
    std::fs::write(dir.join("garbage.pem"), "not pem at all\n").unwrap();
    let cluster = format!(
        "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n\
             peer_tokens = [\"peer-token-0123456789-abcdefghijk\"]\n"
    );
    for (key, field_suffix) in [("garbage.pem", ".key"), ("other.pem", "")] {
        let text = format!("[tls]\ncert = \"cert.pem\"\nkey = \"{key}\"\n");
        let file = parse_file(&text).unwrap();
        let err = resolve(&file, Some(&dir), &args(&[]), &Env::default()).unwrap_err();
        assert_eq!(err.field, format!("tls{field_suffix}"), "{err}");
        let text = format!(
            "{cluster}[cluster.peer_tls]\ncert = \"cert.pem\"\nkey = \"{key}\"\n\
                 ca = \"cert.pem\"\nserver_name = \"peers\"\n"
        );
        let file = parse_file(&text).unwrap();
        let err = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap_err();
        assert_eq!(
            err.field,
            format!("cluster.peer_tls{field_suffix}"),
            "{err}"
        );
    }
    let text = format!(
        "{cluster}[cluster.peer_tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n\
             ca = \"garbage.pem\"\nserver_name = \"peers\"\n"
    );
    let file = parse_file(&text).unwrap();
    let err = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap_err();
    assert_eq!(err.field, "cluster.peer_tls.ca", "{err}");
    let text = text.replace("garbage.pem", "cert.pem");
    let file = parse_file(&text).unwrap();
    let config = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap();
    assert!(config.cluster.unwrap().peer_tls.is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_reports_a_missing_config_file() {
    let flags = args(&["--config", "/nonexistent/ticketing.toml"]);
    let err = load(&flags, &Env::default()).unwrap_err();
    assert_eq!(err.field, "--config");
    assert!(err.message.contains("/nonexistent/ticketing.toml"), "{err}");
}
#[test]
fn state_dir_comes_from_flag_then_file_then_the_default_for_the_process() {
    let dir_of = |file: &FileConfig, argv: &[&str], env: &Env| {
        let config = resolve(file, Some(Path::new("/etc/ticketing")), &args(argv), env).unwrap();
        config
            .settings
            .state
            .expect("the binary always has a state directory")
            .dir
    };
    let none = FileConfig::default();
    let file = parse_file("state_dir = \"state\"").unwrap();
    let user = Env {
        home: Some("/home/u".into()),
        ..Env::default()
    };
    assert_eq!(
        dir_of(&file, &["--state-dir", "/srv/t"], &user),
        PathBuf::from("/srv/t")
    );
    // Relative to the config file, like the TLS paths.
    assert_eq!(
        dir_of(&file, &[], &user),
        PathBuf::from("/etc/ticketing/state")
    );
    assert_eq!(
        dir_of(&none, &[], &user),
        PathBuf::from("/home/u/.local/state/ticketing")
    );
    let xdg = Env {
        xdg_state_home: Some("/x".into()),
        ..user.clone()
    };
    assert_eq!(dir_of(&none, &[], &xdg), PathBuf::from("/x/ticketing"));
    let root = Env {
        is_root: true,
        ..xdg.clone()
    };
    assert_eq!(
        dir_of(&none, &[], &root),
        PathBuf::from("/var/lib/ticketing")
    );
    // systemd's StateDirectory= wins over every default (first entry).
    let systemd = Env {
        state_directory: Some("/var/lib/tk:/var/lib/other".into()),
        ..root.clone()
    };
    assert_eq!(dir_of(&none, &[], &systemd), PathBuf::from("/var/lib/tk"));
    assert_eq!(
        dir_of(&none, &[], &Env::default()),
        PathBuf::from("/var/lib/ticketing")
    );
    // Cluster nodes use the same folder.
    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--state-dir".to_owned(), "/srv/c".to_owned()]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let config = resolve_args(&argv).unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.state.unwrap().dir, PathBuf::from("/srv/c"));
}

#[test]
fn state_dir_insecure_ok_is_off_unless_the_flag_or_the_file_sets_it() {
    let insecure_ok = |file: &FileConfig, argv: &[&str]| {
        let config = resolve(file, None, &args(argv), &Env::default()).unwrap();
        config.settings.state.unwrap().dir_insecure_ok
    };
    let none = FileConfig::default();
    assert!(!insecure_ok(&none, &[]));
    assert!(insecure_ok(&none, &["--state-dir-insecure-ok"]));
    let file = parse_file("state_dir_insecure_ok = true").unwrap();
    assert!(insecure_ok(&file, &[]));
    // Cluster nodes carry it too.
    let mut argv = cluster_args(&SLOTS3);
    argv.push("--state-dir-insecure-ok".to_owned());
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let cluster = resolve_args(&argv).unwrap().cluster.unwrap();
    assert!(cluster.state.unwrap().dir_insecure_ok);
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

/// The secret every case below carries; it must never appear in an error.
const SECRET: &str = "hunter2-super-secret-token-value";

#[test]
fn a_bad_secret_field_in_the_file_is_named_without_its_value() {
    let cases = [
        ("client_tokens", format!("client_tokens = \"{SECRET}\"")),
        (
            "client_tokens",
            format!("client_tokens = [\"{SECRET}\", 5]"),
        ),
        (
            "client_tokens",
            format!("client_tokens = [\n  \"{SECRET}\",\n  true,\n]"),
        ),
        (
            "client_tokens",
            format!("client_tokens = {{ a = \"{SECRET}\" }}"),
        ),
        ("admin_tokens", format!("admin_tokens = \"{SECRET}\"")),
        (
            "cluster.peer_tokens",
            format!("[cluster]\npeer_tokens = \"{SECRET}\""),
        ),
        (
            "cluster.peer_tokens",
            format!("cluster = {{ peer_tokens = \"{SECRET}\" }}"),
        ),
        // Broken TOML inside a secret's value.
        ("client_tokens", format!("client_tokens = [{SECRET}]")),
        ("client_tokens", format!("client_tokens = [\"{SECRET}\"")),
        (
            "client_tokens",
            format!("client_tokens = [\n  \"{SECRET}\"\n  \"{SECRET}\"\n]"),
        ),
        (
            "client_tokens",
            format!("client_tokens = [\"{SECRET}\\q\"]"),
        ),
    ];
    for (field, text) in cases {
        let err = parse_file(&text).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(SECRET), "a secret was printed: {shown}");
        assert!(
            !shown.contains("hunter2"),
            "part of a secret was printed: {shown}"
        );
        assert_eq!(err.field, field, "{text}: {err}");
        assert!(err.message.contains("not shown"), "{text}: {err}");
    }
    // An error in a field after a secret's value names that field.
    let text = format!("client_tokens = [\n  \"{SECRET}\",\n]\nwait_margin_ms = \"soon\"\n");
    let err = parse_file(&text).unwrap_err();
    assert_eq!(err.field, "wait_margin_ms", "{err}");
    assert!(
        !err.message.contains("soon") && err.message.contains("line 4"),
        "{err}"
    );
}

#[test]
fn secret_files_group_or_others_can_read_are_reported_with_path_and_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("ticketing-loose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let config_path = dir.join("ticketing.toml");
    std::fs::write(&config_path, "admin_token_file = \"admin-token\"\n").unwrap();
    let token_path = dir.join("admin-token");
    std::fs::write(&token_path, "admin-token-0123456789\n").unwrap();
    let flags = args(&["--config", config_path.to_str().unwrap()]);
    let loose = |config_mode: u32, token_mode: u32| {
        chmod(&config_path, config_mode);
        chmod(&token_path, token_mode);
        load(&flags, &Env::default()).unwrap().loose_secret_files
    };

    assert_eq!(loose(0o600, 0o400), vec![]);
    let found = loose(0o644, 0o640);
    assert_eq!(
        found,
        vec![
            LooseSecretFile {
                field: "--config",
                path: config_path.clone(),
                mode: 0o644,
            },
            LooseSecretFile {
                field: "admin_token_file",
                path: token_path.clone(),
                mode: 0o640,
            },
        ]
    );
    let line = found[1].to_string();
    assert!(line.contains(&token_path.display().to_string()), "{line}");
    assert!(line.contains("0640"), "{line}");
    assert!(
        line.contains("readable by group or others; chmod 600"),
        "{line}"
    );
    // Others reading is as bad as group reading; writing alone is not a leak.
    assert_eq!(loose(0o604, 0o620).len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn admin_allowed_hosts_come_from_the_flags_or_the_file_and_a_bad_one_is_named() {
    let hosts = |file: &FileConfig, argv: &[&str]| {
        resolve(file, None, &args(argv), &Env::default()).map(|c| c.settings.admin_allowed_hosts)
    };
    let none = FileConfig::default();
    assert_eq!(hosts(&none, &[]), Ok(Vec::new()));
    let file = parse_file("admin_allowed_hosts = [\"admin.example:9225\"]").unwrap();
    assert_eq!(hosts(&file, &[]), Ok(vec![Box::from("admin.example:9225")]));
    assert_eq!(
        hosts(&file, &["--admin-allowed-host", "ops.example:80"]),
        Ok(vec![Box::from("ops.example:80")]),
        "the flags replace the file's list"
    );
    for bad in ["no-port", "name:99999", ":9225", "bad host:1"] {
        let err = hosts(&none, &["--admin-allowed-host", bad]).unwrap_err();
        assert_eq!(err.field, "admin_allowed_hosts", "{err}");
    }
}

#[test]
fn recover_is_a_command_line_flag_with_an_optional_floor() {
    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--recover".to_owned()]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let cluster = resolve_args(&argv).unwrap().cluster.expect("cluster mode");
    assert_eq!(
        cluster.recovery,
        Some(crate::cluster::RecoverySettings {
            explicit_floor: None
        })
    );
    assert!(!cluster.bootstrap);

    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--recover", "--token-floor", "1796139901743063"].map(str::to_owned));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let cluster = resolve_args(&argv).unwrap().cluster.unwrap();
    assert_eq!(
        cluster.recovery.unwrap().explicit_floor,
        Some(1_796_139_901_743_063)
    );

    // A floor without --recover is refused naming it; clap refuses
    // --recover with --bootstrap, naming both.
    let mut argv = cluster_args(&SLOTS3);
    argv.extend(["--token-floor", "5"].map(str::to_owned));
    assert_eq!(cluster_field(&argv), "--token-floor");
    let error = Cli::try_parse_from(["ticketing", "serve", "--recover", "--bootstrap"])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("--recover") && error.contains("--bootstrap"),
        "{error}"
    );
}
