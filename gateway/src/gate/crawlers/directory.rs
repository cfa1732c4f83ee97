//! The signers' key directories: each allow-listed `signature_agent`'s
//! `/.well-known/http-message-signatures-directory` (a JWKS of Ed25519
//! keys), fetched over HTTPS and cached.
//!
//! Only the configured signers' directories are ever fetched: a
//! `Signature-Agent` naming anything else is unverified without a request
//! leaving the gateway, so a client cannot make the gateway fetch a URL of
//! its choosing.
//!
//! Caching is [`Fetched`]'s (`crawlers.directory_ttl`, `_timeout`,
//! `_retry`, the protocol draft's "Cache Behaviour" and "Discovery
//! Failure"): a failed fetch keeps the keys fetched before, and a `keyid`
//! the cached keys lack asks for an early refetch in the background, at
//! most once per `crawlers.directory_retry`.
//!
//! A key is taken when it is `kty: OKP`, `crv: Ed25519`, with a 32-byte
//! `x`; its id is its JWK SHA-256 thumbprint (RFC 7638, RFC 8037 §A.3),
//! and a `kid` that differs from it drops the key (the draft requires
//! them equal). `nbf` and `exp`, when present, bound when it verifies.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::CrawlersConfig;
use crate::gate::fetched::{Fetched, Kind, Policy};

/// The well-known path of a signer's key directory.
pub const WELL_KNOWN: &str = "/.well-known/http-message-signatures-directory";

/// Most keys taken from one directory.
pub const MAX_KEYS: usize = 64;

/// One verification key of a directory.
#[derive(Clone, Debug)]
pub struct DirectoryKey {
    /// The Ed25519 public key.
    pub key: ed25519_dalek::VerifyingKey,
    /// Not before (seconds since the epoch).
    pub nbf: Option<i64>,
    /// Not after.
    pub exp: Option<i64>,
}

/// The keys of a directory by thumbprint.
pub type Keys = HashMap<String, DirectoryKey>;

/// The JWK SHA-256 thumbprint of an Ed25519 public key (RFC 7638 over the
/// members `crv`, `kty`, `x` in that order, RFC 8037 §A.3), base64url.
pub fn thumbprint(x: &[u8; 32]) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let json = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, b64.encode(x));
    b64.encode(Sha256::digest(json.as_bytes()))
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<serde_json::Value>,
}

/// The usable keys of a directory body; `Err` when it is not a JWKS.
pub fn parse_directory(body: &[u8]) -> Result<Keys, String> {
    let jwks: Jwks =
        serde_json::from_slice(body).map_err(|e| format!("not a key directory: {e}"))?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut keys = Keys::new();
    for jwk in jwks.keys.iter().take(MAX_KEYS) {
        let field = |k: &str| jwk.get(k).and_then(|v| v.as_str());
        if field("kty") != Some("OKP") || field("crv") != Some("Ed25519") {
            continue;
        }
        let Some(x) = field("x")
            .and_then(|x| b64.decode(x).ok())
            .and_then(|x| <[u8; 32]>::try_from(x).ok())
        else {
            continue;
        };
        let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(&x) else {
            continue;
        };
        let id = thumbprint(&x);
        if field("kid").is_some_and(|kid| kid != id) {
            continue;
        }
        let time = |k: &str| jwk.get(k).and_then(|v| v.as_i64());
        keys.insert(
            id,
            DirectoryKey {
                key,
                nbf: time("nbf"),
                exp: time("exp"),
            },
        );
    }
    Ok(keys)
}

/// What a lookup of a key found.
#[derive(Debug)]
pub enum Lookup {
    /// The key.
    Found(ed25519_dalek::VerifyingKey),
    /// The directory has no such key (or not now: `nbf`/`exp`).
    Unknown,
    /// The directory could not be had (never fetched, or every fetch
    /// failed).
    Unavailable,
}

/// The directories of the configured signers, fetched and cached by
/// [`Fetched`].
pub struct Directories {
    by_origin: HashMap<String, Arc<Fetched<Keys>>>,
}

impl Directories {
    /// The directories of `origins` (normalized `https://host[:port]`).
    pub fn new(config: &CrawlersConfig, origins: &[String]) -> anyhow::Result<Arc<Directories>> {
        let policy = Policy::new(
            config.directory_ca.as_deref(),
            !origins.is_empty(),
            config.directory_timeout,
            config.directory_ttl,
            config.directory_retry,
        )
        .map_err(|e| anyhow::anyhow!("crawlers.directory_ca: {e}"))?;
        let mut by_origin = HashMap::new();
        for origin in origins {
            let kind = Kind {
                name: "key directory",
                accept: "application/http-message-signatures-directory+json",
                content_types: &[
                    "application/http-message-signatures-directory+json",
                    "application/json",
                ],
                parse: parse_directory,
            };
            let url = format!("{origin}{WELL_KNOWN}");
            by_origin.insert(origin.clone(), Fetched::new(&url, kind, policy.clone())?);
        }
        Ok(Arc::new(Directories { by_origin }))
    }

    /// Fetches every directory once, in the background (at start).
    pub fn warm(&self) {
        for dir in self.by_origin.values() {
            dir.warm();
        }
    }

    /// The key `keyid` of the signer at `origin`, valid at `now_s`:
    /// from the cache, or, when the directory has no keys yet, after a
    /// fetch (shared, at most `directory_timeout`).
    pub async fn key(&self, origin: &str, keyid: &str, now_s: i64) -> Lookup {
        let Some(dir) = self.by_origin.get(origin) else {
            return Lookup::Unavailable;
        };
        let Some(keys) = dir.keys().await else {
            return Lookup::Unavailable;
        };
        match keys.get(keyid) {
            Some(k) if k.nbf.is_none_or(|t| t <= now_s) && k.exp.is_none_or(|t| now_s < t) => {
                Lookup::Found(k.key)
            }
            Some(_) => Lookup::Unknown,
            None => {
                // perhaps a key rotated in since the last fetch: the
                // crawler's next request will find it
                dir.refetch(false).await;
                Lookup::Unknown
            }
        }
    }

    /// How many keys each directory holds now (`None`: none fetched).
    pub fn status(&self) -> Vec<(String, Option<usize>)> {
        let mut out: Vec<_> = self
            .by_origin
            .iter()
            .map(|(origin, d)| (origin.clone(), d.current().map(|k| k.len())))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn x(b64: &str) -> [u8; 32] {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64)
            .unwrap()
            .try_into()
            .unwrap()
    }

    /// RFC 8037 §A.3's thumbprint, and the Web Bot Auth draft's keyid of
    /// RFC 9421's test key.
    #[test]
    fn thumbprints_match_the_rfcs() {
        assert_eq!(
            thumbprint(&x("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
        assert_eq!(
            thumbprint(&x("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs")),
            "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"
        );
    }

    #[test]
    fn a_directory_keeps_only_usable_ed25519_keys() {
        let body = br#"{"keys":[
            {"kty":"OKP","crv":"Ed25519","kid":"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U","x":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs","use":"sig","nbf":1712793600,"exp":1715385600},
            {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"Ed25519","kid":"other","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"X25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"RSA","n":"AQAB","e":"AQAB"},
            {"kty":"OKP","crv":"Ed25519","x":"short"}
        ]}"#;
        let keys = parse_directory(body).unwrap();
        assert_eq!(keys.len(), 2);
        let k = &keys["poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"];
        assert_eq!((k.nbf, k.exp), (Some(1_712_793_600), Some(1_715_385_600)));
        assert!(keys.contains_key("kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"));
        assert!(parse_directory(b"<html>").is_err());
        assert!(parse_directory(b"{\"keys\":{}}").is_err());
    }
}
