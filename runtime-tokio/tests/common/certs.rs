//! Throwaway PKI for the TLS tests: a CA and one leaf signed by it, as PEM
//! files. Only std and rcgen, so that runtime-smol's suite includes this
//! file too (`#[path]`).

use std::path::{Path, PathBuf};

/// The PEM files of a CA and of one leaf (certificate and key) it signed.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA and one leaf for the DNS names or IPs `names`, signed by it, as
/// `{prefix}-ca.pem`, `{prefix}-cert.pem` and `{prefix}-key.pem` in `dir`.
pub fn make_pki(dir: &Path, prefix: &str, names: &[&str]) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let pki = Pki {
        ca: dir.join(format!("{prefix}-ca.pem")),
        cert: dir.join(format!("{prefix}-cert.pem")),
        key: dir.join(format!("{prefix}-key.pem")),
    };
    std::fs::write(&pki.ca, ca.pem()).unwrap();
    std::fs::write(&pki.cert, leaf.pem()).unwrap();
    std::fs::write(&pki.key, leaf_key.serialize_pem()).unwrap();
    pki
}

/// A CA and a server certificate for 127.0.0.1 / localhost in a fresh
/// folder named after `name`, this process and this call. Returns (folder,
/// CA, server certificate, server key); the caller removes the folder.
pub fn make_certs(name: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    // A folder per call: tests run in parallel, and one writing its CA over
    // another's while that one still connects would fail verification.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ticketing-{name}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pki = make_pki(&dir, "server", &["127.0.0.1", "localhost"]);
    (dir, pki.ca, pki.cert, pki.key)
}
