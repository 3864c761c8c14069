//! Certificates and the CRL before they expire: `check` warns within --warn-expiry and is
//! critical within --crit-expiry or past it, naming the file, the subject and the date, with
//! the days left as perfdata; /metrics has the dates. The HTTP verdict never changes for it.
//! Every certificate and CRL is made here, against the stub's CA.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::operator::SOON;
use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, SerialNumber,
};
use time::{Duration, OffsetDateTime};

const DAY: i64 = 86_400;

/// Whole seconds, as X.509 dates carry them.
fn at(days: i64) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    OffsetDateTime::from_unix_timestamp(now + days * DAY).unwrap()
}

fn ca_params(cn: &str, until: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = at(-30);
    params.not_after = until;
    params
}

/// A root CA of its own, ending `until`.
fn root(cn: &str, until: OffsetDateTime) -> CertifiedIssuer<'static, KeyPair> {
    CertifiedIssuer::self_signed(ca_params(cn, until), KeyPair::generate().unwrap()).unwrap()
}

/// An intermediate CA signed by `by`, ending `until`.
fn intermediate(
    cn: &str,
    until: OffsetDateTime,
    by: &CertifiedIssuer<'static, KeyPair>,
) -> CertifiedIssuer<'static, KeyPair> {
    CertifiedIssuer::signed_by(ca_params(cn, until), KeyPair::generate().unwrap(), by).unwrap()
}

/// This host's certificate for the fixture key, signed by the stub's CA, ending `until`.
fn hostcert(s: &Setup, until: OffsetDateTime) -> String {
    let key =
        KeyPair::from_pem(&std::fs::read_to_string(fixture("ec.pkcs8.pem")).unwrap()).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, CERTNAME);
    params.not_before = at(-30);
    params.not_after = until;
    params.signed_by(&key, s.ca.issuer()).unwrap().pem()
}

/// A CRL of the stub's CA, issued `this` and due `next`.
fn crl(s: &Setup, this: OffsetDateTime, next: OffsetDateTime) -> String {
    CertificateRevocationListParams {
        this_update: this,
        next_update: next,
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: Vec::new(),
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(s.ca.issuer())
    .unwrap()
    .pem()
    .unwrap()
}

/// The stub's files with a CRL due in a year: nothing near.
fn setup() -> (Setup, PathBuf) {
    let s = Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem");
    let crl_path = s.files.dir.path().join("crl.pem");
    replace(&crl_path, crl(&s, at(-1), at(365)).as_bytes());
    (s, crl_path)
}

fn check(s: &Setup, crl_path: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = s.args(&["--hostcrl", &crl_path.display().to_string()]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let out: Output = pmcheck().arg("check").args(&args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The label each number of days left gives, for each file: 60 nothing, 20 WARNING, 3 and -1
/// CRITICAL; the line names the file, the subject and the date, the perfdata the days.
#[test]
fn each_file_warns_within_30_days_and_is_critical_within_7_or_past() {
    let (s, crl_path) = setup();
    let ca_pem = s.ca.pem();
    for days in [60, 20, 3, -1] {
        let until = at(days);
        let date = humantime_date(until);
        let expected = match days {
            60 => (Some(0), "OK"),
            20 => (Some(1), "WARNING"),
            _ => (Some(2), "CRITICAL"),
        };

        // hostcert. Past its end the stub refuses it, which is CRITICAL all the same.
        replace(&s.files.hostcert, hostcert(&s, until).as_bytes());
        let (code, line) = check(&s, &crl_path, &[]);
        assert_eq!(
            (code, label(&line)),
            expected,
            "hostcert at {days} days: {line}"
        );
        let days_left = format!(" hostcert_days={}", perf_days(days));
        assert!(line.contains(&days_left), "{days_left} in {line}");
        if days < 30 {
            let named = format!("hostcert CN={CERTNAME} (leaf) ");
            assert!(
                line.contains(&named) && line.contains(&date),
                "{named} {date} in {line}"
            );
        }
        replace(&s.files.hostcert, hostcert(&s, at(400)).as_bytes());

        // localcacert: a second root beside the stub's CA (the probe still verifies).
        let other = root("Puppet CA: old", until);
        replace(
            &s.files.localcacert,
            format!("{ca_pem}{}", other.pem()).as_bytes(),
        );
        let (code, line) = check(&s, &crl_path, &[]);
        assert_eq!(
            (code, label(&line)),
            expected,
            "localcacert at {days} days: {line}"
        );
        if days < 30 {
            assert!(
                line.contains("localcacert CN=Puppet CA: old (root) ") && line.contains(&date),
                "{line}"
            );
        }
        replace(&s.files.localcacert, ca_pem.as_bytes());

        // hostcrl: issued a week before its nextUpdate.
        replace(
            &crl_path,
            crl(&s, until - Duration::days(7), until).as_bytes(),
        );
        let (code, line) = check(&s, &crl_path, &[]);
        assert_eq!(
            (code, label(&line)),
            expected,
            "hostcrl at {days} days: {line}"
        );
        assert_contains!(line, &format!(" hostcrl_days={}", perf_days(days)));
        if days < 0 {
            assert_contains!(line, "is past its nextUpdate");
        }
        replace(&crl_path, crl(&s, at(-1), at(365)).as_bytes());
    }
}

/// A chain with an intermediate: each certificate is placed (leaf, intermediate, root), and
/// the thresholds are the operator's.
#[test]
fn an_intermediate_is_named_as_such_and_the_thresholds_are_settable() {
    let (s, crl_path) = setup();
    let old_root = root("Puppet Root CA", at(900));
    let inter = intermediate("Puppet Intermediate CA", at(50), &old_root);
    replace(
        &s.files.localcacert,
        format!("{}{}{}", s.ca.pem(), inter.pem(), old_root.pem()).as_bytes(),
    );
    let (code, line) = check(&s, &crl_path, &[]);
    assert_eq!(code, Some(0), "{line}");
    let (code, line) = check(
        &s,
        &crl_path,
        &["--warn-expiry", "60d", "--crit-expiry", "10d"],
    );
    assert_eq!(code, Some(1), "{line}");
    assert_contains!(
        line,
        "localcacert CN=Puppet Intermediate CA (intermediate) expires "
    );
    assert!(
        line.contains(" localcacert_days=49.") || line.contains(" localcacert_days=50.0"),
        "{line}"
    );
    assert_contains!(line, ";60:;10:");
}

/// The worst state wins and the line names each: a drain's WARNING and a CRL's CRITICAL give
/// CRITICAL with both.
#[test]
fn a_drain_and_an_expired_crl_give_critical_naming_both() {
    let (s, crl_path) = setup();
    let out = s.pmcheck("drain", &["--reason", "kernel upgrade"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (code, line) = check(&s, &crl_path, &[]);
    assert_eq!(code, Some(1), "drained alone is a warning: {line}");
    replace(&crl_path, crl(&s, at(-10), at(-2)).as_bytes());
    let (code, line) = check(&s, &crl_path, &[]);
    assert_eq!(code, Some(2), "{line}");
    assert!(
        line.starts_with("PMCHECK CRITICAL - kernel upgrade (by "),
        "{line}"
    );
    assert_contains!(line, "is past its nextUpdate");
}

/// A CRL that is no CRL is a warning naming the file; a missing one is not (Puppet can run
/// without), and no hostcrl_days is made up.
#[test]
fn an_unreadable_crl_warns_and_a_missing_one_does_not() {
    let (s, crl_path) = setup();
    std::fs::write(&crl_path, "not a CRL").unwrap();
    let (code, line) = check(&s, &crl_path, &[]);
    assert_eq!(code, Some(1), "{line}");
    assert_contains!(
        line,
        &format!("hostcrl {} holds no PEM CRL", crl_path.display())
    );
    std::fs::remove_file(&crl_path).unwrap();
    let (code, line) = check(&s, &crl_path, &[]);
    assert_eq!(code, Some(0), "{line}");
    assert!(!line.contains("hostcrl"), "{line}");
}

/// The daemon's /metrics has each date, and its verdict stays OK with a certificate due in
/// three days.
#[test]
fn the_metrics_carry_the_dates_and_the_verdict_does_not_change() {
    let (s, crl_path) = setup();
    // Each date is taken once: `at` read twice may fall in two different seconds.
    let inter_end = at(50);
    let inter = intermediate("Puppet Intermediate CA", inter_end, &root("R", at(900)));
    let ca_pem = s.ca.pem();
    replace(
        &s.files.localcacert,
        format!("{ca_pem}{}", inter.pem()).as_bytes(),
    );
    let leaf_end = at(3);
    replace(&s.files.hostcert, hostcert(&s, leaf_end).as_bytes());
    let (this, next) = (at(-1), at(6));
    replace(&crl_path, crl(&s, this, next).as_bytes());
    let d = Daemon::start(&s.args(&["--hostcrl", &crl_path.display().to_string()]));
    let reply = d.wait_for(SOON, "OK", |r| r.body.starts_with("OK"));
    assert_eq!(reply.status, 200);
    let scrape = || {
        request(
            d.addr,
            "GET /metrics HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n",
        )
        .body
    };
    let wanted = [
        format!(
            "pmcheck_certificate_expiry_timestamp_seconds{{file=\"hostcert\",position=\"leaf\"}} {}",
            leaf_end.unix_timestamp()
        ),
        format!(
            "pmcheck_certificate_expiry_timestamp_seconds{{file=\"localcacert\",position=\"intermediate\"}} {}",
            inter_end.unix_timestamp()
        ),
        "pmcheck_certificate_expiry_timestamp_seconds{file=\"localcacert\",position=\"root\"}"
            .into(),
        format!(
            "pmcheck_crl_next_update_timestamp_seconds {}",
            next.unix_timestamp()
        ),
        format!(
            "pmcheck_crl_this_update_timestamp_seconds {}",
            this.unix_timestamp()
        ),
    ];
    let deadline = std::time::Instant::now() + SOON;
    let mut body = scrape();
    while !wanted.iter().all(|w| body.contains(w.as_str())) {
        assert!(
            std::time::Instant::now() < deadline,
            "{wanted:?} in\n{body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        body = scrape();
    }

    // The operator's view: status in words, and the JSON with the days left.
    let url = format!("http://{}/", d.addr);
    let out = s.pmcheck("status", &["--url", &url]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let certs = text
        .lines()
        .find(|l| l.starts_with("certs:  "))
        .unwrap_or_default();
    let leaf = format!(
        "hostcert CN={CERTNAME} (leaf) until {}, in 3.0 days",
        humantime_date(leaf_end)
    );
    assert!(certs.contains(&leaf), "{leaf} in {text}");
    assert_contains!(
        certs,
        "localcacert CN=Puppet Intermediate CA (intermediate) until ",
        "{text}"
    );
    assert_contains!(certs, "due for its nextUpdate ", "{text}");
    let out = s.pmcheck("status", &["--url", &url, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let certs = &json["certificates"];
    assert_eq!(certs["crl"]["days_left"], 6.0, "{json}");
    assert_eq!(
        certs["crl"]["next_update"].as_str(),
        Some(humantime_date(next).as_str()),
        "{json}"
    );
    assert_eq!(certs["certs"][0]["position"], "leaf", "{json}");
}

fn label(line: &str) -> &str {
    line.strip_prefix("PMCHECK ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("")
}

/// Days left as the perfdata prints them, one decimal; -1 day rounds to -1.0.
fn perf_days(days: i64) -> String {
    format!("{:.1}", days as f64)
}

/// `2026-12-14T10:00:00Z`, as check prints a date.
fn humantime_date(t: OffsetDateTime) -> String {
    let fmt = time::format_description::well_known::Rfc3339;
    t.format(&fmt).unwrap().replace("+00:00", "Z")
}
