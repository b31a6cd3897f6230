//! The `[cluster]` half of [`resolve`](super::resolve): identity, slots,
//! this node's slot, peer tokens, the timing profile and peer TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use ticketing_core::cluster::node::ClusterConfig;
use ticketing_core::cluster::peer::{PEER_TOKEN_LEN_MIN, PeerTokenError, PeerTokens};
use ticketing_core::raft::{NodeId, RaftConfig};
use ticketing_core::server::ServerConfig;

use super::auth::pick_tokens;
use super::cli::{ServeArgs, parse_identity};
use super::defaults::ENV_PEER_TOKENS;
use super::env::Env;
use super::error::{ConfigError, parse_addr};
use super::file::{FileCluster, FileConfig, FileSlot};
use super::tls_files::resolve_peer_tls;
use crate::cluster::ClusterSettings;

/// Checks a slot's advertised client address: what `M` and `L` lines carry
/// to line-dialect clients, compared by them as an exact string.
fn parse_advertised(field: &str, text: &str) -> Result<Box<str>, ConfigError> {
    let text = text.trim();
    if text.is_empty() || text.len() > ticketing_core::line::LINE_TEXT_LEN_MAX {
        return Err(ConfigError::new(
            field,
            format!(
                "an advertised address has 1..={} bytes, got {}",
                ticketing_core::line::LINE_TEXT_LEN_MAX,
                text.len()
            ),
        ));
    }
    if text.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            field,
            format!("an advertised address has no spaces or control characters, got {text:?}"),
        ));
    }
    Ok(text.into())
}

/// Each slot's admin address, from `--slot-admin` (which replaces the
/// file's) or `slots[].admin`: every slot or none.
fn slot_admins(
    args: &ServeArgs,
    file_slots: Option<&[FileSlot]>,
    slot_count: usize,
) -> Result<Vec<Box<str>>, ConfigError> {
    let (given, flag): (Vec<Option<&str>>, bool) = if args.slot_admins.is_empty() {
        let list = file_slots.unwrap_or_default();
        (
            list.iter().map(|slot| slot.admin.as_deref()).collect(),
            false,
        )
    } else {
        (
            args.slot_admins.iter().map(|a| Some(a.as_str())).collect(),
            true,
        )
    };
    let field = |index: usize| {
        if flag {
            format!("--slot-admin[{index}]")
        } else {
            format!("cluster.slots[{index}].admin")
        }
    };
    if given.iter().all(Option::is_none) {
        return Ok(Vec::new());
    }
    if flag && given.len() != slot_count {
        return Err(ConfigError::new(
            "--slot-admin",
            format!("give one per slot ({slot_count}), got {}", given.len()),
        ));
    }
    let mut out = Vec::with_capacity(given.len());
    for (index, text) in given.iter().enumerate() {
        let Some(text) = text else {
            return Err(ConfigError::new(
                field(index),
                "required: set admin on every slot, or on none",
            ));
        };
        out.push(parse_admin_address(&field(index), text)?);
    }
    Ok(out)
}

/// Checks an admin address as operators reach it: `HOST:PORT` with a
/// numeric port, a non-empty host, no spaces or control characters.
fn parse_admin_address(field: &str, text: &str) -> Result<Box<str>, ConfigError> {
    let text = parse_advertised(field, text)?;
    let port_ok = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok {
        return Err(ConfigError::new(
            field,
            format!("expected HOST:PORT, got {text:?}"),
        ));
    }
    Ok(text)
}

/// The cluster half of [`resolve`](super::resolve); `server` carries the
/// limits, margin and client tokens already validated. The steps run in a
/// fixed order, so the first fault found is always the same one.
pub(super) fn resolve_cluster(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
    server: &ServerConfig,
    client_tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<ClusterSettings, ConfigError> {
    let table = file.cluster.clone().unwrap_or_default();
    let fingerprint = resolve_identity(args, &table)?;
    // Slots: the flags replace the file's list as a whole.
    let slots = if args.slots.is_empty() {
        slots_from_file(table.slots.as_deref().unwrap_or_default())?
    } else {
        slots_from_flags(&args.slots)?
    };
    check_slot_count(slots.addresses.len())?;
    check_distinct_addresses(&slots.addresses)?;
    let self_slot = resolve_self_slot(args, &table, slots.addresses.len())?;
    let peer_tokens = resolve_peer_tokens(args, env, &table)?;
    let raft = resolve_profile(args, &table)?;
    let status_listen = args
        .status_listen
        .as_deref()
        .or(table.status_listen.as_deref())
        .map(|text| parse_addr("cluster.status_listen", text))
        .transpose()?;
    let peer_tls = resolve_peer_tls(table.peer_tls.as_ref(), file_dir)?;

    // The generation is chosen at start (spawn_cluster); 0 until then.
    let mut node = ClusterConfig::new(
        fingerprint,
        NodeId::new(self_slot, 0),
        slots.addresses.len() as u8,
        peer_tokens,
        0,
    );
    node.peer_silence_timeout = ticketing_core::cluster::default_peer_silence_timeout(&raft);
    node.raft = raft;
    node.limits = server.lock.limits;
    node.hold_caps = server.hold_caps;
    node.wait_margin = server.lock.wait_margin;
    node.connections_max = server.connections_max;
    node.in_flight_per_connection_max = server.in_flight_per_connection_max;
    node.handshake_timeout = server.handshake_timeout;
    node.budget = server.budget;
    node.client_tokens = server.client_tokens.clone();
    node.client_addresses = slots.advertised;
    node.admin_addresses = slot_admins(args, table.slots.as_deref(), slots.addresses.len())?;
    node.validate()
        .map_err(|e| ConfigError::new("cluster", e.to_owned()))?;
    let (client_listen, peer_listen) = slots.addresses[usize::from(self_slot)];
    let mut settings = ClusterSettings::new(
        client_listen,
        peer_listen,
        slots.addresses.iter().map(|(_, peer)| *peer).collect(),
        node,
    );
    settings.bootstrap = args.bootstrap;
    if args.token_floor.is_some() && !args.recover {
        return Err(ConfigError::new(
            "--token-floor",
            "only with --recover (the floor a recovery after losing a majority starts above)",
        ));
    }
    settings.recovery = args.recover.then_some(crate::cluster::RecoverySettings {
        explicit_floor: args.token_floor,
    });
    settings.client_tls = client_tls;
    settings.peer_tls = peer_tls;
    settings.status_listen = status_listen;
    Ok(settings)
}

/// The cluster identity (required): the flag, else the file.
fn resolve_identity(args: &ServeArgs, table: &FileCluster) -> Result<[u8; 32], ConfigError> {
    let identity_text = args
        .cluster_identity
        .as_deref()
        .or(table.identity.as_deref())
        .ok_or_else(|| {
            ConfigError::new(
                "cluster.identity",
                "required in cluster mode (--cluster-identity; make one with `ticketing identity`)",
            )
        })?;
    parse_identity(identity_text).map_err(|e| ConfigError::new("cluster.identity", e))
}

/// Every slot's (client, peer) addresses, and the client address as
/// line-dialect clients are told it, in slot order.
struct SlotAddresses {
    addresses: Vec<(SocketAddr, SocketAddr)>,
    advertised: Vec<Box<str>>,
}

/// The slots of `[[cluster.slots]]`.
fn slots_from_file(list: &[FileSlot]) -> Result<SlotAddresses, ConfigError> {
    fn get<'a>(
        index: usize,
        name: &str,
        value: &'a Option<String>,
    ) -> Result<(SocketAddr, &'a str), ConfigError> {
        let field = format!("cluster.slots[{index}].{name}");
        let text = value
            .as_deref()
            .ok_or_else(|| ConfigError::new(field.clone(), "required"))?;
        parse_addr(&field, text).map(|addr| (addr, text.trim()))
    }
    let mut advertised = Vec::with_capacity(list.len());
    let mut addresses = Vec::with_capacity(list.len());
    for (index, slot) in list.iter().enumerate() {
        let (client, client_text) = get(index, "client", &slot.client)?;
        let (peer, _) = get(index, "peer", &slot.peer)?;
        let shown = slot.advertise.as_deref().unwrap_or(client_text);
        advertised.push(parse_advertised(
            &format!("cluster.slots[{index}].advertise"),
            shown,
        )?);
        addresses.push((client, peer));
    }
    Ok(SlotAddresses {
        addresses,
        advertised,
    })
}

/// The slots of the `--slot CLIENT_ADDR,PEER_ADDR[,ADVERTISED]` flags.
fn slots_from_flags(flags: &[String]) -> Result<SlotAddresses, ConfigError> {
    let mut advertised = Vec::with_capacity(flags.len());
    let mut addresses = Vec::with_capacity(flags.len());
    for (index, text) in flags.iter().enumerate() {
        let field = format!("cluster.slots[{index}]");
        let mut parts = text.splitn(3, ',');
        let (Some(client), Some(peer)) = (parts.next(), parts.next()) else {
            return Err(ConfigError::new(
                field.clone(),
                format!("expected CLIENT_ADDR,PEER_ADDR[,ADVERTISED] (--slot), got {text:?}"),
            ));
        };
        let shown = parts.next().unwrap_or(client);
        advertised.push(parse_advertised(&format!("{field}.advertise"), shown)?);
        addresses.push((
            parse_addr(&format!("{field}.client"), client)?,
            parse_addr(&format!("{field}.peer"), peer)?,
        ));
    }
    Ok(SlotAddresses {
        addresses,
        advertised,
    })
}

/// A cluster has exactly 3 or 5 slots.
fn check_slot_count(count: usize) -> Result<(), ConfigError> {
    if count == 3 || count == 5 {
        return Ok(());
    }
    let why = if count.is_multiple_of(2) {
        "; an even count adds cost but no fault tolerance"
    } else {
        ""
    };
    Err(ConfigError::new(
        "cluster.slots",
        format!("{count} slots given, a cluster has exactly 3 or 5{why}"),
    ))
}

/// No two client or peer addresses of any slots are the same.
fn check_distinct_addresses(slots: &[(SocketAddr, SocketAddr)]) -> Result<(), ConfigError> {
    let mut seen: Vec<(SocketAddr, String)> = Vec::new();
    for (index, (client, peer)) in slots.iter().enumerate() {
        for (addr, name) in [(client, "client"), (peer, "peer")] {
            let field = format!("cluster.slots[{index}].{name}");
            if let Some((_, other)) = seen.iter().find(|(a, _)| a == addr) {
                return Err(ConfigError::new(
                    field,
                    format!("{addr} is also {other}; every address must be distinct"),
                ));
            }
            seen.push((*addr, field));
        }
    }
    Ok(())
}

/// This node's slot (required), below `slot_count`.
fn resolve_self_slot(
    args: &ServeArgs,
    table: &FileCluster,
    slot_count: usize,
) -> Result<u8, ConfigError> {
    let self_slot = args.self_slot.or(table.self_slot).ok_or_else(|| {
        ConfigError::new(
            "cluster.self_slot",
            "required in cluster mode (--self-slot)",
        )
    })?;
    if self_slot >= slot_count as u64 {
        return Err(ConfigError::new(
            "cluster.self_slot",
            format!(
                "{self_slot} is out of range, allowed 0..={}",
                slot_count - 1
            ),
        ));
    }
    Ok(self_slot as u8)
}

/// The peer tokens (at least one): the flags, else the environment, else
/// the file.
fn resolve_peer_tokens(
    args: &ServeArgs,
    env: &Env,
    table: &FileCluster,
) -> Result<PeerTokens, ConfigError> {
    let tokens = pick_tokens(
        &args.peer_tokens,
        "--peer-token",
        env.peer_tokens.as_deref(),
        ENV_PEER_TOKENS,
        table.peer_tokens.as_deref(),
    );
    PeerTokens::new(tokens.values.iter().map(String::as_bytes)).map_err(|e| match e {
        PeerTokenError::Empty => ConfigError::new(
            "cluster.peer_tokens",
            format!("at least one peer token is required (--peer-token, {ENV_PEER_TOKENS})"),
        ),
        PeerTokenError::TooShort(index) => {
            tokens.shorter_than("cluster.peer_tokens", index, PEER_TOKEN_LEN_MIN)
        }
    })
}

/// The Raft timing profile: `default` unless `fast`.
fn resolve_profile(args: &ServeArgs, table: &FileCluster) -> Result<RaftConfig, ConfigError> {
    let profile = args
        .profile
        .as_deref()
        .or(table.profile.as_deref())
        .unwrap_or("default");
    match profile {
        "default" => Ok(RaftConfig::default()),
        "fast" => Ok(RaftConfig::fast()),
        other => Err(ConfigError::new(
            "cluster.profile",
            format!("{other:?} is not one of default, fast"),
        )),
    }
}
