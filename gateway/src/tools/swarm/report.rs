//! What the run found: the verdict ([`Report::violations`], exit status 3
//! when any), the human table and the JSON object, and the progress bar
//! shown on a terminal while the crowd runs.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use super::Settings;
use super::client::{Endpoint, Stats};
use super::ledger::Ledger;
use super::visitor::EventInfo;

/// Everything the run counted, for the verdict and the two renderings.
pub(super) struct Report {
    pub(super) s: Settings,
    pub(super) stopped_by: &'static str,
    pub(super) elapsed: Duration,
    pub(super) started: u64,
    pub(super) finished: u64,
    pub(super) joined: u64,
    pub(super) admitted: u64,
    pub(super) sold_out: u64,
    pub(super) failed: u64,
    pub(super) event: Option<EventInfo>,
    pub(super) stock_before: Option<Value>,
    pub(super) stock: Option<Value>,
    pub(super) ledger: Ledger,
    pub(super) stats: Stats,
    /// Kendall's tau between arrival and admission order (module
    /// `fairness`).
    pub(super) fairness: Value,
}

/// Per endpoint: the count, p50, p99 and max latency in ms (to 0.01 ms).
fn latency_json(stats: &Stats) -> Value {
    let mut m = Map::new();
    for ep in Endpoint::ALL {
        let Some(h) = stats.latency_us.get(ep.name()) else {
            continue;
        };
        let ms = |us: u64| (us as f64 / 10.0).round() / 100.0;
        m.insert(
            ep.name().into(),
            json!({
                "count": h.len(),
                "p50_ms": ms(h.value_at_quantile(0.5)),
                "p99_ms": ms(h.value_at_quantile(0.99)),
                "max_ms": ms(h.max()),
            }),
        );
    }
    Value::Object(m)
}

impl Report {
    fn total(&self) -> Option<u64> {
        self.event
            .as_ref()
            .map(|e| e.total)
            .or_else(|| self.stock.as_ref().and_then(|s| s["total"].as_u64()))
    }

    /// Units held at one moment beyond the stock, as the answers show.
    fn oversold_by_answers(&self) -> u64 {
        self.total()
            .map_or(0, |t| self.ledger.peak_outstanding.saturating_sub(t))
    }

    /// `held + confirmed` beyond `total` in the store's own view.
    fn oversold_by_stock(&self) -> u64 {
        let Some(s) = &self.stock else { return 0 };
        let (Some(t), Some(h), Some(c)) = (
            s["total"].as_u64(),
            s["held"].as_u64(),
            s["confirmed"].as_u64(),
        ) else {
            return 0;
        };
        (h + c).saturating_sub(t)
    }

    fn oversold(&self) -> u64 {
        self.oversold_by_answers().max(self.oversold_by_stock())
    }

    /// Per category of the event: its total and cart limit, the peak of
    /// units outstanding in it by the answers, what the store says is held
    /// and sold in it, the overselling either way, units confirmed, and
    /// visitors above its cart limit. Empty without categories.
    fn categories(&self) -> Vec<Value> {
        let Some(e) = &self.event else {
            return Vec::new();
        };
        let l = &self.ledger;
        let store_cats = self
            .stock
            .as_ref()
            .and_then(|s| s["categories"].as_array().cloned())
            .unwrap_or_default();
        e.categories
            .iter()
            .map(|c| {
                let peak = l.peak_by_category.get(&c.id).copied().unwrap_or(0);
                let store = store_cats.iter().find(|s| s["id"] == c.id.as_str());
                let by_stock = store.and_then(|s| {
                    let (t, h, k) = (
                        s["total"].as_u64()?,
                        s["held"].as_u64()?,
                        s["confirmed"].as_u64()?,
                    );
                    Some((h + k).saturating_sub(t))
                });
                let by_answers = peak.saturating_sub(c.total);
                json!({
                    "id": c.id,
                    "total": c.total,
                    "cart_limit": c.cart_limit,
                    "peak_units_outstanding": peak,
                    "units_confirmed": l.confirmed_by_category.get(&c.id).copied().unwrap_or(0),
                    "oversold": by_answers.max(by_stock.unwrap_or(0)),
                    "oversold_by_answers": by_answers,
                    "oversold_by_stock": by_stock,
                    "above_cart_limit": l.above_category_limit.get(&c.id).copied().unwrap_or(0),
                    "stock": store.map(|s| json!({
                        "total": s["total"],
                        "available": s["available"],
                        "held": s["held"],
                        "confirmed": s["confirmed"],
                    })),
                })
            })
            .collect()
    }

    fn invariant_holds(&self) -> Option<bool> {
        self.stock
            .as_ref()
            .and_then(|s| s["invariant_holds"].as_bool())
    }

    /// What makes the run a failure (exit status 3).
    pub(super) fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.oversold() > 0 {
            v.push(format!("oversold {} unit(s)", self.oversold()));
        }
        if self.ledger.above_cart_limit > 0 {
            v.push(format!(
                "{} visitor(s) above the cart limit",
                self.ledger.above_cart_limit
            ));
        }
        if self.ledger.idempotency_mismatches > 0 {
            v.push(format!(
                "{} idempotent replay(s) returned another hold",
                self.ledger.idempotency_mismatches
            ));
        }
        if self.invariant_holds() == Some(false) {
            v.push("the store's stock invariant does not hold".into());
        }
        for c in self.categories() {
            let id = c["id"].as_str().unwrap_or("?");
            if let Some(n) = c["oversold"].as_u64().filter(|n| *n > 0) {
                v.push(format!("category {id} oversold {n} unit(s)"));
            }
            if let Some(n) = c["above_cart_limit"].as_u64().filter(|n| *n > 0) {
                v.push(format!("{n} visitor(s) above category {id}'s cart limit"));
            }
        }
        v
    }

    fn latency(&self) -> Value {
        latency_json(&self.stats)
    }

    fn units_left_to_expire(&self) -> u64 {
        let l = &self.ledger;
        l.units_held
            .saturating_sub(l.units_confirmed + l.units_released + l.units_lapsed_before_payment)
    }

    pub(super) fn to_json(&self) -> Value {
        let l = &self.ledger;
        let st = &self.stats;
        let stock = |s: &Option<Value>| {
            s.as_ref().map(|s| {
                json!({
                    "total": s["total"],
                    "available": s["available"],
                    "held": s["held"],
                    "confirmed": s["confirmed"],
                    "invariant_holds": s["invariant_holds"],
                    "categories": s.get("categories"),
                })
            })
        };
        json!({
            "urls": self.s.bases,
            "room": self.s.room,
            "event": self.s.event,
            "seed": self.s.seed,
            "stopped_by": self.stopped_by,
            "elapsed_seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "visitors": self.s.visitors,
            "started": self.started,
            "finished": self.finished,
            "unfinished": self.started - self.finished,
            "joined": self.joined,
            "admitted": self.admitted,
            "sold_out_visitors": self.sold_out,
            "failed_visitors": self.failed,
            "total": self.total(),
            "cart_limit": self.event.as_ref().map(|e| e.cart_limit),
            "categories": self.categories(),
            "holds": l.holds,
            "units_held": l.units_held,
            "units_confirmed": l.units_confirmed,
            "units_released": l.units_released,
            "units_lapsed_before_payment": l.units_lapsed_before_payment,
            "units_left_to_expire": self.units_left_to_expire(),
            "peak_units_outstanding": l.peak_outstanding,
            "stock_before": stock(&self.stock_before),
            "stock": stock(&self.stock),
            "oversold": self.oversold(),
            "oversold_by_answers": self.oversold_by_answers(),
            "oversold_by_stock": self.oversold_by_stock(),
            "above_cart_limit": l.above_cart_limit,
            "idempotency_mismatches": l.idempotency_mismatches,
            "errors": st.errors,
            "http_errors": st.http_errors.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
            "transport_errors": st.transport_errors,
            "requests": st.requests,
            "requests_per_sec": (st.requests as f64 / self.elapsed.as_secs_f64().max(1e-3) * 10.0).round() / 10.0,
            "latency_ms": self.latency(),
            "fairness": self.fairness,
            "ok": self.violations().is_empty(),
        })
    }

    pub(super) fn table(&self) -> String {
        let v = self.to_json();
        let mut s = String::new();
        s.push_str(&format!(
            "sluice swarm: {} room {} event {} — {} after {:.1}s, {} requests ({}/s)\n",
            self.s.bases.join(" "),
            self.s.room,
            self.s.event,
            if self.stopped_by == "done" {
                "all visitors done"
            } else {
                "stopped by --duration"
            },
            self.elapsed.as_secs_f64(),
            v["requests"],
            v["requests_per_sec"],
        ));
        line(
            &mut s,
            "visitors",
            format!(
                "{} ({} started, {} unfinished, {} sold out, {} failed)",
                self.s.visitors, self.started, v["unfinished"], self.sold_out, self.failed
            ),
        );
        line(
            &mut s,
            "joined / admitted",
            format!("{} / {}", self.joined, self.admitted),
        );
        line(
            &mut s,
            "fairness (Kendall tau)",
            match self.fairness["kendall_tau"].as_f64() {
                Some(t) => format!(
                    "{t:.6} over {} admitted (join order against place)",
                    self.fairness["visitors"]
                ),
                None => match self.fairness["admission"].as_str() {
                    Some(why) if why.starts_with("not measured") => format!("n/a ({why})"),
                    _ => "n/a (fewer than two admitted)".into(),
                },
            },
        );
        if let Some(lanes) = self.fairness["lanes"].as_object() {
            for (id, l) in lanes {
                line(
                    &mut s,
                    &format!("  in lane {id}"),
                    match l["kendall_tau"].as_f64() {
                        Some(t) => format!("{t:.6} over {} admitted", l["visitors"]),
                        None => format!("n/a ({} admitted)", l["visitors"]),
                    },
                );
            }
        }
        self.table_stock(&mut s, &v);
        self.table_errors(&mut s, &v);
        s.push_str(&format!(
            "  verdict                 {}\n",
            match self.violations() {
                v if v.is_empty() => "ok".to_owned(),
                v => format!("FAILED: {}", v.join("; ")),
            }
        ));
        s
    }

    /// The table's lines on the stock: holds, units, the event, the store's
    /// view, overselling and the cart limit.
    fn table_stock(&self, s: &mut String, v: &Value) {
        let l = &self.ledger;
        line(
            s,
            "holds (201)",
            format!("{} for {} unit(s)", l.holds, l.units_held),
        );
        line(
            s,
            "units",
            format!(
                "{} confirmed, {} released, {} lapsed before payment, {} left to expire",
                l.units_confirmed,
                l.units_released,
                l.units_lapsed_before_payment,
                self.units_left_to_expire()
            ),
        );
        line(
            s,
            "event",
            match &self.event {
                Some(e) => format!("total {}, cart limit {}", e.total, e.cart_limit),
                None => "not seen (nobody admitted)".into(),
            },
        );
        if let Some(st) = &v["stock"].as_object() {
            line(
                s,
                "stock (admin)",
                format!(
                    "total {}, available {}, held {}, confirmed {}, invariant {}",
                    st["total"],
                    st["available"],
                    st["held"],
                    st["confirmed"],
                    st["invariant_holds"]
                ),
            );
        }
        line(
            s,
            "oversold",
            format!(
                "{} (answers: peak {} outstanding; store: {})",
                self.oversold(),
                l.peak_outstanding,
                if self.stock.is_some() {
                    self.oversold_by_stock().to_string()
                } else {
                    "not read, no --admin-token".into()
                }
            ),
        );
        line(s, "above cart limit", l.above_cart_limit.to_string());
        for c in self.categories() {
            line(
                s,
                &format!("category {}", c["id"].as_str().unwrap_or("?")),
                format!(
                    "total {}, cart limit {}, peak {} outstanding, {} confirmed, oversold {}, above its limit {}",
                    c["total"],
                    c["cart_limit"],
                    c["peak_units_outstanding"],
                    c["units_confirmed"],
                    c["oversold"],
                    c["above_cart_limit"]
                ),
            );
        }
        if l.idempotency_mismatches > 0 {
            line(
                s,
                "idempotency mismatches",
                l.idempotency_mismatches.to_string(),
            );
        }
    }

    /// The table's lines on errors and latencies.
    fn table_errors(&self, s: &mut String, v: &Value) {
        let st = &self.stats;
        let mut errs: Vec<String> = st.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        errs.extend(st.http_errors.iter().map(|(k, n)| format!("HTTP {k} {n}")));
        if st.transport_errors > 0 {
            errs.push(format!("transport {}", st.transport_errors));
        }
        line(
            s,
            "errors",
            if errs.is_empty() {
                "none".into()
            } else {
                errs.join(", ")
            },
        );
        s.push_str("  latency (ms)            count      p50      p99\n");
        if let Value::Object(m) = &v["latency_ms"] {
            for (ep, x) in m {
                s.push_str(&format!(
                    "    {ep:<22}{:>7} {:>8.1} {:>8.1}\n",
                    x["count"],
                    x["p50_ms"].as_f64().unwrap_or(0.0),
                    x["p99_ms"].as_f64().unwrap_or(0.0)
                ));
            }
        }
    }
}

/// One `key   value` line of the table.
fn line(s: &mut String, k: &str, v: String) {
    s.push_str(&format!("  {k:<24}{v}\n"));
}

/// A bar of visitors finished, on a terminal (`Settings::progress`);
/// hidden otherwise.
pub(super) fn progress_bar(s: &Settings) -> ProgressBar {
    if !s.progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(s.visitors);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} swarm [{bar:30}] {pos}/{len} visitors {elapsed} {msg}",
    ) {
        b.set_style(style.progress_chars("=> "));
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn latencies_are_reported_in_ms_from_a_histogram() {
        let mut stats = crate::tools::swarm::client::Stats::default();
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for us in 1..=100u64 {
            h.record(us * 1000).unwrap();
        }
        stats.latency_us.insert(Endpoint::ALL[0].name(), h);
        let v = latency_json(&stats);
        let e = &v[Endpoint::ALL[0].name()];
        assert_eq!(e["count"], 100);
        assert!((e["p50_ms"].as_f64().unwrap() - 50.0).abs() < 0.1, "{e}");
        assert!((e["p99_ms"].as_f64().unwrap() - 99.0).abs() < 0.1, "{e}");
        assert!((e["max_ms"].as_f64().unwrap() - 100.0).abs() < 0.1, "{e}");
    }
}
