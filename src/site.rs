//! Which sites may use the server from a browser: the `Host` a request names
//! (`--allowed-host`, and the default rule against DNS rebinding) and whether an
//! `Origin` is the server's own site. The `--allowed-origin` list itself is
//! [`crate::auth::origin_allowed`]'s.
//!
//! Pure decisions over header values: this module does no I/O and keeps no state.

use std::net::IpAddr;
use std::str::FromStr;

/// The host part of a `Host` value (`name`, `name:port`, `[v6]:port`), lower-case
/// is left to the caller.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// Whether a host name is an address (a name no DNS answer can rebind).
fn is_address(name: &str) -> bool {
    IpAddr::from_str(name).is_ok()
}

/// Whether a name is this machine's own: `localhost` and its subdomains, which
/// resolve to loopback by rule (RFC 6761), never through DNS.
fn is_localhost(name: &str) -> bool {
    name.eq_ignore_ascii_case("localhost")
        || name
            .get(name.len().saturating_sub(".localhost".len())..)
            .is_some_and(|tail| tail.eq_ignore_ascii_case(".localhost"))
}

/// Why a request's `Host` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("Host '{0}' is not one of this server's --allowed-host names")]
    NotListed(String),
    #[error(
        "Host '{0}' names this loopback server by a DNS name: a page there could read \
         it (DNS rebinding). Use localhost or an address, or list the name with --allowed-host"
    )]
    Rebinding(String),
}

/// Whether a request may name `host`. With `allowed` names, only they (and
/// addresses) pass. Without, anything passes except a DNS name (other than
/// localhost) in a browser's request (`browser`: it carries `Sec-Fetch-Site`)
/// that reached a loopback socket directly (`local`): the shape of a DNS
/// rebinding attack, a foreign page's name pointed at 127.0.0.1.
pub fn host_allowed(
    allowed: &[String],
    host: Option<&[u8]>,
    browser: bool,
    local: bool,
) -> Result<(), HostError> {
    let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else {
        // A request without a readable Host: HTTP/1.1 refused it when parsed;
        // HTTP/1.0 names no host to check.
        return Ok(());
    };
    let name = host_name(host.trim());
    let quoted = || host.chars().take(100).collect::<String>();
    if is_address(name) {
        return Ok(());
    }
    if !allowed.is_empty() {
        return if allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
        {
            Ok(())
        } else {
            Err(HostError::NotListed(quoted()))
        };
    }
    if browser && local && !is_localhost(name) {
        return Err(HostError::Rebinding(quoted()));
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) is the site `host` names: the page
/// was served by this server itself.
pub fn same_site(origin: &[u8], host: Option<&[u8]>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some(authority) = origin
        .strip_prefix(b"http://")
        .or_else(|| origin.strip_prefix(b"https://"))
    else {
        return false;
    };
    authority.eq_ignore_ascii_case(host.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_split_from_their_ports() {
        assert_eq!(host_name("example.com:8080"), "example.com");
        assert_eq!(host_name("example.com"), "example.com");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("127.0.0.1:80"), "127.0.0.1");
    }

    #[test]
    fn a_browser_naming_a_loopback_server_by_a_dns_name_is_refused() {
        let none: &[String] = &[];
        let rebinding = host_allowed(none, Some(b"evil.example:8080"), true, true);
        assert!(matches!(rebinding, Err(HostError::Rebinding(_))));
        for fine in [
            "localhost:8080",
            "app.localhost",
            "127.0.0.1:8080",
            "[::1]:8080",
        ] {
            assert_eq!(
                host_allowed(none, Some(fine.as_bytes()), true, true),
                Ok(()),
                "{fine}"
            );
        }
        // Not a browser, or not a loopback socket reached directly: the name is
        // not this rule's to judge.
        assert!(host_allowed(none, Some(b"x"), false, true).is_ok());
        assert!(host_allowed(none, Some(b"example.com"), true, false).is_ok());
    }

    #[test]
    fn listed_hosts_are_the_only_names_taken() {
        let allowed = vec!["example.com".to_string()];
        assert!(host_allowed(&allowed, Some(b"EXAMPLE.com:443"), false, false).is_ok());
        assert!(host_allowed(&allowed, Some(b"10.0.0.1"), false, false).is_ok());
        assert!(matches!(
            host_allowed(&allowed, Some(b"evil.example"), false, false),
            Err(HostError::NotListed(_))
        ));
        let any = vec!["*".to_string()];
        assert!(host_allowed(&any, Some(b"evil.example"), true, true).is_ok());
    }

    #[test]
    fn an_origin_is_the_servers_own_site_only_when_it_names_its_host() {
        assert!(same_site(b"http://127.0.0.1:8080", Some(b"127.0.0.1:8080")));
        assert!(same_site(b"https://Example.com", Some(b"example.com")));
        assert!(!same_site(b"http://evil.example", Some(b"127.0.0.1:8080")));
        assert!(!same_site(b"null", Some(b"127.0.0.1:8080")));
        assert!(!same_site(b"http://127.0.0.1:8080", None));
    }
}
