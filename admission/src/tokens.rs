//! Queue and admission tokens: Ed25519 JWTs (`alg: EdDSA`, with `kid`), the
//! keyring that signs and verifies them, the JWKS, and a cache of verified
//! tokens.
//!
//! # Format (API.md "Tokens")
//!
//! Header `{"alg":"EdDSA","typ":"JWT","kid"}`; claims `iss = "sluice"`,
//! `aud` = room, `sub` = visitor id, `iat`, `exp`, `jti`, `typ` = `"queue"`
//! or `"admit"`, `epoch`; queue tokens also `seq`; admission tokens
//! optionally `ipp` (the client's IP prefix it is bound to), `sid` (its
//! session) and `hcap` (the hard cap, Unix seconds, that sliding renewal may
//! not pass).
//!
//! # Verification
//!
//! In this order, cheapest first: at most [`MAX_TOKEN_LEN`] bytes of ASCII,
//! three parts; header `alg` must be `EdDSA` (so `none` and HS256 signed
//! with the public key bytes are refused before any key is touched); `kid`
//! must be a short plain name of a key in the ring (it is only ever a map
//! key, never a path); the signature, `iss`, `aud` (via `jsonwebtoken`);
//! then `typ`, `exp` and `iat` (not in the future) against the caller's
//! `now_s` with [`LEEWAY_S`] of clock skew either way. A queue token is never an admission token: `typ` differs.
//!
//! # Signing
//!
//! Signing uses the cached `ed25519_dalek::SigningKey` and a header encoded
//! once per key: `jsonwebtoken::encode` parses the PKCS#8 key and derives
//! the public key on every call (about 20 µs). The output is a plain
//! compact JWS that `jsonwebtoken::decode` verifies (tested).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Validation};
use parking_lot::Mutex;
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::AdmissionError;

/// The `iss` of every sluice token.
pub const ISSUER: &str = "sluice";
/// Tokens longer than this are refused before parsing.
pub const MAX_TOKEN_LEN: usize = 4096;
/// Clock skew allowed on `exp`, seconds.
pub const LEEWAY_S: u64 = 5;
/// `typ` of a queue token.
pub const TYP_QUEUE: &str = "queue";
/// `typ` of an admission token.
pub const TYP_ADMIT: &str = "admit";

/// Why a token was refused. Every variant maps to 401 `token_invalid`; the
/// variant is for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token too long")]
    Oversized,
    /// Not a compact JWS, bad base64 or JSON, missing claims.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// `alg` other than `EdDSA` (including `none`).
    #[error("algorithm not accepted")]
    Algorithm,
    /// No `kid`, a `kid` that is not a plain short name, or one not in the
    /// keyring.
    #[error("unknown key id")]
    UnknownKid,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// `aud` is another room.
    #[error("token of another room")]
    WrongAudience,
    /// `iss` is not `sluice`.
    #[error("wrong issuer")]
    WrongIssuer,
    /// A queue token where an admission token was expected, or the reverse.
    #[error("wrong token type")]
    WrongType,
    /// Past `exp` (+ leeway).
    #[error("token expired")]
    Expired,
    /// `iat` further in the future than the leeway: a signer whose clock
    /// runs ahead, or a token minted to outlive a key's retirement.
    #[error("token issued in the future")]
    IssuedInFuture,
    /// Signing failed (serialisation).
    #[error("signing failed: {0}")]
    Signing(String),
}

/// Seconds since the Unix epoch, by the machine's clock (the one
/// system "now" of `sluice-clock`).
pub use sluice_clock::now_s as unix_now_s;

fn random_b64(n: usize) -> String {
    let mut buf = vec![0u8; n];
    rand::rng().fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

/// The session of the place `seq` of `epoch` (`epoch.seq`): one place, one
/// session, so however often (and from however many tabs) a place is
/// claimed, its admission tokens name the same session and count once
/// against `max_active`.
pub fn session_of(epoch: u64, seq: u64) -> String {
    format!("{epoch}.{seq}")
}

/// A fresh visitor id: 128 random bits, base64url (22 characters).
pub fn new_visitor_id() -> String {
    random_b64(16)
}

/// A fresh token id (`jti`): 96 random bits, base64url.
pub fn new_jti() -> String {
    random_b64(12)
}

/// The claims of a queue token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueClaims {
    /// Always [`ISSUER`].
    pub iss: String,
    /// The room.
    pub aud: String,
    /// The visitor id.
    pub sub: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expires at, Unix seconds.
    pub exp: u64,
    /// Token id.
    pub jti: String,
    /// Always [`TYP_QUEUE`].
    pub typ: String,
    /// The room's epoch when the seq was handed out.
    pub epoch: u64,
    /// The place in line.
    pub seq: u64,
    /// Where the visitor returns once admitted (a same-origin path, checked
    /// by the gateway before signing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<String>,
    /// The lane the seq belongs to (`crate::lanes`); absent: the room's
    /// default lane (the one line of a room without lanes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
}

impl QueueClaims {
    /// Claims for `seq` in `room`, valid for `ttl` from `now_s`, with a
    /// fresh `jti`.
    pub fn new(room: &str, sub: &str, seq: u64, epoch: u64, now_s: u64, ttl: Duration) -> Self {
        Self {
            iss: ISSUER.into(),
            aud: room.into(),
            sub: sub.into(),
            iat: now_s,
            exp: now_s + ttl.as_secs(),
            jti: new_jti(),
            typ: TYP_QUEUE.into(),
            epoch,
            seq,
            ret: None,
            lane: None,
        }
    }
}

/// The claims of an admission token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmitClaims {
    /// Always [`ISSUER`].
    pub iss: String,
    /// The room.
    pub aud: String,
    /// The visitor id.
    pub sub: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expires at, Unix seconds (short; renewed while the visitor is active).
    pub exp: u64,
    /// Token id.
    pub jti: String,
    /// Always [`TYP_ADMIT`].
    pub typ: String,
    /// The room's epoch.
    pub epoch: u64,
    /// The seq admitted, when it came through the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// IP-prefix binding (e.g. `203.0.113.0/24`), checked by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipp: Option<String>,
    /// Session id (for `session_touch`/`session_end`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<String>,
    /// Hard cap: sliding renewal never extends `exp` past it (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hcap: Option<u64>,
}

impl AdmitClaims {
    /// Claims for `sub` in `room`, valid for `ttl` from `now_s` (but never
    /// past `hcap` when set later), with a fresh `jti`.
    pub fn new(room: &str, sub: &str, epoch: u64, now_s: u64, ttl: Duration) -> Self {
        Self {
            iss: ISSUER.into(),
            aud: room.into(),
            sub: sub.into(),
            iat: now_s,
            exp: now_s + ttl.as_secs(),
            jti: new_jti(),
            typ: TYP_ADMIT.into(),
            epoch,
            seq: None,
            ipp: None,
            sid: None,
            hcap: None,
        }
    }

    /// The renewed claims at `now_s` for another `ttl` (sliding), capped at
    /// `hcap`; `None` once the hard cap is reached.
    pub fn renewed(&self, now_s: u64, ttl: Duration) -> Option<Self> {
        let mut exp = now_s + ttl.as_secs();
        if let Some(h) = self.hcap {
            if now_s >= h {
                return None;
            }
            exp = exp.min(h);
        }
        Some(Self {
            iat: now_s,
            exp,
            jti: new_jti(),
            ..self.clone()
        })
    }
}

/// Every claim either token type may carry: what is cached.
#[derive(Clone, Debug, Deserialize)]
struct AnyClaims {
    iss: String,
    aud: String,
    sub: String,
    iat: u64,
    exp: u64,
    jti: String,
    typ: String,
    epoch: u64,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    ipp: Option<String>,
    #[serde(default)]
    sid: Option<String>,
    #[serde(default)]
    hcap: Option<u64>,
    #[serde(default)]
    ret: Option<String>,
    #[serde(default)]
    lane: Option<String>,
}

/// The checks of a verified token's claims that depend on who asks and
/// when: its type and room, the issuer, `exp` and `iat` against `now_s`
/// with [`LEEWAY_S`] of skew. Run on every use, cached or not.
struct Checked<'a> {
    typ: &'a str,
    aud: &'a str,
    iss: &'a str,
    exp: u64,
    iat: u64,
}

impl Checked<'_> {
    fn check(&self, typ: &str, room: &str, now_s: u64) -> Result<(), TokenError> {
        if self.typ != typ {
            return Err(TokenError::WrongType);
        }
        if self.aud != room {
            return Err(TokenError::WrongAudience);
        }
        if self.iss != ISSUER {
            return Err(TokenError::WrongIssuer);
        }
        if self.exp.saturating_add(LEEWAY_S) < now_s {
            return Err(TokenError::Expired);
        }
        if self.iat > now_s.saturating_add(LEEWAY_S) {
            return Err(TokenError::IssuedInFuture);
        }
        Ok(())
    }
}

impl AdmitClaims {
    /// Whether these claims (of an admission token whose signature was
    /// verified) still admit to `room` at `now_s`: the same checks as every
    /// use through [`VerifyCache::verify_admit`] (type, room, issuer, `exp`,
    /// `iat`), for a holder that remembers the token it verified (byte for
    /// byte) instead of asking the cache again.
    pub fn check(&self, room: &str, now_s: u64) -> Result<(), TokenError> {
        Checked {
            typ: &self.typ,
            aud: &self.aud,
            iss: &self.iss,
            exp: self.exp,
            iat: self.iat,
        }
        .check(TYP_ADMIT, room, now_s)
    }
}

impl AnyClaims {
    fn check(&self, typ: &str, room: &str, now_s: u64) -> Result<(), TokenError> {
        Checked {
            typ: &self.typ,
            aud: &self.aud,
            iss: &self.iss,
            exp: self.exp,
            iat: self.iat,
        }
        .check(typ, room, now_s)
    }

    fn queue(&self) -> Result<QueueClaims, TokenError> {
        Ok(QueueClaims {
            iss: self.iss.clone(),
            aud: self.aud.clone(),
            sub: self.sub.clone(),
            iat: self.iat,
            exp: self.exp,
            jti: self.jti.clone(),
            typ: self.typ.clone(),
            epoch: self.epoch,
            seq: self
                .seq
                .ok_or_else(|| TokenError::Malformed("queue token without seq".into()))?,
            ret: self.ret.clone(),
            lane: self.lane.clone(),
        })
    }

    fn admit(&self) -> AdmitClaims {
        AdmitClaims {
            iss: self.iss.clone(),
            aud: self.aud.clone(),
            sub: self.sub.clone(),
            iat: self.iat,
            exp: self.exp,
            jti: self.jti.clone(),
            typ: self.typ.clone(),
            epoch: self.epoch,
            seq: self.seq,
            ipp: self.ipp.clone(),
            sid: self.sid.clone(),
            hcap: self.hcap,
        }
    }
}

/// Whether `kid` is a plain short name: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= 64
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

struct SigningEntry {
    kid: String,
    key: SigningKey,
    header_b64: String,
    encoding: EncodingKey,
}

struct VerifyEntry {
    public: [u8; 32],
    decoding: DecodingKey,
}

/// One signing key and any number of verify-only keys, by `kid`.
pub struct Keyring {
    signing: SigningEntry,
    verify: HashMap<String, VerifyEntry>,
    validation: Validation,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<_> = self.verify.keys().collect();
        kids.sort();
        f.debug_struct("Keyring")
            .field("signing_kid", &self.signing.kid)
            .field("kids", &kids)
            .finish()
    }
}

fn generate_key() -> SigningKey {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    SigningKey::from_bytes(&secret)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn pem_to_der(text: &str) -> Result<Vec<u8>, AdmissionError> {
    let mut inside = false;
    let mut body = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN PRIVATE KEY-----") {
            inside = true;
        } else if line.starts_with("-----END PRIVATE KEY-----") {
            return STANDARD
                .decode(body.as_bytes())
                .map_err(|e| AdmissionError::Key(format!("bad PEM base64: {e}")));
        } else if inside {
            body.push_str(line);
        }
    }
    Err(AdmissionError::Key(
        "no PEM \"PRIVATE KEY\" (PKCS#8) block".into(),
    ))
}

impl Keyring {
    /// A keyring signing with `key` under `kid`.
    pub fn new(kid: &str, key: SigningKey) -> Result<Self, AdmissionError> {
        if !valid_kid(kid) {
            return Err(AdmissionError::Key(format!(
                "invalid kid {kid:?}: 1-64 of [A-Za-z0-9_-]"
            )));
        }
        let der = key
            .to_pkcs8_der()
            .map_err(|e| AdmissionError::Key(format!("PKCS#8 encoding: {e}")))?;
        let header = serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": kid});
        let header_b64 = URL_SAFE_NO_PAD.encode(header.to_string());
        let mut validation = Validation::new(Algorithm::EdDSA);
        // exp is checked by us against the caller's clock (virtual time).
        validation.validate_exp = false;
        validation.leeway = LEEWAY_S;
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
        let mut ring = Self {
            signing: SigningEntry {
                kid: kid.to_owned(),
                encoding: EncodingKey::from_ed_der(der.as_bytes()),
                header_b64,
                key: key.clone(),
            },
            verify: HashMap::new(),
            validation,
        };
        ring.add_verify_key(kid, key.verifying_key())?;
        Ok(ring)
    }

    /// A keyring with a fresh random key (kid `eph-…`): fine for one
    /// gateway; tokens die with the process.
    pub fn ephemeral() -> Self {
        let mut id = [0u8; 6];
        rand::rng().fill_bytes(&mut id);
        let kid = format!("eph-{}", hex(&id));
        // The kid is valid by construction; the key encodes.
        match Self::new(&kid, generate_key()) {
            Ok(k) => k,
            Err(e) => unreachable!("ephemeral key: {e}"),
        }
    }

    /// Adds a verify-only public key.
    pub fn add_verify_key(&mut self, kid: &str, key: VerifyingKey) -> Result<(), AdmissionError> {
        if !valid_kid(kid) {
            return Err(AdmissionError::Key(format!("invalid kid {kid:?}")));
        }
        let public = key.to_bytes();
        self.verify.insert(
            kid.to_owned(),
            VerifyEntry {
                public,
                decoding: DecodingKey::from_ed_der(&public),
            },
        );
        Ok(())
    }

    /// Adds every key of `other` as verify-only (rotation: the new ring
    /// still accepts the old ring's tokens).
    pub fn trust(mut self, other: &Keyring) -> Self {
        for (kid, e) in &other.verify {
            if let Ok(vk) = VerifyingKey::from_bytes(&e.public) {
                // kids of another ring are valid already.
                let _ = self.add_verify_key(kid, vk);
            }
        }
        self
    }

    /// Loads every key of `dir`:
    ///
    /// - `*.pk8` and `*.der`: PKCS#8 DER private keys; `*.pem`: PEM
    ///   PKCS#8 (`-----BEGIN PRIVATE KEY-----`). The file stem is the kid.
    /// - The signing key: the kid named in a file `signing` (trimmed) if
    ///   there is one, else the lexicographically last kid (`sluice keygen`
    ///   names keys `<unix seconds>-<random>`, so that is the newest).
    ///   Every other key verifies only.
    ///
    /// Fails when there is no key, a key file does not parse, a kid is not
    /// a plain name, or `signing` names a missing key.
    pub fn load_dir(dir: impl AsRef<Path>) -> Result<Self, AdmissionError> {
        let dir = dir.as_ref();
        let mut keys: Vec<(String, SigningKey)> = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "pk8" | "der" | "pem") || !path.is_file() {
                continue;
            }
            let kid = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("")
                .to_owned();
            if !valid_kid(&kid) {
                return Err(AdmissionError::Key(format!(
                    "{}: the file name is the kid and must be 1-64 of [A-Za-z0-9_-]",
                    path.display()
                )));
            }
            let bytes = std::fs::read(&path)?;
            let der = if ext == "pem" {
                pem_to_der(&String::from_utf8_lossy(&bytes))?
            } else {
                bytes
            };
            let key = SigningKey::from_pkcs8_der(&der).map_err(|e| {
                AdmissionError::Key(format!(
                    "{}: not an Ed25519 PKCS#8 key: {e}",
                    path.display()
                ))
            })?;
            keys.push((kid, key));
        }
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let marker = dir.join("signing");
        let signing_kid = if marker.is_file() {
            let k = std::fs::read_to_string(&marker)?.trim().to_owned();
            if !keys.iter().any(|(kid, _)| *kid == k) {
                return Err(AdmissionError::Key(format!(
                    "{}: names {k:?}, which is not a key here",
                    marker.display()
                )));
            }
            k
        } else {
            match keys.last() {
                Some((kid, _)) => kid.clone(),
                None => {
                    return Err(AdmissionError::Key(format!(
                        "{}: no key (*.pk8, *.der, *.pem); make one with `sluice keygen`",
                        dir.display()
                    )));
                }
            }
        };
        let mut ring: Option<Keyring> = None;
        for (kid, key) in &keys {
            if *kid == signing_kid {
                ring = Some(Self::new(kid, key.clone())?);
            }
        }
        let mut ring = ring.ok_or_else(|| AdmissionError::Key("no signing key".into()))?;
        for (kid, key) in &keys {
            ring.add_verify_key(kid, key.verifying_key())?;
        }
        Ok(ring)
    }

    /// The kid that signs.
    pub fn signing_kid(&self) -> &str {
        &self.signing.kid
    }

    /// Every kid that verifies, sorted.
    pub fn kids(&self) -> Vec<String> {
        let mut v: Vec<_> = self.verify.keys().cloned().collect();
        v.sort();
        v
    }

    /// The signing key as a `jsonwebtoken` key (for interop and benches).
    pub fn encoding_key(&self) -> &EncodingKey {
        &self.signing.encoding
    }

    fn sign_claims<T: Serialize>(&self, claims: &T) -> Result<String, TokenError> {
        let payload = serde_json::to_vec(claims).map_err(|e| TokenError::Signing(e.to_string()))?;
        let mut out =
            String::with_capacity(self.signing.header_b64.len() + payload.len() * 4 / 3 + 100);
        out.push_str(&self.signing.header_b64);
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(&payload, &mut out);
        let sig = self.signing.key.sign(out.as_bytes());
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(sig.to_bytes(), &mut out);
        Ok(out)
    }

    /// Signs a queue token.
    pub fn sign_queue(&self, claims: &QueueClaims) -> Result<String, TokenError> {
        self.sign_claims(claims)
    }

    /// Signs an admission token.
    pub fn sign_admit(&self, claims: &AdmitClaims) -> Result<String, TokenError> {
        self.sign_claims(claims)
    }

    fn verify_any(&self, token: &str, room: &str) -> Result<AnyClaims, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Oversized);
        }
        if !token.is_ascii() || token.bytes().filter(|b| *b == b'.').count() != 2 {
            return Err(TokenError::Malformed("not a compact JWS".into()));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::Json(_) => TokenError::Algorithm,
            _ => TokenError::Malformed(e.to_string()),
        })?;
        if header.alg != Algorithm::EdDSA {
            return Err(TokenError::Algorithm);
        }
        let kid = header.kid.as_deref().unwrap_or("");
        if !valid_kid(kid) {
            return Err(TokenError::UnknownKid);
        }
        let entry = self.verify.get(kid).ok_or(TokenError::UnknownKid)?;
        let mut validation = self.validation.clone();
        validation.set_audience(&[room]);
        let data = jsonwebtoken::decode::<AnyClaims>(token, &entry.decoding, &validation).map_err(
            |e| {
                use jsonwebtoken::errors::ErrorKind as K;
                match e.kind() {
                    K::InvalidSignature => TokenError::BadSignature,
                    K::InvalidAudience => TokenError::WrongAudience,
                    K::InvalidIssuer => TokenError::WrongIssuer,
                    K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => {
                        TokenError::Algorithm
                    }
                    _ => TokenError::Malformed(e.to_string()),
                }
            },
        )?;
        Ok(data.claims)
    }

    /// Verifies a queue token of `room` at `now_s`.
    pub fn verify_queue(
        &self,
        token: &str,
        room: &str,
        now_s: u64,
    ) -> Result<QueueClaims, TokenError> {
        let c = self.verify_any(token, room)?;
        c.check(TYP_QUEUE, room, now_s)?;
        c.queue()
    }

    /// Verifies an admission token of `room` at `now_s`.
    pub fn verify_admit(
        &self,
        token: &str,
        room: &str,
        now_s: u64,
    ) -> Result<AdmitClaims, TokenError> {
        let c = self.verify_any(token, room)?;
        c.check(TYP_ADMIT, room, now_s)?;
        Ok(c.admit())
    }

    /// The JWKS of every verifying key (RFC 7517 / RFC 8037), sorted by kid:
    /// `{"keys": [{"kty": "OKP", "crv": "Ed25519", "x", "kid", "alg": "EdDSA", "use": "sig"}]}`.
    pub fn jwks(&self) -> serde_json::Value {
        let keys: Vec<_> = self
            .kids()
            .into_iter()
            .filter_map(|kid| {
                self.verify.get(&kid).map(|e| {
                    serde_json::json!({
                        "kty": "OKP",
                        "crv": "Ed25519",
                        "x": URL_SAFE_NO_PAD.encode(e.public),
                        "kid": kid,
                        "alg": "EdDSA",
                        "use": "sig",
                    })
                })
            })
            .collect();
        serde_json::json!({ "keys": keys })
    }
}

/// Writes a new Ed25519 key to `dir` (created if missing) as
/// `<kid>.pk8` (PKCS#8 DER, mode 0600) and returns the kid:
/// `<unix seconds, 10 digits>-<8 random hex>`, so the newest key sorts last
/// and becomes the signing key on the next load unless a `signing` file pins
/// another.
pub fn keygen(dir: impl AsRef<Path>) -> Result<String, AdmissionError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir)?;
    let key = generate_key();
    let mut r = [0u8; 4];
    rand::rng().fill_bytes(&mut r);
    let kid = format!("{:010}-{}", unix_now_s(), hex(&r));
    let der = key
        .to_pkcs8_der()
        .map_err(|e| AdmissionError::Key(format!("PKCS#8 encoding: {e}")))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(dir.join(format!("{kid}.pk8")))?;
    std::io::Write::write_all(&mut f, der.as_bytes())?;
    f.sync_all()?;
    Ok(kid)
}

// === VerifyCache ===

#[derive(Clone)]
struct CacheEntry {
    claims: Arc<AnyClaims>,
}

/// A bounded cache of verified tokens, so a status poll costs a SHA-256 and
/// a map lookup instead of an Ed25519 verify.
///
/// Keyed by the SHA-256 of the whole token (a token that differs in any byte
/// is another entry). A hit re-checks `typ`, `aud` and `exp` against the
/// caller's time, so an entry never outlives its token. Sharded mutexes keep
/// contention low; a full shard first drops its expired entries and, if
/// still full, is cleared (the next polls pay one verify each). Keys removed
/// from the keyring: call [`VerifyCache::clear`].
pub struct VerifyCache {
    shards: Vec<Mutex<HashMap<[u8; 32], CacheEntry>>>,
    per_shard: usize,
}

impl std::fmt::Debug for VerifyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyCache")
            .field("len", &self.len())
            .finish()
    }
}

const SHARDS: usize = 16;

impl VerifyCache {
    /// A cache holding about `capacity` tokens.
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry.
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }

    fn lookup(&self, key: &[u8; 32]) -> Option<Arc<AnyClaims>> {
        let shard = &self.shards[key[0] as usize % SHARDS];
        shard.lock().get(key).map(|e| e.claims.clone())
    }

    fn insert(&self, key: [u8; 32], claims: AnyClaims, now_s: u64) -> Arc<AnyClaims> {
        let claims = Arc::new(claims);
        let shard = &self.shards[key[0] as usize % SHARDS];
        let mut map = shard.lock();
        if map.len() >= self.per_shard {
            map.retain(|_, e| e.claims.exp.saturating_add(LEEWAY_S) >= now_s);
            if map.len() >= self.per_shard {
                map.clear();
            }
        }
        map.insert(
            key,
            CacheEntry {
                claims: claims.clone(),
            },
        );
        claims
    }

    fn verify_any(
        &self,
        ring: &Keyring,
        token: &str,
        typ: &str,
        room: &str,
        now_s: u64,
    ) -> Result<Arc<AnyClaims>, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Oversized);
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let claims = match self.lookup(&key) {
            Some(c) => c,
            None => {
                let c = ring.verify_any(token, room)?;
                c.check(typ, room, now_s)?;
                self.insert(key, c, now_s)
            }
        };
        claims.check(typ, room, now_s)?;
        Ok(claims)
    }

    /// [`Keyring::verify_queue`] through the cache.
    pub fn verify_queue(
        &self,
        ring: &Keyring,
        token: &str,
        room: &str,
        now_s: u64,
    ) -> Result<QueueClaims, TokenError> {
        self.verify_any(ring, token, TYP_QUEUE, room, now_s)?
            .queue()
    }

    /// [`Keyring::verify_admit`] through the cache.
    pub fn verify_admit(
        &self,
        ring: &Keyring,
        token: &str,
        room: &str,
        now_s: u64,
    ) -> Result<AdmitClaims, TokenError> {
        Ok(self
            .verify_any(ring, token, TYP_ADMIT, room, now_s)?
            .admit())
    }
}

impl Default for VerifyCache {
    /// 100,000 tokens (about 0.4 KB each: some 40 MB when full).
    fn default() -> Self {
        Self::new(100_000)
    }
}
