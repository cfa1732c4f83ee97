//! HTTP Message Signatures (RFC 9421), the part a verifier of requests
//! needs: the `Signature-Input` and `Signature` fields read as RFC 9651
//! dictionaries, and the signature base rebuilt from the request as it
//! reached the gateway, component by component, ending with the
//! `@signature-params` line.
//!
//! What is supported, and why only that: the derived components of a
//! request (`@method`, `@authority`, `@scheme`, `@target-uri`,
//! `@request-target`, `@path`, `@query`) and header fields, whole or one
//! member of a dictionary field (`;key=`, which Web Bot Auth uses for
//! `signature-agent`). Any other component or component parameter
//! (`@query-param`, `;sf`, `;bs`, `;req`, `;tr`, `@status`) makes the
//! signature unverifiable here, so it is refused rather than guessed at: a
//! verifier that built a different base than the signer would only say
//! "bad signature" for a good one, and one that skipped a component would
//! accept a signature over less than the signer meant.
//!
//! The `@signature-params` value is the covered components and parameters
//! serialized again from what was parsed (RFC 9421 §2.3), so two spellings
//! of the same field value sign the same base.

use http::HeaderMap;
use sfv::{BareItem, Dictionary, InnerList, Item, ListEntry, ListSerializer, Parser};

/// Why a signature cannot be verified here (the word counted in metrics).
pub type Reason = &'static str;

/// The request as the signature base reads it.
pub struct RequestView<'a> {
    /// The method, as sent (`GET`).
    pub method: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// `host[:port]`, lower case, without the scheme's default port.
    pub authority: String,
    /// The path (`/` when empty).
    pub path: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
    /// The header fields.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestView<'a> {
    /// The view of a request: `host` is its `Host` (or authority), whose
    /// port is dropped when it is the scheme's default.
    pub fn new(
        method: &'a str,
        scheme: &'a str,
        host: &str,
        uri: &'a http::Uri,
        headers: &'a HeaderMap,
    ) -> RequestView<'a> {
        let host = host.to_ascii_lowercase();
        let authority = match (scheme, host.rsplit_once(':')) {
            ("http", Some((h, "80"))) | ("https", Some((h, "443"))) if !h.ends_with(':') => {
                h.to_owned()
            }
            _ => host,
        };
        RequestView {
            method,
            scheme,
            authority,
            path: if uri.path().is_empty() {
                "/"
            } else {
                uri.path()
            },
            query: uri.query(),
            headers,
        }
    }
}

/// One signature of a request: a label of `Signature-Input`, its covered
/// components and parameters, and its bytes from `Signature`.
#[derive(Debug)]
pub struct Signed {
    /// The label (`sig1`).
    pub label: String,
    /// The covered components, in order, as parsed.
    pub covered: InnerList,
    /// The signature's bytes.
    pub signature: Vec<u8>,
}

impl Signed {
    /// A string parameter (`keyid`, `tag`, `alg`, `nonce`); `Err` when it is
    /// there but not a string.
    pub fn string_param(&self, name: &str) -> Result<Option<&str>, Reason> {
        match self.covered.params.get(name) {
            None => Ok(None),
            Some(v) => v.as_string().map(|s| Some(s.as_str())).ok_or("params"),
        }
    }

    /// An integer parameter (`created`, `expires`); `Err` when it is there
    /// but not an integer.
    pub fn int_param(&self, name: &str) -> Result<Option<i64>, Reason> {
        match self.covered.params.get(name) {
            None => Ok(None),
            Some(v) => v.as_integer().map(|i| Some(i64::from(i))).ok_or("params"),
        }
    }

    /// The covered components' names and their `key` parameter, in order.
    pub fn components(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.covered.items.iter().map(|item| {
            let name = item.bare_item.as_string().map_or("", |s| s.as_str());
            let key = item
                .params
                .get("key")
                .and_then(|k| k.as_string())
                .map(|s| s.as_str());
            (name, key)
        })
    }
}

/// The combined value of a header field: each line trimmed, joined with
/// `, ` (RFC 9421 §2.1); `None` when the field is absent or not text.
pub fn field_value(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for v in headers.get_all(name) {
        let v = v.to_str().ok()?.trim();
        match &mut out {
            Some(s) => {
                s.push_str(", ");
                s.push_str(v);
            }
            None => out = Some(v.to_owned()),
        }
    }
    out
}

/// A field parsed as an RFC 9651 dictionary.
pub fn dictionary(headers: &HeaderMap, name: &str) -> Result<Option<Dictionary>, Reason> {
    match field_value(headers, name) {
        None => Ok(None),
        Some(v) => Parser::new(&v)
            .parse::<Dictionary>()
            .map(Some)
            .map_err(|_| "malformed"),
    }
}

/// Most signatures of one request looked at (a request carrying more is
/// read for its first ones only).
pub const MAX_SIGNATURES: usize = 4;

/// The signatures of a request: each `Signature-Input` member (an inner
/// list of component identifiers, each a string) with its `Signature`
/// member (a byte sequence). `Ok(empty)` when the request carries no
/// `Signature-Input`.
pub fn signatures(headers: &HeaderMap) -> Result<Vec<Signed>, Reason> {
    let Some(inputs) = dictionary(headers, "signature-input")? else {
        return Ok(Vec::new());
    };
    let sigs = dictionary(headers, "signature")?.ok_or("malformed")?;
    let mut out = Vec::new();
    for (label, entry) in inputs.iter().take(MAX_SIGNATURES) {
        let ListEntry::InnerList(covered) = entry else {
            return Err("malformed");
        };
        if covered
            .items
            .iter()
            .any(|i| i.bare_item.as_string().is_none())
        {
            return Err("malformed");
        }
        let signature = match sigs.get(label.as_str()) {
            Some(ListEntry::Item(Item {
                bare_item: BareItem::ByteSequence(b),
                ..
            })) => b.clone(),
            _ => return Err("malformed"),
        };
        out.push(Signed {
            label: label.as_str().to_owned(),
            covered: covered.clone(),
            signature,
        });
    }
    Ok(out)
}

/// The signature base of `sig` over `req` (RFC 9421 §2.5): one line per
/// covered component, `"name";params: value`, then the
/// `"@signature-params"` line, lines joined by `\n` with none after the
/// last. `Err("components")` for a component this request lacks, one
/// named twice, or one not supported here (module docs).
pub fn signature_base(req: &RequestView<'_>, sig: &Signed) -> Result<String, Reason> {
    let mut base = String::new();
    let mut seen: Vec<String> = Vec::new();
    for item in &sig.covered.items {
        let id = serialize_item(item);
        if seen.contains(&id) {
            return Err("components");
        }
        let value = component_value(req, item)?;
        if value.contains('\n') || value.contains('\r') {
            return Err("components");
        }
        base.push_str(&id);
        base.push_str(": ");
        base.push_str(&value);
        base.push('\n');
        seen.push(id);
    }
    base.push_str("\"@signature-params\": ");
    base.push_str(&serialize_inner_list(&sig.covered));
    Ok(base)
}

/// The value of one covered component.
fn component_value(req: &RequestView<'_>, item: &Item) -> Result<String, Reason> {
    let name = item.bare_item.as_string().ok_or("components")?.as_str();
    if let Some(derived) = name.strip_prefix('@') {
        if !item.params.is_empty() {
            return Err("components");
        }
        let query = req.query.map(|q| format!("?{q}")).unwrap_or_default();
        return Ok(match derived {
            "method" => req.method.to_owned(),
            "authority" => req.authority.clone(),
            "scheme" => req.scheme.to_owned(),
            "target-uri" => format!("{}://{}{}{query}", req.scheme, req.authority, req.path),
            "request-target" => format!("{}{query}", req.path),
            "path" => req.path.to_owned(),
            "query" => format!("?{}", req.query.unwrap_or("")),
            _ => return Err("components"),
        });
    }
    if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("components");
    }
    let value = field_value(req.headers, name).ok_or("components")?;
    let mut key = None;
    for (param, v) in &item.params {
        match (param.as_str(), v.as_string()) {
            ("key", Some(k)) if key.is_none() => key = Some(k.as_str()),
            _ => return Err("components"),
        }
    }
    let Some(key) = key else {
        return Ok(value);
    };
    let dict = Parser::new(&value)
        .parse::<Dictionary>()
        .map_err(|_| "components")?;
    let member = dict.get(key).ok_or("components")?;
    let mut ser = ListSerializer::new();
    ser.members([member]);
    ser.finish().ok_or("components")
}

/// A component identifier (an item: the name and its parameters) in its
/// serialized form.
fn serialize_item(item: &Item) -> String {
    let mut ser = ListSerializer::new();
    ser.bare_item(&item.bare_item).parameters(&item.params);
    ser.finish().unwrap_or_default()
}

/// An inner list with its parameters, serialized (`("a" "b");p=1`).
pub fn serialize_inner_list(list: &InnerList) -> String {
    let entry = ListEntry::InnerList(list.clone());
    let mut ser = ListSerializer::new();
    ser.members([&entry]);
    ser.finish().unwrap_or_else(|| "()".to_owned())
}

/// Whether `signature` is `key`'s Ed25519 signature of `base` (strict:
/// no malleable or small-order forms).
pub fn verify_ed25519(key: &ed25519_dalek::VerifyingKey, base: &str, signature: &[u8]) -> bool {
    let Ok(sig) = ed25519_dalek::Signature::from_slice(signature) else {
        return false;
    };
    key.verify_strict(base.as_bytes(), &sig).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use base64::Engine as _;
    use http::HeaderValue;

    use super::*;

    /// RFC 9421 Appendix B.1.4, `test-key-ed25519`: the public key.
    const RFC_ED25519_X: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";

    fn rfc_key() -> ed25519_dalek::VerifyingKey {
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(RFC_ED25519_X)
            .unwrap();
        ed25519_dalek::VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// RFC 9421 Appendix B.2.6, "Signing a Request Using ed25519": the
    /// base rebuilt from the example request is the RFC's, byte for byte,
    /// and the RFC's signature verifies over it (and over nothing else).
    #[test]
    fn rfc_9421_b_2_6_ed25519_example() {
        let h = headers(&[
            ("host", "example.com"),
            ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
            ("content-type", "application/json"),
            (
                "content-digest",
                "sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:",
            ),
            ("content-length", "18"),
            (
                "signature-input",
                "sig-b26=(\"date\" \"@method\" \"@path\" \"@authority\" \"content-type\" \"content-length\");created=1618884473;keyid=\"test-key-ed25519\"",
            ),
            (
                "signature",
                "sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:",
            ),
        ]);
        let uri: http::Uri = "/foo?param=Value&Pet=dog".parse().unwrap();
        let req = RequestView::new("POST", "https", "example.com", &uri, &h);
        let sigs = signatures(&h).unwrap();
        assert_eq!(sigs.len(), 1);
        let base = signature_base(&req, &sigs[0]).unwrap();
        let want = "\"date\": Tue, 20 Apr 2021 02:07:55 GMT\n\
                    \"@method\": POST\n\
                    \"@path\": /foo\n\
                    \"@authority\": example.com\n\
                    \"content-type\": application/json\n\
                    \"content-length\": 18\n\
                    \"@signature-params\": (\"date\" \"@method\" \"@path\" \"@authority\" \"content-type\" \"content-length\");created=1618884473;keyid=\"test-key-ed25519\"";
        assert_eq!(base, want);
        assert!(verify_ed25519(&rfc_key(), &base, &sigs[0].signature));
        assert_eq!(sigs[0].int_param("created").unwrap(), Some(1_618_884_473));
        assert_eq!(
            sigs[0].string_param("keyid").unwrap(),
            Some("test-key-ed25519")
        );
        // one byte of a covered component changed: no longer verifies
        let tampered = base.replace("/foo", "/fop");
        assert!(!verify_ed25519(&rfc_key(), &tampered, &sigs[0].signature));
    }

    /// The Web Bot Auth protocol draft's Ed25519 vector (the RFC's key):
    /// `@authority` and the `signature-agent` member keyed by label.
    #[test]
    fn web_bot_auth_draft_ed25519_vector() {
        let h = headers(&[
            ("host", "example.com"),
            ("signature-agent", "agent2=\"https://signature-agent.test\""),
            (
                "signature-input",
                "sig2=(\"@authority\" \"signature-agent\";key=\"agent2\");created=1735689600;keyid=\"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U\";alg=\"ed25519\";expires=4889289600;nonce=\"n9p433xm+NJ3ph3upfBIGmsuwHw387YV7Q/F+6BSpGCVjYCqQw6rznNA8PVVLySrAWsv0hQtFioQb6E1YsauiA==\";tag=\"web-bot-auth\"",
            ),
            (
                "signature",
                "sig2=:RdNFx5Bj6au3YgAMQL/RzmUlZE8QZLIaXGRpw985hWnwPfMxT228NMk6ehRS1PSl4e8PhbNZACSanGdhEwYCCg==:",
            ),
        ]);
        let uri: http::Uri = "/".parse().unwrap();
        let req = RequestView::new("GET", "https", "example.com:443", &uri, &h);
        let sigs = signatures(&h).unwrap();
        let base = signature_base(&req, &sigs[0]).unwrap();
        assert!(base.starts_with(
            "\"@authority\": example.com\n\"signature-agent\";key=\"agent2\": \"https://signature-agent.test\"\n\"@signature-params\": (\"@authority\" \"signature-agent\";key=\"agent2\");created=1735689600;"
        ), "{base}");
        assert!(verify_ed25519(&rfc_key(), &base, &sigs[0].signature));
        assert_eq!(sigs[0].string_param("tag").unwrap(), Some("web-bot-auth"));
        assert_eq!(
            sigs[0].components().collect::<Vec<_>>(),
            vec![("@authority", None), ("signature-agent", Some("agent2"))]
        );
        // another authority: the same signature no longer verifies
        let other = RequestView::new("GET", "https", "example.org", &uri, &h);
        let base = signature_base(&other, &sigs[0]).unwrap();
        assert!(!verify_ed25519(&rfc_key(), &base, &sigs[0].signature));
    }

    #[test]
    fn derived_components_and_refusals() {
        let h = headers(&[("x-a", " one "), ("x-a", "two"), ("host", "h.example:80")]);
        let uri: http::Uri = "/p/q?x=1&y".parse().unwrap();
        let req = RequestView::new("GET", "http", "H.example:80", &uri, &h);
        assert_eq!(req.authority, "h.example");
        let base_of = |input: &str| {
            let mut hh = h.clone();
            hh.insert("signature-input", HeaderValue::from_str(input).unwrap());
            hh.insert("signature", HeaderValue::from_static("s=:AAAA:"));
            let sigs = signatures(&hh)?;
            signature_base(&req, &sigs[0])
        };
        let b = base_of(
            "s=(\"@target-uri\" \"@request-target\" \"@query\" \"@scheme\" \"x-a\");created=1",
        )
        .unwrap();
        assert_eq!(
            b,
            "\"@target-uri\": http://h.example/p/q?x=1&y\n\"@request-target\": /p/q?x=1&y\n\"@query\": ?x=1&y\n\"@scheme\": http\n\"x-a\": one, two\n\"@signature-params\": (\"@target-uri\" \"@request-target\" \"@query\" \"@scheme\" \"x-a\");created=1"
        );
        for bad in [
            "s=(\"@status\")",
            "s=(\"@query-param\";name=\"x\")",
            "s=(\"x-a\";sf)",
            "s=(\"x-a\";bs)",
            "s=(\"x-missing\")",
            "s=(\"X-A\")",
            "s=(\"@method\" \"@method\")",
            "s=(\"x-a\";key=\"nope\")",
        ] {
            assert_eq!(base_of(bad), Err("components"), "{bad}");
        }
        // not an inner list, a component that is not a string, no signature
        let mut hh = h.clone();
        hh.insert("signature-input", HeaderValue::from_static("s=1"));
        hh.insert("signature", HeaderValue::from_static("s=:AAAA:"));
        assert_eq!(signatures(&hh).unwrap_err(), "malformed");
        hh.insert("signature-input", HeaderValue::from_static("s=(a)"));
        assert_eq!(signatures(&hh).unwrap_err(), "malformed");
        hh.insert("signature-input", HeaderValue::from_static("t=(\"@path\")"));
        assert_eq!(signatures(&hh).unwrap_err(), "malformed");
        hh.insert("signature-input", HeaderValue::from_static("s=(\"@path\""));
        assert_eq!(signatures(&hh).unwrap_err(), "malformed");
        assert!(signatures(&h).unwrap().is_empty());
    }
}
