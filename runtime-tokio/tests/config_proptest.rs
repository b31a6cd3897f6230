//! The config parser on structured input: TOML files and command lines
//! built from every known field, a few unknown ones, and values of every
//! shape. Nothing panics, and every refusal names the field at fault: a
//! field the config has (not merely something shaped like a name), and for
//! a command line clap refuses, the flag or argument refused. (The
//! `config_loader` fuzz target takes bytes; this reaches deeper, valid
//! configs more often.)

use clap::Parser;
use proptest::prelude::*;
use ticketing_tokio::config::{Cli, Command, Env, ServeArgs, parse_file, resolve};

/// Keys of the config file, by table ("" = top level); a few unknown ones.
const FILE_KEYS: &[(&str, &str)] = &[
    ("", "listen"),
    ("", "client_tokens"),
    ("", "insecure_no_auth"),
    ("", "log_level"),
    ("", "wait_margin_ms"),
    ("", "worker_threads"),
    ("", "no_such_field"),
    ("tls", "cert"),
    ("tls", "key"),
    ("limits", "max_keys"),
    ("limits", "max_waiters_per_key"),
    ("limits", "max_waiters_total"),
    ("limits", "max_connections"),
    ("limits", "max_in_flight_per_connection"),
    ("limits", "max_nothing"),
    ("cluster", "identity"),
    ("cluster", "self_slot"),
    ("cluster", "peer_tokens"),
    ("cluster", "profile"),
    ("cluster", "status_listen"),
    ("cluster.peer_tls", "cert"),
    ("cluster.peer_tls", "key"),
    ("cluster.peer_tls", "ca"),
    ("cluster.peer_tls", "server_name"),
];

/// Flags of `ticketing serve` that take a value, and the switches.
const VALUE_FLAGS: &[&str] = &[
    "--listen",
    "--client-token",
    "--tls-cert",
    "--tls-key",
    "--log-level",
    "--max-keys",
    "--max-waiters-per-key",
    "--max-waiters-total",
    "--max-connections",
    "--max-in-flight-per-connection",
    "--wait-margin-ms",
    "--worker-threads",
    "--cluster-identity",
    "--self-slot",
    "--slot",
    "--peer-token",
    "--profile",
    "--status-listen",
    "--token-floor",
];
const SWITCHES: &[&str] = &[
    "--insecure-no-auth",
    "--cluster",
    "--bootstrap",
    "--recover",
];

/// Text values: addresses, tokens, levels, identities, numbers, junk.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("127.0.0.1:5225".to_owned()),
        Just("[::1]:0".to_owned()),
        Just("0.0.0.0:99999".to_owned()),
        Just("127.0.0.1:5225,127.0.0.1:6225".to_owned()),
        Just("token-0123456789abcdef".to_owned()),
        Just("short".to_owned()),
        Just("debug".to_owned()),
        Just("fast".to_owned()),
        Just("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just(String::new()),
        "[ -~]{0,24}",
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

/// A TOML value of any shape.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0u64..20).prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        text().prop_map(|s| format!("{s:?}")),
        proptest::collection::vec(text(), 0..4).prop_map(|items| format!("{items:?}")),
        Just("1.5".to_owned()),
        Just("{}".to_owned()),
    ]
}

/// A config file: some keys set, tables in order, maybe slot tables; or
/// arbitrary text.
fn file_text() -> impl Strategy<Value = String> {
    let structured = (
        proptest::collection::vec((0..FILE_KEYS.len(), toml_value()), 0..8),
        proptest::collection::vec((text(), text()), 0..6),
    )
        .prop_map(|(entries, slots)| {
            let mut tables: Vec<(&str, Vec<String>)> = Vec::new();
            for (key, value) in entries {
                let (table, name) = FILE_KEYS[key];
                let line = format!("{name} = {value}");
                match tables.iter_mut().find(|(t, _)| *t == table) {
                    Some((_, lines)) => lines.push(line),
                    None => tables.push((table, vec![line])),
                }
            }
            // Top-level keys must come before any table header.
            tables.sort_by_key(|(table, _)| (!table.is_empty(), *table));
            let mut text = String::new();
            for (table, lines) in tables {
                if !table.is_empty() {
                    text.push_str(&format!("[{table}]\n"));
                }
                for line in lines {
                    text.push_str(&line);
                    text.push('\n');
                }
            }
            for (client, peer) in slots {
                text.push_str(&format!(
                    "[[cluster.slots]]\nclient = {client:?}\npeer = {peer:?}\n"
                ));
            }
            text
        });
    prop_oneof![4 => structured, 1 => "[ -~\n]{0,80}"]
}

/// A `serve` command line.
fn argv() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(
        prop_oneof![
            (0..VALUE_FLAGS.len(), text())
                .prop_map(|(flag, value)| vec![VALUE_FLAGS[flag].to_owned(), value]),
            (0..SWITCHES.len()).prop_map(|switch| vec![SWITCHES[switch].to_owned()]),
        ],
        0..6,
    )
    .prop_map(|parts| parts.into_iter().flatten().collect())
}

/// The `serve` arguments of `argv`, or clap's refusal as printed.
fn serve_args(argv: &[String]) -> Result<ServeArgs, String> {
    let mut full = vec!["ticketing".to_owned(), "serve".to_owned()];
    full.extend_from_slice(argv);
    match Cli::try_parse_from(full)
        .map_err(|error| error.to_string())?
        .command
    {
        Command::Serve(args) => Ok(args),
        other => Err(format!("parsed as another command: {other:?}")),
    }
}

/// Whether clap's refusal `error` of `argv` names what it refuses: a
/// quoted flag of `serve` (`'--max-keys <MAX_KEYS>'`), or a quoted
/// argument of `argv` that looks like a flag, or the start of one (clap
/// quotes `'- '` for the argument `- a`).
fn names_a_flag(error: &str, argv: &[String]) -> bool {
    // A value may hold quotes itself: a flag quoted anywhere counts.
    let flag_quoted = VALUE_FLAGS
        .iter()
        .chain(SWITCHES)
        .any(|flag| error.contains(&format!("'{flag} <")) || error.contains(&format!("'{flag}'")));
    flag_quoted
        || error.split('\'').skip(1).step_by(2).any(|quoted| {
            let name = quoted.split(" <").next().unwrap_or("");
            VALUE_FLAGS.contains(&name)
                || SWITCHES.contains(&name)
                || (name.starts_with('-')
                    && argv
                        .iter()
                        .any(|arg| arg.starts_with('-') && arg.starts_with(name)))
        })
}

/// Whether `field` (indexes stripped) is a field the config has: a key of
/// the file, a flag, an environment variable, the file itself, or a part
/// of the slot list.
fn is_known_field(field: &str) -> bool {
    let base: String = {
        let mut base = String::new();
        let mut depth = 0;
        for c in field.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ if depth == 0 => base.push(c),
                _ => {}
            }
        }
        base
    };
    let file_key = FILE_KEYS.iter().any(|(table, name)| {
        if table.is_empty() {
            base == *name
        } else {
            base == format!("{table}.{name}") || base == *table
        }
    });
    file_key
        || VALUE_FLAGS.contains(&base.as_str())
        || SWITCHES.contains(&base.as_str())
        || [
            "--config",
            "RUST_LOG",
            "TICKETING_CLIENT_TOKENS",
            "TICKETING_PEER_TOKENS",
            "admin_tokens",
            "cluster",
            "cluster.slots",
            "cluster.slots.client",
            "cluster.slots.peer",
        ]
        .contains(&base.as_str())
}

/// A field as the config names it: `--flag`, `RUST_LOG`, or a file path
/// such as `limits.keys_max`, `client_tokens[1]`, `cluster.slots[2].peer`.
fn is_field_name(field: &str) -> bool {
    if field == "RUST_LOG" || field == "TICKETING_CLIENT_TOKENS" || field == "TICKETING_PEER_TOKENS"
    {
        return true;
    }
    if let Some(flag) = field.strip_prefix("--") {
        return !flag.is_empty()
            && flag
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'-' || b.is_ascii_digit());
    }
    !field.is_empty()
        && field.split('.').all(|part| {
            let name = part.split('[').next().unwrap_or("");
            !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && part[name.len()..].split_terminator(']').all(|index| {
                    index
                        .strip_prefix('[')
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn arbitrary_files_and_flags_never_panic_and_errors_name_a_field(
        text in file_text(),
        argv in argv(),
        client_tokens in proptest::option::of(text()),
        admin_tokens in proptest::option::of(text()),
        peer_tokens in proptest::option::of(text()),
        rust_log in proptest::option::of(text()),
    ) {
        let env = Env {
            client_tokens,
            admin_tokens,
            rust_log,
            peer_tokens,
            // Resolving only names the folder; nothing here touches it.
            state_directory: Some("/nonexistent/ticketing-proptest".into()),
            xdg_state_home: None,
            home: None,
            is_root: false,
        };
        // A command line clap refuses must name what it refuses; the file
        // and the environment are then checked with no flags.
        let args = match serve_args(&argv) {
            Ok(args) => args,
            Err(error) => {
                prop_assert!(names_a_flag(&error, &argv), "{} for {:?}", error, argv);
                ServeArgs::default()
            }
        };
        let file = match parse_file(&text) {
            Ok(file) => file,
            Err(error) => {
                // The file as a whole (not TOML), or the field whose value
                // is of the wrong kind or whose name is unknown.
                prop_assert!(is_field_name(&error.field), "{:?} in {:?}", error, text);
                prop_assert!(!error.message.is_empty());
                return Ok(());
            }
        };
        // Relative TLS paths resolve against a folder that does not exist,
        // so a TLS setting is refused when read, naming its field.
        let dir = std::path::Path::new("/nonexistent-ticketing-config-dir");
        if let Err(error) = resolve(&file, Some(dir), &args, &env) {
            prop_assert!(is_field_name(&error.field), "{:?} in {:?} / {:?}", error, text, argv);
            prop_assert!(is_known_field(&error.field), "{:?} in {:?} / {:?}", error, text, argv);
            prop_assert!(!error.message.is_empty());
        }
    }
}

#[test]
fn the_field_name_check_accepts_names_and_refuses_the_rest() {
    for good in [
        "listen",
        "limits.max_keys",
        "client_tokens[1]",
        "cluster.slots[2].peer",
        "--config",
        "RUST_LOG",
    ] {
        assert!(is_field_name(good), "{good}");
    }
    for bad in ["", "invalid TOML", "limits.", "x[]", "--", "Listen"] {
        assert!(!is_field_name(bad), "{bad}");
    }
}

#[test]
fn the_known_field_and_flag_checks_refuse_the_rest() {
    for known in [
        "listen",
        "limits.max_keys",
        "client_tokens[1]",
        "cluster.slots[2].peer",
        "cluster.peer_tls.ca",
        "--max-keys",
        "--config",
        "RUST_LOG",
    ] {
        assert!(is_known_field(known), "{known}");
    }
    for unknown in ["limits.nothing_here", "tls.cat", "--no-such-flag", "HOME"] {
        assert!(!is_known_field(unknown), "{unknown}");
    }
    let argv = vec!["--max-keys".to_owned(), "x".to_owned(), "-1".to_owned()];
    assert!(names_a_flag(
        "error: invalid value 'x' for '--max-keys <MAX_KEYS>'",
        &argv
    ));
    assert!(names_a_flag("error: unexpected argument '-1' found", &argv));
    assert!(names_a_flag(
        "error: unexpected argument '- ' found",
        &["- a".to_owned()]
    ));
    assert!(!names_a_flag("error: something went wrong", &argv));
    assert!(!names_a_flag("error: unexpected argument 'x' found", &argv));
}
