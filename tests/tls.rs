//! The probe's TLS as this host: server certificates from another CA, for another name or
//! without a SAN; every key format Puppet writes; renewed files picked up.

mod common;

use std::time::Duration;

use common::*;

const SOON: Duration = Duration::from_secs(10);

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let s = Setup::new(Behavior::Running);
    let rogue = Ca::new("rogue");
    let impostor = Stub::start_trusting(&rogue, &s.ca, &[CERTNAME], Behavior::Running);
    let d = Daemon::start(&args(&s.files, impostor.addr, s.state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(a.body, "certificate is not signed by the CA in", "{a:?}");
    assert_eq!(
        impostor.requests(),
        0,
        "no request may reach an unverified server"
    );
}

#[test]
fn a_localcacert_with_several_certificates_works() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("another CA first in the file");
    common::replace(
        &s.files.localcacert,
        format!("{}{}", other.pem(), s.ca.pem()).as_bytes(),
    );
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "a finished probe", |a| {
        !a.body.starts_with("STARTING")
    });
    assert_eq!(a.status, 200, "{a:?}");
}

#[test]
fn a_server_certificate_without_san_gets_a_precise_message() {
    let ca = Ca::new("old");
    let files = HostFiles::new(&ca, "rsa.pkcs8.pem", "rsa.pkcs1.pem");
    let stub = Stub::start(&ca, &[], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(a.body, "has no subjectAltName", "{a:?}");
}

/// A certificate for other names says them as names, and where pmcheck's certname came from.
#[test]
fn a_server_certificate_for_another_name_names_both_and_the_certnames_source() {
    let ca = Ca::new("names");
    let files = HostFiles::new(&ca, "rsa.pkcs8.pem", "rsa.pkcs1.pem");
    let stub = Stub::start(&ca, &["puppet", "puppet.example.com"], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(
        a.body,
        &format!(
            "certificate is for puppet, puppet.example.com but pmcheck expects {CERTNAME} \
             (the certname, from command line): set --certname"
        ),
        "{a:?}"
    );
    assert!(!a.body.contains("DnsName"), "{a:?}");
}

#[test]
fn a_client_certificate_puppet_server_does_not_trust_is_down() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("other");
    s.files
        .install(&other, "rsa.pkcs8.pem", "rsa.pkcs1.pem", &s.ca);
    let d = s.daemon(&[]);
    // Under load TLS 1.3's late alert can lose the race with the request (hyper: "connection
    // was not ready"), still DOWN; the next probe reads the alert.
    let a = d.wait_for(SOON, "DOWN, the certificate rejected", |a| {
        assert!(!a.body.starts_with("OK"), "{a:?}");
        a.body.contains("rejected this host's certificate")
    });
    assert!(a.body.starts_with("DOWN - "), "{a:?}");
}

#[test]
fn every_client_key_format_puppet_writes_works() {
    let ca = Ca::new("keys");
    let stub = Stub::start(&ca, &[CERTNAME], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    for (pkcs8, key) in [
        ("rsa.pkcs8.pem", "rsa.pkcs1.pem"),
        ("ec.pkcs8.pem", "ec.sec1.pem"),
        ("rsa.pkcs8.pem", "rsa.pkcs8.pem"),
        ("ec.pkcs8.pem", "ec.pkcs8.pem"),
    ] {
        let files = HostFiles::new(&ca, pkcs8, key);
        let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
        let a = d.wait_for(SOON, "a finished probe", |a| {
            !a.body.starts_with("STARTING")
        });
        assert_eq!(a.status, 200, "{key}: {a:?}");
    }
}

#[test]
fn encrypted_and_missing_keys_say_exactly_that() {
    let s = Setup::new(Behavior::Running);
    for (key, expected) in [
        ("rsa.encrypted-legacy.pem", "is encrypted"),
        ("rsa.encrypted-pkcs8.pem", "is encrypted"),
        ("ec.pkcs8.pem", "do not fit together"),
    ] {
        s.files.install(&s.ca, "rsa.pkcs8.pem", key, &s.ca);
        let d = s.daemon(&[]);
        let a = d.wait_for(
            SOON,
            "UNKNOWN",
            is("UNKNOWN - cannot probe Puppet Server: "),
        );
        assert!(a.body.contains(expected), "{key}: {a:?}");
        assert!(
            a.body.contains(&s.files.hostprivkey.display().to_string()),
            "{a:?}"
        );
    }
    std::fs::remove_file(&s.files.hostprivkey).unwrap();
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(a.body, "cannot read hostprivkey", "{a:?}");
    assert_contains!(a.body, "No such file", "{a:?}");
}

#[test]
fn renewed_certificate_files_are_picked_up_without_a_restart() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("before renewal");
    s.files
        .install(&other, "rsa.pkcs8.pem", "rsa.pkcs1.pem", &s.ca);
    let mut d = s.daemon(&[]);
    d.wait_for(SOON, "DOWN", is("DOWN"));
    // Renewal: a certificate from the right CA, and a different key type too.
    s.files.install(&s.ca, "ec.pkcs8.pem", "ec.sec1.pem", &s.ca);
    d.wait_for(SOON, "OK after the files changed", is("OK"));
    assert!(
        d.child().try_wait().unwrap().is_none(),
        "the same process, never restarted"
    );
}
