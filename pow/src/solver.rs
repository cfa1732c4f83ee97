//! The native solver, for `sluice swarm`, tests and benchmarks.
//!
//! A browser solves in `static/pow-worker.js`; this is the same search in
//! Rust. Each puzzle's counter space is split among threads: thread `t` of
//! `T` tries `t, t + T, t + 2T, …`, and the first hit stops the others.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::hash::{ChallengeHasher, PuzzleHasher, meets_difficulty};

/// How many counters a thread tries between looks at the stop flag.
const CHECK_EVERY: u64 = 1024;

/// Finds a counter `n` in `start, start + step, …` whose puzzle hash for
/// `(challenge, index)` has at least `bits` leading zero bits. Single
/// threaded. `None` only if the sequence runs past `u64::MAX` (or `step`
/// is 0 and `start` fails).
pub fn solve_puzzle(challenge: &str, index: u8, bits: u8, start: u64, step: u64) -> Option<u64> {
    search(
        &PuzzleHasher::new(challenge, index),
        bits,
        start,
        step,
        None,
    )
}

fn search(
    h: &PuzzleHasher,
    bits: u8,
    start: u64,
    step: u64,
    stop: Option<&AtomicBool>,
) -> Option<u64> {
    let mut n = start;
    let mut until_check = CHECK_EVERY;
    loop {
        if meets_difficulty(&h.hash(n), bits) {
            return Some(n);
        }
        n = n.checked_add(step).filter(|_| step > 0)?;
        until_check -= 1;
        if until_check == 0 {
            until_check = CHECK_EVERY;
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return None;
            }
        }
    }
}

/// Solves all `puzzles` of `challenge` at `bits`, using `threads` OS
/// threads (at least one) per puzzle. Returns the counters as decimal
/// strings in puzzle order, ready for the join request.
pub fn solve(challenge: &str, puzzles: u8, bits: u8, threads: usize) -> Vec<String> {
    let threads = threads.max(1);
    let base = ChallengeHasher::new(challenge);
    let mut out = Vec::with_capacity(usize::from(puzzles));
    for index in 0..puzzles {
        let h = base.puzzle(index);
        let n = if threads == 1 {
            search(&h, bits, 0, 1, None)
        } else {
            solve_parallel(&h, bits, threads)
        };
        // Unreachable in practice: 2^64 hashes.
        out.push(n.map_or_else(|| "0".to_string(), |n| n.to_string()));
    }
    out
}

fn solve_parallel(h: &PuzzleHasher, bits: u8, threads: usize) -> Option<u64> {
    let stop = AtomicBool::new(false);
    let step = u64::try_from(threads).unwrap_or(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..step)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let found = search(h, bits, t, step, Some(stop));
                    if found.is_some() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    found
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|j| j.join().ok().flatten())
            .min()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::hash::{leading_zero_bits, puzzle_hash};

    #[test]
    fn single_and_multi_thread_agree_on_validity() {
        let ch = "test.challenge";
        for threads in [1, 3] {
            let sol = solve(ch, 5, 8, threads);
            for (i, n) in sol.iter().enumerate() {
                let h = puzzle_hash(ch, u8::try_from(i).unwrap(), n.parse().unwrap());
                assert!(leading_zero_bits(&h) >= 8);
            }
        }
    }

    #[test]
    fn single_thread_finds_the_first_counter() {
        let n = solve_puzzle("x.y", 2, 6, 0, 1).unwrap();
        for m in 0..n {
            assert!(leading_zero_bits(&puzzle_hash("x.y", 2, m)) < 6);
        }
        assert_eq!(solve("x.y", 3, 6, 1)[2], n.to_string());
    }

    #[test]
    fn step_respects_residue() {
        let n = solve_puzzle("x.y", 0, 6, 3, 4).unwrap();
        assert_eq!(n % 4, 3);
        assert_eq!(solve_puzzle("x.y", 0, 250, u64::MAX - 1, 1), None);
    }
}
