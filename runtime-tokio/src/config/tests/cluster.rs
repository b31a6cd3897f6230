//! Cluster settings: slots, identity, peer tokens, admin addresses,
//! recovery, state directories.

use super::*;

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
