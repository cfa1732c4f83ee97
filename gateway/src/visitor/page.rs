//! The waiting-room page and the static files it loads, embedded in the
//! binary. The page has no inline script and no external asset, so it is
//! served under a strict Content-Security-Policy; its texts come in the
//! visitor's language (`Accept-Language`: English, French) and every value
//! put into the page is HTML-escaped.
//!
//! A room may restyle its page ([`PageConfig`]): a brand name, an accent
//! colour (served as a generated stylesheet, so no inline style is needed)
//! and an operator's template directory whose `waiting.html`, `waiting.css`
//! and `logo.svg`/`logo.png` replace the embedded ones. The placeholders a
//! template may use are [`PLACEHOLDERS`] and the texts' keys; they are
//! documented in `docs/waiting-page.md`.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, LazyLock};

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::app::problem::Problem;
use crate::config::ConfigError;
use crate::gate::rooms::Room;

const PAGE: &str = include_str!("../../../static/waiting.html");

/// The strict policy of the page: same-origin scripts, styles, workers and
/// fetches only; no inline code, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; worker-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The embedded static files: name, content type, bytes.
const FILES: &[(&str, &str, &str)] = &[
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
];

/// `GET /_sluice/static/{file}`: only the embedded names, and a room's own
/// files (`theme.{room}.css`, and from its template directory
/// `waiting.{room}.css`, `logo.{room}.svg|png`); anything else (including
/// traversal attempts) is 404.
pub async fn static_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    if let Some((_, ctype, body)) = FILES
        .iter()
        .chain(crate::admin::dashboard::FILES)
        .find(|(name, _, _)| *name == file)
    {
        return asset(ctype, axum::body::Body::from(*body));
    }
    room_file(&state, &file).unwrap_or_else(|| {
        Problem::new(StatusCode::NOT_FOUND, "not_found", "No such file").into_response()
    })
}

/// A static asset answer: its type, five minutes of caching, `nosniff`.
pub(crate) fn asset(ctype: &'static str, body: axum::body::Body) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    res
}

/// `{kind}.{room}.{ext}`: a file of one room's page.
fn room_file(state: &AppState, file: &str) -> Option<Response> {
    let mut parts = file.split('.');
    let (kind, room, ext) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let room = state.room(room).ok()?;
    let page = &room.config.page;
    match (kind, ext) {
        ("theme", "css") => Some(asset(
            "text/css; charset=utf-8",
            axum::body::Body::from(page.theme_css()),
        )),
        ("waiting", "css") => {
            let css = template(page.template_dir.as_deref()?)?.css.clone()?;
            Some(asset(
                "text/css; charset=utf-8",
                axum::body::Body::from(css),
            ))
        }
        ("logo", _) => {
            let t = template(page.template_dir.as_deref()?)?;
            let (lext, ctype, bytes) = t.logo.as_ref()?;
            (*lext == ext).then(|| asset(ctype, axum::body::Body::from(bytes.clone())))
        }
        _ => None,
    }
}

// === the look of a room's page ===

/// The look of one room's waiting page (`[rooms.page]` in the config).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PageConfig {
    /// The operator's name, shown above the heading and as the logo's
    /// text alternative (at most 100 characters). None: nothing shown.
    pub brand_name: Option<String>,
    /// The accent colour (progress bar, focus rings) as `#rrggbb`. None:
    /// the built-in blue.
    pub accent_color: Option<String>,
    /// A directory holding `waiting.html` (required) and optionally
    /// `waiting.css` and `logo.svg` or `logo.png`, used instead of the
    /// embedded page. Read once, at the first page served.
    pub template_dir: Option<PathBuf>,
}

/// The placeholders a template may use besides the texts' keys:
/// `{{room}}`, `{{return_to}}`, `{{brand_name}}`, `{{logo}}` (an `<img>`
/// element, or nothing), `{{stylesheet_url}}`, `{{theme_url}}` and
/// `{{texts_json}}` (for `<script type="application/json">`).
pub const PLACEHOLDERS: &[&str] = &[
    "room",
    "return_to",
    "brand_name",
    "logo",
    "stylesheet_url",
    "theme_url",
    "texts_json",
];

impl PageConfig {
    /// Checks the colour, the name and the template directory (it must
    /// hold a `waiting.html` that uses known placeholders only).
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        if let Some(c) = &self.accent_color
            && !(c.len() == 7
                && c.starts_with('#')
                && c.bytes().skip(1).all(|b| b.is_ascii_hexdigit()))
        {
            return Err(ConfigError::invalid(
                format!("{field}.accent_color"),
                "must be a colour written #rrggbb",
            ));
        }
        if let Some(n) = &self.brand_name
            && (n.chars().count() > 100 || n.chars().any(char::is_control))
        {
            return Err(ConfigError::invalid(
                format!("{field}.brand_name"),
                "must be at most 100 characters, without control characters",
            ));
        }
        if let Some(dir) = &self.template_dir {
            let t = load_template(dir).map_err(|e| {
                ConfigError::invalid(format!("{field}.template_dir"), e.to_string())
            })?;
            let known = texts(Lang::En);
            for key in placeholders(&t.html) {
                if !known.contains_key(key) && !PLACEHOLDERS.contains(&key) {
                    return Err(ConfigError::invalid(
                        format!("{field}.template_dir"),
                        format!("waiting.html uses an unknown placeholder {{{{{key}}}}}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The generated stylesheet of the room's colours.
    pub fn theme_css(&self) -> String {
        match &self.accent_color {
            // Validated as #rrggbb: nothing else can reach the stylesheet.
            Some(c) => format!(":root, :root:not(#x) {{ --accent: {c}; }}\n"),
            None => String::from("/* the built-in colours */\n"),
        }
    }
}

/// A template directory, loaded.
struct Template {
    html: String,
    css: Option<String>,
    /// Extension, content type, bytes.
    logo: Option<(&'static str, &'static str, Vec<u8>)>,
}

/// Loaded template directories by path, read once.
static TEMPLATES: LazyLock<Mutex<HashMap<PathBuf, Arc<Template>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn load_template(dir: &FsPath) -> std::io::Result<Template> {
    let html = std::fs::read_to_string(dir.join("waiting.html")).map_err(|e| {
        std::io::Error::new(e.kind(), format!("{}/waiting.html: {e}", dir.display()))
    })?;
    let css = std::fs::read_to_string(dir.join("waiting.css")).ok();
    let logo = [("svg", "image/svg+xml"), ("png", "image/png")]
        .into_iter()
        .find_map(|(ext, ctype)| {
            std::fs::read(dir.join(format!("logo.{ext}")))
                .ok()
                .map(|b| (ext, ctype, b))
        });
    Ok(Template { html, css, logo })
}

/// The template of `dir`, read at its first use; None (and a warning)
/// when it cannot be read.
fn template(dir: &FsPath) -> Option<Arc<Template>> {
    if let Some(t) = TEMPLATES.lock().get(dir) {
        return Some(t.clone());
    }
    match load_template(dir) {
        Ok(t) => {
            let t = Arc::new(t);
            TEMPLATES.lock().insert(dir.to_owned(), t.clone());
            Some(t)
        }
        Err(e) => {
            tracing::warn!(error = %e, "waiting page template unreadable: serving the embedded page");
            None
        }
    }
}

/// The `{{key}}` names used in `html`.
fn placeholders(html: &str) -> impl Iterator<Item = &str> {
    html.split("{{")
        .skip(1)
        .filter_map(|rest| rest.split_once("}}").map(|(k, _)| k.trim()))
}

/// Replaces every `{{key}}` of `html` in one pass (a value is never
/// scanned again, so text in it that looks like a placeholder stays text);
/// unknown keys become empty.
fn render(html: &str, values: &HashMap<&str, String>) -> String {
    let mut out = String::with_capacity(html.len() + 1024);
    let mut rest = html;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        match after.find("}}") {
            Some(end) => {
                if let Some(v) = values.get(after[..end].trim()) {
                    out.push_str(v);
                }
                rest = &after[end + 2..];
            }
            None => {
                out.push_str(&rest[at..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// A language the page speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// English (the default).
    En,
    /// French.
    Fr,
}

/// Picks the first supported language of `Accept-Language`, by quality.
pub fn pick_lang(headers: &HeaderMap) -> Lang {
    let Some(h) = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok())
    else {
        return Lang::En;
    };
    let mut best = (Lang::En, -1.0f32);
    for item in h.split(',') {
        let mut parts = item.trim().split(';');
        let tag = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .find_map(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
            })
            .unwrap_or(1.0);
        let lang = if tag == "fr" || tag.starts_with("fr-") {
            Some(Lang::Fr)
        } else if tag == "en" || tag.starts_with("en-") {
            Some(Lang::En)
        } else {
            None
        };
        if let Some(l) = lang
            && q > best.1
        {
            best = (l, q);
        }
    }
    best.0
}

fn texts(lang: Lang) -> Map<String, Value> {
    let v = match lang {
        Lang::En => json!({
            "lang": "en",
            "title": "You are in line",
            "heading": "You are in line",
            "lead": "So many people arrived at once that we are letting them in a few at a time, in the order they came. Your place is kept.",
            "noscript": "This waiting room needs JavaScript to hold your place in line. Please turn it on and reload the page.",
            "status_label": "Your place in line",
            "progress_label": "Progress through the line",
            "position_label": "Your position",
            "ahead_label": "People ahead of you",
            "eta_label": "Estimated wait",
            "keep_open": "Keep this page open: it moves you on by itself. Reloading or opening it in another tab keeps your place.",
            "preparing": "Getting your place ready…",
            "solving": "Checking your browser…",
            "solving_progress": "Checking your browser… {done} of {total}",
            "waiting": "You are number {position} in line.",
            "next": "You are next!",
            "admitted": "It is your turn! Taking you there…",
            "paused": "The line is paused for a moment. Your place is kept.",
            "sold_out": "Sorry: everything is sold out.",
            "sold_out_for_now": "Everything is in someone's basket right now. Tickets not paid for come back: keep this page open, your place is kept.",
            "closed": "This waiting room is closed.",
            "reconnecting": "Reconnecting… your place is kept.",
            "eta_under_minute": "under a minute",
            "eta_minutes": "{lo}–{hi} minutes",
            "eta_hours": "{lo}–{hi} hours",
            "prequeue": "The sale opens at {time} (your local time). Everyone who arrives before then gets a place in a random draw: no need to rush.",
            "prequeue_lead": "The sale has not opened yet. Keep this page open: when it opens, places are drawn at random among everyone already here, then the page takes you in when your turn comes.",
            "prequeue_position": "In the draw",
            "prequeue_tickets_label": "In the draw so far",
            "prequeue_countdown": "opens in {countdown}",
            "prequeue_opening": "opening now: drawing places…"
        }),
        Lang::Fr => json!({
            "lang": "fr",
            "title": "Vous êtes dans la file",
            "heading": "Vous êtes dans la file",
            "lead": "Tant de monde est arrivé en même temps que nous faisons entrer les visiteurs quelques-uns à la fois, dans l'ordre d'arrivée. Votre place est gardée.",
            "noscript": "Cette salle d'attente a besoin de JavaScript pour garder votre place. Activez-le puis rechargez la page.",
            "status_label": "Votre place dans la file",
            "progress_label": "Progression dans la file",
            "position_label": "Votre position",
            "ahead_label": "Personnes devant vous",
            "eta_label": "Attente estimée",
            "keep_open": "Gardez cette page ouverte : elle vous fera entrer toute seule. Recharger la page ou l'ouvrir dans un autre onglet garde votre place.",
            "preparing": "Préparation de votre place…",
            "solving": "Vérification de votre navigateur…",
            "solving_progress": "Vérification de votre navigateur… {done} sur {total}",
            "waiting": "Vous êtes numéro {position} dans la file.",
            "next": "C'est bientôt à vous !",
            "admitted": "C'est votre tour ! Redirection…",
            "paused": "La file est en pause un instant. Votre place est gardée.",
            "sold_out": "Désolé : tout est vendu.",
            "sold_out_for_now": "Tout est dans un panier pour le moment. Les billets non payés reviennent : gardez cette page ouverte, votre place est gardée.",
            "closed": "Cette salle d'attente est fermée.",
            "reconnecting": "Reconnexion… votre place est gardée.",
            "eta_under_minute": "moins d'une minute",
            "eta_minutes": "{lo} à {hi} minutes",
            "eta_hours": "{lo} à {hi} heures",
            "prequeue": "La vente ouvre à {time} (heure locale). Tous ceux qui arrivent avant obtiennent une place par tirage au sort : inutile de se presser.",
            "prequeue_lead": "La vente n'est pas encore ouverte. Gardez cette page ouverte : à l'ouverture, les places sont tirées au sort entre tous ceux déjà présents, puis la page vous fera entrer à votre tour.",
            "prequeue_position": "Dans le tirage",
            "prequeue_tickets_label": "Inscrits au tirage",
            "prequeue_countdown": "ouverture dans {countdown}",
            "prequeue_opening": "ouverture : tirage des places…"
        }),
    };
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Escapes text for HTML content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The waiting page for `room`, in the visitor's language, returning to
/// the URL it asked for.
pub fn waiting_page(
    _state: &AppState,
    room: &Room,
    headers: &HeaderMap,
    return_to: &str,
) -> Response {
    let lang = pick_lang(headers);
    let t = texts(lang);
    let page = &room.config.page;
    let custom = page.template_dir.as_deref().and_then(template);
    let id = room.id();
    // JSON inside <script type="application/json">: `<` escaped so no
    // text can close the element.
    let texts_json = Value::Object(t.clone()).to_string().replace('<', "\\u003c");
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
    let logo = custom
        .as_ref()
        .and_then(|c| c.logo.as_ref())
        .map(|(ext, _, _)| {
            format!(
                "<img class=\"logo\" src=\"/_sluice/static/logo.{}.{ext}\" alt=\"{}\">",
                html_escape(id),
                html_escape(&brand)
            )
        })
        .unwrap_or_default();
    values.insert("logo", logo);
    let stylesheet = if custom.as_ref().is_some_and(|c| c.css.is_some()) {
        format!("/_sluice/static/waiting.{}.css", html_escape(id))
    } else {
        "/_sluice/static/waiting.css".to_owned()
    };
    values.insert("stylesheet_url", stylesheet);
    values.insert(
        "theme_url",
        format!("/_sluice/static/theme.{}.css", html_escape(id)),
    );
    values.insert("texts_json", texts_json);
    let html = render(custom.as_ref().map_or(PAGE, |c| c.html.as_str()), &values);
    let mut res = html.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Language"));
    res
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
