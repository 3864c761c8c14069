//! When the files Puppet's TLS rests on stop being valid: this host's certificate
//! (`hostcert`), the CA chain (`localcacert`) and the CRL Puppet Server checks agents against
//! (`hostcrl`). Read for the operator (`check`, `/metrics`), never for the verdict: an expired
//! certificate already fails the probe, and taking every master out for a warning would be the
//! cascade pmcheck exists to prevent.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

use crate::file_stamp::FileStamp;

/// Which file: the `file` label of the metrics, and the name `check` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum File {
    /// This host's certificate (and any chain appended to it).
    Hostcert,
    /// The Puppet CA's certificate(s).
    Localcacert,
    /// The CRL.
    Hostcrl,
}

impl File {
    /// The label value, as puppet.conf names the setting.
    pub fn as_str(self) -> &'static str {
        match self {
            File::Hostcert => "hostcert",
            File::Localcacert => "localcacert",
            File::Hostcrl => "hostcrl",
        }
    }
}

/// Where a certificate sits in its chain: the `position` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// The first certificate of `hostcert`: this host's own.
    Leaf,
    /// A CA certificate signed by another.
    Intermediate,
    /// A self-signed CA certificate.
    Root,
}

impl Position {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Position::Leaf => "leaf",
            Position::Intermediate => "intermediate",
            Position::Root => "root",
        }
    }
}

/// One certificate's end of validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertEnd {
    /// The file it is in.
    pub file: File,
    /// Its place in the chain.
    pub position: Position,
    /// Its subject, as `CN=...` (one safe line).
    pub subject: String,
    /// `notAfter`, in seconds since the epoch.
    pub not_after: i64,
}

/// The CRL's dates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlDates {
    /// The issuer of the CRL with the earliest `nextUpdate` (a file may hold one per CA).
    pub issuer: String,
    /// That CRL's `thisUpdate`, in seconds since the epoch.
    pub this_update: i64,
    /// That CRL's `nextUpdate`; a CRL without one never goes stale.
    pub next_update: Option<i64>,
}

/// What the three files say, read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expiries {
    /// Every certificate of `hostcert` and `localcacert`.
    pub certs: Vec<CertEnd>,
    /// The CRL's dates, when it was read.
    pub crl: Option<CrlDates>,
    /// Files that could not be read or parsed, in words. A missing CRL is not one: Puppet runs
    /// without (`certificate_revocation = false`).
    pub unreadable: Vec<String>,
}

impl Expiries {
    /// Reads the files; what cannot be read is said in `unreadable`, never an error.
    pub fn read(hostcert: &Path, localcacert: &Path, hostcrl: &Path) -> Self {
        let mut out = Expiries::default();
        for (file, path) in [(File::Hostcert, hostcert), (File::Localcacert, localcacert)] {
            match certificates(file, path) {
                Ok(certs) => out.certs.extend(certs),
                Err(why) => out.unreadable.push(why),
            }
        }
        match crl(hostcrl) {
            Ok(dates) => out.crl = dates,
            Err(why) => out.unreadable.push(why),
        }
        out
    }

    /// The earliest `notAfter` of each (file, position) present, for the metrics.
    pub fn earliest(&self) -> Vec<(File, Position, i64)> {
        let mut out: Vec<(File, Position, i64)> = Vec::new();
        for c in &self.certs {
            match out
                .iter_mut()
                .find(|(f, p, _)| *f == c.file && *p == c.position)
            {
                Some(entry) => entry.2 = entry.2.min(c.not_after),
                None => out.push((c.file, c.position, c.not_after)),
            }
        }
        out
    }

    /// The worst of the dates against the thresholds, with each problem named and the days
    /// left per file as monitoring-plugin performance data.
    pub fn judge(&self, now: i64, warn: Duration, crit: Duration) -> Judgement {
        let mut j = Judgement::default();
        let mut note = |severity: Severity, what: String| {
            if severity != Severity::Ok {
                j.severity = j.severity.max(severity);
                j.problems.push(what);
            }
        };
        let severity_of = |end: i64| {
            let left = end - now;
            if left <= secs(crit) {
                Severity::Critical
            } else if left <= secs(warn) {
                Severity::Warning
            } else {
                Severity::Ok
            }
        };
        for c in &self.certs {
            note(
                severity_of(c.not_after),
                format!(
                    "{} {} ({}) {}",
                    c.file.as_str(),
                    c.subject,
                    c.position.as_str(),
                    ends("expires", c.not_after, now)
                ),
            );
        }
        if let Some(crl) = &self.crl
            && let Some(next) = crl.next_update
        {
            note(
                severity_of(next),
                format!(
                    "hostcrl of {} {}",
                    crl.issuer,
                    ends("is due for its nextUpdate", next, now)
                ),
            );
        }
        for why in &self.unreadable {
            note(Severity::Warning, why.clone());
        }
        let days = |end: i64| (end - now) as f64 / 86_400.0;
        let (w, c) = (secs(warn) as f64 / 86_400.0, secs(crit) as f64 / 86_400.0);
        for file in [File::Hostcert, File::Localcacert] {
            if let Some(end) = self
                .certs
                .iter()
                .filter(|e| e.file == file)
                .map(|e| e.not_after)
                .min()
            {
                let _ = write!(
                    j.perfdata,
                    " {}_days={:.1};{w}:;{c}:",
                    file.as_str(),
                    days(end)
                );
            }
        }
        if let Some(next) = self.crl.as_ref().and_then(|c| c.next_update) {
            let _ = write!(j.perfdata, " hostcrl_days={:.1};{w}:;{c}:", days(next));
        }
        j
    }
}

/// A monitoring plugin's state, worst last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Nothing due.
    #[default]
    Ok,
    /// Due within `--warn-expiry`, or a file that cannot be read.
    Warning,
    /// Due within `--crit-expiry`, or past.
    Critical,
}

/// What [`Expiries::judge`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judgement {
    /// The worst state.
    pub severity: Severity,
    /// Each problem, in words.
    pub problems: Vec<String>,
    /// ` hostcert_days=20.0;30:;7:` and so on, each with a leading space.
    pub perfdata: String,
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// `expires 2026-12-14T10:00:00Z (in 20 days)`, or `expired ... (3 days ago)`.
fn ends(verb: &str, end: i64, now: i64) -> String {
    let date = timestamp(end);
    let left = end - now;
    if left > 0 {
        format!("{verb} {date} (in {})", days_text(left))
    } else if verb == "expires" {
        format!("expired {date} ({} ago)", days_text(-left))
    } else {
        format!("is past its nextUpdate {date} ({} ago)", days_text(-left))
    }
}

fn days_text(seconds: i64) -> String {
    match seconds / 86_400 {
        0 => format!("{} hours", seconds / 3600),
        1 => "1 day".into(),
        n => format!("{n} days"),
    }
}

/// Now, in seconds since the epoch: what the dates are compared with.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, secs)
}

/// Seconds since the epoch as RFC 3339 UTC, or as a count outside 1970 to 9999: a deploy
/// record's offset can put its time in year 10000, where humantime would panic.
pub fn timestamp(seconds: i64) -> String {
    (u64::try_from(seconds).ok())
        .and_then(|s| std::time::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
        .and_then(|t| crate::puppet::timestamp::write(t, humantime::format_rfc3339_seconds))
        .unwrap_or_else(|| format!("{seconds} s since the epoch"))
}

/// The PEM objects of `path`, read at most `limit` bytes of; `what` names the file.
fn pem<T: PemObject>(path: &Path, limit: u64, what: &str) -> Result<Vec<T>, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("{what} cannot be read: {e}");
    let bytes = crate::safe_file::read(path, limit).map_err(|e| cannot(&e))?;
    T::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cannot(&e))
}

fn certificates(file: File, path: &Path) -> Result<Vec<CertEnd>, String> {
    let what = || format!("{} {}", file.as_str(), path.display());
    let ders: Vec<CertificateDer> = pem(path, crate::safe_file::PEM_LIMIT, &what())?;
    if ders.is_empty() {
        return Err(format!("{} holds no PEM certificate", what()));
    }
    let mut out = Vec::with_capacity(ders.len());
    for (i, der) in ders.iter().enumerate() {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| format!("{} certificate {}: not X.509: {e}", what(), i + 1))?;
        let self_signed = cert.subject() == cert.issuer();
        let position = match (file, i) {
            (File::Hostcert, 0) => Position::Leaf,
            _ if self_signed => Position::Root,
            _ => Position::Intermediate,
        };
        out.push(CertEnd {
            file,
            position,
            subject: crate::text::one_line(&cert.subject().to_string(), 200).into_owned(),
            not_after: cert.validity().not_after.timestamp(),
        });
    }
    Ok(out)
}

fn crl(path: &Path) -> Result<Option<CrlDates>, String> {
    let what = || format!("hostcrl {}", path.display());
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(None);
    }
    let ders: Vec<CertificateRevocationListDer> = pem(path, crate::safe_file::CRL_LIMIT, &what())?;
    let mut earliest: Option<CrlDates> = None;
    for (i, der) in ders.iter().enumerate() {
        let (_, list) = CertificateRevocationList::from_der(der)
            .map_err(|e| format!("{} CRL {}: not an X.509 CRL: {e}", what(), i + 1))?;
        let dates = CrlDates {
            issuer: crate::text::one_line(&list.issuer().to_string(), 200).into_owned(),
            this_update: list.last_update().timestamp(),
            next_update: list.next_update().map(|t| t.timestamp()),
        };
        if earliest.as_ref().is_none_or(|e| {
            dates
                .next_update
                .is_some_and(|next| e.next_update.is_none_or(|n| next < n))
        }) {
            earliest = Some(dates);
        }
    }
    earliest
        .map(Some)
        .ok_or_else(|| format!("{} holds no PEM CRL", what()))
}

/// The three paths, as settings name them, and what they said when last read.
#[derive(Debug, Clone)]
pub struct Files {
    /// `hostcert`.
    pub hostcert: PathBuf,
    /// `localcacert`.
    pub localcacert: PathBuf,
    /// `hostcrl` (or webserver.conf's `ssl-crl-path`).
    pub hostcrl: PathBuf,
    /// The files' stamps and dates at the last read: read again only when a file changed.
    pub last: Arc<Mutex<Option<(Stamps, Expiries)>>>,
}

/// The three files' stamps, in the order of [`Files`]; `None` for one that cannot be examined.
pub type Stamps = [Option<FileStamp>; 3];

impl Files {
    /// What they say now: read again only when one of them changed since the last read (a
    /// large CRL is not parsed every minute).
    pub fn read_if_changed(&self) -> Expiries {
        let stamps = [&self.hostcert, &self.localcacert, &self.hostcrl].map(|p| FileStamp::of(p));
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, dates)) = last.as_ref()
            && *seen == stamps
        {
            return dates.clone();
        }
        // The daemon's reader, every [`REFRESH`]: what cannot be read is logged.
        let dates = Expiries::read(&self.hostcert, &self.localcacert, &self.hostcrl);
        for why in &dates.unreadable {
            tracing::debug!(%why, "cannot read certificate dates");
        }
        *last = Some((stamps, dates.clone()));
        dates
    }
}

/// How often the daemon re-reads the files: they change a few times a year (renewal, a new
/// CRL), and a scrape then shows the new dates within this.
pub const REFRESH: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    /// A deploy record's time a person can read, and one RFC 3339 has no year for (an offset
    /// west of UTC on the last second of 9999) as a count, not a panic.
    #[test]
    fn timestamps_outside_rfc_3339_are_counts() {
        assert_eq!(timestamp(1_795_520_432), "2026-11-24T11:40:32Z");
        assert_eq!(timestamp(253_402_304_399), "253402304399 s since the epoch");
        assert_eq!(timestamp(-1), "-1 s since the epoch");
        assert_eq!(
            timestamp(i64::MAX),
            format!("{} s since the epoch", i64::MAX)
        );
    }

    /// The daemon reads the files again only when one changed: a stamp seen before gives what
    /// was read then (here a stand-in the files never said), a change reads again.
    #[test]
    fn files_are_read_again_only_when_one_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("cert.pem"), "not a certificate").unwrap();
        let files = Files {
            hostcert: path("cert.pem"),
            localcacert: path("ca.pem"),
            hostcrl: path("crl.pem"),
            last: Arc::default(),
        };
        let first = files.read_if_changed();
        assert!(
            first.unreadable.iter().any(|w| w.contains("cert.pem")),
            "{first:?}"
        );
        let stand_in = Expiries {
            unreadable: vec!["read before".into()],
            ..Expiries::default()
        };
        if let Some((_, dates)) = files.last.lock().unwrap().as_mut() {
            *dates = stand_in.clone();
        }
        assert_eq!(
            files.read_if_changed(),
            stand_in,
            "unchanged: not read again"
        );
        std::fs::write(path("ca.pem"), "not a CA either").unwrap();
        let again = files.read_if_changed();
        assert!(
            again.unreadable.iter().any(|w| w.contains("ca.pem")),
            "{again:?}"
        );
    }
}
