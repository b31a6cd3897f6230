//! Secrets: client, admin and peer tokens, TLS files, and errors that name
//! a field without echoing its value.

use super::*;

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
