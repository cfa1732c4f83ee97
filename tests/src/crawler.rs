//! What the verified-crawler tests stand up around a gateway: a crawler
//! operator's signer ([`Signer`], RFC 9421 signatures with Ed25519 in the
//! Web Bot Auth profile, written here from the RFC, not with the
//! gateway's code), its key directory served over HTTPS on a loopback port
//! ([`KeyDirectory`]), and a DNS server on a loopback UDP port answering
//! PTR, A and AAAA from a table ([`DnsServer`]), so no test asks the
//! machine's own DNS.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use bytes::Bytes;
use ed25519_dalek::Signer as _;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, PTR};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::tls::TestCa;

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A crawler operator's signing key.
pub struct Signer {
    key: ed25519_dalek::SigningKey,
}

impl Default for Signer {
    fn default() -> Self {
        Self::new()
    }
}

impl Signer {
    /// A fresh key.
    pub fn new() -> Signer {
        let mut seed = [0u8; 32];
        rand::fill(&mut seed);
        Signer {
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        }
    }

    /// The public key's `x`, base64url.
    pub fn x(&self) -> String {
        B64URL.encode(self.key.verifying_key().as_bytes())
    }

    /// The JWK SHA-256 thumbprint (RFC 7638: the required members of an
    /// OKP key, `crv`, `kty`, `x`, in that order, no spaces).
    pub fn keyid(&self) -> String {
        let json = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, self.x());
        B64URL.encode(<sha2::Sha256 as sha2::Digest>::digest(json.as_bytes()))
    }

    /// The public key as a directory's JWK.
    pub fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "OKP", "crv": "Ed25519", "x": self.x(), "kid": self.keyid(), "use": "sig",
        })
    }

    /// The `Signature-Agent`, `Signature-Input` and `Signature` headers of
    /// `sig`.
    pub fn headers(&self, sig: &Sig) -> Vec<(String, String)> {
        let mut ids = Vec::new();
        let mut lines = Vec::new();
        let agent_value = format!("\"{}\"", sig.agent);
        for c in &sig.components {
            let (id, value) = match *c {
                "@authority" => ("\"@authority\"".to_owned(), sig.authority.clone()),
                "@method" => ("\"@method\"".to_owned(), sig.method.clone()),
                "@path" => ("\"@path\"".to_owned(), sig.path.clone()),
                "signature-agent" => (
                    format!("\"signature-agent\";key=\"{}\"", sig.agent_key),
                    agent_value.clone(),
                ),
                other => (format!("\"{other}\""), String::new()),
            };
            lines.push(format!("{id}: {value}"));
            ids.push(id);
        }
        let mut params = format!("({})", ids.join(" "));
        params.push_str(&format!(";created={}", sig.created));
        params.push_str(&format!(";expires={}", sig.expires));
        let keyid = sig.keyid.clone().unwrap_or_else(|| self.keyid());
        params.push_str(&format!(";keyid=\"{keyid}\""));
        if let Some(alg) = &sig.alg {
            params.push_str(&format!(";alg=\"{alg}\""));
        }
        if let Some(nonce) = &sig.nonce {
            params.push_str(&format!(";nonce=\"{nonce}\""));
        }
        params.push_str(&format!(";tag=\"{}\"", sig.tag));
        lines.push(format!("\"@signature-params\": {params}"));
        let base = lines.join("\n");
        let signature = self.key.sign(base.as_bytes());
        vec![
            (
                "signature-agent".into(),
                format!("{}={agent_value}", sig.agent_key),
            ),
            ("signature-input".into(), format!("sig1={params}")),
            (
                "signature".into(),
                format!("sig1=:{}:", B64.encode(signature.to_bytes())),
            ),
        ]
    }
}

/// What a signature covers and says.
#[derive(Clone, Debug)]
pub struct Sig {
    /// The signer's origin, as `Signature-Agent` names it.
    pub agent: String,
    /// The `Signature-Agent` member's key.
    pub agent_key: String,
    /// Covered components, in order (`@authority`, `@method`, `@path`,
    /// `signature-agent`).
    pub components: Vec<&'static str>,
    /// `@authority` as signed (`host:port`).
    pub authority: String,
    /// `@method` as signed.
    pub method: String,
    /// `@path` as signed.
    pub path: String,
    /// `created`.
    pub created: i64,
    /// `expires`.
    pub expires: i64,
    /// `keyid`; `None`: the signer's own thumbprint.
    pub keyid: Option<String>,
    /// `alg`.
    pub alg: Option<String>,
    /// `nonce`.
    pub nonce: Option<String>,
    /// `tag`.
    pub tag: String,
}

impl Sig {
    /// A good signature by the signer at `agent` of `GET path` at
    /// `authority`: `@authority`, `@method`, `@path` and the
    /// `Signature-Agent` member, created now, expiring in five minutes,
    /// with a fresh nonce.
    pub fn new(agent: &str, authority: &str, path: &str) -> Sig {
        let mut nonce = [0u8; 32];
        rand::fill(&mut nonce);
        Sig {
            agent: agent.to_owned(),
            agent_key: "agent1".to_owned(),
            components: vec!["@authority", "@method", "@path", "signature-agent"],
            authority: authority.to_owned(),
            method: "GET".to_owned(),
            path: path.to_owned(),
            created: now(),
            expires: now() + 300,
            keyid: None,
            alg: Some("ed25519".to_owned()),
            nonce: Some(B64.encode(nonce)),
            tag: "web-bot-auth".to_owned(),
        }
    }
}

/// Where [`KeyDirectory`] serves its keys as an origin's JWKS.
pub const JWKS_PATH: &str = "/jwks.json";

/// A signer's key directory over HTTPS (a certificate of `ca` for
/// 127.0.0.1), serving its JWKS at
/// `/.well-known/http-message-signatures-directory`, and the same body at
/// [`JWKS_PATH`] as an origin publishes its JWKS (`application/jwk-set+json`).
/// Stops when dropped.
pub struct KeyDirectory {
    /// Its address.
    pub addr: SocketAddr,
    body: Arc<parking_lot::Mutex<String>>,
    fetches: Arc<AtomicU64>,
    failing: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl KeyDirectory {
    /// Starts serving the keys of `signers`.
    pub async fn start(ca: &TestCa, signers: &[&Signer]) -> KeyDirectory {
        let leaf = ca.leaf(&["127.0.0.1"]);
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("certificate");
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
        let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind directory");
        let addr = listener.local_addr().expect("addr");
        let body = Arc::new(parking_lot::Mutex::new(String::new()));
        let fetches = Arc::new(AtomicU64::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (b, f, down) = (body.clone(), fetches.clone(), failing.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, b, f, down) = (acceptor.clone(), b.clone(), f.clone(), down.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (b, f, down) = (b.clone(), f.clone(), down.clone());
                        async move {
                            let jwks = req.uri().path() == JWKS_PATH;
                            let wk = jwks
                                || req.uri().path()
                                    == "/.well-known/http-message-signatures-directory";
                            if wk {
                                f.fetch_add(1, Ordering::Relaxed);
                            }
                            let res = if wk && down.load(Ordering::Relaxed) {
                                http::Response::builder()
                                    .status(503)
                                    .body(Full::new(Bytes::from_static(b"down")))
                            } else if wk {
                                http::Response::builder()
                                    .header(
                                        "content-type",
                                        if jwks {
                                            "application/jwk-set+json"
                                        } else {
                                            "application/http-message-signatures-directory+json"
                                        },
                                    )
                                    .body(Full::new(Bytes::from(b.lock().clone())))
                            } else {
                                http::Response::builder()
                                    .status(404)
                                    .body(Full::new(Bytes::new()))
                            };
                            Ok::<_, Infallible>(res.expect("response"))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        let dir = KeyDirectory {
            addr,
            body,
            fetches,
            failing,
            task,
        };
        dir.serve(signers);
        dir
    }

    /// Serves the keys of `signers` from now on.
    pub fn serve(&self, signers: &[&Signer]) {
        let keys: Vec<_> = signers.iter().map(|s| s.jwk()).collect();
        *self.body.lock() = serde_json::json!({ "keys": keys }).to_string();
    }

    /// Serves `body` (any JSON) from now on.
    pub fn serve_json(&self, body: &serde_json::Value) {
        *self.body.lock() = body.to_string();
    }

    /// `https://127.0.0.1:port/jwks.json`.
    pub fn jwks_url(&self) -> String {
        format!("https://{}{JWKS_PATH}", self.addr)
    }

    /// `https://127.0.0.1:port`: the signer's origin.
    pub fn origin(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// From now on answer 503 (`true`: an outage of the signer) or the
    /// keys again.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Directory fetches asked so far (answered or failed).
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }
}

impl Drop for KeyDirectory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A DNS server on a loopback UDP port answering from its table: PTR of
/// an address, A/AAAA of a name; anything else NXDOMAIN. Stops when
/// dropped. [`DnsServer::black_hole`] is one that never answers.
pub struct DnsServer {
    /// Its address.
    pub addr: SocketAddr,
    queries: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// The records a [`DnsServer`] answers with.
#[derive(Clone, Default)]
pub struct Zone {
    ptr: HashMap<String, Vec<String>>,
    addrs: HashMap<String, Vec<IpAddr>>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Zone {
    /// An empty zone.
    pub fn new() -> Zone {
        Zone::default()
    }

    /// `ip`'s PTR names.
    pub fn ptr(mut self, ip: &str, names: &[&str]) -> Zone {
        let ip: IpAddr = ip.parse().expect("an address");
        self.ptr.insert(
            key(&Name::from(ip).to_ascii()),
            names.iter().map(|n| (*n).to_owned()).collect(),
        );
        self
    }

    /// `name`'s addresses (A or AAAA).
    pub fn addrs(mut self, name: &str, ips: &[&str]) -> Zone {
        self.addrs.insert(
            key(name),
            ips.iter().map(|i| i.parse().expect("an address")).collect(),
        );
        self
    }
}

impl DnsServer {
    /// Starts answering from `zone`.
    pub async fn start(zone: Zone) -> DnsServer {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind dns");
        let addr = sock.local_addr().expect("addr");
        let queries = Arc::new(AtomicU64::new(0));
        let q = queries.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    continue;
                };
                q.fetch_add(1, Ordering::Relaxed);
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                if let Some(answer) = answer(&zone, &query)
                    && let Ok(bytes) = answer.to_vec()
                {
                    let _ = sock.send_to(&bytes, peer).await;
                }
            }
        });
        DnsServer {
            addr,
            queries,
            task,
        }
    }

    /// A nameserver that takes queries and never answers.
    pub async fn black_hole() -> DnsServer {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind dns");
        let addr = sock.local_addr().expect("addr");
        let queries = Arc::new(AtomicU64::new(0));
        let q = queries.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while sock.recv_from(&mut buf).await.is_ok() {
                q.fetch_add(1, Ordering::Relaxed);
            }
        });
        DnsServer {
            addr,
            queries,
            task,
        }
    }

    /// Queries received so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The answer to `query` from `zone`.
fn answer(zone: &Zone, query: &Message) -> Option<Message> {
    let q = query.queries.first()?.clone();
    let mut res = Message::response(query.metadata.id, OpCode::Query);
    res.metadata.message_type = MessageType::Response;
    res.metadata.recursion_desired = query.metadata.recursion_desired;
    res.metadata.recursion_available = true;
    res.metadata.authoritative = true;
    res.add_query(q.clone());
    let name = q.name().clone();
    let k = key(&name.to_ascii());
    let records: Vec<Record> = match q.query_type() {
        RecordType::PTR => zone
            .ptr
            .get(&k)
            .into_iter()
            .flatten()
            .filter_map(|n| Name::from_ascii(format!("{}.", key(n))).ok())
            .map(|n| Record::from_rdata(name.clone(), 60, RData::PTR(PTR(n))))
            .collect(),
        RecordType::A => zone
            .addrs
            .get(&k)
            .into_iter()
            .flatten()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => Some(Record::from_rdata(name.clone(), 60, RData::A(A(*v4)))),
                IpAddr::V6(_) => None,
            })
            .collect(),
        RecordType::AAAA => zone
            .addrs
            .get(&k)
            .into_iter()
            .flatten()
            .filter_map(|ip| match ip {
                IpAddr::V6(v6) => {
                    Some(Record::from_rdata(name.clone(), 60, RData::AAAA(AAAA(*v6))))
                }
                IpAddr::V4(_) => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let known = zone.ptr.contains_key(&k) || zone.addrs.contains_key(&k);
    if records.is_empty() && !known {
        res.metadata.response_code = ResponseCode::NXDomain;
    }
    res.add_answers(records);
    Some(res)
}
