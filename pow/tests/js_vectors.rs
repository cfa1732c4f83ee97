//! `static/test/vectors.json` is current and agrees with the verifier: the
//! JavaScript tests (`node --test static/test/`) check the browser solver
//! against the same file, so both sides agree on every hash.

#![allow(clippy::unwrap_used)]

#[path = "../examples/js_vectors.rs"]
#[allow(unreachable_pub)] // shared with the crates that export it
mod js_vectors;

use serde_json::Value;
use sluice_pow::Keyset;

#[test]
fn committed_vectors_are_current() {
    let text = std::fs::read_to_string(js_vectors::path())
        .expect("static/test/vectors.json missing: cargo run -p sluice-pow --example js_vectors");
    let file: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        file,
        js_vectors::vectors(),
        "regenerate with: cargo run -p sluice-pow --example js_vectors"
    );
}

#[test]
fn vector_solutions_verify() {
    let v = js_vectors::vectors();
    let keys = Keyset::from_secret(js_vectors::SECRET).unwrap();
    for c in v["challenges"].as_array().unwrap() {
        let sols: Vec<String> = c["solutions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        keys.verify(
            c["challenge"].as_str().unwrap(),
            &sols,
            c["room"].as_str().unwrap(),
            js_vectors::NOW_MS + 1,
        )
        .unwrap();
    }
}
