//! The browser pages the binary carries: the live dashboard (`GET /`), the chat
//! room (`GET /chat`) and the browser client they both use (`GET /throng.js`).
//!
//! The files live in `web/` and are embedded at build time, so a server works
//! offline with nothing beside its binary. `THRONG_WEB_DIR=DIR` makes it read them
//! from `DIR` on every request instead, to edit a page and reload it without a
//! rebuild. This module only maps a path to a file; it must not know about
//! connections, routing or the data the pages show (they fetch it themselves).
//!
//! `web/report.html` and `web/report.css` are not served: they are the skeleton
//! and stylesheet of `throng bench --report` (`bench::report::html`).

use std::borrow::Cow;

/// One page: where it is served, its file in `web/`, its content type and the
/// copy embedded at build time.
struct Page {
    path: &'static str,
    file: &'static str,
    content_type: &'static str,
    embedded: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

const PAGES: [Page; 3] = [
    Page {
        path: "/",
        file: "dashboard.html",
        content_type: HTML,
        embedded: include_str!("../web/dashboard.html"),
    },
    Page {
        path: "/chat",
        file: "chat.html",
        content_type: HTML,
        embedded: include_str!("../web/chat.html"),
    },
    Page {
        path: "/throng.js",
        file: "throng.js",
        content_type: JAVASCRIPT,
        embedded: include_str!("../web/throng.js"),
    },
];

/// A page to send: its content type and bytes.
#[derive(Debug)]
pub struct Served {
    pub content_type: &'static str,
    pub body: Cow<'static, [u8]>,
}

impl Served {
    /// The page's `Content-Security-Policy`: its own inline scripts (by their
    /// SHA-256, so an injected one does not run) and this server's, connections to
    /// this server only, and no site may frame it.
    pub fn content_security_policy(&self) -> String {
        let mut scripts = String::new();
        for inline in inline_scripts(&self.body) {
            use base64::Engine;
            use sha2::Digest;
            let digest = sha2::Sha256::digest(inline);
            scripts.push_str(" 'sha256-");
            scripts.push_str(&base64::engine::general_purpose::STANDARD.encode(digest));
            scripts.push('\'');
        }
        format!(
            "default-src 'self'; script-src 'self'{scripts}; style-src 'self' 'unsafe-inline'; \
             connect-src 'self' ws: wss:; img-src 'self' data:; base-uri 'none'; \
             form-action 'none'; frame-ancestors 'none'"
        )
    }
}

/// The contents of each `<script>` element without attributes (the inline ones).
fn inline_scripts(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    const OPEN: &[u8] = b"<script>";
    const CLOSE: &[u8] = b"</script>";
    let mut rest = body;
    std::iter::from_fn(move || {
        let start = rest.windows(OPEN.len()).position(|w| w == OPEN)? + OPEN.len();
        let len = rest[start..]
            .windows(CLOSE.len())
            .position(|w| w == CLOSE)?;
        let script = &rest[start..start + len];
        rest = &rest[start + len + CLOSE.len()..];
        Some(script)
    })
}

/// Whether `path` is one of the pages (a `GET` of it is answered by [`serve`]).
pub fn is_page(path: &str) -> bool {
    PAGES.iter().any(|p| p.path == path)
}

/// The page at `path`, from `THRONG_WEB_DIR` when that is set, else embedded.
/// `Err` carries why a development directory could not give it.
pub fn serve(path: &str) -> Option<Result<Served, String>> {
    let page = PAGES.iter().find(|p| p.path == path)?;
    let body = match std::env::var_os("THRONG_WEB_DIR") {
        None => Cow::Borrowed(page.embedded.as_bytes()),
        Some(dir) => {
            let file = std::path::Path::new(&dir).join(page.file);
            match std::fs::read(&file) {
                Ok(bytes) => Cow::Owned(bytes),
                Err(e) => {
                    return Some(Err(format!(
                        "THRONG_WEB_DIR: cannot read {}: {e}",
                        file.display()
                    )));
                }
            }
        }
    };
    Some(Ok(Served {
        content_type: page.content_type,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pages_policy_names_each_inline_script_by_its_hash() {
        let served = Served {
            content_type: HTML,
            body: Cow::Borrowed(b"<script src=\"/throng.js\"></script><script>alert(1)</script>"),
        };
        let csp = served.content_security_policy();
        // printf 'alert(1)' | openssl dgst -sha256 -binary | base64
        assert!(
            csp.contains("script-src 'self' 'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"));
        let chat = serve("/chat").unwrap().unwrap();
        assert_eq!(inline_scripts(&chat.body).count(), 1);
    }

    #[test]
    fn every_page_is_embedded_and_typed() {
        for path in ["/", "/chat", "/throng.js"] {
            assert!(is_page(path));
            let served = serve(path).unwrap().unwrap();
            assert!(!served.body.is_empty(), "{path} is empty");
        }
        assert_eq!(
            serve("/throng.js").unwrap().unwrap().content_type,
            JAVASCRIPT
        );
        assert!(serve("/nope").is_none());
        let dashboard = serve("/").unwrap().unwrap();
        let text = std::str::from_utf8(&dashboard.body).unwrap();
        // Offline: the pages load nothing from elsewhere.
        assert!(text.contains("/throng.js") && !text.contains("https://"));
    }
}
