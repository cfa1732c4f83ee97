//! What the property drivers of categories and waves expect of a hold the
//! store may have forgotten: a released or lapsed hold is kept for the
//! released retention ([`crate::Retention`]), counted from its release or
//! from its deadline, then a release or a payment of it answers "not
//! found". Virtual time passes ten minutes in a few steps of waves.

use super::Harness;

/// A hold's status in a driver's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Held,
    Confirmed,
    Released,
    Expired,
}

/// How an ended hold's record stands against its retention.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    Yes,
    /// Within a second of its end of retention: either answer is right
    /// (real time's slack).
    Either,
    Gone,
}

/// Whether the store still keeps a hold of `status` at `now`: `deadline_ms`
/// its deadline, `released_ms` when a release or a failed payment ended
/// it (the store's clock). A confirmed hold's retention is months, beyond
/// any case.
pub(crate) fn kept(
    h: &Harness,
    status: St,
    deadline_ms: u64,
    released_ms: Option<u64>,
    now: u64,
) -> Kept {
    let keep = u64::try_from(h.retention.released.as_millis()).unwrap_or(u64::MAX);
    let forgotten_at = match status {
        St::Released => released_ms.map(|at| at.saturating_add(keep)),
        St::Expired => Some(deadline_ms.saturating_add(keep)),
        St::Held | St::Confirmed => None,
    };
    match forgotten_at {
        Some(at) if now > at.saturating_add(1_000) => Kept::Gone,
        Some(at) if now.saturating_add(1_000) >= at => Kept::Either,
        _ => Kept::Yes,
    }
}

/// Whether an answer to a release or a payment is right: the model's
/// while the record is kept, "not found" (`forgotten`) once it may be
/// gone.
pub(crate) fn answer_stands(kept: Kept, as_expected: bool, forgotten: bool) -> bool {
    match kept {
        Kept::Yes => as_expected,
        Kept::Either => as_expected || forgotten,
        Kept::Gone => forgotten,
    }
}
