//! `packaging/`: the sample config is accepted by the daemon's own config
//! loader as systemd would run it, and the unit runs what the docs say
//! (`systemd-analyze verify` itself runs in `.ci/run`).

use std::path::{Path, PathBuf};

use ticketing_tokio::config::{self, Env, LogFormat, ServeArgs};

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(file)
}

/// The environment of the unit's process: `DynamicUser=` (not root) and
/// `StateDirectory=ticketing`.
fn systemd_env() -> Env {
    Env {
        state_directory: Some("/var/lib/ticketing".to_owned()),
        is_root: false,
        ..Env::default()
    }
}

#[test]
fn the_sample_config_loads_with_the_systemd_state_directory() {
    let args = ServeArgs {
        config: Some(packaging("ticketing.toml")),
        ..ServeArgs::default()
    };
    let config = config::load(&args, &systemd_env()).expect("the sample config loads");
    assert_eq!(config.settings.listen, "127.0.0.1:5225".parse().unwrap());
    assert_eq!(
        config.settings.admin_listen,
        Some("127.0.0.1:9225".parse().unwrap())
    );
    assert_eq!(config.log_format, LogFormat::Json);
    assert!(config.cluster.is_none(), "the sample is single mode");
    let state = config.settings.state.expect("a state directory");
    assert_eq!(state.dir, Path::new("/var/lib/ticketing"));
}

#[test]
fn the_unit_runs_serve_with_the_sample_config_path_and_is_hardened() {
    let unit = std::fs::read_to_string(packaging("ticketing.service")).unwrap();
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|line| line.strip_prefix(&format!("{key}=")))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        values("ExecStart"),
        ["/usr/local/bin/ticketing serve --config /etc/ticketing/ticketing.toml"]
    );
    assert!(
        !unit
            .lines()
            .any(|l| l.starts_with("ExecStart") && l.contains("--bootstrap"))
    );
    assert_eq!(values("StateDirectory"), ["ticketing"]);
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2"),
    ] {
        assert_eq!(values(key), [value], "{key}");
    }
    // The sample config leaves state_dir unset, so StateDirectory= decides.
    let sample = std::fs::read_to_string(packaging("ticketing.toml")).unwrap();
    let file = config::parse_file(&sample).unwrap();
    assert!(file.state_dir.is_none());
}
