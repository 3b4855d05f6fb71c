//! What the bench's TLS (`wss://`, `https://`) trusts and whom it greets: the
//! rustls [`ClientConfig`] built from `--insecure` or `--ca FILE` (otherwise the
//! Mozilla roots `webpki-roots` builds in), the verifier behind `--insecure`
//! (any certificate, but the handshake's signatures still checked), the server
//! name (SNI when the URL's host is a DNS name; rustls sends none for an IP
//! address), and the text a TLS failure gets in the report.
//!
//! It owns no socket: the event loop's non-blocking glue is `client/tls.rs`, the
//! publisher's and `handshakes` mode's blocking streams are `https.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, ring, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Which server certificates the bench accepts (`--insecure`, `--ca FILE`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// Any certificate at all (self-signed test certificates).
    pub insecure: bool,
    /// The CA certificates of this PEM file, instead of the built-in roots.
    pub ca: Option<PathBuf>,
}

/// Everything one TLS connection to the server needs: the config (shared, with
/// its session cache) and the name to greet and check the certificate against.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    pub config: Arc<ClientConfig>,
    pub name: ServerName<'static>,
}

impl TlsTarget {
    /// The target for `host` (a DNS name or an IP address, as the URL wrote it).
    pub fn new(config: Arc<ClientConfig>, host: &str) -> Result<TlsTarget, String> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("'{host}' is not a name TLS can check a certificate for: {e}"))?;
        Ok(TlsTarget { config, name })
    }
}

/// The client config for `trust`; `resume`: keep sessions (rustls's default
/// in-memory cache, so a reconnect resumes with a ticket) or never resume.
pub fn client_config(trust: &Trust, resume: bool) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let mut config = if trust.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
            .with_no_client_auth()
    } else {
        let roots = match &trust.ca {
            Some(path) => ca_roots(path)?,
            None => RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    // WebSocket upgrades, event streams, polls and publishes are all HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !resume {
        config.resumption = Resumption::disabled();
    }
    Ok(Arc::new(config))
}

/// The CA certificates of a PEM file, as trust anchors.
fn ca_roots(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("--ca {shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--ca {shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("--ca {shown}: no CERTIFICATE in the file"));
    }
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|e| format!("--ca {shown}: certificate {}: {e}", i + 1))?;
    }
    Ok(roots)
}

/// Why a TLS connection failed, as the report counts it: rustls's words, and
/// for a certificate it refused, what to do about it.
pub fn reason(e: &rustls::Error) -> String {
    match e {
        // webpki's words, which rustls passes on only as text.
        rustls::Error::InvalidCertificate(_) if e.to_string().contains("CaUsedAsEndEntity") => {
            format!(
                "tls: {e} (the server's own certificate is a CA's, as `openssl req -x509` makes \
                 by default: serve one signed by a CA and trust that with --ca FILE, or --insecure)"
            )
        }
        rustls::Error::InvalidCertificate(_) => {
            format!("tls: {e} (trust its CA with --ca FILE, or --insecure for a test certificate)")
        }
        // What a plain HTTP answer to a ClientHello looks like to rustls.
        rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
            format!("tls: {e} (does the server speak TLS on this port?)")
        }
        _ => format!("tls: {e}"),
    }
}

/// `--insecure`: any certificate is taken as the server's, but the handshake's
/// signatures are checked with the provider's algorithms, as for a trusted one.
#[derive(Debug)]
struct AcceptAnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
