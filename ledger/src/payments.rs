//! Payments reconciled: the payment provider's own list of payment events
//! against the holds the ledger recorded.
//!
//! A webhook lost on its way (the provider charged, the gateway never
//! heard) leaves a paid hold that lapses and goes back on sale; a webhook
//! that arrives after the hold lapsed is refused by the store. Either way
//! the money and the sale disagree, and only the provider's list shows it.
//! Each provider event is classified ([`classify`]) against the ledger's
//! row of its hold; nothing is changed anywhere: a paid hold that lapsed is
//! a refund to report, never a sale (the units may be sold again already).

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::store::Ledger;

/// One payment event as the provider lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderPayment {
    /// The provider's event id (the webhook's `payment_event_id`).
    pub payment_event_id: String,
    /// The hold it paid for.
    pub hold_id: String,
    /// `succeeded` or `failed`.
    pub outcome: String,
}

/// What one provider event means, against the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// Paid, and the hold is confirmed by this very payment: in order.
    Settled,
    /// Failed, and no sale was made of it: in order.
    NoSale,
    /// Paid, but the hold lapsed or was released before the payment
    /// arrived: refund the buyer (never a sale).
    Refund {
        /// The hold's state in the ledger.
        status: String,
    },
    /// Paid, but the hold was confirmed by another payment event: charged
    /// twice, refund this one.
    DoubleCharge {
        /// The payment that confirmed the hold.
        confirmed_by: String,
    },
    /// Paid, and the hold is still open: the webhook did not arrive (yet).
    /// Send it again before the deadline, or refund after it.
    WebhookMissing,
    /// The ledger has no such hold (not recorded yet: the ledger's lag; or
    /// not ours).
    UnknownHold,
    /// Failed at the provider, yet the ledger has the hold confirmed by
    /// this id: investigate.
    Inconsistent {
        /// The hold's state in the ledger.
        status: String,
    },
}

impl Finding {
    /// Whether an operator has something to do.
    pub fn needs_action(&self) -> bool {
        !matches!(self, Finding::Settled | Finding::NoSale)
    }
}

/// Classifies one provider event against the ledger's row of its hold:
/// `(status, payment_event_id)`, `None` when the ledger has no such hold.
pub fn classify(p: &ProviderPayment, hold: Option<(&str, Option<&str>)>) -> Finding {
    let succeeded = p.outcome == "succeeded";
    let Some((status, paid_by)) = hold else {
        return if succeeded {
            Finding::UnknownHold
        } else {
            Finding::NoSale
        };
    };
    let by_this = paid_by == Some(p.payment_event_id.as_str());
    match (succeeded, status) {
        (true, "confirmed") if by_this => Finding::Settled,
        (true, "confirmed") => Finding::DoubleCharge {
            confirmed_by: paid_by.unwrap_or("").to_owned(),
        },
        (true, "held") => Finding::WebhookMissing,
        (true, s) => Finding::Refund {
            status: s.to_owned(),
        },
        (false, "confirmed") if by_this => Finding::Inconsistent {
            status: status.to_owned(),
        },
        (false, _) => Finding::NoSale,
    }
}

impl Ledger {
    /// Classifies each of the provider's payment events against the holds
    /// recorded; returns them with their finding, in the order given.
    pub async fn reconcile_payments(
        &self,
        payments: &[ProviderPayment],
    ) -> Result<Vec<(ProviderPayment, Finding)>> {
        let ids: Vec<&str> = payments.iter().map(|p| p.hold_id.as_str()).collect();
        let rows = self
            .client()
            .query(
                "SELECT hold_id, status, payment_event_id FROM holds
                 WHERE hold_id = ANY($1::text[])",
                &[&ids],
            )
            .await?;
        let holds: std::collections::HashMap<String, (String, Option<String>)> = rows
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        Ok(payments
            .iter()
            .map(|p| {
                let h = holds
                    .get(&p.hold_id)
                    .map(|(s, by)| (s.as_str(), by.as_deref()));
                (p.clone(), classify(p, h))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paid(outcome: &str) -> ProviderPayment {
        ProviderPayment {
            payment_event_id: "pe1".into(),
            hold_id: "demo.h".into(),
            outcome: outcome.into(),
        }
    }

    #[test]
    fn each_case_is_named() {
        let ok = paid("succeeded");
        assert_eq!(
            classify(&ok, Some(("confirmed", Some("pe1")))),
            Finding::Settled
        );
        assert_eq!(
            classify(&ok, Some(("confirmed", Some("pe0")))),
            Finding::DoubleCharge {
                confirmed_by: "pe0".into()
            }
        );
        assert_eq!(classify(&ok, Some(("held", None))), Finding::WebhookMissing);
        assert_eq!(
            classify(&ok, Some(("expired", None))),
            Finding::Refund {
                status: "expired".into()
            }
        );
        assert_eq!(classify(&ok, None), Finding::UnknownHold);
        let failed = paid("failed");
        assert_eq!(
            classify(&failed, Some(("released", Some("pe1")))),
            Finding::NoSale
        );
        assert_eq!(classify(&failed, None), Finding::NoSale);
        assert!(classify(&failed, Some(("confirmed", Some("pe1")))).needs_action());
        assert!(!Finding::Settled.needs_action());
    }
}
