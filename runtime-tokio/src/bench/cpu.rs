//! CPU time of processes from `/proc` (Linux; `None` elsewhere).

use std::time::Duration;

/// `/proc` reports CPU times in clock ticks of `USER_HZ`, 100 on Linux.
const TICKS_PER_SECOND: u64 = 100;

/// CPU time a process spent, split the way the kernel counts it:
/// running its own code (user) and in system calls and the interrupts
/// charged to it (system). On loopback the system part carries most
/// of the sockets' cost, which no change to the process's own code
/// can take away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Time in the process's own code.
    pub user: Duration,
    /// Time in the kernel on the process's behalf.
    pub system: Duration,
    /// Times a thread of the process went to sleep waiting for work
    /// (voluntary context switches, summed over the threads alive when
    /// read): each one is a wake-up later, the costliest part of a
    /// small batch.
    pub sleeps: u64,
}

impl CpuTimes {
    /// User plus system.
    pub fn total(self) -> Duration {
        self.user + self.system
    }

    /// What was spent between `earlier` and `self` (never negative).
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            sleeps: self.sleeps.saturating_sub(earlier.sleeps),
        }
    }
}

impl std::ops::Add for CpuTimes {
    type Output = CpuTimes;

    fn add(self, other: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user + other.user,
            system: self.system + other.system,
            sleeps: self.sleeps + other.sleeps,
        }
    }
}

/// User and system time of process `pid`, all its threads (also ended
/// ones).
pub fn process_cpu(pid: u32) -> Option<CpuTimes> {
    let (user, system) = stat_times(&format!("/proc/{pid}/stat"))?;
    Some(CpuTimes {
        user,
        system,
        sleeps: voluntary_switches(pid),
    })
}

/// User plus system time of the calling thread alone.
#[allow(
    dead_code,
    reason = "the throughput bench times its own thread; `ticketing bench` reads whole processes"
)]
pub fn this_thread_cpu() -> Option<Duration> {
    let (user, system) = stat_times("/proc/thread-self/stat")?;
    Some(user + system)
}

/// User and system time from a `stat` file of procfs.
fn stat_times(path: &str) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses; the fields
    // after its last ')' start at field 3 (state); utime and stime are
    // fields 14 and 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let ticks = |field: Option<&str>| -> Option<Duration> {
        let ticks: u64 = field?.parse().ok()?;
        Some(Duration::from_millis(
            ticks.checked_mul(1000 / TICKS_PER_SECOND)?,
        ))
    };
    Some((ticks(fields.next())?, ticks(fields.next())?))
}

/// Voluntary context switches of `pid`'s threads, from each thread's
/// `/proc/PID/task/TID/status` (0 where unreadable).
fn voluntary_switches(pid: u32) -> u64 {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .flatten()
        .filter_map(|thread| std::fs::read_to_string(thread.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The summed CPU times of `pids`; `None` if there are none or one is
/// unreadable.
pub fn total_cpu(pids: &[u32]) -> Option<CpuTimes> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&pid| process_cpu(pid))
        .try_fold(CpuTimes::default(), |sum, times| Some(sum + times?))
}

/// The processes listening on the loopback addresses among `addrs` (a
/// server on this machine), as far as `/proc` shows them: a socket bound
/// to that address and port, or to the wildcard address of its family
/// and that port (which serves it too). Another process on the same port
/// of another address (a test beside it, an IPv6-only socket) is not it.
pub fn listening_pids(addrs: &[String]) -> Vec<u32> {
    let wanted: Vec<std::net::SocketAddr> =
        addrs.iter().flat_map(|addr| loopback_addrs(addr)).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            // local_address is field 1 ("ADDR:PORT" in hex), st field 3
            // (0A = LISTEN), inode field 9.
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if proc_net_addr(local).is_some_and(|bound| serves_any(bound, &wanted)) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    let mut pids = Vec::new();
    if inodes.is_empty() {
        return pids;
    }
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let listens = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| {
                inodes
                    .iter()
                    .any(|inode| target.as_os_str() == inode.as_str())
            })
        });
        if listens && pid != std::process::id() {
            pids.push(pid);
        }
    }
    pids
}

/// The socket addresses `host:port` names when the host is an IP loopback
/// address or `localhost` (both of its addresses).
fn loopback_addrs(addr: &str) -> Vec<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Vec::new();
    };
    let Ok(port) = port.parse::<u16>() else {
        return Vec::new();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ips: Vec<IpAddr> = if host == "localhost" {
        vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
    } else {
        host.parse::<IpAddr>()
            .into_iter()
            .filter(IpAddr::is_loopback)
            .collect()
    };
    ips.into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// A `local_address` of `/proc/net/tcp{,6}`: the address as 8 or 32 hex
/// digits, each 32-bit word in the machine's byte order, then the port.
fn proc_net_addr(field: &str) -> Option<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for word in 0..ip.len() / 8 {
        let word = u32::from_str_radix(ip.get(word * 8..word * 8 + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip: IpAddr = match bytes.len() {
        4 => Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?).into(),
        16 => Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?).into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Whether a socket bound to `bound` takes connections to one of `wanted`.
fn serves_any(bound: std::net::SocketAddr, wanted: &[std::net::SocketAddr]) -> bool {
    wanted.iter().any(|want| {
        if bound.port() != want.port() {
            return false;
        }
        let bound_ip = match bound.ip() {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
            v4 => v4,
        };
        bound_ip == want.ip()
            || (bound_ip.is_unspecified() && bound_ip.is_ipv4() == want.ip().is_ipv4())
            // A dual-stack wildcard socket serves IPv4 too.
            || bound.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    })
}

#[cfg(test)]
mod tests {
    // The throughput bench includes this file under a harness of its own,
    // which compiles no `#[test]`: the import is unused there.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn proc_net_addresses_decode_in_the_machine_byte_order() {
        let v4 = if cfg!(target_endian = "little") {
            "0100007F:1F90"
        } else {
            "7F000001:1F90"
        };
        assert_eq!(proc_net_addr(v4), "127.0.0.1:8080".parse().ok());
        let v6_loopback = if cfg!(target_endian = "little") {
            "00000000000000000000000001000000:1F90"
        } else {
            "00000000000000000000000000000001:1F90"
        };
        assert_eq!(proc_net_addr(v6_loopback), "[::1]:8080".parse().ok());
        assert_eq!(proc_net_addr("zz:1F90"), None);
    }

    #[test]
    fn only_sockets_that_serve_the_address_given_count() {
        let wanted = loopback_addrs("127.0.0.1:8080");
        let serves = |bound: &str| serves_any(bound.parse().unwrap(), &wanted);
        assert!(serves("127.0.0.1:8080"));
        assert!(serves("0.0.0.0:8080"));
        assert!(serves("[::]:8080"));
        assert!(serves("[::ffff:127.0.0.1]:8080"));
        assert!(!serves("127.0.0.1:8081"), "another port");
        assert!(!serves("127.0.0.2:8080"), "another loopback address");
        assert!(!serves("[::1]:8080"), "IPv6 loopback does not serve IPv4");
        assert_eq!(loopback_addrs("localhost:1").len(), 2);
        assert!(loopback_addrs("10.0.0.1:1").is_empty());
    }
}
