//! One spelling for each request path and host, decided at the edge.
//!
//! The gateway picks a waiting room (and the bypass rules) by matching the
//! request path, then sends the request on to an origin that resolves the
//! path itself. If the two readings differ, a visitor reaches a guarded page
//! without queueing by spelling it differently: `//tickets`, `/./tickets`,
//! `/x/../tickets`, `/%74ickets`, `/robots.txt/../tickets`,
//! `/tickets;jsessionid=1`, `/public/..;/tickets` (Tomcat). So the path is
//! normalised once, here; rooms are chosen on the normalised form, the
//! normalised form is what the origin is sent, and what cannot be normalised
//! without guessing how the origin reads it is refused (400
//! `malformed_request`, with [`Malformed::reason`] as the detail).
//!
//! # What [`normalize_path`] does
//! - Escapes of unreserved characters (`ALPHA DIGIT - . _ ~`) are decoded
//!   and every other escape is kept with UPPERCASE hex (RFC 3986 §2.3,
//!   §6.2.2.1, §6.2.2.2): `%74ickets` is `tickets`, `%c3%a9` is `%C3%A9`.
//!   Decoding comes before dot-segment removal, so `/a/%2e%2e/b` is `/b`
//!   (nginx and most servers decode first too).
//! - Bytes that may not appear in a URI path at all but that `http::Uri`
//!   lets through (`"`, `[`, `]`, `^`, `{`, `|`, `}`, and any non-ASCII
//!   UTF-8) are percent-encoded, so `/a|b` and `/a%7Cb`, `/café` and
//!   `/caf%C3%A9` are one path (origins decode both to the same bytes).
//! - Runs of `/` merge into one (nginx `merge_slashes`, Apache, Tomcat, Go's
//!   `path.Clean` all do), then dot segments are removed as in RFC 3986
//!   §5.2.4 (§6.2.2.3). A trailing `/` is kept.
//! - Everything else (sub-delims, `:`, `@`, `;` path parameters) is left as
//!   it was written: RFC 3986 §2.2 makes a reserved character and its escape
//!   different data, so `forward` may not change one into the other.
//!
//! Two strings come out: `forward`, sent to the origin, and `route`, matched
//! against rules. `route` is the reading of `forward` by an origin that
//! decodes everything: `%2F` is a `/` there (and dot segments are resolved
//! again after that), and every escape of a printable ASCII character but
//! `%`, `?` and `#` is decoded (so a rule `/@admin` also covers
//! `/%40admin`, and `/tickets%3Bx` is `tickets` with a parameter). Rules
//! compare segments with their `;params` removed, as Tomcat and Spring do.
//!
//! # What is refused, and why
//! - a target not in origin form (RFC 9112 §3.2.1): anything not starting
//!   with `/`, such as `*` or an absolute URI, and a raw `?` or `#` (the
//!   caller splits off the query; a fragment is never part of a target);
//! - `\` raw or as `%5C`: IIS, Windows servers and several frameworks read
//!   it as `/`, so `/robots.txt\..\tickets` would climb;
//! - NUL raw or as `%00` (C-string truncation), and other raw control
//!   characters or spaces (they cannot come in HTTP/1.1, RFC 9112 §3.2);
//! - `%` not followed by two hex digits: servers disagree on what it is;
//! - `%25` followed by the escape of `.`, `/`, `\`, NUL or `;` (`%252e`):
//!   a second decoding, which some origin stacks do, gives it structure;
//! - an escape starting an overlong UTF-8 sequence (`%C0%AE`, `%E0%80%AE`):
//!   never valid UTF-8 (RFC 3629 §3), and old decoders read it as `.`/`/`;
//! - a `..` that climbs above the root: servers clamp, 400 or pass it on,
//!   so no one reading is right (RFC 3986 §5.2.4 clamps; we do not guess);
//! - a dot segment with parameters (`..;x`, `.;`, `..%3B`): Tomcat strips
//!   the parameter and resolves it (`/public/..;/admin` is `/admin`);
//! - a `..` that removes a segment made only of parameters (`/a/;x/../b`):
//!   Tomcat drops the empty segment first and so climbs one level more
//!   (`/b`) than every other server (`/a/b`).
//!
//! A path holding `%2F` is accepted but flagged
//! ([`CanonicalPath::encoded_slash`]): origins disagree on whether it
//! separates segments, so the caller refuses it unless the room opted in.
//!
//! Not done here: the query is the caller's (not normalised, forwarded as
//! received, never matched); `%3F`, `%23`, `%25` and encoded controls
//! (`%0D%0A`) are kept encoded in both strings; non-ASCII is never
//! case-folded; Windows' dropping of trailing dots and spaces in names
//! (`/tickets.` is `/tickets` on IIS) is not modelled.
//!
//! # Hosts
//! [`normalize_host`] lowercases a `Host` value or an absolute-form
//! authority, drops one trailing dot, writes an IPv6 literal in its RFC 5952
//! form and refuses userinfo, bad ports and characters outside a DNS name.
//!
//! # Why this is our own code
//! No crate does this. `url` implements the WHATWG URL standard, which is a
//! browser's reading, not an origin's: it reads `\` as `/`, clamps `..` at
//! the root, keeps empty segments, recognises `%2e` only inside dot segments
//! and decodes no other escape, and keeps the hex case as written. `http`'s
//! `Uri` only splits the target (and silently drops a `#fragment`).

use std::borrow::Cow;
use std::fmt;
use std::net::Ipv6Addr;

/// Why a path, rule or host was refused. [`Malformed::reason`] is the short
/// text for the 400 `malformed_request` detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Malformed {
    /// The path does not start with `/`, or holds a raw `?` or `#`: the
    /// target is not in origin form (RFC 9112 §3.2.1; `*`, authority-form
    /// and absolute-form are handled, or refused, by the caller).
    NotOriginForm,
    /// A raw `\`: IIS and some frameworks read it as `/`.
    Backslash,
    /// `%5C`: an escaped `\`, read as `/` by the same servers once decoded.
    EncodedBackslash,
    /// A NUL, raw or as `%00`: C code stops reading the path there.
    Nul,
    /// A raw control character, space or DEL.
    Control,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// `%25` followed by the escape of `.`, `/`, `\`, NUL or `;` (such as
    /// `%252e`): an origin stack that decodes twice sees structure there.
    DoubleEncoded,
    /// An escape that starts an overlong UTF-8 sequence (`%C0%AE`,
    /// `%E0%80%AE`): never valid UTF-8, and old decoders (IIS, some JVMs)
    /// read it as `.`, `/` or `\`.
    OverlongUtf8,
    /// A `..` segment that would climb above the root.
    AboveRoot,
    /// A dot segment followed by path parameters (`..;x`, `.;`, `..%3B`):
    /// Tomcat strips the parameters and resolves the dots.
    DotSegmentWithParams,
    /// A `..` that would remove a segment made only of parameters (`;x`):
    /// Tomcat drops such a segment before resolving dots, so it would climb
    /// one level further than every other server.
    ParamsSegmentClimbed,
    /// A configured rule holding path parameters (`;`): rules are compared
    /// with parameters removed from the path, so it could never match.
    RuleHasParams,
    /// An empty host name.
    EmptyHost,
    /// A host with userinfo (`user@host`).
    UserInfo,
    /// A port that is empty, not all digits, or above 65535.
    BadPort,
    /// A host with a character outside a DNS name, an empty label, or an
    /// unbalanced or misplaced bracket.
    BadHost,
    /// A bracketed literal that is not an IPv6 address (IPvFuture and zone
    /// identifiers are refused too).
    BadIpLiteral,
}

impl Malformed {
    /// A short text for the 400 `malformed_request` detail.
    pub fn reason(&self) -> &'static str {
        match self {
            Malformed::NotOriginForm => "request target is not in origin form",
            Malformed::Backslash => "backslash in path",
            Malformed::EncodedBackslash => "encoded backslash in path",
            Malformed::Nul => "NUL in path",
            Malformed::Control => "control character or space in path",
            Malformed::BadEscape => "malformed percent escape in path",
            Malformed::DoubleEncoded => "double percent-encoding in path",
            Malformed::OverlongUtf8 => "overlong UTF-8 escape in path",
            Malformed::AboveRoot => "path climbs above the root",
            Malformed::DotSegmentWithParams => "dot segment with parameters in path",
            Malformed::ParamsSegmentClimbed => "dot segment removes a parameter-only segment",
            Malformed::RuleHasParams => "path rule holds parameters",
            Malformed::EmptyHost => "empty host",
            Malformed::UserInfo => "userinfo in host",
            Malformed::BadPort => "invalid port",
            Malformed::BadHost => "invalid host",
            Malformed::BadIpLiteral => "invalid IP literal in host",
        }
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Malformed {}

// === paths ===

/// A request path, normalised. Both strings start with `/` and hold no
/// query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath<'a> {
    /// What the origin is sent (no query): dot segments removed, slashes
    /// merged, unreserved escapes decoded, other escapes kept with UPPERCASE
    /// hex, bytes not allowed in a path percent-encoded. `%2F` is kept as
    /// `%2F`.
    pub forward: Cow<'a, str>,
    /// What rules are matched on ([`rule_covers`]): `forward` read by an
    /// origin that decodes: `%2F` is a `/` (and dot segments and runs of `/`
    /// are resolved again after that), and every escape of a printable
    /// ASCII character other than `%`, `?` and `#` is decoded (`%3B` is a
    /// `;`). It may hold characters `forward` would escape (`"`, `|`…):
    /// it is for comparing, not for sending.
    pub route: Cow<'a, str>,
    /// The path held an encoded slash (`%2F` or `%2f`), even in a segment a
    /// `..` then removed. Origins disagree on whether it separates
    /// segments: the caller refuses it unless the room opted in.
    pub encoded_slash: bool,
}

/// Normalises `raw`, the path part of an origin-form target (starting with
/// `/`, without the query), or says why it cannot be (see the module doc).
///
/// Fast path: when nothing needs to change (the common case), both fields
/// are `Cow::Borrowed(raw)` and nothing is allocated; one pass over the
/// bytes decides that. Normalising `forward` again gives it back unchanged
/// and borrowed, with the same `route`.
pub fn normalize_path(raw: &str) -> Result<CanonicalPath<'_>, Malformed> {
    if let Some(scan) = scan_canonical(raw.as_bytes()) {
        let route = if scan.route_differs {
            Cow::Owned(route_of(raw)?)
        } else {
            Cow::Borrowed(raw)
        };
        return Ok(CanonicalPath {
            forward: Cow::Borrowed(raw),
            route,
            encoded_slash: scan.encoded_slash,
        });
    }
    let (forward, encoded_slash) = forward_of(raw)?;
    let route = if route_differs(forward.as_bytes()) {
        route_of(&forward)?
    } else {
        forward.clone()
    };
    Ok(CanonicalPath {
        forward: Cow::Owned(forward),
        route: Cow::Owned(route),
        encoded_slash,
    })
}

/// Whether `route` (a [`CanonicalPath::route`]) lies under `rule` (a
/// [`normalize_rule`] output) on whole segments: `Some(score)`, the rule's
/// length, for "most specific wins", or `None`.
///
/// `/tickets` covers `/tickets`, `/tickets/`, `/tickets/1`, and, as each
/// segment of the route is compared with its `;params` removed,
/// `/tickets;jsessionid=x` and `/tickets;a/b`; not `/ticketsx`. A segment
/// that is nothing but parameters counts as empty and merges away, as it
/// does in Tomcat (`/;x/tickets` is `/tickets`). A rule ending in `/`
/// covers what lies under it (`/tickets/` covers `/tickets/` and
/// `/tickets/1`, not `/tickets`); `/` covers every path.
/// `case_insensitive` compares segments ASCII case-insensitively (a room
/// option for case-insensitive origins such as IIS; off by default).
pub fn rule_covers(route: &str, rule: &str, case_insensitive: bool) -> Option<usize> {
    let rest = route.strip_prefix('/')?;
    let rule_body = rule.strip_prefix('/')?;
    if rule_body.is_empty() {
        return Some(rule.len());
    }
    if !case_insensitive && !rest.contains(';') {
        // The common case, as plain prefixes: a canonical route without
        // parameters has no empty segment but a trailing one.
        return match rest.strip_prefix(rule_body) {
            Some(after)
                if rule_body.ends_with('/') || after.is_empty() || after.starts_with('/') =>
            {
                Some(rule.len())
            }
            _ => None,
        };
    }
    let (rule_body, rule_is_dir) = match rule_body.strip_suffix('/') {
        Some(body) => (body, true),
        None => (rule_body, false),
    };
    // The route's segments with parameters removed; empty ones (from
    // `;params` segments) merged away, as a parameter-stripping origin does.
    let mut segments = rest
        .split('/')
        .map(|s| s.split_once(';').map_or(s, |(name, _)| name))
        .peekable();
    for want in rule_body.split('/') {
        loop {
            match segments.next() {
                // Skipped unless it is the last: the route's trailing `/`.
                Some("") if segments.peek().is_some() => continue,
                Some(got) if segment_eq(got, want, case_insensitive) => break,
                _ => return None,
            }
        }
    }
    if !rule_is_dir {
        return Some(rule.len());
    }
    // A directory rule needs something after its last segment, if only the
    // route's trailing `/` (a last segment that is empty, or only params).
    segments.next().map(|_| rule.len())
}

/// A configured path rule normalised the way [`normalize_path`] normalises
/// requests, in the form [`rule_covers`] compares (the `route` form). A rule
/// that is [`Malformed`], or that holds `;` parameters
/// ([`Malformed::RuleHasParams`]), is a configuration error.
pub fn normalize_rule(rule: &str) -> Result<String, Malformed> {
    let path = normalize_path(rule)?;
    if path.route.contains(';') {
        return Err(Malformed::RuleHasParams);
    }
    Ok(path.route.into_owned())
}

fn segment_eq(got: &str, want: &str, case_insensitive: bool) -> bool {
    if case_insensitive {
        // Escapes are uppercase on both sides, so folding ASCII letters
        // cannot make `%` escapes of different bytes meet.
        got.eq_ignore_ascii_case(want)
    } else {
        got == want
    }
}

/// What the one-pass scan found in a path already in canonical form.
struct Scan {
    /// `route` differs from `forward` (a `%2F`, or an escape it decodes).
    route_differs: bool,
    encoded_slash: bool,
}

/// `Some` when `raw` is already a canonical `forward` (nothing to decode,
/// encode, uppercase, merge or resolve, and nothing to refuse); `None` when
/// the slow path must decide. Exact on canonical input, so that normalising
/// an output borrows it (a property test holds it to the slow path).
fn scan_canonical(b: &[u8]) -> Option<Scan> {
    if b.first() != Some(&b'/') {
        return None;
    }
    let mut scan = Scan {
        route_differs: false,
        encoded_slash: false,
    };
    let mut segment_start = 1;
    let mut i = 1;
    while let Some(&c) = b.get(i) {
        match SCAN_CLASS[usize::from(c)] {
            Class::Plain => i += 1,
            Class::Slash => {
                // An empty segment here is a run of slashes.
                let segment = b.get(segment_start..i)?;
                if segment.is_empty() || !plain_segment(segment) {
                    return None;
                }
                segment_start = i + 1;
                i += 1;
            }
            Class::Percent => {
                let v = upper_hex(*b.get(i + 1)?)? << 4 | upper_hex(*b.get(i + 2)?)?;
                if v == 0 || v == b'\\' || is_unreserved(v) || overlong_at(b, i + 3, v) {
                    return None;
                }
                if v == b'/' {
                    scan.encoded_slash = true;
                    scan.route_differs = true;
                } else if route_decodes(v) {
                    scan.route_differs = true;
                } else if v == b'%' && double_encoded_at(b, i + 3) {
                    return None;
                }
                i += 3;
            }
            Class::Other => return None,
        }
    }
    // The last segment may be empty: that is a trailing slash.
    if !plain_segment(b.get(segment_start..)?) {
        return None;
    }
    Some(scan)
}

/// A byte as the fast scan sees it.
#[derive(Clone, Copy)]
enum Class {
    /// A `pchar` kept as written.
    Plain,
    Slash,
    Percent,
    /// Anything the slow path must look at (or refuse).
    Other,
}

/// One lookup per byte on the fast path.
const SCAN_CLASS: [Class; 256] = {
    let mut table = [Class::Other; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        table[i] = if c == b'/' {
            Class::Slash
        } else if c == b'%' {
            Class::Percent
        } else if is_pchar_raw(c) {
            Class::Plain
        } else {
            Class::Other
        };
        i += 1;
    }
    table
};

/// Neither a dot segment nor one with parameters (which the slow path
/// refuses). Exact for canonical input: an escape in other forms (`.%2e`,
/// `.%3b`) sends the scan to the slow path by itself.
fn plain_segment(segment: &[u8]) -> bool {
    match segment {
        b"." | b".." => false,
        [b'.', b'.', rest @ ..] | [b'.', rest @ ..] => {
            !(rest.starts_with(b";") || rest.starts_with(b"%3B"))
        }
        _ => true,
    }
}

/// The slow path for `forward`: a fresh string built segment by segment.
/// Returns it and whether an encoded slash was seen.
fn forward_of(raw: &str) -> Result<(String, bool), Malformed> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(Malformed::NotOriginForm);
    }
    let mut out = Resolver::new(raw.len() + 8);
    let mut encoded_slash = false;
    let mut i = 1;
    loop {
        let start = out.begin();
        while let Some(&c) = b.get(i) {
            if c == b'/' {
                break;
            }
            if c == b'%' {
                let v = escape_at(b, i)?;
                i += 3;
                match v {
                    0 => return Err(Malformed::Nul),
                    b'\\' => return Err(Malformed::EncodedBackslash),
                    v if overlong_at(b, i, v) => return Err(Malformed::OverlongUtf8),
                    b'/' => {
                        encoded_slash = true;
                        out.push_escape(v);
                    }
                    v if is_unreserved(v) => out.push_byte(v),
                    v => out.push_escape(v),
                }
                continue;
            }
            match c {
                0 => return Err(Malformed::Nul),
                b'\\' => return Err(Malformed::Backslash),
                b'?' | b'#' => return Err(Malformed::NotOriginForm),
                0..=0x20 | 0x7F => return Err(Malformed::Control),
                c if is_pchar_raw(c) => out.push_byte(c),
                // `"`, `<`, `>`, `[`, `]`, `^`, `` ` ``, `{`, `|`, `}` and
                // non-ASCII: not allowed in a path, and origins decode the
                // escape to the same byte.
                c => out.push_escape(c),
            }
            i += 1;
        }
        let last = i >= b.len();
        out.end(start, last)?;
        if last {
            break;
        }
        i += 1;
    }
    let forward = out.finish();
    // Checked on the output: `%25%32%65` becomes `%252e` once the
    // unreserved `%32%65` are decoded.
    let bytes = forward.as_bytes();
    if (0..bytes.len())
        .any(|i| bytes.get(i..i + 3) == Some(b"%25") && double_encoded_at(bytes, i + 3))
    {
        return Err(Malformed::DoubleEncoded);
    }
    Ok((forward, encoded_slash))
}

/// `route` from a canonical `forward`: `%2F` splits segments and the
/// escapes [`route_decodes`] names are decoded; then runs of `/` and dot
/// segments are resolved again, with the same refusals.
fn route_of(forward: &str) -> Result<String, Malformed> {
    let b = forward.as_bytes();
    let mut out = Resolver::new(b.len());
    let mut i = 1;
    loop {
        let start = out.begin();
        let mut boundary = false;
        while let Some(&c) = b.get(i) {
            if c == b'/' {
                i += 1;
                boundary = true;
                break;
            }
            if c == b'%' {
                let v = escape_at(b, i)?;
                i += 3;
                if v == b'/' {
                    boundary = true;
                    break;
                }
                if route_decodes(v) {
                    out.push_byte(v);
                } else {
                    out.push_escape(v);
                }
                continue;
            }
            out.push_byte(c);
            i += 1;
        }
        out.end(start, !boundary)?;
        if !boundary {
            break;
        }
    }
    Ok(out.finish())
}

/// Whether a canonical `forward` holds an escape that `route` decodes.
fn route_differs(forward: &[u8]) -> bool {
    (0..forward.len()).any(|i| {
        forward.get(i) == Some(&b'%')
            && escape_at(forward, i).is_ok_and(|v| v == b'/' || route_decodes(v))
    })
}

/// Builds a path segment by segment, resolving dot segments and runs of
/// `/` as each segment ends (RFC 3986 §5.2.4, with "above the root"
/// refused instead of clamped).
struct Resolver {
    out: String,
    /// Where each kept segment starts in `out` (at its `/`).
    starts: Vec<usize>,
    trailing_slash: bool,
}

enum SegmentKind {
    Empty,
    Dot,
    DotDot,
    DotWithParams,
    Plain,
}

impl Resolver {
    fn new(capacity: usize) -> Resolver {
        Resolver {
            out: String::with_capacity(capacity),
            starts: Vec::new(),
            trailing_slash: false,
        }
    }

    /// Starts a segment; returns where it starts.
    fn begin(&mut self) -> usize {
        let start = self.out.len();
        self.out.push('/');
        start
    }

    /// Only ASCII is ever pushed: everything else is escaped.
    fn push_byte(&mut self, c: u8) {
        self.out.push(char::from(c));
    }

    fn push_escape(&mut self, v: u8) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        self.out.push('%');
        self.out.push(char::from(HEX[usize::from(v >> 4)]));
        self.out.push(char::from(HEX[usize::from(v & 15)]));
    }

    /// Ends the segment begun at `start`: keeps it, or drops it and acts on
    /// it if it is empty or a dot segment. `last`: it ends the path.
    fn end(&mut self, start: usize, last: bool) -> Result<(), Malformed> {
        let segment = self.out.get(start + 1..).unwrap_or_default();
        match segment_kind(segment) {
            SegmentKind::Plain => {
                self.starts.push(start);
                return Ok(());
            }
            SegmentKind::DotWithParams => return Err(Malformed::DotSegmentWithParams),
            SegmentKind::Empty | SegmentKind::Dot => self.out.truncate(start),
            SegmentKind::DotDot => {
                self.out.truncate(start);
                let previous = self.starts.pop().ok_or(Malformed::AboveRoot)?;
                if params_only(self.out.get(previous + 1..).unwrap_or_default()) {
                    return Err(Malformed::ParamsSegmentClimbed);
                }
                self.out.truncate(previous);
            }
        }
        // An empty or dot segment at the end leaves the path ending in `/`.
        if last {
            self.trailing_slash = true;
        }
        Ok(())
    }

    fn finish(mut self) -> String {
        if self.trailing_slash || self.out.is_empty() {
            self.out.push('/');
        }
        self.out
    }
}

/// Classifies a segment as written in `forward` or `route` (escapes
/// uppercase; `%3B` counts as `;` so that `..%3B` is caught in `forward`).
fn segment_kind(segment: &str) -> SegmentKind {
    match segment {
        "" => SegmentKind::Empty,
        "." => SegmentKind::Dot,
        ".." => SegmentKind::DotDot,
        _ => {
            let after_dots = segment
                .strip_prefix("..")
                .or_else(|| segment.strip_prefix('.'));
            if after_dots.is_some_and(params_only) {
                SegmentKind::DotWithParams
            } else {
                SegmentKind::Plain
            }
        }
    }
}

/// A segment (or its rest) that starts with parameters: `;x`, `%3Bx`.
fn params_only(segment: &str) -> bool {
    segment.starts_with(';') || segment.starts_with("%3B")
}

/// The byte of the escape at `b[i] == '%'`, any hex case.
fn escape_at(b: &[u8], i: usize) -> Result<u8, Malformed> {
    match (
        b.get(i + 1).copied().and_then(hex),
        b.get(i + 2).copied().and_then(hex),
    ) {
        (Some(h), Some(l)) => Ok(h << 4 | l),
        _ => Err(Malformed::BadEscape),
    }
}

/// An escape of `v`, followed at `i` by what comes next, that starts an
/// overlong UTF-8 sequence: `C0`/`C1` always, `E0` before `80`-`9F`, `F0`
/// before `80`-`8F` (RFC 3629 §3). Latin-1 paths (`%E0` alone is `à`)
/// still pass.
fn overlong_at(b: &[u8], i: usize, v: u8) -> bool {
    let next = || {
        if b.get(i) == Some(&b'%') {
            escape_at(b, i).ok()
        } else {
            None
        }
    };
    match v {
        0xC0 | 0xC1 => true,
        0xE0 => next().is_some_and(|n| (0x80..=0x9F).contains(&n)),
        0xF0 => next().is_some_and(|n| (0x80..=0x8F).contains(&n)),
        _ => false,
    }
}

/// After a `%25` ending at `i`: the escape of `.`, `/`, `\`, NUL or `;`.
fn double_encoded_at(b: &[u8], i: usize) -> bool {
    match (
        b.get(i).copied().and_then(hex),
        b.get(i + 1).copied().and_then(hex),
    ) {
        (Some(h), Some(l)) => matches!(h << 4 | l, b'.' | b'/' | b'\\' | 0 | b';'),
        _ => false,
    }
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Hex digits as the canonical form writes them (lowercase is not).
fn upper_hex(c: u8) -> Option<u8> {
    if c.is_ascii_lowercase() { None } else { hex(c) }
}

/// RFC 3986 §2.3.
const fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

/// A `pchar` (RFC 3986 §3.3) other than a percent escape: kept raw.
const fn is_pchar_raw(c: u8) -> bool {
    is_unreserved(c)
        || matches!(
            c,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// Escapes `route` decodes: printable ASCII except `%` (it would start a
/// new escape), `?` and `#` (they would end the path), `/` (a separator,
/// handled apart) and `\` (refused before).
fn route_decodes(v: u8) -> bool {
    matches!(v, 0x21..=0x7E) && !matches!(v, b'%' | b'?' | b'#' | b'/' | b'\\')
}

// === hosts ===

/// A host, normalised: what a `Host` field or an absolute-form authority
/// names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CanonicalHost {
    /// Lowercase, one trailing dot dropped; an IPv6 literal in brackets, in
    /// its RFC 5952 form (`[fe80::1]`).
    pub name: String,
    /// The port, if one was given.
    pub port: Option<u16>,
}

/// Normalises a `Host` field value or an absolute-form authority
/// (RFC 9112 §3.2.2, RFC 3986 §3.2.2). Refused: empty, userinfo (`@`), a bad
/// port (not digits, above 65535, empty after `:`), whitespace and control
/// characters, an unbalanced bracket, a bracketed literal that is not IPv6,
/// an empty label (`a..b`, `a.b..`), and any character outside
/// `ALPHA DIGIT - . _ ~`. RFC 3986's reg-name also allows escapes and
/// sub-delims; no DNS name holds them, an escape is a second spelling of a
/// name, and a `,` is what two `Host` fields joined look like.
pub fn normalize_host(raw: &str) -> Result<CanonicalHost, Malformed> {
    if raw.is_empty() {
        return Err(Malformed::EmptyHost);
    }
    if raw.bytes().any(|c| c <= b' ' || c >= 0x7F) {
        return Err(Malformed::BadHost);
    }
    if raw.contains('@') {
        return Err(Malformed::UserInfo);
    }
    if let Some(rest) = raw.strip_prefix('[') {
        let (literal, after) = rest.split_once(']').ok_or(Malformed::BadHost)?;
        let addr: Ipv6Addr = literal.parse().map_err(|_| Malformed::BadIpLiteral)?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(
                after.strip_prefix(':').ok_or(Malformed::BadHost)?,
            )?),
        };
        return Ok(CanonicalHost {
            name: format!("[{addr}]"),
            port,
        });
    }
    if raw.contains(['[', ']']) {
        return Err(Malformed::BadHost);
    }
    let (name, port) = match raw.split_once(':') {
        // A second `:` is an unbracketed IPv6 address or garbage.
        Some((_, port)) if port.contains(':') => return Err(Malformed::BadHost),
        Some((name, port)) => (name, Some(parse_port(port)?)),
        None => (raw, None),
    };
    if name.is_empty() {
        return Err(Malformed::EmptyHost);
    }
    if !name.bytes().all(is_unreserved) {
        return Err(Malformed::BadHost);
    }
    // The root label's dot, once: `example.com.` is `example.com`.
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.split('.').any(str::is_empty) {
        return Err(Malformed::BadHost);
    }
    Ok(CanonicalHost {
        name: name.to_ascii_lowercase(),
        port,
    })
}

fn parse_port(s: &str) -> Result<u16, Malformed> {
    // `u16::from_str` would take `+80`; a long run of zeros is still a port
    // but not one any client sends.
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(Malformed::BadPort);
    }
    s.parse().map_err(|_| Malformed::BadPort)
}

impl CanonicalHost {
    /// Same name, and same port once a missing port is read as
    /// `default_port` (the scheme's: 80 for `http`, 443 for `https`).
    pub fn same_host_with_default_port(&self, other: &CanonicalHost, default_port: u16) -> bool {
        self.name == other.name
            && self.port.unwrap_or(default_port) == other.port.unwrap_or(default_port)
    }
}

impl fmt::Display for CanonicalHost {
    /// The `Host` field value: `name` or `name:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    const CASES: u32 = 512;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: CASES,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// `(forward, route or "=" for the same, encoded_slash)`, or the refusal.
    type PathWant = Result<(&'static str, &'static str, bool), Malformed>;
    /// `(name, port)`, or the refusal.
    type HostWant = Result<(&'static str, Option<u16>), Malformed>;

    /// `Ok((forward, route, encoded_slash))` or the refusal.
    fn norm(raw: &str) -> Result<(String, String, bool), Malformed> {
        normalize_path(raw).map(|c| {
            (
                c.forward.into_owned(),
                c.route.into_owned(),
                c.encoded_slash,
            )
        })
    }

    // The `Cow` itself is the point: borrowed, and from this very string.
    #[allow(clippy::ptr_arg)]
    fn is_borrowed_from(cow: &Cow<'_, str>, from: &str) -> bool {
        matches!(cow, Cow::Borrowed(s) if std::ptr::eq(*s, from))
    }

    // === examples ===

    #[test]
    fn bypass_spellings_of_a_guarded_prefix_route_to_it_or_are_refused() {
        use Malformed::*;
        let rule = normalize_rule("/tickets").unwrap();
        let cases: &[(&str, Result<&str, Malformed>)] = &[
            ("//tickets", Ok("/tickets")),
            ("/./tickets", Ok("/tickets")),
            ("/x/../tickets", Ok("/tickets")),
            ("/%74ickets", Ok("/tickets")),
            ("/%74%69%63%6B%65%74%73", Ok("/tickets")),
            ("/robots.txt/../tickets", Ok("/tickets")),
            ("/robots.txt/%2e%2e/tickets", Ok("/tickets")),
            ("/robots.txt/.%2E/tickets", Ok("/tickets")),
            ("/robots.txt%2F..%2Ftickets", Ok("/tickets")),
            ("/tickets;jsessionid=1", Ok("/tickets;jsessionid=1")),
            ("/tickets%3Bjsessionid=1", Ok("/tickets;jsessionid=1")),
            ("/;x/tickets", Ok("/;x/tickets")),
            ("/tickets/", Ok("/tickets/")),
            ("/%2e%2e/tickets", Err(AboveRoot)),
            ("/%2e%2e%2ftickets", Err(AboveRoot)),
            ("/public/..;/tickets", Err(DotSegmentWithParams)),
            ("/public/.;/tickets", Err(DotSegmentWithParams)),
            ("/public/..;x=1/tickets", Err(DotSegmentWithParams)),
            ("/public/..%3B/tickets", Err(DotSegmentWithParams)),
            ("/public/%2e%2e%3b/tickets", Err(DotSegmentWithParams)),
            ("/public%2F..;%2Ftickets", Err(DotSegmentWithParams)),
            ("/public/;x/../tickets", Err(ParamsSegmentClimbed)),
            ("/robots.txt\\..\\tickets", Err(Backslash)),
            ("/robots.txt%5c..%5ctickets", Err(EncodedBackslash)),
            ("/robots.txt/%c0%ae%c0%ae/tickets", Err(OverlongUtf8)),
            ("/tickets%00.txt", Err(Nul)),
            ("/%252e%252e/tickets", Err(DoubleEncoded)),
        ];
        for (raw, want) in cases {
            let got = normalize_path(raw);
            match (want, &got) {
                (Ok(route), Ok(c)) => {
                    assert_eq!(c.route, *route, "{raw:?}");
                    assert!(rule_covers(&c.route, &rule, false).is_some(), "{raw:?}");
                }
                (Err(e), Err(g)) => assert_eq!(e, g, "{raw:?}"),
                _ => panic!("{raw:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn path_examples() {
        use Malformed::*;
        let cases: &[(&str, PathWant)] = &[
            ("/", Ok(("/", "=", false))),
            ("/tickets/123", Ok(("/tickets/123", "=", false))),
            ("/a//b///c", Ok(("/a/b/c", "=", false))),
            ("//", Ok(("/", "=", false))),
            ("/a//", Ok(("/a/", "=", false))),
            ("/a/", Ok(("/a/", "=", false))),
            ("/a/./b", Ok(("/a/b", "=", false))),
            ("/a/b/..", Ok(("/a/", "=", false))),
            ("/a/.", Ok(("/a/", "=", false))),
            ("/a/..", Ok(("/", "=", false))),
            ("/a/b/../../c/", Ok(("/c/", "=", false))),
            ("/%2E", Ok(("/", "=", false))),
            ("/a/%2e%2e/b", Ok(("/b", "=", false))),
            ("/a;x/../b", Ok(("/b", "=", false))),
            ("/...", Ok(("/...", "=", false))),
            ("/a/.../b", Ok(("/a/.../b", "=", false))),
            ("/..a/.b/a..", Ok(("/..a/.b/a..", "=", false))),
            ("/.well-known/acme", Ok(("/.well-known/acme", "=", false))),
            ("/%7E%41%2d%5f%2E7", Ok(("/~A-_.7", "=", false))),
            ("/%c3%a9", Ok(("/%C3%A9", "=", false))),
            ("/caf\u{e9}", Ok(("/caf%C3%A9", "=", false))),
            ("/a%20b", Ok(("/a%20b", "=", false))),
            ("/100%25", Ok(("/100%25", "=", false))),
            ("/100%25a1", Ok(("/100%25a1", "=", false))),
            ("/a%3F", Ok(("/a%3F", "=", false))),
            ("/a%23", Ok(("/a%23", "=", false))),
            ("/a%0d%0a", Ok(("/a%0D%0A", "=", false))),
            ("/a:b@c!$&'()*+,;=", Ok(("/a:b@c!$&'()*+,;=", "=", false))),
            ("/a|b", Ok(("/a%7Cb", "/a|b", false))),
            ("/a%7cb", Ok(("/a%7Cb", "/a|b", false))),
            (
                "/{\"j\":[1]}",
                Ok(("/%7B%22j%22:%5B1%5D%7D", "/{\"j\":[1]}", false)),
            ),
            ("/%40admin", Ok(("/%40admin", "/@admin", false))),
            ("/tickets%3Bx", Ok(("/tickets%3Bx", "/tickets;x", false))),
            ("/a%2fb", Ok(("/a%2Fb", "/a/b", true))),
            ("/a%2F%2Fb", Ok(("/a%2F%2Fb", "/a/b", true))),
            ("/a%2F", Ok(("/a%2F", "/a/", true))),
            ("/a%2F.", Ok(("/a%2F.", "/a/", true))),
            ("/a%2Fb/../c", Ok(("/c", "=", true))),
            ("/a/b%2F..%2Fc", Ok(("/a/b%2F..%2Fc", "/a/c", true))),
            ("/..", Err(AboveRoot)),
            ("/a/../..", Err(AboveRoot)),
            ("/a/b/../../../c", Err(AboveRoot)),
            ("/a/..%2F..%2Fb", Err(AboveRoot)),
            ("/a/.;", Err(DotSegmentWithParams)),
            ("/a/..;", Err(DotSegmentWithParams)),
            ("/a/%2E;x", Err(DotSegmentWithParams)),
            ("/a/;x/../b", Err(ParamsSegmentClimbed)),
            ("/a/%3bx/../b", Err(ParamsSegmentClimbed)),
            ("/a/;x%2F..", Err(ParamsSegmentClimbed)),
            ("/a\\b", Err(Backslash)),
            ("/a%5cb", Err(EncodedBackslash)),
            ("/a%5C", Err(EncodedBackslash)),
            ("/a\0", Err(Nul)),
            ("/a%00", Err(Nul)),
            ("/a%", Err(BadEscape)),
            ("/a%2", Err(BadEscape)),
            ("/a%zz", Err(BadEscape)),
            ("/a%2g", Err(BadEscape)),
            ("/a%%41", Err(BadEscape)),
            ("/..%c0%af../x", Err(OverlongUtf8)),
            ("/%c0%ae%c0%ae/x", Err(OverlongUtf8)),
            ("/%C1%9C", Err(OverlongUtf8)),
            ("/%e0%80%ae", Err(OverlongUtf8)),
            ("/%F0%80%80%AE", Err(OverlongUtf8)),
            ("/%E0%A4%B9%E0", Ok(("/%E0%A4%B9%E0", "=", false))),
            ("/%F0%9F%8E%9F", Ok(("/%F0%9F%8E%9F", "=", false))),
            ("/%u002e%u002e/x", Err(BadEscape)),
            ("/%252E", Err(DoubleEncoded)),
            ("/%252f", Err(DoubleEncoded)),
            ("/%255C", Err(DoubleEncoded)),
            ("/%2500", Err(DoubleEncoded)),
            ("/%253B", Err(DoubleEncoded)),
            ("/%25%32%65", Err(DoubleEncoded)),
            ("/a b", Err(Control)),
            ("/a\tb", Err(Control)),
            ("/a\r\nb", Err(Control)),
            ("/a\u{7f}", Err(Control)),
            ("", Err(NotOriginForm)),
            ("tickets", Err(NotOriginForm)),
            ("*", Err(NotOriginForm)),
            ("http://example.com/tickets", Err(NotOriginForm)),
            ("/a?b", Err(NotOriginForm)),
            ("/a#b", Err(NotOriginForm)),
        ];
        for (raw, want) in cases {
            let want =
                want.map(|(f, r, s)| (f.to_owned(), if r == "=" { f } else { r }.to_owned(), s));
            assert_eq!(norm(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn canonical_paths_are_borrowed_not_copied() {
        for raw in [
            "/",
            "/tickets",
            "/tickets/123/",
            "/.well-known/acme-challenge/x-y_z~",
            "/tickets;jsessionid=1",
            "/a/;x",
            "/caf%C3%A9/a%20b/100%25",
            "/%E0%A4%B9%E0%A4%BF/%F0%9F%8E%9F",
            "/a:b@c!$&'()*+,=",
            "/a/.../..b",
        ] {
            let c = normalize_path(raw).unwrap();
            assert!(is_borrowed_from(&c.forward, raw), "{raw:?}: {c:?}");
            assert!(is_borrowed_from(&c.route, raw), "{raw:?}: {c:?}");
            assert!(!c.encoded_slash);
        }
        // Only `route` needs a copy here.
        let raw = "/a%2Fb";
        let c = normalize_path(raw).unwrap();
        assert!(is_borrowed_from(&c.forward, raw));
        assert!(matches!(c.route, Cow::Owned(ref r) if r == "/a/b"));
        // Lowercase hex is a change.
        assert!(matches!(
            normalize_path("/a%2fb").unwrap().forward,
            Cow::Owned(_)
        ));
    }

    #[test]
    fn rule_examples() {
        let covers =
            |route: &str, rule: &str| rule_covers(route, &normalize_rule(rule).unwrap(), false);
        for route in [
            "/tickets",
            "/tickets/",
            "/tickets/1",
            "/tickets;jsessionid=x",
            "/tickets;a/b",
            "/tickets/;x",
            "/;x/tickets",
            "/;x/;y/tickets/;z/1",
        ] {
            assert_eq!(covers(route, "/tickets"), Some(8), "{route:?}");
        }
        for route in ["/ticketsx", "/ticket", "/", "/x/tickets", "/Tickets", "/;x"] {
            assert_eq!(covers(route, "/tickets"), None, "{route:?}");
        }
        for route in [
            "/tickets/",
            "/tickets/1",
            "/tickets;x/",
            "/tickets/;x",
            "/tickets/1/2",
        ] {
            assert_eq!(covers(route, "/tickets/"), Some(9), "{route:?}");
        }
        for route in ["/tickets", "/tickets;x", "/ticketsx/", "/"] {
            assert_eq!(covers(route, "/tickets/"), None, "{route:?}");
        }
        for route in ["/", "/a", "/;x", "/a/b/"] {
            assert_eq!(covers(route, "/"), Some(1), "{route:?}");
        }
        assert_eq!(covers("/a/b/c", "/a/b"), Some(4));
        assert_eq!(covers("/a/bc", "/a/b"), None);
        // Most specific wins: the longer rule scores higher.
        assert!(covers("/a/b/c", "/a/b") > covers("/a/b/c", "/a"));
        // Case.
        let rule = normalize_rule("/tickets").unwrap();
        assert_eq!(rule_covers("/TICKETS/1", &rule, false), None);
        assert_eq!(rule_covers("/TICKETS/1", &rule, true), Some(8));
        assert_eq!(rule_covers("/Tickets;X", &rule, true), Some(8));
        // Not normalised input is not a route.
        assert_eq!(rule_covers("tickets", &rule, false), None);
    }

    #[test]
    fn rules_are_normalised_like_requests() {
        use Malformed::*;
        let cases: &[(&str, Result<&str, Malformed>)] = &[
            ("/tickets", Ok("/tickets")),
            ("/tickets/", Ok("/tickets/")),
            ("//tickets/./", Ok("/tickets/")),
            ("/a/../b", Ok("/b")),
            ("/%74ickets", Ok("/tickets")),
            ("/%40admin", Ok("/@admin")),
            ("/a|b", Ok("/a|b")),
            ("/caf\u{e9}", Ok("/caf%C3%A9")),
            ("/a%2Fb", Ok("/a/b")),
            ("/", Ok("/")),
            ("/a;b", Err(RuleHasParams)),
            ("/a%3Bb", Err(RuleHasParams)),
            ("tickets", Err(NotOriginForm)),
            ("/..", Err(AboveRoot)),
        ];
        for (rule, want) in cases {
            assert_eq!(normalize_rule(rule).as_deref(), want.as_deref(), "{rule:?}");
        }
        // A request spelled like the rule's raw form matches it.
        let rule = normalize_rule("/a|b").unwrap();
        let c = normalize_path("/a%7Cb/c").unwrap();
        assert_eq!(rule_covers(&c.route, &rule, false), Some(4));
    }

    #[test]
    fn host_examples() {
        use Malformed::*;
        let cases: &[(&str, HostWant)] = &[
            ("example.com", Ok(("example.com", None))),
            ("Example.COM.", Ok(("example.com", None))),
            ("Example.COM.:8080", Ok(("example.com", Some(8080)))),
            ("a.example:443", Ok(("a.example", Some(443)))),
            ("a.example:65535", Ok(("a.example", Some(65535)))),
            ("a.example:080", Ok(("a.example", Some(80)))),
            ("127.0.0.1:80", Ok(("127.0.0.1", Some(80)))),
            ("my_host-1", Ok(("my_host-1", None))),
            ("[::1]:8080", Ok(("[::1]", Some(8080)))),
            ("[FE80::1]", Ok(("[fe80::1]", None))),
            ("[0:0:0:0:0:0:0:1]", Ok(("[::1]", None))),
            (
                "[::FFFF:192.0.2.1]:80",
                Ok(("[::ffff:192.0.2.1]", Some(80))),
            ),
            ("", Err(EmptyHost)),
            (":80", Err(EmptyHost)),
            ("a.example:", Err(BadPort)),
            ("a.example:65536", Err(BadPort)),
            ("a.example:+80", Err(BadPort)),
            ("a.example:8a", Err(BadPort)),
            ("a.example:000080", Err(BadPort)),
            ("[::1]:", Err(BadPort)),
            ("[::1]:99999", Err(BadPort)),
            ("example.com..", Err(BadHost)),
            (".example.com", Err(BadHost)),
            ("a..example", Err(BadHost)),
            (".", Err(BadHost)),
            ("a.example:80:80", Err(BadHost)),
            ("::1", Err(BadHost)),
            ("[::1", Err(BadHost)),
            ("::1]", Err(BadHost)),
            ("[::1]x", Err(BadHost)),
            ("[::1]]", Err(BadHost)),
            ("a[b]", Err(BadHost)),
            ("exa mple.com", Err(BadHost)),
            (" example.com", Err(BadHost)),
            ("example.com\r", Err(BadHost)),
            ("example.com\0", Err(BadHost)),
            ("a.example,b.example", Err(BadHost)),
            ("ex%41mple.com", Err(BadHost)),
            ("ex\u{e4}mple.com", Err(BadHost)),
            ("example.com/", Err(BadHost)),
            ("example.com\\", Err(BadHost)),
            ("user@example.com", Err(UserInfo)),
            ("user:pw@example.com:80", Err(UserInfo)),
            ("[zz]", Err(BadIpLiteral)),
            ("[]", Err(BadIpLiteral)),
            ("[127.0.0.1]", Err(BadIpLiteral)),
            ("[fe80::1%25eth0]", Err(BadIpLiteral)),
            ("[v1.fe]", Err(BadIpLiteral)),
        ];
        for (raw, want) in cases {
            let got = normalize_host(raw).map(|h| (h.name, h.port));
            let want = want.map(|(n, p)| (n.to_owned(), p));
            assert_eq!(got, want, "{raw:?}");
        }
    }

    #[test]
    fn hosts_compare_by_name_and_port() {
        let h = |s: &str| normalize_host(s).unwrap();
        assert_eq!(h("Example.com."), h("example.COM"));
        assert_eq!(h("example.com:443"), h("EXAMPLE.com:443"));
        assert_ne!(h("example.com"), h("example.com:443"));
        assert_ne!(h("example.com:80"), h("example.com:8080"));
        assert_ne!(h("example.com"), h("example.org"));
        assert!(h("example.com").same_host_with_default_port(&h("example.com:443"), 443));
        assert!(!h("example.com").same_host_with_default_port(&h("example.com:443"), 80));
        assert_eq!(h("[0::1]:80"), h("[::1]:80"));
        assert_eq!(h("[::1]:80").to_string(), "[::1]:80");
        assert_eq!(h("Example.com.").to_string(), "example.com");
    }

    #[test]
    fn reasons_are_distinct_and_short() {
        use Malformed::*;
        let all = [
            NotOriginForm,
            Backslash,
            EncodedBackslash,
            Nul,
            Control,
            BadEscape,
            DoubleEncoded,
            OverlongUtf8,
            AboveRoot,
            DotSegmentWithParams,
            ParamsSegmentClimbed,
            RuleHasParams,
            EmptyHost,
            UserInfo,
            BadPort,
            BadHost,
            BadIpLiteral,
        ];
        let reasons: std::collections::HashSet<_> = all.iter().map(Malformed::reason).collect();
        assert_eq!(reasons.len(), all.len());
        assert!(reasons.iter().all(|r| r.len() < 60));
        assert_eq!(AboveRoot.to_string(), AboveRoot.reason());
    }

    /// What `http::Uri` (as hyper hands it over) gives this module: the
    /// caller must refuse or handle these forms before or through it.
    #[test]
    fn http_uri_paths_as_the_caller_sees_them() {
        let path = |t: &str| t.parse::<http::Uri>().unwrap().path().to_owned();
        // asterisk-form and authority-form: not origin form.
        assert_eq!(normalize_path(&path("*")), Err(Malformed::NotOriginForm));
        assert_eq!(
            normalize_path(&path("example.com:443")),
            Err(Malformed::NotOriginForm)
        );
        // absolute-form: the path is there (the authority is the caller's).
        assert_eq!(norm(&path("http://Example.com/a/../b?q")).unwrap().0, "/b");
        // a fragment is dropped by `http` before we see it.
        assert_eq!(path("/robots.txt#/../tickets"), "/robots.txt");
        // the query is not part of `path()`.
        assert_eq!(path("/a/./b?x=/../c"), "/a/./b");
    }

    // === properties ===

    /// A model of a permissive origin: decode every escape, read `\` as
    /// `/`, strip `;params` from each segment, merge slashes, resolve dot
    /// segments clamping at the root. Bytes, since decoding may leave
    /// UTF-8.
    fn origin_model(target: &str) -> Vec<u8> {
        let b = target.as_bytes();
        let mut decoded = Vec::with_capacity(b.len());
        let mut i = 0;
        while let Some(&c) = b.get(i) {
            if c == b'%'
                && let Ok(v) = escape_at(b, i)
            {
                decoded.push(v);
                i += 3;
                continue;
            }
            decoded.push(if c == b'\\' { b'/' } else { c });
            i += 1;
        }
        let body = decoded.strip_prefix(b"/").unwrap_or(&decoded);
        let segments: Vec<&[u8]> = body.split(|&c| c == b'/').collect();
        let mut stack: Vec<&[u8]> = Vec::new();
        let mut trailing = false;
        for (n, segment) in segments.iter().enumerate() {
            let last = n + 1 == segments.len();
            let name = segment.split(|&c| c == b';').next().unwrap_or_default();
            match name {
                b"" | b"." => trailing = last,
                b".." => {
                    stack.pop();
                    trailing = last;
                }
                _ => stack.push(name),
            }
        }
        let mut out = Vec::new();
        for s in &stack {
            out.push(b'/');
            out.extend_from_slice(s);
        }
        if trailing || out.is_empty() {
            out.push(b'/');
        }
        out
    }

    /// The model's "lies under": whole segments, as [`rule_covers`] means.
    fn model_covers(path: &[u8], rule: &[u8], case_insensitive: bool) -> bool {
        let fold = |s: &[u8]| {
            if case_insensitive {
                s.to_ascii_lowercase()
            } else {
                s.to_vec()
            }
        };
        let (path, rule) = (fold(path), fold(rule));
        if rule == b"/" || rule.ends_with(b"/") {
            return path.starts_with(&rule);
        }
        path == rule || (path.starts_with(&rule) && path.get(rule.len()) == Some(&b'/'))
    }

    const RULES: &[&str] = &[
        "/", "/a", "/a/", "/A", "/b", "/a/b", "/a/b/", "/ab", "/a%20", "/%C3%A9", "/a|", "/@",
        "/a/a", "/b/a", "/~", "/-/",
    ];

    fn rules() -> Vec<String> {
        RULES.iter().map(|r| normalize_rule(r).unwrap()).collect()
    }

    /// The checks every accepted path passes, whatever made it: idempotence
    /// (borrowed), the fast path agreeing with the slow one, and `route`
    /// being its own route.
    fn check_canonical(c: &CanonicalPath<'_>) -> Result<(), TestCaseError> {
        let again = normalize_path(&c.forward).unwrap();
        prop_assert!(is_borrowed_from(&again.forward, &c.forward), "{:?}", c);
        prop_assert_eq!(&again.route, &c.route);
        prop_assert_eq!(again.encoded_slash, c.forward.contains("%2F"));
        let (slow_forward, _) = forward_of(&c.forward).unwrap();
        prop_assert_eq!(&slow_forward, &c.forward);
        let slow_route = route_of(&c.forward).unwrap();
        prop_assert_eq!(&slow_route, &c.route);
        let of_route = normalize_path(&c.route).unwrap();
        prop_assert_eq!(&of_route.route, &c.route);
        prop_assert!(!of_route.encoded_slash);
        Ok(())
    }

    /// Tiny deterministic chooser fed by proptest's bytes.
    struct Picks<'a>(std::iter::Cycle<std::slice::Iter<'a, u8>>);

    impl Picks<'_> {
        fn below(&mut self, n: u8) -> u8 {
            self.0.next().copied().unwrap_or(0) % n
        }
        fn coin(&mut self) -> bool {
            self.below(2) == 0
        }
    }

    fn escape(c: u8, lower: bool) -> String {
        let s = format!("%{c:02X}");
        if lower { s.to_ascii_lowercase() } else { s }
    }

    fn dot(p: &mut Picks<'_>) -> &'static str {
        [".", "%2e", "%2E"][usize::from(p.below(3))]
    }

    /// Another spelling of a canonical segment, which every origin that
    /// decodes reads the same. `reserved`: may encode sub-delims too
    /// (changes `forward`, not `route`).
    fn respell_segment(segment: &str, p: &mut Picks<'_>, reserved: bool) -> String {
        let b = segment.as_bytes();
        let mut out = String::new();
        let mut i = 0;
        while let Some(&c) = b.get(i) {
            if c == b'%' {
                let esc = &segment[i..i + 3];
                out.push_str(&if p.coin() {
                    esc.to_ascii_lowercase()
                } else {
                    esc.to_owned()
                });
                i += 3;
                continue;
            }
            let encode = if is_unreserved(c) {
                p.below(3) == 0
            } else {
                reserved && p.coin()
            };
            if encode {
                out.push_str(&escape(c, p.coin()));
            } else {
                out.push(char::from(c));
            }
            i += 1;
        }
        out
    }

    fn respell(segments: &[String], trailing: bool, p: &mut Picks<'_>, reserved: bool) -> String {
        let mut out = String::from("/");
        let n = segments.len();
        for i in 0..=n {
            // Insertions that resolve to nothing, at a place where a
            // segment starts (or at the end, when the path ends in `/`).
            if i < n || trailing || n == 0 {
                for _ in 0..p.below(3) {
                    match p.below(4) {
                        0 => out.push('/'),
                        1 => {
                            out.push_str(dot(p));
                            out.push('/');
                        }
                        2 => {
                            out.push_str(if p.coin() { "junk" } else { "j%2E;p=1" });
                            out.push('/');
                            out.push_str(dot(p));
                            out.push_str(dot(p));
                            out.push('/');
                        }
                        _ => {}
                    }
                }
            }
            if let Some(segment) = segments.get(i) {
                out.push_str(&respell_segment(segment, p, reserved));
                if i + 1 < n || trailing {
                    out.push('/');
                }
            }
        }
        out
    }

    fn segment_strategy() -> impl Strategy<Value = String> {
        let atom = prop::sample::select(vec![
            "a", "b", "Z", "0", "9", "-", ".", "_", "~", "%20", "%C3%A9", "!", "+", "@", ":", "=",
        ]);
        let params = prop::sample::select(vec!["", "", "", ";", ";jsessionid=1", ";v=1.2"]);
        (prop::collection::vec(atom, 0..5), params)
            .prop_map(|(atoms, params)| format!("{}{params}", atoms.concat()))
            .prop_filter("a plain, non-empty segment", |s| {
                !s.is_empty() && matches!(segment_kind(s), SegmentKind::Plain)
            })
    }

    const TOKENS: &[&str] = &[
        "/",
        "/",
        "/",
        "//",
        "a",
        "b",
        "A",
        "1",
        "-",
        "~",
        ".",
        "..",
        "%2e",
        "%2E",
        "%2e%2e",
        "%2F",
        "%2f",
        "%5C",
        "\\",
        ";",
        ";x=1",
        "%3B",
        "%3b",
        "%41",
        "%61",
        "%20",
        "%c3%a9",
        "\u{e9}",
        "|",
        "%7c",
        "%25",
        "%252e",
        "%",
        "%0",
        "%00",
        "@",
        "%40",
        "!",
        "%21",
        "..;",
        ".;",
        "?",
        " ",
        "%c0%ae",
        "%E0",
        "%e0%a4%b9",
        "%80",
    ];

    /// Raw targets made of segments rich in what origins disagree on:
    /// dots (raw and encoded), parameters (raw and `%3B`), encoded slashes
    /// and backslashes, bad and double escapes, bytes to encode.
    fn raw_target_strategy() -> impl Strategy<Value = String> {
        let segment = prop_oneof![
            4 => prop::sample::select(vec!["a", "b", "A", "ab"]).prop_map(str::to_owned),
            3 => prop::sample::select(vec![".", "..", "%2e", "%2E%2e", ".%2E"]).prop_map(str::to_owned),
            3 => prop::sample::select(vec![";", ";x=1", "%3B", "a;x", "%3bx", "b%3B"]).prop_map(str::to_owned),
            1 => Just(String::new()),
            4 => prop::collection::vec(prop::sample::select(TOKENS), 1..4).prop_map(|t| t.concat()),
        ];
        (prop::collection::vec(segment, 0..7), any::<bool>()).prop_map(|(segments, trailing)| {
            format!("/{}{}", segments.join("/"), if trailing { "/" } else { "" })
        })
    }

    proptest! {
        #![proptest_config(config())]

        /// One path, every spelling: what an origin resolves to the same
        /// path routes (and forwards) the same.
        #[test]
        fn one_path_every_spelling(
            segments in prop::collection::vec(segment_strategy(), 0..5),
            trailing in any::<bool>(),
            reserved in any::<bool>(),
            picks in prop::collection::vec(any::<u8>(), 1..64),
        ) {
            let trailing = trailing || segments.is_empty();
            let canonical = format!("/{}{}", segments.join("/"), if trailing && !segments.is_empty() { "/" } else { "" });
            let canon = normalize_path(&canonical).unwrap();
            prop_assert!(is_borrowed_from(&canon.forward, &canonical), "{:?}", canon);
            let spelled = respell(&segments, trailing, &mut Picks(picks.iter().cycle()), reserved);
            let c = normalize_path(&spelled).map_err(|e| TestCaseError::fail(format!("{spelled:?}: {e}")))?;
            prop_assert_eq!(&c.route, &canon.route, "{:?}", spelled);
            if !reserved {
                prop_assert_eq!(&c.forward, &canon.forward, "{:?}", spelled);
            }
            check_canonical(&c)?;
            // Rules: the fixed set, and every prefix of the path itself
            // (which must cover it).
            let mut own = Vec::new();
            let names: Vec<&str> = segments.iter().map(|s| s.split(';').next().unwrap_or_default()).collect();
            for k in 1..=names.len() {
                if names[..k].iter().all(|n| !n.is_empty()) {
                    let prefix = format!("/{}", names[..k].join("/"));
                    own.push(normalize_rule(&prefix).unwrap());
                    if k < names.len() || trailing {
                        own.push(normalize_rule(&format!("{prefix}/")).unwrap());
                    }
                }
            }
            for rule in &own {
                prop_assert!(rule_covers(&c.route, rule, false).is_some(), "{:?} under {:?}", c.route, rule);
            }
            for rule in rules().iter().chain(&own) {
                for ci in [false, true] {
                    prop_assert_eq!(rule_covers(&c.route, rule, ci), rule_covers(&canon.route, rule, ci));
                }
            }
        }

        /// Origin model agrees: we never forward what a permissive origin
        /// reads as another path than the raw target, and the rules decide
        /// on the path that origin serves.
        #[test]
        fn origin_model_agrees(raw in raw_target_strategy()) {
            if let Ok(c) = normalize_path(&raw) {
                let served = origin_model(&c.forward);
                if !c.encoded_slash {
                    prop_assert_eq!(origin_model(&raw), served.clone(), "{:?} -> {:?}", raw, c.forward);
                }
                for rule in rules() {
                    for ci in [false, true] {
                        prop_assert_eq!(
                            rule_covers(&c.route, &rule, ci).is_some(),
                            model_covers(&served, &origin_model(&rule), ci),
                            "{:?} -> {:?} / {:?}, rule {:?}", raw, c.forward, c.route, rule
                        );
                    }
                }
                check_canonical(&c)?;
            }
        }

        /// Idempotence and fast/slow agreement on arbitrary text, and no
        /// panic anywhere.
        #[test]
        fn idempotent_on_anything(raw in "/[a-zA-Z0-9./;%2eEfF5cC\\\\|é~ -]{0,24}") {
            if let Ok(c) = normalize_path(&raw) {
                check_canonical(&c)?;
            }
        }

        #[test]
        fn never_panics(raw in any::<String>()) {
            let _ = normalize_path(&raw);
            let _ = normalize_rule(&raw);
            if let Ok(h) = normalize_host(&raw) {
                prop_assert_eq!(normalize_host(&h.to_string()), Ok(h));
            }
            let _ = rule_covers(&raw, "/a", true);
            let _ = rule_covers("/a", &raw, false);
        }
    }
}
