//! The server's TLS configuration: the certificate chain and private key read
//! from PEM files, the rustls `ServerConfig` built from them (ring provider,
//! TLS 1.3 and 1.2, ALPN `http/1.1`, stateless session tickets, secrets
//! extractable so the record layer can take over), and swapping it on reload.
//!
//! It owns only configuration: it must not touch connections, sockets or
//! signals. Whoever handles SIGHUP calls [`Certificates::reload`]; handshakes
//! already under way keep the `Arc` they started with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::server::{NoServerSessionStorage, ProducesTickets};
use rustls::version::{TLS12, TLS13};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The one application protocol throng speaks over TLS: WebSocket, SSE and
/// long-poll all start as HTTP/1.1.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Two tickets per TLS 1.3 handshake so a browser opening two connections in
/// parallel can resume both; each ticket is single-use by convention.
const TLS13_TICKETS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not valid PEM: {source}", path.display())]
    BadPem {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("no certificate (BEGIN CERTIFICATE) in {}", path.display())]
    NoCertificate { path: PathBuf },
    #[error(
        "no private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in {}",
        path.display()
    )]
    NoKey { path: PathBuf },
    #[error("the key in {} does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{} holds {len} bytes; a ticket key needs at least {min} random bytes (openssl rand -out FILE 48)", path.display(), min = super::tickets::MIN_SECRET)]
    ShortTicketKey { path: PathBuf, len: usize },
    #[error("rustls refused {} with {}: {source}", cert.display(), key.display())]
    Rejected {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// Builds the server configuration from a PEM certificate chain (leaf first)
/// and a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let ticketer =
        rustls::crypto::ring::Ticketer::new().map_err(|source| rejected(cert, key, source))?;
    build(cert, key, ticketer)
}

fn build(
    cert: &Path,
    key: &Path,
    ticketer: Arc<dyn ProducesTickets>,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let chain = read_chain(cert)?;
    let private_key = read_key(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS13, &TLS12])
        .map_err(|source| rejected(cert, key, source))?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(|source| match source {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                TlsConfigError::KeyMismatch {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                }
            }
            source => rejected(cert, key, source),
        })?;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    // Tickets carry the session, so a resumed client costs the server nothing
    // between its connections; a server-side cache would hold memory per client.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.ticketer = ticketer;
    config.send_tls13_tickets = TLS13_TICKETS;
    // The record layer is throng's own once the handshake is done.
    config.enable_secret_extraction = true;
    // TLS 1.3 key updates are answered from the traffic secrets, caught here.
    config.key_log = Arc::new(super::traffic::Capture);
    Ok(Arc::new(config))
}

fn rejected(cert: &Path, key: &Path, source: rustls::Error) -> TlsConfigError {
    TlsConfigError::Rejected {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    }
}

fn pem_error(path: &Path, e: pem::Error) -> TlsConfigError {
    match e {
        pem::Error::Io(source) => TlsConfigError::Unreadable {
            path: path.to_path_buf(),
            source,
        },
        source => TlsConfigError::BadPem {
            path: path.to_path_buf(),
            source,
        },
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(TlsConfigError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsConfigError::NoKey {
            path: path.to_path_buf(),
        },
        e => pem_error(path, e),
    })
}

/// The configuration new handshakes use, and where it came from so it can be
/// read again.
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

/// The secret session tickets are sealed with: a `--tls-ticket-key` file's
/// bytes, else what a `--workers` master handed on, else none (rustls's own).
pub fn ticket_secret(file: Option<&Path>) -> Result<Option<Vec<u8>>, TlsConfigError> {
    if let Some(path) = file {
        let bytes = std::fs::read(path).map_err(|source| TlsConfigError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        if bytes.len() < super::tickets::MIN_SECRET {
            return Err(TlsConfigError::ShortTicketKey {
                path: path.to_path_buf(),
                len: bytes.len(),
            });
        }
        return Ok(Some(bytes));
    }
    Ok(std::env::var(super::tickets::SECRET_ENV)
        .ok()
        .and_then(|hex| super::tickets::secret_from_hex(&hex)))
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Certificates {
    /// Reads the pair; session tickets are sealed with keys derived from
    /// `ticket_secret` when given (shared by every process that has it, see
    /// [`super::tickets`]), else with rustls's in-memory keys.
    pub fn load(
        cert: &Path,
        key: &Path,
        ticket_secret: Option<&[u8]>,
    ) -> Result<Self, TlsConfigError> {
        let config = match ticket_secret {
            Some(secret) => build(
                cert,
                key,
                Arc::new(super::tickets::SharedTicketer::new(secret)),
            )?,
            None => server_config(cert, key)?,
        };
        Ok(Self {
            current: RwLock::new(config),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })
    }

    /// The configuration for a handshake starting now.
    pub fn current(&self) -> Arc<ServerConfig> {
        // A panic while holding the lock cannot leave a half-written Arc behind,
        // so a poisoned lock still holds a usable config.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads both files again; on any error the old configuration stays.
    pub fn reload(&self) -> Result<(), TlsConfigError> {
        // Keeping the ticket keys means clients holding a ticket from before
        // the reload still resume instead of paying for a full handshake.
        let ticketer = self.current().ticketer.clone();
        let fresh = build(&self.cert, &self.key, ticketer)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A directory under the system temp dir, removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("throng-tls-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        pub(crate) fn write(&self, name: &str, contents: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A self-signed certificate for `localhost` with its key, both as PEM.
    pub(crate) struct TestCert {
        pub(crate) cert_pem: String,
        pub(crate) key_pem: String,
        pub(crate) cert_der: CertificateDer<'static>,
    }

    pub(crate) fn test_cert() -> TestCert {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        TestCert {
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
            cert_der: ck.cert.der().clone(),
        }
    }

    #[test]
    fn loads_cert_and_key() {
        let dir = TempDir::new("loads");
        let tc = test_cert();
        let cert = dir.write("cert.pem", &tc.cert_pem);
        let key = dir.write("key.pem", &tc.key_pem);
        let config = server_config(&cert, &key).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(config.enable_secret_extraction);
        assert_eq!(config.send_tls13_tickets, 2);
        assert!(config.ticketer.enabled());
        assert!(!config.session_storage.can_cache());
    }

    #[test]
    fn cert_and_key_in_one_file() {
        let dir = TempDir::new("onefile");
        let tc = test_cert();
        let both = dir.write("both.pem", &format!("{}{}", tc.cert_pem, tc.key_pem));
        server_config(&both, &both).unwrap();
    }

    #[test]
    fn refuses_missing_file() {
        let dir = TempDir::new("missing");
        let tc = test_cert();
        let key = dir.write("key.pem", &tc.key_pem);
        let missing = dir.0.join("nope.pem");
        let err = server_config(&missing, &key).unwrap_err();
        assert!(matches!(err, TlsConfigError::Unreadable { ref path, .. } if *path == missing));
        assert!(err.to_string().contains("nope.pem"), "{err}");
        let cert = dir.write("cert.pem", &tc.cert_pem);
        let err = server_config(&cert, &missing).unwrap_err();
        assert!(matches!(err, TlsConfigError::Unreadable { ref path, .. } if *path == missing));
    }

    #[test]
    fn refuses_pem_without_key() {
        let dir = TempDir::new("nokey");
        let tc = test_cert();
        let cert = dir.write("cert.pem", &tc.cert_pem);
        let err = server_config(&cert, &cert).unwrap_err();
        assert!(
            matches!(err, TlsConfigError::NoKey { ref path } if *path == cert),
            "{err}"
        );
        assert!(err.to_string().contains("cert.pem"), "{err}");
    }

    #[test]
    fn refuses_pem_without_certificate() {
        let dir = TempDir::new("nocert");
        let tc = test_cert();
        let key = dir.write("key.pem", &tc.key_pem);
        let err = server_config(&key, &key).unwrap_err();
        assert!(
            matches!(err, TlsConfigError::NoCertificate { ref path } if *path == key),
            "{err}"
        );
        let empty = dir.write("empty.pem", "");
        let err = server_config(&empty, &key).unwrap_err();
        assert!(matches!(err, TlsConfigError::NoCertificate { .. }), "{err}");
    }

    #[test]
    fn refuses_broken_pem() {
        let dir = TempDir::new("broken");
        let tc = test_cert();
        let key = dir.write("key.pem", &tc.key_pem);
        let cut = &tc.cert_pem[..tc.cert_pem.len() / 2];
        let cert = dir.write("cert.pem", cut);
        let err = server_config(&cert, &key).unwrap_err();
        assert!(matches!(err, TlsConfigError::BadPem { .. }), "{err}");
    }

    #[test]
    fn refuses_key_of_another_cert() {
        let dir = TempDir::new("mismatch");
        let a = test_cert();
        let b = test_cert();
        let cert = dir.write("cert.pem", &a.cert_pem);
        let key = dir.write("key.pem", &b.key_pem);
        let err = server_config(&cert, &key).unwrap_err();
        assert!(matches!(err, TlsConfigError::KeyMismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn reload_swaps_and_keeps_old_on_bad_files() {
        let dir = TempDir::new("reload");
        let a = test_cert();
        let cert = dir.write("cert.pem", &a.cert_pem);
        let key = dir.write("key.pem", &a.key_pem);
        let certs = Certificates::load(&cert, &key, None).unwrap();
        let first = certs.current();
        assert!(Arc::ptr_eq(&first, &certs.current()));

        let b = test_cert();
        dir.write("cert.pem", &b.cert_pem);
        dir.write("key.pem", &b.key_pem);
        certs.reload().unwrap();
        let second = certs.current();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(Arc::ptr_eq(&first.ticketer, &second.ticketer));

        // A half-written renewal: new certificate, old key.
        let c = test_cert();
        dir.write("cert.pem", &c.cert_pem);
        assert!(matches!(
            certs.reload().unwrap_err(),
            TlsConfigError::KeyMismatch { .. }
        ));
        assert!(Arc::ptr_eq(&second, &certs.current()));

        std::fs::remove_file(&key).unwrap();
        assert!(matches!(
            certs.reload().unwrap_err(),
            TlsConfigError::Unreadable { .. }
        ));
        assert!(Arc::ptr_eq(&second, &certs.current()));
    }
}
