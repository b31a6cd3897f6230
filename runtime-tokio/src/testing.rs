//! Test support (feature `testing`, hidden, not a stable API): the fuzz
//! entry point of the config loader, replayed by the stable test
//! `runtime-tokio/tests/fuzz_corpus.rs`.

use clap::Parser;
use toml::{Table, Value};

use crate::config::{Cli, Command, Env, ServeArgs, flag_value_error, parse_file, resolve};

/// A value shorter than this may appear in an error by coincidence (`1`,
/// `json`); a longer one with a digit in it looks like a token, and must
/// not.
const SECRET_LEN_MIN: usize = 8;

/// The config loader on arbitrary input: a TOML file, then (after a NUL
/// byte) `ticketing serve` flags separated by NUL bytes. Nothing panics;
/// every error names a field on one line and shows no token-like string
/// the input gave as a value.
pub fn config_loader(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = input.split('\0');
    let text = parts.next().unwrap_or_default();
    let flags: Vec<&str> = parts.collect();
    let args = serve_args(&flags);
    let table = toml::from_str::<Table>(text).ok();
    let mut values = Vec::new();
    let mut keys = Vec::new();
    if let Some(table) = &table {
        collect(table, &mut keys, &mut values);
    }
    let hidden: Vec<&str> = values
        .iter()
        .map(String::as_str)
        .filter(|value| looks_secret(value) && !keys.iter().any(|key| key.contains(value)))
        .collect();
    let file = match parse_file(text) {
        Ok(file) => file,
        Err(error) => {
            let shown = error.to_string();
            assert!(names_a_field(&error.field), "no field named: {shown:?}");
            assert!(
                !error.message.is_empty() && !shown.contains('\n'),
                "{shown:?}"
            );
            // A file that is TOML is refused for a value, which is not shown.
            if table.is_some() {
                for value in &hidden {
                    assert!(!shown.contains(value), "{value:?} shown: {shown:?}");
                }
            }
            return;
        }
    };
    // Reading files named by absolute paths could block (`/dev/stdin`);
    // relative ones resolve against a folder that does not exist.
    if ["/dev", "/proc", "/sys"]
        .iter()
        .any(|dir| input.contains(dir))
    {
        return;
    }
    let env = Env {
        state_directory: Some("/nonexistent/ticketing-fuzz".into()),
        ..Env::default()
    };
    let dir = std::path::Path::new("/nonexistent-ticketing-config-dir");
    if let Err(error) = resolve(&file, Some(dir), &args, &env) {
        let shown = error.to_string();
        assert!(names_a_field(&error.field), "no field named: {shown:?}");
        assert!(!error.message.is_empty(), "{shown:?}");
        // Other fields' values (an address) may be quoted: a token's may
        // not, unless the same text is also given as another value.
        let tokens = token_values(table.as_ref());
        for token in tokens.iter().filter(|token| looks_secret(token)) {
            if values.iter().filter(|value| value == &token).count() == 1 {
                assert!(
                    !shown.contains(token.as_str()),
                    "{token:?} shown: {shown:?}"
                );
            }
        }
    }
}

/// `ticketing serve FLAGS…`, or the defaults when clap refuses them (then
/// checking that a refused value is not shown).
fn serve_args(flags: &[&str]) -> ServeArgs {
    let mut argv = vec!["ticketing", "serve"];
    argv.extend_from_slice(flags);
    match Cli::try_parse_from(&argv) {
        Ok(cli) => match cli.command {
            Command::Serve(args) => args,
            _ => ServeArgs::default(),
        },
        Err(error) => {
            if let Some(message) = flag_value_error(&error) {
                assert!(message.starts_with("flag `"), "{message:?}");
                for value in flags
                    .iter()
                    .filter(|value| looks_secret(value) && !value.starts_with('-'))
                {
                    assert!(!message.contains(value), "{value:?} shown: {message:?}");
                }
            }
            ServeArgs::default()
        }
    }
}

/// Every key and every string value of `table`, at any depth.
fn collect(table: &Table, keys: &mut Vec<String>, values: &mut Vec<String>) {
    for (key, value) in table {
        keys.push(key.clone());
        collect_value(value, keys, values);
    }
}

fn collect_value(value: &Value, keys: &mut Vec<String>, values: &mut Vec<String>) {
    match value {
        Value::String(text) => values.push(text.clone()),
        Value::Array(items) => {
            for item in items {
                collect_value(item, keys, values);
            }
        }
        Value::Table(table) => collect(table, keys, values),
        _ => {}
    }
}

/// The strings of the token lists, where they are lists of strings.
fn token_values(table: Option<&Table>) -> Vec<String> {
    let Some(table) = table else {
        return Vec::new();
    };
    let cluster = table.get("cluster").and_then(Value::as_table);
    [
        table.get("client_tokens"),
        table.get("admin_tokens"),
        cluster.and_then(|cluster| cluster.get("peer_tokens")),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_array)
    .flatten()
    .filter_map(Value::as_str)
    .map(str::to_owned)
    .collect()
}

fn looks_secret(value: &str) -> bool {
    value.len() >= SECRET_LEN_MIN && value.bytes().any(|b| b.is_ascii_digit())
}

/// A field as errors name it: `--flag`, `RUST_LOG`, `limits.max_keys`,
/// `cluster.slots[2].peer`, or an unknown key as written (quoted when it
/// is not a bare key).
fn names_a_field(field: &str) -> bool {
    !field.is_empty() && !field.chars().any(char::is_control)
}
