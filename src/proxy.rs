//! Who the client is behind a reverse proxy. `--trusted-proxy` names the peers
//! (addresses or networks) whose `X-Forwarded-For` is believed; from any other
//! peer the header is ignored, so nobody can claim another address by sending it.
//!
//! The client is the rightmost address of the header that is not itself a trusted
//! proxy (each proxy appends the address it was reached from, and only the
//! trusted ones' entries can be taken at their word). That address is what the
//! per-IP limits and the logs use. An entry that is no address (`unknown`, a
//! quoted or zoned one) makes the client unknown, which is remote; a forwarded
//! request is never local, whatever address it names, so only a loopback peer
//! that forwards for nobody has the publish rule's loopback privilege. Pure functions over a parsed
//! request: this module does no I/O and keeps no state.

use std::net::IpAddr;
use std::str::FromStr;

use crate::protocol::http::Request;

/// An address or a network (`10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or
/// /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

/// A `--trusted-proxy` value that is no address or network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not an IP address or network (ADDR or ADDR/BITS, e.g. 10.0.0.0/8)")]
pub struct BadNetwork(String);

impl FromStr for Network {
    type Err = BadNetwork;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadNetwork(s.chars().take(60).collect());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((addr, bits)) => (addr, Some(bits)),
            None => (s.trim(), None),
        };
        let addr = IpAddr::from_str(addr).map_err(|_| bad())?.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(bits) => match bits.parse::<u8>() {
                Ok(bits) if bits <= max => bits,
                _ => return Err(bad()),
            },
        };
        Ok(Network { addr, prefix })
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Network {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the first `prefix` of `width` bits of `a` and `b` agree.
fn same_prefix(a: u128, b: u128, width: u32, prefix: u8) -> bool {
    let prefix = u32::from(prefix);
    if prefix == 0 {
        return true;
    }
    let shift = width - prefix;
    (a >> shift) == (b >> shift)
}

/// Who sent a request, as far as the server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The peer itself, the address a trusted proxy forwards for, or the
    /// unspecified address when a trusted proxy's entry is unreadable (unknown,
    /// and so remote).
    pub addr: IpAddr,
    /// The address came from `X-Forwarded-For`: whatever it says, the request
    /// crossed a proxy, so it earns no loopback privilege.
    pub forwarded: bool,
}

impl Client {
    /// Whether the request comes from this machine itself: a loopback peer that
    /// forwards for nobody.
    pub fn is_local(&self) -> bool {
        !self.forwarded && self.addr.is_loopback()
    }
}

/// The address the client of `req` is known by: the peer itself, unless the peer
/// is a trusted proxy that says who it forwards for.
pub fn client_address(peer: IpAddr, req: &Request<'_>, trusted: &[Network]) -> Client {
    let peer = peer.to_canonical();
    let direct = Client {
        addr: peer,
        forwarded: false,
    };
    if !is_trusted(peer, trusted) {
        return direct;
    }
    // Every X-Forwarded-For header, in order, is one list: walked from its end,
    // without collecting it.
    let mut hops = req
        .headers
        .iter()
        .rev()
        .filter(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-for"))
        .flat_map(|(_, value)| value.rsplit(|&b| b == b','))
        .peekable();
    if hops.peek().is_none() {
        return direct;
    }
    let mut client = peer;
    for hop in hops {
        // What a trusted hop wrote is believed; an entry that is no address is
        // an unknown client, not the last hop's: unknown is remote.
        let Some(hop) = parse_hop(hop) else {
            return Client {
                addr: unknown(peer),
                forwarded: true,
            };
        };
        client = hop;
        if !is_trusted(client, trusted) {
            break;
        }
    }
    Client {
        addr: client,
        forwarded: true,
    }
}

/// The address that stands for a client nobody can name: the unspecified one of
/// the peer's family.
fn unknown(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// One `X-Forwarded-For` entry: a bare address, `IPV4:PORT`, `[IPV6]` or
/// `[IPV6]:PORT`. Anything else (`unknown`, empty, quoted, a zone id, `127.1`)
/// is `None`.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(hop.trim_ascii()).ok()?;
    if let Some(bracketed) = text.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return std::net::Ipv6Addr::from_str(v6)
            .ok()
            .map(|a| IpAddr::V6(a).to_canonical());
    }
    if let Ok(addr) = IpAddr::from_str(text) {
        return Some(addr.to_canonical());
    }
    let (v4, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    std::net::Ipv4Addr::from_str(v4).ok().map(IpAddr::V4)
}

fn is_port(s: &str) -> bool {
    // Digits only: `u16`'s parse would also take a leading `+`.
    s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u16>().is_ok()
}

fn is_trusted(ip: IpAddr, trusted: &[Network]) -> bool {
    trusted.iter().any(|n| n.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::http::parse_request;

    fn client(peer: &str, headers: &str, trusted: &[&str]) -> String {
        found(peer, headers, trusted).addr.to_string()
    }

    fn found(peer: &str, headers: &str, trusted: &[&str]) -> Client {
        let raw = format!("GET / HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
        let (req, _) = parse_request(raw.as_bytes()).unwrap().unwrap();
        let trusted: Vec<Network> = trusted.iter().map(|t| t.parse().unwrap()).collect();
        client_address(peer.parse().unwrap(), &req, &trusted)
    }

    #[test]
    fn an_unreadable_entry_is_an_unknown_remote_client() {
        let proxy = ["127.0.0.1"];
        for entry in [
            "unknown",
            "",
            "203.0.113.5,",
            "\"203.0.113.5\"",
            "fe80::1%eth0",
            "127.1",
            "203.0.113.5:port",
            "[2001:db8::1",
        ] {
            let got = found(
                "127.0.0.1",
                &format!("X-Forwarded-For: {entry}\r\n"),
                &proxy,
            );
            assert_eq!(got.addr.to_string(), "0.0.0.0", "{entry}");
            assert!(!got.is_local(), "{entry}");
        }
        // Address-and-port forms are read.
        let port = found(
            "127.0.0.1",
            "X-Forwarded-For: 203.0.113.5:51234\r\n",
            &proxy,
        );
        assert_eq!(port.addr.to_string(), "203.0.113.5");
        let v6 = found(
            "127.0.0.1",
            "X-Forwarded-For: [2001:db8::1]:443\r\n",
            &proxy,
        );
        assert_eq!(v6.addr.to_string(), "2001:db8::1");
        let bracket = found("127.0.0.1", "X-Forwarded-For: [2001:db8::1]\r\n", &proxy);
        assert_eq!(bracket.addr.to_string(), "2001:db8::1");
    }

    #[test]
    fn a_forwarded_loopback_address_is_not_local() {
        // A client inside a broad trusted range claims 127.0.0.1.
        let claim = "X-Forwarded-For: 127.0.0.1, 10.1.2.3\r\n";
        let got = found("127.0.0.1", claim, &["127.0.0.1", "10.0.0.0/8"]);
        assert!(got.addr.is_loopback() && got.forwarded && !got.is_local());
        // The proxy's own request, with no header, is the proxy's.
        let direct = found("127.0.0.1", "", &["127.0.0.1"]);
        assert!(direct.is_local());
        // From a peer that is no trusted proxy the header changes nothing.
        let ignored = found("127.0.0.1", "X-Forwarded-For: 203.0.113.5\r\n", &[]);
        assert!(ignored.is_local());
    }

    #[test]
    fn the_header_is_believed_only_from_a_trusted_peer() {
        let xff = "X-Forwarded-For: 203.0.113.7\r\n";
        assert_eq!(client("127.0.0.1", xff, &[]), "127.0.0.1");
        assert_eq!(client("10.1.1.1", xff, &["127.0.0.1"]), "10.1.1.1");
        assert_eq!(client("127.0.0.1", xff, &["127.0.0.1"]), "203.0.113.7");
        assert_eq!(client("127.0.0.1", "", &["127.0.0.1"]), "127.0.0.1");
    }

    #[test]
    fn the_client_is_the_rightmost_address_no_trusted_proxy_wrote_for_itself() {
        // A client that sends its own header cannot hide behind it.
        let spoofed = "X-Forwarded-For: 1.2.3.4, 198.51.100.9\r\n";
        assert_eq!(client("127.0.0.1", spoofed, &["127.0.0.1"]), "198.51.100.9");
        // Two trusted proxies in a row.
        let chain = "X-Forwarded-For: 198.51.100.9, 10.0.0.5\r\n";
        assert_eq!(
            client("127.0.0.1", chain, &["127.0.0.1", "10.0.0.0/8"]),
            "198.51.100.9"
        );
        // Headers given twice are one list.
        let twice = "X-Forwarded-For: 198.51.100.9\r\nX-Forwarded-For: 10.0.0.5\r\n";
        assert_eq!(
            client("127.0.0.1", twice, &["127.0.0.1", "10.0.0.0/8"]),
            "198.51.100.9"
        );
        // An entry that is no address is an unknown client, not the last hop.
        let junk = "X-Forwarded-For: nonsense, 10.0.0.5\r\n";
        assert_eq!(
            client("127.0.0.1", junk, &["127.0.0.1", "10.0.0.0/8"]),
            "0.0.0.0"
        );
    }

    #[test]
    fn networks_parse_and_match() {
        let net: Network = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.200.3.4".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.0.0.1".parse().unwrap()));
        let v6: Network = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let any: Network = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains("8.8.8.8".parse().unwrap()));
        for bad in ["", "10.0.0.0/33", "nope", "10.0.0.0/x", "::1/129"] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }
}
