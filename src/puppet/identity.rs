//! The host's Puppet identity: its certificate, private key and the Puppet CA, turned into a
//! rustls client configuration that trusts that CA alone.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::ring;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// The three files Puppet keeps under its ssldir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFiles {
    /// This host's certificate (PEM).
    pub hostcert: PathBuf,
    /// This host's private key (PEM: PKCS#1, SEC1 or PKCS#8).
    pub hostprivkey: PathBuf,
    /// The Puppet CA certificate(s), the only trust anchors.
    pub localcacert: PathBuf,
}

/// Why the identity files cannot be used; each names the file and the setting behind it.
#[derive(Debug, Error)]
pub enum IdentityError {
    /// A file cannot be read.
    #[error("cannot read {setting} {path}: {source}{hint}", hint = read_hint(source, path))]
    Read {
        /// The Puppet setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// A certificate file holds no certificate; `source` is `None` when the file parses but holds
    /// no CERTIFICATE block.
    #[error(
        "{setting} {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----): {}",
        source.as_ref().map_or("the file has no CERTIFICATE block".to_owned(), ToString::to_string)
    )]
    NoCertificate {
        /// The Puppet setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        source: Option<pem::Error>,
    },
    /// The private key is encrypted.
    #[error(
        "hostprivkey {path} is encrypted (a Puppet passfile?): pmcheck needs the key unencrypted, \
         readable only by root and group puppet (mode 0640)"
    )]
    EncryptedKey {
        /// The key file.
        path: PathBuf,
    },
    /// The key file holds no private key.
    #[error(
        "hostprivkey {path} holds no private key (expected -----BEGIN RSA PRIVATE KEY-----, \
         EC PRIVATE KEY or PRIVATE KEY): {}",
        match source {
            pem::Error::NoItemsFound => "the file has no private key block".to_owned(),
            other => other.to_string(),
        }
    )]
    NoKey {
        /// The key file.
        path: PathBuf,
        /// What the PEM parser said.
        source: pem::Error,
    },
    /// The certificate block is not a valid certificate.
    #[error(
        "hostcert {path} holds a CERTIFICATE block that is not a valid X.509 certificate ({source}): \
         restore it from Puppet's ssldir or get a new one with `puppet ssl bootstrap`"
    )]
    BadCertificate {
        /// The certificate file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The key block is not a usable key.
    #[error(
        "hostprivkey {path} holds a PRIVATE KEY block that is not a usable RSA or EC key \
         ({source}): restore it from Puppet's ssldir"
    )]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The CA file holds no usable trust anchor.
    #[error("localcacert {path} holds no certificate usable as a trust anchor")]
    NoTrustAnchor {
        /// The CA file.
        path: PathBuf,
    },
    /// rustls refused its own configuration.
    #[error("the TLS library cannot be set up: {0}")]
    Provider(#[source] rustls::Error),
    /// The certificate and the key are not a pair.
    #[error("hostcert {hostcert} and hostprivkey {hostprivkey} do not fit together: {source}")]
    KeyMismatch {
        /// The certificate file.
        hostcert: PathBuf,
        /// The key file.
        hostprivkey: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

/// What to do about a file that cannot be read, from what blocks it: its own mode bits when
/// they are the cause (a key of mode 0600: no group helps), else the directories on its path.
fn read_hint(e: &io::Error, path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    match e.kind() {
        io::ErrorKind::NotFound => {
            " (has this host got its Puppet certificate yet? Start Puppet Server or run the agent once, or point pmcheck at the files with --hostcert/--hostprivkey/--localcacert)".to_owned()
        }
        io::ErrorKind::PermissionDenied => match std::fs::metadata(path) {
            Ok(meta) if meta.mode() & 0o044 == 0 => format!(
                " (its mode {:04o} lets only its owner {1} read it, and no group helps: make \
                 it 0640 with group puppet, as Puppet writes it, or run pmcheck as {1})",
                meta.mode() & 0o7777,
                crate::accounts::user_name(meta.uid()),
            ),
            Ok(meta) => format!(
                " (mode {:04o}, group {1}: run pmcheck as a member of group {1})",
                meta.mode() & 0o7777,
                crate::accounts::group_name(meta.gid()),
            ),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                " (a directory on its path blocks it: `sudo pmcheck config --check` names which, \
                 and the group that may enter it)"
                    .to_owned()
            }
            Err(_) => {
                " (run pmcheck as a user that may read it, such as a member of group puppet)"
                    .to_owned()
            }
        },
        _ => String::new(),
    }
}

impl IdentityFiles {
    /// Loads the files and builds a TLS client configuration: server verified against
    /// localcacert only (never the system roots), client identity hostcert + hostprivkey.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, IdentityError> {
        let mut roots = RootCertStore::empty();
        let (added, _ignored) =
            roots.add_parsable_certificates(read_certificates("localcacert", &self.localcacert)?);
        if added == 0 {
            return Err(IdentityError::NoTrustAnchor {
                path: self.localcacert.clone(),
            });
        }
        let chain = read_certificates("hostcert", &self.hostcert)?;
        // Each file on its own first, so that garbage is named as such and not as a mismatch.
        if let Some(leaf) = chain.first() {
            rustls::server::ParsedCertificate::try_from(leaf).map_err(|e| {
                IdentityError::BadCertificate {
                    path: self.hostcert.clone(),
                    source: e,
                }
            })?;
        }
        let key = read_private_key(&self.hostprivkey)?;
        let provider = Arc::new(ring::default_provider());
        provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|source| IdentityError::BadKey {
                path: self.hostprivkey.clone(),
                source,
            })?;
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(IdentityError::Provider)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|source| IdentityError::KeyMismatch {
                hostcert: self.hostcert.clone(),
                hostprivkey: self.hostprivkey.clone(),
                source,
            })
    }
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, IdentityError> {
    crate::safe_file::read(path, crate::safe_file::PEM_LIMIT).map_err(|source| {
        IdentityError::Read {
            setting,
            path: path.to_owned(),
            source,
        }
    })
}

/// Every certificate in a PEM file: a CA file may hold a whole chain.
fn read_certificates(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, IdentityError> {
    let bytes = read(setting, path)?;
    let no_cert = |source: Option<pem::Error>| IdentityError::NoCertificate {
        setting,
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| no_cert(Some(e)))?;
    if certs.is_empty() {
        return Err(no_cert(None));
    }
    Ok(certs)
}

/// The first private key in PKCS#1 (what Puppet writes for RSA), SEC1 (EC keys, possibly after
/// an `EC PARAMETERS` block) or PKCS#8 form.
fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, IdentityError> {
    let bytes = read("hostprivkey", path)?;
    // Legacy OpenSSL encryption keeps the usual label and adds a Proc-Type header; PKCS#8
    // encryption changes the label. Neither is a key we can use, and the parser would only
    // say "no items found".
    let text = String::from_utf8_lossy(&bytes);
    if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(IdentityError::EncryptedKey {
            path: path.to_owned(),
        });
    }
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| IdentityError::NoKey {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A key the daemon may not read is named with what blocks it: a mode that no group
    /// helps is not answered with "join group puppet".
    #[test]
    fn a_refused_file_is_named_with_what_blocks_it() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, "x").unwrap();
        let denied = || io::Error::from(io::ErrorKind::PermissionDenied);
        let owner = crate::accounts::user_name(nix::unistd::getuid().as_raw());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_hint(&denied(), &key),
            format!(
                " (its mode 0600 lets only its owner {owner} read it, and no group helps: make \
                 it 0640 with group puppet, as Puppet writes it, or run pmcheck as {owner})"
            )
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let group = crate::accounts::group_name(nix::unistd::getgid().as_raw());
        assert_eq!(
            read_hint(&denied(), &key),
            format!(" (mode 0640, group {group}: run pmcheck as a member of group {group})")
        );
        assert!(read_hint(&denied(), &dir.path().join("gone")).contains("group puppet"));
    }
}
