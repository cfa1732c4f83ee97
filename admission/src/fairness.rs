//! Fairness measured: Kendall's tau-b between the order visitors arrived in
//! and the order they were admitted in.
//!
//! Our own code because the statistics crates we looked at either compute
//! it in O(n²) or pull in a numerics stack the gateway has no other use
//! for; `sluice simulate` runs 3,000,000 visitors, where O(n²) is hours.
//!
//! Each visitor is a pair `(arrived, admitted)` (any two orderable keys:
//! arrival time or arrival index, admission time or admission index). A
//! pair of visitors is *concordant* when the one who came first also got
//! in first, *discordant* when it got in later, and tied when either key
//! is equal (two joins in the same millisecond, one batch of admissions).
//! Ties in one key only keep tau-b below 1 even for a perfect FIFO, so the
//! reports rank admissions by *place* (the frontier position a visitor was
//! admitted at), which is strict.
//! tau-b = (C − D) / √((n₀ − n₁)(n₀ − n₂)), with n₀ = n(n−1)/2 pairs, n₁
//! pairs tied in arrival, n₂ tied in admission: 1 is perfect FIFO, −1 the
//! reverse, about 0 a fair lottery (the `random` queueing method).
//!
//! # The algorithm (Knight, 1966)
//!
//! Sort by `(arrived, admitted)`; count the ties in `arrived` (n₁) and the
//! joint ties (n₃). Then merge-sort by `admitted`, counting the swaps a
//! stable merge makes: every swap is one discordant pair (equal keys are
//! never swapped, and pairs tied in arrival are already in admission
//! order). After the sort, count the ties in `admitted` (n₂). Then
//! C − D = n₀ − n₁ − n₂ + n₃ − 2·swaps. O(n log n) time, O(n) memory; the
//! unit tests hold it to the O(n²) definition on random inputs.

/// Kendall's tau-b of `pairs` (`(arrived, admitted)` per visitor), or
/// `None` when it is undefined: fewer than two visitors, or every pair
/// tied in one of the keys (everybody arrived, or was admitted, at once).
pub fn kendall_tau_b<A: Ord + Copy, B: Ord + Copy>(pairs: &[(A, B)]) -> Option<f64> {
    let n = pairs.len() as u128;
    if n < 2 {
        return None;
    }
    let mut v: Vec<(A, B)> = pairs.to_vec();
    v.sort_unstable();
    let n0 = n * (n - 1) / 2;
    let n1 = tied_pairs(&v, |a, b| a.0 == b.0);
    let n3 = tied_pairs(&v, |a, b| a == b);
    let mut ys: Vec<B> = v.iter().map(|p| p.1).collect();
    let mut buf = ys.clone();
    let swaps = merge_count(&mut ys, &mut buf);
    let n2 = tied_pairs(&ys, |a, b| a == b);
    let (x, y) = (n0 - n1, n0 - n2);
    if x == 0 || y == 0 {
        return None;
    }
    let num = n0 as f64 - n1 as f64 - n2 as f64 + n3 as f64 - 2.0 * swaps as f64;
    Some((num / ((x as f64).sqrt() * (y as f64).sqrt())).clamp(-1.0, 1.0))
}

/// Pairs within runs of neighbours that `same` calls equal (the slice is
/// sorted so that equal items are adjacent).
fn tied_pairs<T>(v: &[T], same: impl Fn(&T, &T) -> bool) -> u128 {
    let mut total = 0u128;
    let mut run = 1u128;
    for i in 1..v.len() {
        if same(&v[i - 1], &v[i]) {
            run += 1;
        } else {
            total += run * (run - 1) / 2;
            run = 1;
        }
    }
    total + run * (run - 1) / 2
}

/// Sorts `v` (stable, bottom-up merge sort) and returns how many pairs
/// were out of order (strictly greater before smaller).
fn merge_count<T: Ord + Copy>(v: &mut [T], buf: &mut [T]) -> u128 {
    let n = v.len();
    let mut swaps = 0u128;
    let mut width = 1;
    while width < n {
        let mut lo = 0;
        while lo < n {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut i, mut j, mut k) = (lo, mid, lo);
            while i < mid && j < hi {
                if v[j] < v[i] {
                    // v[j] jumps over every item left in the left run
                    swaps += (mid - i) as u128;
                    buf[k] = v[j];
                    j += 1;
                } else {
                    buf[k] = v[i];
                    i += 1;
                }
                k += 1;
            }
            buf[k..k + (mid - i)].copy_from_slice(&v[i..mid]);
            k += mid - i;
            buf[k..k + (hi - j)].copy_from_slice(&v[j..hi]);
            lo = hi;
        }
        v.copy_from_slice(buf);
        width *= 2;
    }
    swaps
}

/// The definition, pair by pair: O(n²), for the tests.
#[cfg(any(test, feature = "test-util"))]
pub fn kendall_tau_b_naive<A: Ord + Copy, B: Ord + Copy>(pairs: &[(A, B)]) -> Option<f64> {
    use std::cmp::Ordering::Equal;
    let (mut c, mut d, mut tx, mut ty) = (0i128, 0i128, 0i128, 0i128);
    let mut n0 = 0i128;
    for i in 0..pairs.len() {
        for j in i + 1..pairs.len() {
            n0 += 1;
            let a = pairs[i].0.cmp(&pairs[j].0);
            let b = pairs[i].1.cmp(&pairs[j].1);
            if a == Equal {
                tx += 1;
            }
            if b == Equal {
                ty += 1;
            }
            if a != Equal && b != Equal {
                if a == b {
                    c += 1;
                } else {
                    d += 1;
                }
            }
        }
    }
    let (x, y) = (n0 - tx, n0 - ty);
    if pairs.len() < 2 || x == 0 || y == 0 {
        return None;
    }
    Some(((c - d) as f64 / ((x as f64).sqrt() * (y as f64).sqrt())).clamp(-1.0, 1.0))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn known_values() {
        let fifo: Vec<(u32, u32)> = (0..100).map(|i| (i, i)).collect();
        assert_eq!(kendall_tau_b(&fifo), Some(1.0));
        let rev: Vec<(u32, u32)> = (0..100).map(|i| (i, 100 - i)).collect();
        assert_eq!(kendall_tau_b(&rev), Some(-1.0));
        assert_eq!(kendall_tau_b::<u32, u32>(&[]), None);
        assert_eq!(kendall_tau_b(&[(1, 1)]), None);
        // everyone admitted in one batch: undefined, not 0
        assert_eq!(kendall_tau_b(&[(1, 5), (2, 5), (3, 5)]), None);
        // one swapped neighbour among 4: C = 5, D = 1, tau = 4/6
        let t = kendall_tau_b(&[(1, 1), (2, 3), (3, 2), (4, 4)]).unwrap();
        assert!((t - 4.0 / 6.0).abs() < 1e-12);
        // ties in one key only: admitted in batches of two, in arrival
        // order, is C = 40, D = 0 of 45 pairs, 5 tied: 40/√(45·40), not 1.
        // Callers that want 1 for FIFO rank admissions by place.
        let batches: Vec<(u32, u32)> = (0..10).map(|i| (i, i / 2)).collect();
        let t = kendall_tau_b(&batches).unwrap();
        assert!((t - 40.0 / (45.0f64 * 40.0).sqrt()).abs() < 1e-12, "{t}");
    }

    #[test]
    fn large_input_is_fast_enough() {
        // 200,000 visitors, one late swap: well within a unit test's time
        // in debug builds (O(n²) would be 2·10¹⁰ comparisons)
        let mut v: Vec<(u64, u64)> = (0..200_000).map(|i| (i, i)).collect();
        v.swap(10, 20);
        let t = kendall_tau_b(&v).unwrap();
        assert!(t > 0.999_99 && t < 1.0, "{t}");
    }

    proptest::proptest! {
        /// The O(n log n) count agrees with the definition, ties and all.
        #[test]
        fn agrees_with_the_definition(
            pairs in proptest::collection::vec((0u8..12, 0u8..12), 0..120),
        ) {
            let fast = kendall_tau_b(&pairs);
            let slow = kendall_tau_b_naive(&pairs);
            match (fast, slow) {
                (Some(a), Some(b)) => proptest::prop_assert!((a - b).abs() < 1e-9, "{a} vs {b}"),
                (a, b) => proptest::prop_assert_eq!(a, b),
            }
        }

        /// Without ties (distinct keys), too, over a wider range.
        #[test]
        fn agrees_without_ties(perm in proptest::collection::vec(0u32..1_000_000, 2..300)) {
            let pairs: Vec<(usize, u32)> = perm.iter().copied().enumerate().collect();
            let a = kendall_tau_b(&pairs).unwrap_or(f64::NAN);
            let b = kendall_tau_b_naive(&pairs).unwrap_or(f64::NAN);
            proptest::prop_assert!((a - b).abs() < 1e-9 || (a.is_nan() && b.is_nan()));
        }
    }
}
