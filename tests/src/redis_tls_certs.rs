//! Certificates for the Redis TLS tests, made with [`crate::tls::TestCa`]:
//! a server certificate (for `127.0.0.1` and `localhost` unless told
//! otherwise; Redis also presents it as a client when it replicates or
//! joins a cluster bus) and a client certificate, signed by one test CA,
//! in the shapes `redis-server --tls-*` and `sluice --redis-ca …` read.

use std::path::PathBuf;

use crate::redis_server::ServerTls;
use crate::tls::{Leaf, TestCa};

/// A CA and the server and client certificates it signed, as files.
pub struct TlsCerts {
    ca: TestCa,
    server: Leaf,
    client: Leaf,
}

impl TlsCerts {
    /// A CA, a server certificate for `127.0.0.1` and `localhost`, and a
    /// client certificate.
    pub fn generate() -> TlsCerts {
        Self::for_names(&["127.0.0.1", "localhost"])
    }

    /// The same with the server certificate naming only `names` (a name the
    /// server is not reached by: a host name mismatch).
    pub fn for_names(names: &[&str]) -> TlsCerts {
        let ca = TestCa::new();
        let server = ca.peer_leaf(names);
        let client = ca.client_leaf("sluice-client");
        TlsCerts { ca, server, client }
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.ca.cert.clone()
    }

    /// The client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.client.cert.clone()
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.client.key.clone()
    }

    /// What a `redis-server` needs to serve TLS with these files; with
    /// `auth_clients` it requires a client certificate signed by the CA.
    pub fn server(&self, auth_clients: bool) -> ServerTls {
        ServerTls {
            cert: self.server.cert.clone(),
            key: self.server.key.clone(),
            ca: self.ca(),
            client_cert: self.client_cert(),
            client_key: self.client_key(),
            auth_clients,
        }
    }
}
