//! Admits `n` visitors to a room of a running gateway through the JSON API
//! (challenge, solve, join, poll) and writes their admission tokens to a
//! file, one per line: the token supply of `tests/bench/holds.sh`.
//!
//! Usage: `cargo run --release -p sluice-tests --example mint_tokens -- BASE_URL ROOM N OUT_FILE`
//!
//! The room must admit quickly (a high rate and burst) and ask for little
//! work (`puzzles = 1`, `difficulty_floor_bits = 1`), with
//! `join_limit_per_prefix_per_min = 0` and `attack_min_solve = "0s"`
//! (every join comes from 127.0.0.1).

use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sluice_tests::visitor::Visitor;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [base, room, n, out] = args.as_slice() else {
        anyhow::bail!("usage: mint_tokens BASE_URL ROOM N OUT_FILE");
    };
    let n: usize = n.parse()?;
    let started = Instant::now();
    let tokens: Vec<Option<String>> = futures_util::stream::iter(0..n)
        .map(|_| async {
            let mut v = Visitor::new(base, room);
            let res = v.join("/").await;
            if !res.status.is_success() {
                eprintln!("join failed: {} {}", res.status, res.text());
                return None;
            }
            if !v.wait_admitted(Duration::from_secs(60), 100).await {
                eprintln!("not admitted within 60 s");
                return None;
            }
            v.admission_token
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let tokens: Vec<String> = tokens.into_iter().flatten().collect();
    anyhow::ensure!(
        tokens.len() == n,
        "only {} of {n} visitors admitted",
        tokens.len()
    );
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    for t in &tokens {
        writeln!(f, "{t}")?;
    }
    f.flush()?;
    eprintln!(
        "{n} visitors admitted to {room} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
