//! A JSON-client visitor for end-to-end tests: fetches a challenge, solves
//! it with the native solver, joins, polls, and keeps its tokens the way a
//! mobile app would (as bearer tokens, no cookie jar).

use serde_json::{Value, json};

use crate::client::{Answer, TestClient};

/// One visitor of one room.
pub struct Visitor {
    /// Gateway base URL.
    pub base: String,
    /// Room id.
    pub room: String,
    /// The queue token once joined.
    pub queue_token: Option<String>,
    /// The admission token once admitted.
    pub admission_token: Option<String>,
    /// The seq once joined.
    pub seq: Option<u64>,
    client: TestClient,
}

impl Visitor {
    /// A new visitor.
    pub fn new(base: &str, room: &str) -> Visitor {
        Self::with_client(base, room, TestClient::new())
    }

    /// A new visitor calling through `client` (e.g. an https one,
    /// [`crate::tls::TestCa::https_client`]).
    pub fn with_client(base: &str, room: &str, client: TestClient) -> Visitor {
        Visitor {
            base: base.to_owned(),
            room: room.to_owned(),
            queue_token: None,
            admission_token: None,
            seq: None,
            client,
        }
    }

    /// Fetches a challenge.
    pub async fn challenge(&self) -> Answer {
        self.client
            .post_json(
                &format!("{}/_sluice/rooms/{}/challenge", self.base, self.room),
                &[],
                &json!({}),
            )
            .await
    }

    /// Fetches and solves a challenge: `(challenge, solutions)`.
    pub async fn solved(&self) -> (String, Vec<String>) {
        let c = self.challenge().await;
        assert_eq!(c.status, 200, "challenge: {}", c.text());
        let v = c.json();
        let challenge = v["challenge"].as_str().expect("challenge").to_owned();
        let k = v["puzzles"].as_u64().expect("puzzles") as u8;
        let b = v["difficulty_bits"].as_u64().expect("bits") as u8;
        let min_solve = v["min_solve_ms"].as_u64().unwrap_or(0);
        let received = std::time::Instant::now();
        let ch = challenge.clone();
        let solutions = tokio::task::spawn_blocking(move || sluice_pow::solve(&ch, k, b, 1))
            .await
            .expect("solver");
        // Under attack a proof is refused sooner than min_solve_ms after
        // the challenge: wait out the rest, as the page does.
        let floor_ms = if min_solve > 0 { min_solve + 50 } else { 0 };
        let floor = std::time::Duration::from_millis(floor_ms);
        if let Some(rest) = floor.checked_sub(received.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        (challenge, solutions)
    }

    /// Solves and joins; records the tokens it gets.
    pub async fn join(&mut self, return_to: &str) -> Answer {
        let (challenge, solutions) = self.solved().await;
        self.join_with(&challenge, &solutions, return_to).await
    }

    /// Joins with a given solution.
    pub async fn join_with(
        &mut self,
        challenge: &str,
        solutions: &[String],
        return_to: &str,
    ) -> Answer {
        let res = self
            .client
            .post_json(
                &format!("{}/_sluice/rooms/{}/join", self.base, self.room),
                &[],
                &json!({"challenge": challenge, "solutions": solutions, "return_to": return_to}),
            )
            .await;
        self.record(&res);
        res
    }

    fn record(&mut self, res: &Answer) {
        if !res.status.is_success() {
            return;
        }
        let v: Value = match serde_json::from_slice(&res.body) {
            Ok(v) => v,
            Err(_) => return,
        };
        if let Some(t) = v["queue_token"].as_str() {
            self.queue_token = Some(t.to_owned());
        }
        if let Some(s) = v["seq"].as_u64() {
            self.seq = Some(s);
        }
        if let Some(t) = v["admission_token"].as_str() {
            self.admission_token = Some(t.to_owned());
        }
    }

    /// Polls status once with the queue token.
    pub async fn status(&mut self) -> Answer {
        let token = self.queue_token.clone().unwrap_or_default();
        let auth = format!("Bearer {token}");
        let res = self
            .client
            .get(
                &format!("{}/_sluice/rooms/{}/status", self.base, self.room),
                &[("authorization", &auth)],
            )
            .await;
        self.record(&res);
        res
    }

    /// Polls until admitted (honouring `poll_after_ms`, capped at `cap_ms`)
    /// or until `limit` passes.
    pub async fn wait_admitted(&mut self, limit: std::time::Duration, cap_ms: u64) -> bool {
        if self.queue_token.is_none() && self.admission_token.is_some() {
            // admitted at once when joining (passthrough)
            return true;
        }
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            let res = self.status().await;
            let v = res.json();
            if v["state"] == "admitted" {
                return true;
            }
            let wait = v["poll_after_ms"].as_u64().unwrap_or(500).min(cap_ms);
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
        false
    }

    /// A request with the admission token as a cookie.
    pub async fn get_admitted(&self, path: &str) -> Answer {
        let cookie = format!(
            "sluice_a_{}={}",
            self.room,
            self.admission_token.clone().unwrap_or_default()
        );
        self.client
            .get(
                &format!("{}{}", self.base, path),
                &[("cookie", &cookie), ("accept", "application/json")],
            )
            .await
    }

    /// A JSON call with the admission token as bearer.
    pub async fn call_admitted(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Value>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let auth = format!(
            "Bearer {}",
            self.admission_token.clone().unwrap_or_default()
        );
        let mut h: Vec<(&str, &str)> = vec![
            ("authorization", &auth),
            ("content-type", "application/json"),
        ];
        h.extend_from_slice(extra);
        let b = body.map(|v| v.to_string()).unwrap_or_default();
        self.client
            .call(
                method,
                &format!("{}{}", self.base, path),
                &h,
                crate::client::body(b),
            )
            .await
    }
}

/// The join body for a challenge answer (status 200 asserted): the
/// challenge solved natively, with `return_to`. For tests that send the
/// challenge and the join themselves (with an invite code or an enqueue
/// token).
pub async fn join_body(challenge: &Answer, return_to: &str) -> Value {
    assert_eq!(challenge.status, 200, "challenge: {}", challenge.text());
    let v = challenge.json();
    let ch = v["challenge"].as_str().expect("challenge").to_owned();
    let k = v["puzzles"].as_u64().expect("puzzles") as u8;
    let b = v["difficulty_bits"].as_u64().expect("bits") as u8;
    let c2 = ch.clone();
    let solutions = tokio::task::spawn_blocking(move || sluice_pow::solve(&c2, k, b, 1))
        .await
        .expect("solver");
    json!({"challenge": ch, "solutions": solutions, "return_to": return_to})
}

/// Joins `room` at the gateway `base` and returns the admission token
/// (passthrough, or after a short wait in line, at most a minute).
pub async fn admit(base: &str, room: &str) -> String {
    let mut v = Visitor::new(base, room);
    let res = v.join("/").await;
    assert!(res.status.is_success(), "join: {}", res.text());
    assert!(
        v.wait_admitted(std::time::Duration::from_secs(60), 50)
            .await,
        "never admitted"
    );
    v.admission_token.expect("admission token")
}
