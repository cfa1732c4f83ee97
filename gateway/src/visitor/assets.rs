//! The static files the waiting page and the dashboard load, stored once
//! with their content hash and their compressed forms, and answered from
//! memory.
//!
//! **Names.** Every file has its plain name (`waiting.js`,
//! `theme.{room}.css`) and a hashed one: the first 16 hex digits of the
//! SHA-256 of its bytes put before the extension
//! (`waiting.3f9a1c2b4d5e6f70.js`, `theme.{room}.3f9a1c2b4d5e6f70.css`).
//! The pages link the hashed names only, and the page hands `waiting.js`
//! the worker's hashed URL (`data-worker-url`), since a script cannot know
//! its own hash without being rebuilt.
//!
//! **Caching** (API.md, "Cacheable assets"). A hashed name whose hash is
//! the file's answers `Cache-Control: public, max-age=31536000, immutable`
//! ([`Immutable`], the one exception the control plane's no-store layer
//! keeps): those bytes can never change under that URL, so a reload
//! fetches the page alone. Every other answer stays `no-store`, the rule
//! of `/_sluice/`:
//! - a plain name (an operator's template linking the plain names, an old
//!   page, an external link) answers the current bytes;
//! - a hashed name whose hash is not the file's (a page rendered by a
//!   gateway of another version during a rolling deploy) answers
//!   `307` to the plain name: the page still gets a working file, and no
//!   cache keeps bytes under a name that promises others. A 404 would
//!   leave that page without its script, its visitor stuck on "Getting
//!   your place ready…" for good.
//!
//! **Encoding.** A br (quality 11) and a gzip (level 9) form are made once,
//! when the file is stored, and kept when smaller (text of 256 bytes or
//! more, as the per-request compression's threshold; PNG is left alone).
//! An answer picks one by `Accept-Encoding` (br at equal q), says
//! `Vary: Accept-Encoding` and its exact `Content-Length`; the gateway's
//! per-request compression leaves it alone ([`Precompressed`]). Each form
//! has its own strong `ETag` (`"{hash}"`, `"{hash}-br"`, `"{hash}-gzip"`)
//! and a matching `If-None-Match` answers 304. HEAD is the router's (the
//! same head, no body).
//!
//! **Rooms' files.** A room's `theme.{room}.css` is made from its
//! configuration, and a template directory's `waiting.css` and logo are
//! read once, at the first page served (`visitor::template`); none changes
//! while the process runs (a new theme or template takes a restart, which
//! makes new hashes), so they are hashed and cached like the embedded
//! files. The theme, a few dozen bytes, is hashed where it is needed.

use std::io::Write;
use std::sync::{Arc, LazyLock, Once};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use sha2::{Digest, Sha256};

/// Where every static file is served.
pub const PREFIX: &str = "/_sluice/static/";

/// The caching of a hashed name whose hash is the file's.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// Hex digits of the content hash in a hashed name (64 bits: two versions
/// of a file sharing a name, so that a browser keeps the old one for a
/// year, never happens in practice).
const HASH_DIGITS: usize = 16;

/// Bodies shorter than this are stored plain (the per-request
/// compression's threshold too: the framing would eat the gain).
pub const MIN_COMPRESSED: usize = 256;

/// Marks an answer whose `Cache-Control` is a hashed file's
/// ([`IMMUTABLE`]): the control plane's no-store layer keeps it, unless
/// the answer sets a cookie.
#[derive(Clone, Copy, Debug)]
pub struct Immutable;

/// Marks an answer whose encoding is already chosen from stored forms:
/// the per-request compression leaves it (and its `ETag` and
/// `Content-Length`) as it is.
#[derive(Clone, Copy, Debug)]
pub struct Precompressed;

/// How an answer may be cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// The hashed name of the current bytes: a year, immutable.
    Immutable,
    /// A plain name: the control plane's `no-store`.
    NoStore,
}

// === Asset ===

/// One static file: its bytes, their hash, and their compressed forms.
#[derive(Debug)]
pub struct Asset {
    ctype: &'static str,
    hash: String,
    identity: Bytes,
    br: Option<Bytes>,
    gzip: Option<Bytes>,
}

/// One representation of an asset: its `Content-Encoding` (none for the
/// bytes as they are) and its body.
struct Form<'a> {
    coding: Option<&'static str>,
    body: &'a Bytes,
}

impl Asset {
    /// Stores `bytes` (of type `ctype`): hashes them and makes their
    /// compressed forms. The CPU of br's best quality is spent here, once.
    pub fn new(ctype: &'static str, bytes: impl Into<Bytes>) -> Asset {
        Asset::with_quality(ctype, bytes.into(), BEST)
    }

    fn with_quality(ctype: &'static str, identity: Bytes, quality: u32) -> Asset {
        let digest = Sha256::digest(&identity);
        let hash: String = digest
            .iter()
            .take(HASH_DIGITS / 2)
            .map(|b| format!("{b:02x}"))
            .collect();
        let compressible = identity.len() >= MIN_COMPRESSED
            && (!ctype.starts_with("image/") || ctype.starts_with("image/svg"));
        let smaller =
            |form: Option<Vec<u8>>| form.filter(|f| f.len() < identity.len()).map(Bytes::from);
        let (br, gzip) = if compressible {
            (
                smaller(brotli(&identity, quality)),
                smaller(gzip(&identity, quality)),
            )
        } else {
            (None, None)
        };
        Asset {
            ctype,
            hash,
            identity,
            br,
            gzip,
        }
    }

    /// Stores a constant document answered outside `/_sluice/static/`
    /// (the OpenAPI document, the dashboard's page): as [`Asset::new`],
    /// at a quality cheap in time and memory ([`DOCUMENT_QUALITY`]).
    pub fn document(ctype: &'static str, bytes: impl Into<Bytes>) -> Asset {
        Asset::with_quality(ctype, bytes.into(), DOCUMENT_QUALITY)
    }

    /// The content hash put in the hashed name.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The hashed URL of this asset served under the plain name `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{PREFIX}{}", hashed_name(name, &self.hash))
    }

    /// The bytes as stored, and their br and gzip forms if kept (sizes
    /// for the tests and the README's figures).
    pub fn sizes(&self) -> (usize, Option<usize>, Option<usize>) {
        (
            self.identity.len(),
            self.br.as_ref().map(Bytes::len),
            self.gzip.as_ref().map(Bytes::len),
        )
    }

    /// The answer to a GET (or HEAD) of this asset with the request's
    /// `headers`: the form `Accept-Encoding` picks, or 304 when
    /// `If-None-Match` names it.
    pub fn answer(&self, headers: &HeaderMap, caching: Caching) -> Response {
        let form = self.pick(headers);
        let tag = self.etag(form.coding);
        let fresh = if_none_match(headers, &tag);
        let mut res = if fresh {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            let mut res = Body::from(form.body.clone()).into_response();
            let h = res.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(self.ctype));
            if let Some(coding) = form.coding {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
            }
            res
        };
        let h = res.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&tag) {
            h.insert(header::ETAG, v);
        }
        if self.br.is_some() || self.gzip.is_some() {
            h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(match caching {
                Caching::Immutable => IMMUTABLE,
                Caching::NoStore => "no-store",
            }),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        res.extensions_mut().insert(Precompressed);
        if caching == Caching::Immutable {
            res.extensions_mut().insert(Immutable);
        }
        res
    }

    /// The form to send: br or gzip when the client takes it (by its q,
    /// br at a tie), else the bytes as they are.
    fn pick(&self, headers: &HeaderMap) -> Form<'_> {
        match coding_for(headers, self.br.is_some(), self.gzip.is_some()) {
            Some(Coding::Br) => Form {
                coding: Some("br"),
                body: self.br.as_ref().unwrap_or(&self.identity),
            },
            Some(Coding::Gzip) => Form {
                coding: Some("gzip"),
                body: self.gzip.as_ref().unwrap_or(&self.identity),
            },
            None => Form {
                coding: None,
                body: &self.identity,
            },
        }
    }

    /// The strong validator of one form: a representation per coding.
    fn etag(&self, coding: Option<&str>) -> String {
        match coding {
            Some(c) => format!("\"{}-{c}\"", self.hash),
            None => format!("\"{}\"", self.hash),
        }
    }
}

/// `name` with `hash` put before its extension: `waiting.js` →
/// `waiting.{hash}.js`, `theme.{room}.css` → `theme.{room}.{hash}.css`.
pub fn hashed_name(name: &str, hash: &str) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) => format!("{stem}.{hash}.{ext}"),
        None => format!("{name}.{hash}"),
    }
}

/// A hashed name taken apart: the plain name and the hash, when the part
/// before the extension has the shape of one (16 lowercase hex digits).
pub fn split_hashed(file: &str) -> Option<(String, &str)> {
    let (rest, ext) = file.rsplit_once('.')?;
    let (stem, hash) = rest.rsplit_once('.')?;
    let shaped = hash.len() == HASH_DIGITS
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (shaped && !stem.is_empty()).then(|| (format!("{stem}.{ext}"), hash))
}

/// The answer to a hashed name whose hash is not the file's: 307 to the
/// plain name (no-store, as every answer but [`Immutable`] ones).
pub fn stale(name: &str) -> Response {
    let mut res = StatusCode::TEMPORARY_REDIRECT.into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("{PREFIX}{name}")) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    res
}

/// A compressed form an answer can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// `br`.
    Br,
    /// `gzip`.
    Gzip,
}

impl Coding {
    /// Its `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// `bytes` in this coding at `quality` (br 0–11, gzip 0–9), `None`
    /// when the encoder fails.
    pub fn encode(self, bytes: &[u8], quality: u32) -> Option<Vec<u8>> {
        match self {
            Coding::Br => brotli(bytes, quality),
            Coding::Gzip => gzip(bytes, quality),
        }
    }
}

/// The coding to answer `headers`' `Accept-Encoding` with, among the forms
/// there are (`br`, `gzip`): the one the client gives the higher q, br at a
/// tie; `None` for the bytes as they are.
pub fn coding_for(headers: &HeaderMap, br: bool, gzip: bool) -> Option<Coding> {
    if !br && !gzip {
        return None;
    }
    let mut fields = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok());
    // One field is the usual case: read in place, not joined.
    let first = fields.next()?;
    let joined;
    let accept = match fields.next() {
        None => first,
        Some(second) => {
            joined = [first, second]
                .into_iter()
                .chain(fields)
                .collect::<Vec<_>>()
                .join(",");
            joined.as_str()
        }
    };
    let q_br = if br { quality(accept, "br") } else { 0.0 };
    let q_gzip = if gzip { quality(accept, "gzip") } else { 0.0 };
    if q_br > 0.0 && q_br >= q_gzip {
        Some(Coding::Br)
    } else if q_gzip > 0.0 {
        Some(Coding::Gzip)
    } else {
        None
    }
}

/// The q a client gives `coding` in `Accept-Encoding` (RFC 9110 §12.5.3):
/// its own entry's, else `*`'s, else 0.
fn quality(accept: &str, coding: &str) -> f32 {
    let mut star = None;
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let q = parts
            .find_map(|p| {
                let (k, v) = p.split_once('=')?;
                if !k.trim().eq_ignore_ascii_case("q") {
                    return None;
                }
                v.trim().parse::<f32>().ok()
            })
            .unwrap_or(1.0);
        if name.eq_ignore_ascii_case(coding) {
            return q;
        }
        if name == "*" {
            star = Some(q);
        }
    }
    star.unwrap_or(0.0)
}

/// Whether `If-None-Match` names `tag` (weak comparison, RFC 9110
/// §13.1.2), or is `*`.
fn if_none_match(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
}

/// The best quality: br 11, gzip 9 (the encoders clamp what is above
/// their range).
const BEST: u32 = 11;

/// br and gzip quality of [`Asset::document`]s. Over the 200 KB OpenAPI
/// document (release build): br 9 takes 18 ms and 29 MB of peak memory
/// for its hash table, 11 takes 230 ms and 14 MB (2 s in a debug build),
/// 6 takes 6 ms and 4 MB for 15% more bytes than 11.
const DOCUMENT_QUALITY: u32 = 6;

fn brotli(bytes: &[u8], quality: u32) -> Option<Vec<u8>> {
    let mut w = ::brotli::CompressorWriter::new(Vec::new(), 4096, quality.min(11), 22);
    w.write_all(bytes).ok()?;
    w.flush().ok()?;
    Some(w.into_inner())
}

fn gzip(bytes: &[u8], level: u32) -> Option<Vec<u8>> {
    let level = flate2::Compression::new(level.min(9));
    let mut w = flate2::write::GzEncoder::new(Vec::new(), level);
    w.write_all(bytes).ok()?;
    w.finish().ok()
}

// === the embedded files ===

/// The embedded files: plain name, content type, bytes. The waiting page
/// itself is rendered per request ([`crate::visitor::page`]); the
/// dashboard's page by [`crate::admin::dashboard`].
const EMBEDDED_FILES: &[(&str, &str, &str)] = &[
    (
        "waiting.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/waiting.js"),
    ),
    (
        "waiting.css",
        "text/css; charset=utf-8",
        include_str!("../../../static/waiting.css"),
    ),
    (
        "pow-solver.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/pow-solver.js"),
    ),
    (
        "pow-worker.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/pow-worker.js"),
    ),
    (
        "admin.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/admin.js"),
    ),
    (
        "admin.css",
        "text/css; charset=utf-8",
        include_str!("../../../static/admin.css"),
    ),
];

/// The embedded files, stored at their first use ([`warm`] starts it).
static EMBEDDED: LazyLock<Vec<(&'static str, Arc<Asset>)>> = LazyLock::new(|| {
    EMBEDDED_FILES
        .iter()
        .map(|(name, ctype, text)| {
            let bytes = Bytes::from_static(text.as_bytes());
            (*name, Arc::new(Asset::new(ctype, bytes)))
        })
        .collect()
});

/// Hashes and compresses the embedded files on a thread of their own, at
/// start: br's best quality over the ~100 KB takes a good part of a
/// second of CPU in a debug build, which neither the listener nor (unless
/// it comes in that moment, when it waits for it) a visitor's request
/// should wait for. Once per process.
pub fn warm() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let started = std::thread::Builder::new()
            .name("sluice-assets".into())
            .spawn(|| {
                LazyLock::force(&EMBEDDED);
                // the constant documents answered elsewhere, too
                LazyLock::force(&crate::app::OPENAPI_DOCUMENT);
                LazyLock::force(&crate::admin::dashboard::PAGES);
            });
        if let Err(e) = started {
            // Then the first request that needs a file stores them.
            tracing::debug!(error = %e, "static files stored at their first use");
        }
    });
}

/// The embedded file of plain name `name`.
pub fn embedded(name: &str) -> Option<Arc<Asset>> {
    EMBEDDED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| a.clone())
}

/// The hashed URL of the embedded file `name` (its plain URL if there is
/// no such file: a typo in a page stays visible as a 404, not a panic).
pub fn embedded_url(name: &str) -> String {
    embedded(name).map_or_else(|| format!("{PREFIX}{name}"), |a| a.url(name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::Read;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    async fn body(res: Response) -> Bytes {
        axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap()
    }

    #[test]
    fn names_carry_the_hash_before_the_extension() {
        assert_eq!(
            hashed_name("waiting.js", "0123456789abcdef"),
            "waiting.0123456789abcdef.js"
        );
        assert_eq!(
            hashed_name("theme.default.css", "0123456789abcdef"),
            "theme.default.0123456789abcdef.css"
        );
        assert_eq!(
            split_hashed("waiting.0123456789abcdef.js"),
            Some(("waiting.js".to_owned(), "0123456789abcdef"))
        );
        assert_eq!(
            split_hashed("logo.vip.0123456789abcdef.svg"),
            Some(("logo.vip.svg".to_owned(), "0123456789abcdef"))
        );
        for plain in [
            "waiting.js",
            "theme.default.css",
            "waiting.0123456789ABCDEF.js",
            "waiting.0123456789abcde.js",
            "waiting.0123456789abcdefa.js",
            ".0123456789abcdef.js",
            "0123456789abcdef.js",
        ] {
            assert_eq!(split_hashed(plain), None, "{plain}");
        }
    }

    #[test]
    fn accept_encoding_by_quality() {
        for (accept, br, gzip) in [
            ("br, gzip", 1.0, 1.0),
            ("gzip;q=0.5, br;q=0.4", 0.4, 0.5),
            ("br;q=0, gzip", 0.0, 1.0),
            ("*", 1.0, 1.0),
            ("*;q=0.2, br", 1.0, 0.2),
            ("identity", 0.0, 0.0),
            ("GZIP ; Q=0.3", 0.0, 0.3),
            ("", 0.0, 0.0),
        ] {
            assert_eq!(quality(accept, "br"), br, "{accept}");
            assert_eq!(quality(accept, "gzip"), gzip, "{accept}");
        }
    }

    #[tokio::test]
    async fn an_answer_picks_a_stored_form_and_says_so() {
        let text = "let x = 1;\n".repeat(200);
        let a = Asset::new("text/javascript; charset=utf-8", text.clone());
        let (plain, br, gz) = a.sizes();
        assert_eq!(plain, text.len());
        assert!(br.unwrap() < gz.unwrap() && gz.unwrap() < plain / 4);
        for (accept, coding) in [
            ("gzip, deflate, br", Some("br")),
            ("br;q=0.5, gzip", Some("gzip")),
            ("gzip;q=0, br;q=0", None),
            ("zstd", None),
        ] {
            let res = a.answer(&headers(&[("accept-encoding", accept)]), Caching::Immutable);
            assert_eq!(res.status(), StatusCode::OK);
            let h = res.headers();
            assert_eq!(
                h.get("content-encoding").map(|v| v.to_str().unwrap()),
                coding,
                "{accept}"
            );
            assert_eq!(h["vary"], "Accept-Encoding");
            assert_eq!(h["cache-control"], IMMUTABLE);
            assert_eq!(h["x-content-type-options"], "nosniff");
            let tag = h["etag"].to_str().unwrap().to_owned();
            assert_eq!(
                tag,
                coding.map_or(format!("\"{}\"", a.hash()), |c| format!(
                    "\"{}-{c}\"",
                    a.hash()
                ))
            );
            assert!(res.extensions().get::<Immutable>().is_some());
            assert!(res.extensions().get::<Precompressed>().is_some());
            let got = body(res).await;
            let mut decoded = Vec::new();
            match coding {
                Some("br") => {
                    ::brotli::Decompressor::new(&got[..], 4096)
                        .read_to_end(&mut decoded)
                        .unwrap();
                }
                Some(_) => {
                    flate2::read::GzDecoder::new(&got[..])
                        .read_to_end(&mut decoded)
                        .unwrap();
                }
                None => decoded = got.to_vec(),
            }
            assert_eq!(decoded, text.as_bytes(), "{accept}");
        }
    }

    #[tokio::test]
    async fn if_none_match_names_one_form() {
        let a = Asset::new("text/css; charset=utf-8", "a { b: c }\n".repeat(100));
        let br = format!("\"{}-br\"", a.hash());
        for (inm, accept, status) in [
            (br.as_str(), "br", StatusCode::NOT_MODIFIED),
            (&format!("W/{br}"), "br", StatusCode::NOT_MODIFIED),
            (&format!("\"x\", {br}"), "br", StatusCode::NOT_MODIFIED),
            ("*", "br", StatusCode::NOT_MODIFIED),
            // the br tag does not validate the gzip form
            (br.as_str(), "gzip", StatusCode::OK),
            ("\"0000000000000000\"", "br", StatusCode::OK),
        ] {
            let res = a.answer(
                &headers(&[("accept-encoding", accept), ("if-none-match", inm)]),
                Caching::NoStore,
            );
            assert_eq!(res.status(), status, "{inm} {accept}");
            assert_eq!(res.headers()["cache-control"], "no-store");
            assert!(res.extensions().get::<Immutable>().is_none());
            if status == StatusCode::NOT_MODIFIED {
                assert!(res.headers().get("content-encoding").is_none());
                assert!(res.headers().contains_key("etag"));
                assert!(body(res).await.is_empty());
            }
        }
    }

    #[test]
    fn small_and_compressed_files_are_stored_plain() {
        let a = Asset::new("text/css; charset=utf-8", "a{}");
        assert_eq!(a.sizes(), (3, None, None));
        let res = a.answer(&headers(&[("accept-encoding", "br")]), Caching::Immutable);
        assert!(res.headers().get("content-encoding").is_none());
        assert!(res.headers().get("vary").is_none());
        let png = Asset::new("image/png", vec![0u8; 4096]);
        assert_eq!(png.sizes(), (4096, None, None));
        let svg = Asset::new("image/svg+xml", "<svg/>".repeat(100));
        assert!(svg.sizes().1.is_some());
    }

    #[test]
    fn every_embedded_file_has_a_hashed_url() {
        warm();
        for (name, _, text) in EMBEDDED_FILES {
            let a = embedded(name).unwrap();
            let url = embedded_url(name);
            let file = url.strip_prefix(PREFIX).unwrap();
            assert_eq!(split_hashed(file), Some(((*name).to_owned(), a.hash())));
            let digest = Sha256::digest(text.as_bytes());
            assert!(hex(&digest).starts_with(a.hash()));
        }
        assert_eq!(embedded_url("nope.js"), "/_sluice/static/nope.js");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn a_stale_hash_is_sent_to_the_plain_name() {
        let res = stale("waiting.js");
        assert_eq!(res.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(res.headers()["location"], "/_sluice/static/waiting.js");
        assert!(res.extensions().get::<Immutable>().is_none());
    }
}
