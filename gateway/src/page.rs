//! The waiting-room page and the static files it loads, embedded in the
//! binary. The page has no inline script and no external asset, so it is
//! served under a strict Content-Security-Policy; its texts come in the
//! visitor's language (`Accept-Language`: English, French) and every value
//! put into the page is HTML-escaped.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::problem::Problem;
use crate::rooms::Room;

const PAGE: &str = include_str!("../../static/waiting.html");

/// The strict policy of the page: same-origin scripts, styles, workers and
/// fetches only; no inline code, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; worker-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The embedded static files: name, content type, bytes.
const FILES: &[(&str, &str, &str)] = &[
    (
        "waiting.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/waiting.js"),
    ),
    (
        "waiting.css",
        "text/css; charset=utf-8",
        include_str!("../../static/waiting.css"),
    ),
    (
        "pow-solver.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/pow-solver.js"),
    ),
    (
        "pow-worker.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/pow-worker.js"),
    ),
];

/// `GET /_sluice/static/{file}`: only the embedded names; anything else
/// (including traversal attempts) is 404.
pub async fn static_file(Path(file): Path<String>) -> Response {
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, ctype, body)) => {
            let mut res = (*body).into_response();
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
        None => Problem::new(StatusCode::NOT_FOUND, "not_found", "No such file").into_response(),
    }
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
            "closed": "This waiting room is closed.",
            "reconnecting": "Reconnecting… your place is kept.",
            "eta_under_minute": "under a minute",
            "eta_minutes": "{lo}–{hi} minutes",
            "eta_hours": "{lo}–{hi} hours"
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
            "closed": "Cette salle d'attente est fermée.",
            "reconnecting": "Reconnexion… votre place est gardée.",
            "eta_under_minute": "moins d'une minute",
            "eta_minutes": "{lo} à {hi} minutes",
            "eta_hours": "{lo} à {hi} heures"
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
    let mut html = PAGE.to_owned();
    for (k, v) in &t {
        if let Some(s) = v.as_str() {
            html = html.replace(&format!("{{{{{k}}}}}"), &html_escape(s));
        }
    }
    html = html.replace("{{room}}", &html_escape(room.id()));
    html = html.replace("{{return_to}}", &html_escape(return_to));
    // JSON inside <script type="application/json">: `<` escaped so no
    // text can close the element.
    let texts_json = Value::Object(t).to_string().replace('<', "\\u003c");
    html = html.replace("{{texts_json}}", &texts_json);
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
            assert!(
                en.contains_key(key) || ["room", "return_to", "texts_json"].contains(&key),
                "{key}"
            );
        }
    }
}
