//! The waiting page's template and texts: a room's look (`[rooms.page]`),
//! an operator's template directory, the languages. No request handling
//! here (that is [`crate::visitor::page`]), so the configuration can check
//! a template with the same code that renders it.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, LazyLock};

use http::{HeaderMap, header};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::config::error::ConfigError;
use crate::visitor::assets::Asset;

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
/// element, or nothing), `{{stylesheet_url}}`, `{{theme_url}}`,
/// `{{texts_json}}` (for `<script type="application/json">`), and the
/// hashed URLs of the page's scripts, `{{solver_url}}`, `{{script_url}}`
/// and `{{worker_url}}` (for `data-worker-url`), and `{{enqueue}}`
/// (`required` when the room takes only visitors with an enqueue token,
/// else empty: for `data-enqueue`, so the page asks no work of a visitor
/// it must send to sign in), `{{sign_in_url}}` (the room's
/// `[rooms.enqueue] sign_in_url` in such a room, else empty: for
/// `data-sign-in`).
pub const PLACEHOLDERS: &[&str] = &[
    "room",
    "return_to",
    "brand_name",
    "logo",
    "stylesheet_url",
    "theme_url",
    "texts_json",
    "solver_url",
    "script_url",
    "worker_url",
    "enqueue",
    "sign_in_url",
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

/// A template directory, loaded: its page, and its stylesheet and logo
/// stored as the page's other static files are (hashed, compressed).
pub(crate) struct Template {
    pub(crate) html: String,
    pub(crate) css: Option<Arc<Asset>>,
    /// Extension and file.
    pub(crate) logo: Option<(&'static str, Arc<Asset>)>,
}

/// Loaded template directories by path, read once.
static TEMPLATES: LazyLock<Mutex<HashMap<PathBuf, Arc<Template>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn load_template(dir: &FsPath) -> std::io::Result<Template> {
    let html = std::fs::read_to_string(dir.join("waiting.html")).map_err(|e| {
        std::io::Error::new(e.kind(), format!("{}/waiting.html: {e}", dir.display()))
    })?;
    let css = std::fs::read_to_string(dir.join("waiting.css"))
        .ok()
        .map(|css| Arc::new(Asset::new("text/css; charset=utf-8", css)));
    let logo = [("svg", "image/svg+xml"), ("png", "image/png")]
        .into_iter()
        .find_map(|(ext, ctype)| {
            std::fs::read(dir.join(format!("logo.{ext}")))
                .ok()
                .map(|b| (ext, Arc::new(Asset::new(ctype, b))))
        });
    Ok(Template { html, css, logo })
}

/// The template of `dir`, read at its first use; None (and a warning)
/// when it cannot be read.
pub(crate) fn template(dir: &FsPath) -> Option<Arc<Template>> {
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
pub(crate) fn render(html: &str, values: &HashMap<&str, String>) -> String {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

pub(crate) fn texts(lang: Lang) -> Map<String, Value> {
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
            "next_wave": "More tickets go on sale at {time} (your local time).",
            "closed": "This waiting room is closed.",
            "full": "The room is full right now and keeps no line. This page tries again by itself in a moment.",
            "reconnecting": "Reconnecting… your place is kept.",
            "eta_under_minute": "under a minute",
            "eta_minutes": "{lo}–{hi} minutes",
            "eta_hours": "{lo}–{hi} hours",
            "prequeue": "The sale opens at {time} (your local time). Everyone who arrives before then gets a place in a random draw: no need to rush.",
            "prequeue_lead": "The sale has not opened yet. Keep this page open: when it opens, places are drawn at random among everyone already here, then the page takes you in when your turn comes.",
            "prequeue_position": "In the draw",
            "prequeue_tickets_label": "In the draw so far",
            "prequeue_countdown": "opens in {countdown}",
            "prequeue_opening": "opening now: drawing places…",
            "draw_waiting": "You are in the next draw: when the people ahead have gone in, places are drawn at random among everyone waiting, you included. Your place in the draw is kept."
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
            "next_wave": "D'autres billets seront mis en vente à {time} (heure locale).",
            "closed": "Cette salle d'attente est fermée.",
            "full": "La salle est pleine pour le moment et ne garde pas de file. Cette page réessaie d'elle-même dans un instant.",
            "reconnecting": "Reconnexion… votre place est gardée.",
            "eta_under_minute": "moins d'une minute",
            "eta_minutes": "{lo} à {hi} minutes",
            "eta_hours": "{lo} à {hi} heures",
            "prequeue": "La vente ouvre à {time} (heure locale). Tous ceux qui arrivent avant obtiennent une place par tirage au sort : inutile de se presser.",
            "prequeue_lead": "La vente n'est pas encore ouverte. Gardez cette page ouverte : à l'ouverture, les places sont tirées au sort entre tous ceux déjà présents, puis la page vous fera entrer à votre tour.",
            "prequeue_position": "Dans le tirage",
            "prequeue_tickets_label": "Inscrits au tirage",
            "prequeue_countdown": "ouverture dans {countdown}",
            "prequeue_opening": "ouverture : tirage des places…",
            "draw_waiting": "Vous êtes dans le prochain tirage : quand les personnes devant vous seront entrées, les places seront tirées au sort entre tous ceux qui attendent, vous compris. Votre place dans le tirage est gardée."
        }),
    };
    let mut all = match v {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if let Value::Object(more) = door_texts(lang) {
        all.extend(more);
    }
    all
}

/// The texts of a room's door (one `json!` for every text is too deep for
/// the macro): the invite form of an invite-only room, and the sign-in
/// notice of a room that takes only visitors signed in at the shop.
fn door_texts(lang: Lang) -> Value {
    match lang {
        Lang::En => json!({
            "invite_prompt": "This line is by invitation.",
            "invite_label": "Invite code",
            "invite_submit": "Join the line",
            "invite_required": "This room is by invitation: enter the code you were given.",
            "invite_unknown": "That code was not recognised. Check it and try again.",
            "invite_used": "That code can no longer be used. Ask whoever gave it to you for a new one.",
            "invite_checking": "Checking your code…",
            "invite_wait": "Too many codes were tried from your network. Trying again in {seconds} s…",
            "enqueue_required": "This line is for customers signed in at the shop. Please sign in there first: the shop then sends you back here, and your place is kept for your account.",
            "enqueue_invalid": "Your sign-in for this line has expired or is not valid. Please sign in at the shop again: it sends you back here.",
            "enqueue_link": "Back to the page you wanted",
            "enqueue_sign_in_link": "Sign in at the shop",
            "invite_lead": "This line is open to invited guests: enter your invite code to take a place in it.",
            "sign_in_lead": "This line is for the shop's signed-in customers: sign in at the shop to take a place in it."
        }),
        Lang::Fr => json!({
            "invite_prompt": "Cette file est sur invitation.",
            "invite_label": "Code d'invitation",
            "invite_submit": "Rejoindre la file",
            "invite_required": "Cette salle est sur invitation : saisissez le code que vous avez reçu.",
            "invite_unknown": "Ce code n'a pas été reconnu. Vérifiez-le et réessayez.",
            "invite_used": "Ce code ne peut plus être utilisé. Demandez-en un nouveau à qui vous l'a donné.",
            "invite_checking": "Vérification de votre code…",
            "invite_wait": "Trop de codes ont été essayés depuis votre réseau. Nouvel essai dans {seconds} s…",
            "enqueue_required": "Cette file est réservée aux clients connectés à la boutique. Connectez-vous d'abord sur la boutique : elle vous renvoie ici, et votre place est gardée pour votre compte.",
            "enqueue_invalid": "Votre connexion pour cette file a expiré ou n'est pas valable. Reconnectez-vous sur la boutique : elle vous renvoie ici.",
            "enqueue_link": "Retour à la page demandée",
            "enqueue_sign_in_link": "Se connecter sur la boutique",
            "invite_lead": "Cette file est réservée aux invités : saisissez votre code d'invitation pour y prendre place.",
            "sign_in_lead": "Cette file est réservée aux clients connectés à la boutique : connectez-vous sur la boutique pour y prendre place."
        }),
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
