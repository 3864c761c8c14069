//! A Puppet-like PKI made on the spot: a CA, and this host's certificate and key signed by it.

#![allow(dead_code)]

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use super::{CERTNAME, fixture, replace};

/// A Puppet-like CA that signs server and host certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Puppet CA: {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's key and certificate, to sign what a test makes itself.
    pub fn issuer(&self) -> &CertifiedIssuer<'static, KeyPair> {
        &self.issuer
    }

    /// A certificate for `key`, with `sans` as subjectAltNames (none, like pre-6.15.2 Puppet CAs).
    pub fn issue(&self, cn: &str, sans: &[&str], key: &KeyPair) -> String {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.signed_by(key, &self.issuer).unwrap().pem()
    }
}

/// The files pmcheck is pointed at.
pub struct HostFiles {
    pub dir: tempfile::TempDir,
    pub hostcert: PathBuf,
    pub hostprivkey: PathBuf,
    pub localcacert: PathBuf,
}

impl HostFiles {
    /// hostcert signed by `ca` for the key in `pkcs8_fixture`, hostprivkey as `key_fixture`.
    pub fn new(ca: &Ca, pkcs8_fixture: &str, key_fixture: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let files = Self {
            hostcert: dir.path().join("hostcert.pem"),
            hostprivkey: dir.path().join("hostprivkey.pem"),
            localcacert: dir.path().join("ca.pem"),
            dir,
        };
        files.install(ca, pkcs8_fixture, key_fixture, ca);
        files
    }

    /// Replaces the files atomically, as Puppet does on renewal: write aside, rename over.
    pub fn install(&self, ca: &Ca, pkcs8_fixture: &str, key_fixture: &str, trust: &Ca) {
        let key =
            KeyPair::from_pem(&std::fs::read_to_string(fixture(pkcs8_fixture)).unwrap()).unwrap();
        let cert = ca.issue(CERTNAME, &[], &key);
        replace(&self.hostcert, cert.as_bytes());
        replace(
            &self.hostprivkey,
            &std::fs::read(fixture(key_fixture)).unwrap(),
        );
        replace(&self.localcacert, trust.pem().as_bytes());
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--hostcert".into(),
            self.hostcert.display().to_string(),
            "--hostprivkey".into(),
            self.hostprivkey.display().to_string(),
            "--localcacert".into(),
            self.localcacert.display().to_string(),
            "--certname".into(),
            CERTNAME.into(),
        ]
    }
}
