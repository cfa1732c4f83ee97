//! Certificates for the Redis TLS tests, made in the test with rcgen: a CA,
//! a server certificate it signs (for `127.0.0.1` and `localhost` unless
//! told otherwise; Redis also presents it as a client when it replicates or
//! joins a cluster bus), and a client certificate it signs, all written as
//! PEM files into a temporary directory removed on drop.
//!
//! (The gateway's HTTPS tests have their own helper; this one is small and
//! only what `redis-server --tls-*` and `sluice --redis-ca …` read.)

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::redis_server::{ServerTls, free_port};

/// A CA and the server and client certificates it signed, as files.
pub struct TlsCerts {
    dir: PathBuf,
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
        let dir = std::env::temp_dir().join(format!(
            "sluice-redis-certs-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("certs dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "sluice test Redis CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        write(&dir.join("ca.pem"), &ca_cert.pem());
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        leaf(&dir, "server", names, &issuer);
        leaf(&dir, "client", vec!["sluice-client".to_owned()], &issuer);
        TlsCerts { dir }
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// What a `redis-server` needs to serve TLS with these files; with
    /// `auth_clients` it requires a client certificate signed by the CA.
    pub fn server(&self, auth_clients: bool) -> ServerTls {
        ServerTls {
            cert: self.dir.join("server.pem"),
            key: self.dir.join("server.key"),
            ca: self.ca(),
            client_cert: self.client_cert(),
            client_key: self.client_key(),
            auth_clients,
        }
    }
}

impl Drop for TlsCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A certificate for `names` signed by `issuer`, as NAME.pem and NAME.key.
fn leaf(dir: &Path, name: &str, names: Vec<String>, issuer: &Issuer<'_, KeyPair>) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(names).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, issuer).expect("sign");
    write(&dir.join(format!("{name}.pem")), &cert.pem());
    write(&dir.join(format!("{name}.key")), &key.serialize_pem());
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write PEM");
}
