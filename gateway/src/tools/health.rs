//! `sluice health URL`: asks a running gateway one of its probes
//! (`/_sluice/serving` by default, `/_sluice/healthz`) and exits 0 when it
//! answers 2xx, 1 otherwise. It is the container image's `HEALTHCHECK`:
//! the runtime image carries the `sluice` binary and CA roots but no curl,
//! and the check must ask the server, not re-read its config.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Exit status of a URL that is not one (as a bad config).
const EXIT_USAGE: u8 = 64;

/// Flags of `sluice health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The probe to ask, e.g. `http://127.0.0.1:8080/_sluice/serving`
    /// (plain http: the check runs beside the server, on loopback).
    #[arg(default_value = "http://127.0.0.1:8080/_sluice/serving")]
    pub url: String,
    /// How long to wait for the answer, e.g. `2s`.
    #[arg(long, default_value = "2s", value_parser = humantime_serde::re::humantime::parse_duration)]
    pub timeout: Duration,
}

/// Runs `sluice health`: 0 on a 2xx answer, 1 on any other answer or none,
/// 64 on a URL it cannot ask.
pub fn run(args: HealthArgs) -> ExitCode {
    let uri = match parse_url(&args.url) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("sluice: health: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: health: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(ask(uri, args.timeout)) {
        Ok((status, body)) if status.is_success() => {
            println!("{status} {body}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!("sluice: health: {} answered {status} {body}", args.url);
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sluice: health: {}: {e}", args.url);
            ExitCode::FAILURE
        }
    }
}

/// An `http://host:port/path` URL, or why it is not one.
fn parse_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("URL {url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "URL {url:?}: give an http://host:port/path URL (the probe is asked on loopback, without TLS)"
        ));
    }
    Ok(uri)
}

/// One GET, bounded by `timeout`: the status and the body (lossy text).
async fn ask(uri: http::Uri, timeout: Duration) -> Result<(http::StatusCode, String), String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(uri)
        .header(http::header::USER_AGENT, "sluice-health")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let res = client.request(req).await.map_err(|e| e.to_string())?;
        let status = res.status();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn only_plain_http_urls_are_asked() {
        assert!(parse_url("http://127.0.0.1:8080/_sluice/serving").is_ok());
        for bad in [
            "https://127.0.0.1/",
            "127.0.0.1:8080",
            "not a url",
            "ftp://x/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
