//! `[server]`: the HTTP front's threads.

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// The HTTP front.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Threads that accept and serve connections, each with an event loop
    /// of its own that a connection stays on (with the upstream connections
    /// it uses), as nginx's workers do. `0` (the default): one per core.
    /// Background work (admission ticks, reaping, Redis) runs apart from
    /// them.
    pub io_threads: usize,
    /// Plain HTTP/1.1 requests (`GET` or `HEAD`, no body, no upgrade, no
    /// `Expect`) are read and answered by the gateway's own HTTP/1.1 code
    /// (`sluice_wire::front`), without hyper's dispatcher, body channel and codec
    /// (about 1,600 fewer instructions per proxied request, README
    /// "Measured"); at the first request that is not plain, hyper serves the
    /// connection. `false`: hyper serves every request.
    pub native_http1: bool,
}

impl ServerConfig {
    /// The I/O threads to start: `io_threads`, or one per core for `0`.
    pub fn threads(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            io_threads: 0,
            native_http1: true,
        }
    }
}

impl ServerConfig {
    /// Checks the section: a thread count a machine can run.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.io_threads > 1024 {
            return Err(ConfigError::invalid(
                "server.io_threads",
                "must be from 0 (one per core) to 1024",
            ));
        }
        Ok(())
    }
}
