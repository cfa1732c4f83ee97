//! Token security: everything that must be refused is refused; rotation,
//! JWKS and interop with `jsonwebtoken` work.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use sluice_admission::tokens::{LEEWAY_S, MAX_TOKEN_LEN};
use sluice_admission::{
    AdmitClaims, Keyring, QueueClaims, TokenError, VerifyCache, keygen, new_visitor_id,
};

const NOW: u64 = 1_800_000_000;
const ROOM: &str = "sale";

fn queue_claims() -> QueueClaims {
    QueueClaims::new(
        ROOM,
        &new_visitor_id(),
        42,
        7,
        NOW,
        Duration::from_secs(3600),
    )
}

fn admit_claims() -> AdmitClaims {
    let mut c = AdmitClaims::new(ROOM, &new_visitor_id(), 7, NOW, Duration::from_secs(300));
    c.seq = Some(42);
    c.sid = Some("sess-1".into());
    c.ipp = Some("203.0.113.0/24".into());
    c.hcap = Some(NOW + 3600);
    c
}

fn b64(v: &serde_json::Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn parts(token: &str) -> (String, String, String) {
    let mut it = token.split('.');
    (
        it.next().unwrap().to_owned(),
        it.next().unwrap().to_owned(),
        it.next().unwrap().to_owned(),
    )
}

#[test]
fn roundtrip_and_header() {
    let ring = Keyring::ephemeral();
    let q = queue_claims();
    let t = ring.sign_queue(&q).unwrap();
    assert_eq!(ring.verify_queue(&t, ROOM, NOW).unwrap(), q);
    let header = jsonwebtoken::decode_header(&t).unwrap();
    assert_eq!(header.alg, Algorithm::EdDSA);
    assert_eq!(header.typ.as_deref(), Some("JWT"));
    assert_eq!(header.kid.as_deref(), Some(ring.signing_kid()));
    let a = admit_claims();
    let t = ring.sign_admit(&a).unwrap();
    assert_eq!(ring.verify_admit(&t, ROOM, NOW).unwrap(), a);
}

#[test]
fn tampered_signature_and_payload_refused() {
    let ring = Keyring::ephemeral();
    let t = ring.sign_queue(&queue_claims()).unwrap();
    let (h, p, s) = parts(&t);
    // flip one signature character
    let mut sig: Vec<u8> = s.into_bytes();
    sig[10] = if sig[10] == b'A' { b'B' } else { b'A' };
    let bad = format!("{h}.{p}.{}", String::from_utf8(sig).unwrap());
    assert_eq!(
        ring.verify_queue(&bad, ROOM, NOW),
        Err(TokenError::BadSignature)
    );
    // a payload moved to the front of the queue, old signature
    let mut claims = queue_claims();
    claims.seq = 1;
    let p2 = b64(&serde_json::to_value(&claims).unwrap());
    let (_, _, s) = parts(&t);
    let bad = format!("{h}.{p2}.{s}");
    assert_eq!(
        ring.verify_queue(&bad, ROOM, NOW),
        Err(TokenError::BadSignature)
    );
    // garbage
    for junk in ["", "a.b", "a.b.c.d", "...", "é.é.é"] {
        assert!(ring.verify_queue(junk, ROOM, NOW).is_err(), "{junk:?}");
    }
}

#[test]
fn alg_none_refused() {
    let ring = Keyring::ephemeral();
    let h = b64(&serde_json::json!({"alg": "none", "typ": "JWT", "kid": ring.signing_kid()}));
    let p = b64(&serde_json::to_value(queue_claims()).unwrap());
    for t in [format!("{h}.{p}."), format!("{h}.{p}.AAAA")] {
        let e = ring.verify_queue(&t, ROOM, NOW).unwrap_err();
        assert!(
            matches!(e, TokenError::Algorithm | TokenError::Malformed(_)),
            "{e:?}"
        );
    }
}

#[test]
fn hs256_signed_with_the_public_key_refused() {
    let ring = Keyring::ephemeral();
    let jwks = ring.jwks();
    let x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    let raw = URL_SAFE_NO_PAD.decode(&x).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(ring.signing_kid().to_owned());
    // whatever form of the public key an attacker might try as the secret
    for secret in [raw.clone(), x.into_bytes()] {
        let t = jsonwebtoken::encode(
            &header,
            &queue_claims(),
            &EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert_eq!(ring.verify_queue(&t, ROOM, NOW), Err(TokenError::Algorithm));
    }
}

#[test]
fn unknown_kid_and_odd_kids_refused() {
    let ring = Keyring::ephemeral();
    let other = Keyring::ephemeral();
    let t = other.sign_queue(&queue_claims()).unwrap();
    assert_eq!(
        ring.verify_queue(&t, ROOM, NOW),
        Err(TokenError::UnknownKid)
    );
    // a key of another ring under a kid this ring knows: bad signature
    let mut secret = [0u8; 32];
    secret[0] = 9;
    let impostor = Keyring::new(ring.signing_kid(), SigningKey::from_bytes(&secret)).unwrap();
    let t = impostor.sign_queue(&queue_claims()).unwrap();
    assert_eq!(
        ring.verify_queue(&t, ROOM, NOW),
        Err(TokenError::BadSignature)
    );
    // path tricks and oversized kids are never looked up
    let p = b64(&serde_json::to_value(queue_claims()).unwrap());
    for kid in [
        "../../etc/passwd",
        "a/b",
        "",
        &"k".repeat(65),
        "kid with space",
    ] {
        let h = b64(&serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}));
        let t = format!("{h}.{p}.AAAA");
        assert_eq!(
            ring.verify_queue(&t, ROOM, NOW),
            Err(TokenError::UnknownKid),
            "{kid:?}"
        );
    }
    let h = b64(&serde_json::json!({"alg": "EdDSA", "typ": "JWT"}));
    assert_eq!(
        ring.verify_queue(&format!("{h}.{p}.AAAA"), ROOM, NOW),
        Err(TokenError::UnknownKid)
    );
    assert!(Keyring::new("../x", SigningKey::from_bytes(&secret)).is_err());
}

#[test]
fn oversized_refused_before_parsing() {
    let ring = Keyring::ephemeral();
    let t = "a".repeat(MAX_TOKEN_LEN + 1);
    assert_eq!(ring.verify_queue(&t, ROOM, NOW), Err(TokenError::Oversized));
    let cache = VerifyCache::new(10);
    assert_eq!(
        cache.verify_queue(&ring, &t, ROOM, NOW),
        Err(TokenError::Oversized)
    );
}

#[test]
fn wrong_room_refused() {
    let ring = Keyring::ephemeral();
    let t = ring.sign_queue(&queue_claims()).unwrap();
    assert_eq!(
        ring.verify_queue(&t, "other", NOW),
        Err(TokenError::WrongAudience)
    );
    let t = ring.sign_admit(&admit_claims()).unwrap();
    assert_eq!(
        ring.verify_admit(&t, "other", NOW),
        Err(TokenError::WrongAudience)
    );
}

#[test]
fn wrong_issuer_refused() {
    let ring = Keyring::ephemeral();
    let mut c = queue_claims();
    c.iss = "evil".into();
    let t = ring.sign_queue(&c).unwrap();
    assert_eq!(
        ring.verify_queue(&t, ROOM, NOW),
        Err(TokenError::WrongIssuer)
    );
}

#[test]
fn expiry_with_small_leeway() {
    let ring = Keyring::ephemeral();
    let c = queue_claims();
    let t = ring.sign_queue(&c).unwrap();
    assert!(ring.verify_queue(&t, ROOM, c.exp + LEEWAY_S).is_ok());
    assert_eq!(
        ring.verify_queue(&t, ROOM, c.exp + LEEWAY_S + 1),
        Err(TokenError::Expired)
    );
}

#[test]
fn queue_and_admission_tokens_never_mix() {
    let ring = Keyring::ephemeral();
    let q = ring.sign_queue(&queue_claims()).unwrap();
    let a = ring.sign_admit(&admit_claims()).unwrap();
    assert_eq!(ring.verify_admit(&q, ROOM, NOW), Err(TokenError::WrongType));
    assert_eq!(ring.verify_queue(&a, ROOM, NOW), Err(TokenError::WrongType));
    let cache = VerifyCache::new(100);
    assert_eq!(
        cache.verify_admit(&ring, &q, ROOM, NOW),
        Err(TokenError::WrongType)
    );
    assert!(cache.verify_queue(&ring, &q, ROOM, NOW).is_ok());
    // cached now: still the wrong type as an admission token
    assert_eq!(
        cache.verify_admit(&ring, &q, ROOM, NOW),
        Err(TokenError::WrongType)
    );
    // an admission token signed with a forged typ in a queue token's shape
    let mut c = queue_claims();
    c.typ = "admit".into();
    let forged = ring.sign_queue(&c).unwrap();
    // (only the gateway can sign; this checks the typ claim drives the type)
    assert!(ring.verify_admit(&forged, ROOM, NOW).is_ok());
    assert_eq!(
        ring.verify_queue(&forged, ROOM, NOW),
        Err(TokenError::WrongType)
    );
}

#[test]
fn token_of_another_keyring_refused() {
    let a = Keyring::ephemeral();
    let b = Keyring::ephemeral();
    let t = b.sign_admit(&admit_claims()).unwrap();
    assert_eq!(a.verify_admit(&t, ROOM, NOW), Err(TokenError::UnknownKid));
}

#[test]
fn rotation_old_key_still_verifies() {
    let old = Keyring::ephemeral();
    let t = old.sign_queue(&queue_claims()).unwrap();
    let new = Keyring::ephemeral().trust(&old);
    assert_ne!(new.signing_kid(), old.signing_kid());
    assert!(new.verify_queue(&t, ROOM, NOW).is_ok());
    let t2 = new.sign_queue(&queue_claims()).unwrap();
    assert_eq!(
        jsonwebtoken::decode_header(&t2).unwrap().kid.as_deref(),
        Some(new.signing_kid())
    );
    assert_eq!(new.jwks()["keys"].as_array().unwrap().len(), 2);
}

#[test]
fn jwks_matches_and_verifies_with_jsonwebtoken() {
    let old = Keyring::ephemeral();
    let ring = Keyring::ephemeral().trust(&old);
    let jwks = ring.jwks();
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    for k in keys {
        assert_eq!(k["kty"], "OKP");
        assert_eq!(k["crv"], "Ed25519");
        assert_eq!(k["alg"], "EdDSA");
        assert_eq!(k["use"], "sig");
        assert_eq!(
            URL_SAFE_NO_PAD
                .decode(k["x"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
    }
    // a third party verifies our tokens from the JWKS alone
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks).unwrap();
    for (signer, token) in [
        (&ring, ring.sign_queue(&queue_claims()).unwrap()),
        (&old, old.sign_queue(&queue_claims()).unwrap()),
    ] {
        let jwk = set.find(signer.signing_kid()).unwrap();
        let key = DecodingKey::from_jwk(jwk).unwrap();
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_audience(&[ROOM]);
        v.validate_exp = false;
        let data = jsonwebtoken::decode::<QueueClaims>(&token, &key, &v).unwrap();
        assert_eq!(data.claims.seq, 42);
    }
}

#[test]
fn interop_with_jsonwebtoken_encode() {
    let ring = Keyring::ephemeral();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(ring.signing_kid().to_owned());
    let c = queue_claims();
    let t = jsonwebtoken::encode(&header, &c, ring.encoding_key()).unwrap();
    assert_eq!(ring.verify_queue(&t, ROOM, NOW).unwrap(), c);
}

#[test]
fn verify_cache_hits_and_rechecks() {
    let ring = Keyring::ephemeral();
    let cache = VerifyCache::new(1000);
    let c = queue_claims();
    let t = ring.sign_queue(&c).unwrap();
    assert_eq!(cache.verify_queue(&ring, &t, ROOM, NOW).unwrap(), c);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.verify_queue(&ring, &t, ROOM, NOW).unwrap(), c);
    assert_eq!(cache.len(), 1);
    // a hit still checks room and expiry
    assert_eq!(
        cache.verify_queue(&ring, &t, "other", NOW),
        Err(TokenError::WrongAudience)
    );
    assert_eq!(
        cache.verify_queue(&ring, &t, ROOM, c.exp + LEEWAY_S + 1),
        Err(TokenError::Expired)
    );
    // a tampered token is its own entry and is refused
    let bad = format!("{}x", &t[..t.len() - 1]);
    assert!(cache.verify_queue(&ring, &bad, ROOM, NOW).is_err());
    assert_eq!(cache.len(), 1);
    // bounded
    let small = VerifyCache::new(16);
    for _ in 0..200 {
        let t = ring.sign_queue(&queue_claims()).unwrap();
        small.verify_queue(&ring, &t, ROOM, NOW).unwrap();
    }
    assert!(small.len() <= 16);
    small.clear();
    assert!(small.is_empty());
}

#[test]
fn sliding_renewal_respects_hard_cap() {
    let c = admit_claims();
    let r = c.renewed(NOW + 100, Duration::from_secs(300)).unwrap();
    assert_eq!(r.exp, NOW + 400);
    assert_ne!(r.jti, c.jti);
    let r = c.renewed(NOW + 3500, Duration::from_secs(300)).unwrap();
    assert_eq!(r.exp, NOW + 3600);
    assert!(c.renewed(NOW + 3600, Duration::from_secs(300)).is_none());
}

#[test]
fn visitor_ids_are_long_and_unique() {
    let a = new_visitor_id();
    let b = new_visitor_id();
    assert_eq!(a.len(), 22); // 128 bits
    assert_ne!(a, b);
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    );
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-keys-{name}-{}", new_visitor_id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn keygen_and_load_dir() {
    let dir = temp_dir("load");
    assert!(Keyring::load_dir(&dir).is_err(), "an empty dir has no key");
    let k1 = keygen(&dir).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let k2 = keygen(&dir).unwrap();
    assert_ne!(k1, k2);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(format!("{k1}.pk8")))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let ring = Keyring::load_dir(&dir).unwrap();
    let last = if k1 > k2 { &k1 } else { &k2 };
    assert_eq!(ring.signing_kid(), last);
    assert_eq!(ring.kids().len(), 2);
    // the same keys load the same way in another process: tokens cross
    let t = ring.sign_queue(&queue_claims()).unwrap();
    assert!(
        Keyring::load_dir(&dir)
            .unwrap()
            .verify_queue(&t, ROOM, NOW)
            .is_ok()
    );
    // a marker pins the signing key
    let first = if k1 > k2 { &k2 } else { &k1 };
    std::fs::write(dir.join("signing"), format!("{first}\n")).unwrap();
    assert_eq!(Keyring::load_dir(&dir).unwrap().signing_kid(), first);
    std::fs::write(dir.join("signing"), "nope").unwrap();
    assert!(Keyring::load_dir(&dir).is_err());
    std::fs::remove_file(dir.join("signing")).unwrap();
    // PEM PKCS#8 works too
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let der = key.to_pkcs8_der().unwrap();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(der.as_bytes())
    );
    std::fs::write(dir.join("zz-pem.pem"), pem).unwrap();
    let ring = Keyring::load_dir(&dir).unwrap();
    assert_eq!(ring.signing_kid(), "zz-pem");
    assert_eq!(ring.kids().len(), 3);
    // a broken key file is an error, not a silent skip
    std::fs::write(dir.join("broken.der"), b"not a key").unwrap();
    assert!(Keyring::load_dir(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
