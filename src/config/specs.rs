//! The values of the `--listen` and `--broker` flags: where to listen (one
//! address, or one per port of a range) and which broker keeps channels, parsed
//! from their text. Plain data: nothing here binds or connects.

use std::net::{IpAddr, SocketAddr};

/// Where to listen: one address, or one address per port of a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenSpec {
    pub ip: IpAddr,
    pub first_port: u16,
    pub last_port: u16,
}

impl ListenSpec {
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        (self.first_port..=self.last_port).map(|port| SocketAddr::new(self.ip, port))
    }
}

impl std::str::FromStr for ListenSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, ports) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("'{s}' is not host:port or host:first-last"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = match host {
            "localhost" => IpAddr::from([127, 0, 0, 1]),
            "" => IpAddr::from([0, 0, 0, 0]),
            h => h
                .parse()
                .map_err(|_| format!("'{h}' is not an IP address (in '{s}')"))?,
        };
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| format!("'{p}' is not a port number (in '{s}')"))
        };
        let (first_port, last_port) = match ports.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(ports)?;
                (p, p)
            }
        };
        if first_port > last_port {
            return Err(format!("port range {first_port}-{last_port} is empty"));
        }
        if first_port == 0 && last_port != 0 {
            return Err("a port range cannot start at 0".into());
        }
        Ok(ListenSpec {
            ip,
            first_port,
            last_port,
        })
    }
}

/// Which broker keeps channels: this process alone, or Redis for every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerSpec {
    Memory,
    /// `redis://host[:port][/db]`, the master behind Sentinel
    /// (`redis-sentinel://[[user]:password@]host[:port][,host[:port]…]/master`) or
    /// a Redis Cluster (`redis-cluster://host:port[,host:port…]`); as written (the
    /// broker reads it again at start).
    Redis(String),
}

impl std::str::FromStr for BrokerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "memory" {
            return Ok(BrokerSpec::Memory);
        }
        if s.starts_with("redis://") || s.starts_with("redis-sentinel://") {
            crate::broker::RedisBroker::check_url(s)?;
            return Ok(BrokerSpec::Redis(s.to_string()));
        }
        if let Some(rest) = s.strip_prefix("redis-cluster://") {
            let hosts = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let hosts: Vec<&str> = hosts.trim_end_matches('/').split(',').collect();
            let bad = hosts.iter().find(|h| {
                h.rsplit_once(':')
                    .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
            });
            return match bad {
                Some(h) => Err(format!(
                    "'{s}': a cluster node must be host:port, not '{h}'"
                )),
                None => Ok(BrokerSpec::Redis(s.to_string())),
            };
        }
        Err(format!(
            "'{s}' is not a broker: use memory, redis://host[:port][/db], redis-sentinel://[[user]:password@]host[:port][,host[:port]…]/master or redis-cluster://host:port[,host:port…]"
        ))
    }
}
