//! The waiting-room page and the static files it loads, embedded in the
//! binary. The page has no inline script and no external asset, so it is
//! served under a strict Content-Security-Policy; its texts come in the
//! visitor's language (`Accept-Language`: English, French) and every value
//! put into the page is HTML-escaped.
//!
//! A room may restyle its page ([`crate::visitor::template::PageConfig`]): a brand name, an accent
//! colour (served as a generated stylesheet, so no inline style is needed)
//! and an operator's template directory whose `waiting.html`, `waiting.css`
//! and `logo.svg`/`logo.png` replace the embedded ones. The placeholders a
//! template may use are [`crate::visitor::template::PLACEHOLDERS`] and the texts' keys; they are
//! documented in `docs/waiting-page.md`.
//!
//! The page is `no-store` (it carries the visitor's return path and
//! language, and is where a reload learns the current files); every file
//! it loads is linked by its hashed name and cached for a year
//! ([`crate::visitor::assets`]), so a reload moves the page alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;

use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::gate::rooms::Room;
use crate::visitor::assets::{self, Asset, Caching, Coding, split_hashed};
use crate::visitor::template::{Lang, PageConfig, html_escape, pick_lang, render, template, texts};

const PAGE: &str = include_str!("../../../static/waiting.html");

/// The strict policy of the page: same-origin scripts, styles, workers and
/// fetches only; no inline code, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; worker-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// `GET /_sluice/static/{file}`: the embedded files
/// ([`crate::visitor::assets`]) and a room's own (`theme.{room}.css`, and
/// from its template directory `waiting.{room}.css`,
/// `logo.{room}.svg|png`), each under its plain and its hashed name;
/// anything else (including traversal attempts) is 404.
///
/// The hashed name of the current bytes is answered immutable; a plain
/// name no-store; a hashed name of other bytes 307 to the plain name. The
/// exact hash is tried first, then the plain name, so a room whose id has
/// the shape of a hash (`waiting.{room}.css`) keeps its file.
pub async fn static_file(
    State(state): State<AppState>,
    Path(file): Path<String>,
    headers: HeaderMap,
) -> Response {
    let hashed = split_hashed(&file);
    if let Some((plain, hash)) = &hashed
        && let Some(found) = lookup(&state, plain)
        && found.hash() == *hash
    {
        return found.answer(&headers, Caching::Immutable);
    }
    if let Some(found) = lookup(&state, &file) {
        return found.answer(&headers, Caching::NoStore);
    }
    match hashed {
        Some((plain, _)) if lookup(&state, &plain).is_some() => assets::stale(&plain),
        _ => Problem::new(StatusCode::NOT_FOUND, "not_found", "No such file").into_response(),
    }
}

/// The static file of plain name `file`: an embedded one, or a room's.
fn lookup(state: &AppState, file: &str) -> Option<Arc<Asset>> {
    assets::embedded(file).or_else(|| room_file(state, file))
}

/// `{kind}.{room}.{ext}`: a file of one room's page.
fn room_file(state: &AppState, file: &str) -> Option<Arc<Asset>> {
    let mut parts = file.split('.');
    let (kind, room, ext) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let room = state.room(room).ok()?;
    let page = &room.config.page;
    match (kind, ext) {
        ("theme", "css") => Some(theme(page)),
        ("waiting", "css") => template(page.template_dir.as_deref()?)?.css.clone(),
        ("logo", _) => {
            let t = template(page.template_dir.as_deref()?)?;
            let (lext, logo) = t.logo.as_ref()?;
            (*lext == ext).then(|| logo.clone())
        }
        _ => None,
    }
}

/// A room's generated colour stylesheet, stored (a few dozen bytes: hashed
/// where it is needed, never compressed).
fn theme(page: &PageConfig) -> Arc<Asset> {
    Arc::new(Asset::new("text/css; charset=utf-8", page.theme_css()))
}

/// The waiting page for `room`, in the visitor's language, returning to
/// the URL it asked for: from the room's [`PageCache`], in the form the
/// visitor's `Accept-Encoding` picks.
pub fn waiting_page(
    _state: &AppState,
    room: &Room,
    headers: &HeaderMap,
    return_to: &str,
) -> Response {
    let lang = pick_lang(headers);
    let (page, rendered) = room
        .page_cache
        .get_or_render(lang, return_to, || render_page(room, lang, return_to));
    // A page rendered for this request is sent as it is: compressed from
    // its second request on, so a client making up a new URL each time
    // never has the gateway compress anything.
    let compress = page.compressible() && !rendered;
    let coding = assets::coding_for(headers, compress, compress);
    let (body, coding) = match coding.and_then(|c| page.form(c).map(|b| (b, c))) {
        Some((body, c)) => (body, Some(c)),
        None => (page.html.clone(), None),
    };
    let mut res = Body::from(body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Some(c) = coding {
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(c.token()),
        );
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(
        header::VARY,
        HeaderValue::from_static(if page.compressible() {
            "Accept-Language, Accept-Encoding"
        } else {
            "Accept-Language"
        }),
    );
    // Encoded here from the kept forms: the per-request compression
    // leaves it alone.
    res.extensions_mut().insert(assets::Precompressed);
    res
}

/// The waiting page's HTML for `room` in `lang`, returning to `return_to`,
/// and whether it may be kept: not when the room's template directory
/// could not be read (the embedded page stands in until it can).
fn render_page(room: &Room, lang: Lang, return_to: &str) -> (String, bool) {
    let t = texts(lang);
    let page = &room.config.page;
    let custom = page.template_dir.as_deref().and_then(template);
    let id = room.id();
    // JSON inside <script type="application/json">: `<` escaped so no
    // text can close the element.
    // A room with no door (invite codes, enqueue tokens) leaves the door's
    // texts out of the JSON: every page load would carry them for nothing.
    let door = room.config.invite_only || room.enqueue.is_some();
    let shown = t
        .iter()
        .filter(|(k, _)| door || !(k.starts_with("invite_") || k.starts_with("enqueue_")))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let texts_json = Value::Object(shown).to_string().replace('<', "\\u003c");
    let mut values: HashMap<&str, String> = HashMap::new();
    for (k, v) in &t {
        if let Some(s) = v.as_str() {
            values.insert(k.as_str(), html_escape(s));
        }
    }
    values.insert("room", html_escape(id));
    values.insert("return_to", html_escape(return_to));
    let brand = page.brand_name.clone().unwrap_or_default();
    values.insert("brand_name", html_escape(&brand));
    // Every file by its hashed name (room ids are [A-Za-z0-9_-]: nothing
    // to escape in a URL, escaped all the same).
    let logo = custom
        .as_ref()
        .and_then(|c| c.logo.as_ref())
        .map(|(ext, logo)| {
            format!(
                "<img class=\"logo\" src=\"{}\" alt=\"{}\">",
                html_escape(&logo.url(&format!("logo.{id}.{ext}"))),
                html_escape(&brand)
            )
        })
        .unwrap_or_default();
    values.insert("logo", logo);
    let stylesheet = match custom.as_ref().and_then(|c| c.css.as_ref()) {
        Some(css) => css.url(&format!("waiting.{id}.css")),
        None => assets::embedded_url("waiting.css"),
    };
    values.insert("stylesheet_url", html_escape(&stylesheet));
    values.insert(
        "theme_url",
        html_escape(&theme(page).url(&format!("theme.{id}.css"))),
    );
    values.insert("solver_url", assets::embedded_url("pow-solver.js"));
    values.insert("script_url", assets::embedded_url("waiting.js"));
    values.insert("worker_url", assets::embedded_url("pow-worker.js"));
    values.insert("texts_json", texts_json);
    let enqueue_required = room.enqueue.is_some() && room.config.enqueue.required;
    values.insert(
        "enqueue",
        if enqueue_required { "required" } else { "" }.to_owned(),
    );
    let sign_in = match &room.config.enqueue.sign_in_url {
        Some(url) if enqueue_required => html_escape(url),
        _ => String::new(),
    };
    values.insert("sign_in_url", sign_in);
    let html = render(custom.as_ref().map_or(PAGE, |c| c.html.as_str()), &values);
    (html, page.template_dir.is_none() || custom.is_some())
}

// === the rendered pages, kept ===

/// br and gzip quality of a kept page's forms: made once per page kept
/// and asked again, which a flood of made-up URLs can make often (each
/// drop of the kept pages), so the per-request compression's quality,
/// not the best.
const PAGE_QUALITY: u32 = 4;

/// Pages kept per room (return URLs × languages): the few URLs a sale's
/// visitors arrive at, with room to spare. Past it the room's pages are
/// all dropped and kept again as they are asked for.
const KEPT_PAGES: usize = 32;

/// Return URLs longer than this are rendered for their request only.
const KEPT_URL_LEN: usize = 512;

/// A room's waiting pages as rendered, by language and return URL, each
/// with its br and gzip forms made when first asked for.
///
/// A cookie-less visitor's first request is the waiting page, so the
/// opening surge of a sale is pages: rendered and compressed per request,
/// they were most of the gateway's CPU in `tests/bench/surge.sh` (br's
/// encoder zeroes a large table for each answer: page faults and TLB
/// shootdowns across the I/O threads). A room's configuration
/// (`Room::config`) does not change while the room lives, so its page
/// for a (language, return URL) never changes either.
///
/// Bounded: [`KEPT_PAGES`] pages of URLs up to [`KEPT_URL_LEN`] bytes. A
/// page is compressed from its second request on: a client that makes up
/// a new URL per request gets its page rendered and sent as it is, and
/// drops the kept pages at worst once per [`KEPT_PAGES`] requests.
#[derive(Debug, Default)]
pub struct PageCache {
    pages: Mutex<KeptPages>,
}

/// Kept pages by (language, return URL).
type KeptPages = HashMap<(Lang, Box<str>), Arc<KeptPage>>;

/// One rendered page and its compressed forms (`None`: not smaller, or the
/// encoder failed: the page is sent as it is).
#[derive(Debug)]
pub struct KeptPage {
    html: Bytes,
    br: OnceLock<Option<Bytes>>,
    gzip: OnceLock<Option<Bytes>>,
}

impl KeptPage {
    fn new(html: String) -> KeptPage {
        KeptPage {
            html: Bytes::from(html),
            br: OnceLock::new(),
            gzip: OnceLock::new(),
        }
    }

    /// Whether compressed forms are worth making (the per-request
    /// compression's threshold).
    fn compressible(&self) -> bool {
        self.html.len() >= assets::MIN_COMPRESSED
    }

    /// The page in `coding`, made the first time it is asked for.
    fn form(&self, coding: Coding) -> Option<Bytes> {
        let cell = match coding {
            Coding::Br => &self.br,
            Coding::Gzip => &self.gzip,
        };
        cell.get_or_init(|| {
            coding
                .encode(&self.html, PAGE_QUALITY)
                .filter(|f| f.len() < self.html.len())
                .map(Bytes::from)
        })
        .clone()
    }
}

impl PageCache {
    /// The page for (`lang`, `return_to`), rendered by `render` when not
    /// kept (`render` says whether its page may be kept), and whether it
    /// was rendered for this call.
    pub fn get_or_render(
        &self,
        lang: Lang,
        return_to: &str,
        render: impl FnOnce() -> (String, bool),
    ) -> (Arc<KeptPage>, bool) {
        let kept = |(html, keep): (String, bool)| (Arc::new(KeptPage::new(html)), keep);
        if return_to.len() > KEPT_URL_LEN {
            return (kept(render()).0, true);
        }
        let key = (lang, Box::<str>::from(return_to));
        if let Some(page) = self.lock().get(&key) {
            return (page.clone(), false);
        }
        // Rendered outside the lock: a miss does not hold up the hits.
        let (page, keep) = kept(render());
        if !keep {
            return (page, true);
        }
        let mut pages = self.lock();
        if pages.len() >= KEPT_PAGES {
            pages.clear();
        }
        // Another request may have kept the same page meanwhile: that one
        // is answered, as rendered for this call all the same.
        (pages.entry(key).or_insert(page).clone(), true)
    }

    /// Pages kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no page is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptPages> {
        // A panic while the map was held left it whole (inserts and clears
        // only): keep using it.
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::visitor::template::*;

    /// A page of `n` bytes naming its key, counting its renders.
    fn page_of(lang: Lang, url: &str, renders: &std::cell::Cell<u32>) -> (String, bool) {
        renders.set(renders.get() + 1);
        let mut html = format!("<p>{lang:?} {url}</p>");
        html.push_str(&"waiting ".repeat(100));
        (html, true)
    }

    #[test]
    fn kept_pages_are_their_own_keys_and_bounded() {
        let cache = PageCache::default();
        let renders = std::cell::Cell::new(0);
        let get = |lang, url: &str| {
            cache
                .get_or_render(lang, url, || page_of(lang, url, &renders))
                .0
        };
        let (a, rendered) =
            cache.get_or_render(Lang::En, "/a", || page_of(Lang::En, "/a", &renders));
        assert!(rendered);
        let (again, rendered) = cache.get_or_render(Lang::En, "/a", || unreachable!("kept"));
        assert!(Arc::ptr_eq(&a, &again) && !rendered, "kept");
        assert_eq!(renders.get(), 1);
        let fr = get(Lang::Fr, "/a");
        assert!(!Arc::ptr_eq(&a, &fr));
        assert!(
            std::str::from_utf8(&fr.html)
                .unwrap()
                .starts_with("<p>Fr /a</p>")
        );
        // A new URL per request: never more than KEPT_PAGES kept, and each
        // answer is its own URL's page.
        for i in 0..1000 {
            let url = format!("/x/{i}");
            let page = get(Lang::En, &url);
            assert!(
                std::str::from_utf8(&page.html)
                    .unwrap()
                    .starts_with(&format!("<p>En {url}</p>"))
            );
            assert!(cache.len() <= KEPT_PAGES);
        }
        // Too long to keep: rendered each time, kept never.
        let long = format!("/{}", "l".repeat(KEPT_URL_LEN));
        let before = renders.get();
        let n = cache.len();
        get(Lang::En, &long);
        get(Lang::En, &long);
        assert_eq!(renders.get(), before + 2);
        assert_eq!(cache.len(), n);
        // A page its renderer says not to keep (an unreadable template).
        let c2 = PageCache::default();
        c2.get_or_render(Lang::En, "/t", || ("<p>embedded</p>".into(), false));
        assert!(c2.is_empty());
    }

    #[test]
    fn kept_forms_decode_to_the_page() {
        use std::io::Read;
        let renders = std::cell::Cell::new(0);
        let page = KeptPage::new(page_of(Lang::En, "/a", &renders).0);
        assert!(page.compressible());
        let br = page.form(Coding::Br).unwrap();
        let mut out = Vec::new();
        brotli::Decompressor::new(&br[..], 4096)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, page.html);
        let gz = page.form(Coding::Gzip).unwrap();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, page.html);
        assert!(br.len() < page.html.len() && gz.len() < page.html.len());
        // made once: the same bytes again
        assert_eq!(page.form(Coding::Br).unwrap().as_ptr(), br.as_ptr());
        // A page too small to gain is sent as it is.
        assert!(!KeptPage::new("<p>hi</p>".into()).compressible());
    }

    #[test]
    fn language_by_quality() {
        let mut h = HeaderMap::new();
        assert_eq!(pick_lang(&h), Lang::En);
        h.insert(
            header::ACCEPT_LANGUAGE,
            "fr-CA,fr;q=0.9,en;q=0.8".parse().unwrap(),
        );
        assert_eq!(pick_lang(&h), Lang::Fr);
        h.insert(
            header::ACCEPT_LANGUAGE,
            "de, en;q=0.9, fr;q=0.5".parse().unwrap(),
        );
        assert_eq!(pick_lang(&h), Lang::En);
    }

    #[test]
    fn placeholders_are_replaced_once() {
        let mut v = HashMap::new();
        v.insert("a", "{{b}}".to_owned());
        v.insert("b", "B".to_owned());
        assert_eq!(render("x{{a}}y{{ b }}z{{nope}}{{", &v), "x{{b}}yBz{{");
    }

    #[test]
    fn page_settings_are_validated() {
        let ok = PageConfig {
            brand_name: Some("Acme <Tickets>".into()),
            accent_color: Some("#A1b2C3".into()),
            template_dir: None,
        };
        ok.validate("p").unwrap();
        assert!(ok.theme_css().contains("--accent: #A1b2C3;"));
        for bad in ["red", "#12345", "#1234567", "#12345g", "#123456;}"] {
            let c = PageConfig {
                accent_color: Some(bad.into()),
                ..PageConfig::default()
            };
            let e = c.validate("rooms[0].page").unwrap_err().to_string();
            assert!(e.contains("rooms[0].page.accent_color"), "{bad}: {e}");
        }
        let dir = std::env::temp_dir().join(format!("sluice-page-{}", rand::random::<u64>()));
        let missing = PageConfig {
            template_dir: Some(dir.clone()),
            ..PageConfig::default()
        };
        assert!(
            missing
                .validate("p")
                .unwrap_err()
                .to_string()
                .contains("waiting.html")
        );
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("waiting.html"),
            "<p>{{heading}} {{brand_name}} {{typo}}</p>",
        )
        .unwrap();
        let e = missing.validate("p").unwrap_err().to_string();
        assert!(e.contains("{{typo}}"), "{e}");
        std::fs::write(dir.join("waiting.html"), PAGE).unwrap();
        missing.validate("p").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn escaping() {
        assert_eq!(
            html_escape("<a href=\"x\">'&"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
        );
    }

    #[test]
    fn every_placeholder_has_a_text_in_every_language() {
        let en = texts(Lang::En);
        let fr = texts(Lang::Fr);
        assert_eq!(en.keys().collect::<Vec<_>>(), fr.keys().collect::<Vec<_>>());
        for cap in PAGE.split("{{").skip(1) {
            let key = cap.split("}}").next().unwrap();
            assert!(en.contains_key(key) || PLACEHOLDERS.contains(&key), "{key}");
        }
    }
}
