//! Puppet's own files, followed while the daemon runs: Puppet Server's webserver.conf (where it
//! listens) and puppet.conf (the certname, the ssldir and the files of this host's identity).
//! Both are read again when one changes (inotify on their directories) and at each reload, by
//! the rule that read them at start ([`crate::settings::Settings::resolve`]); webserver.conf
//! also at each probe its listener refused.
//!
//! Puppet Server reads webserver.conf only at its own start, so a changed file says nothing yet
//! of where it listens: pmcheck moves when the listener it probes refuses (the restart that
//! applies the file; a stop's hold is then let go of on the new one), and before that only
//! says what it will do. The probe, the agent connections and `status` read the one
//! [`crate::puppet::client::Address`] moved here. A changed identity is not taken up under a
//! running prober (another certname may need another certificate that Puppet has not yet
//! signed): it is said once, with the restart that takes it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use tokio::sync::watch;

use crate::puppet::probe_error::ProbeError;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::settings::host::{Webserver, read_confd_file};
use crate::settings::{Host, Setting, Settings, Source};

/// How long a change settles before the files are read: an editor's or a tool's write may
/// come in several steps.
const SETTLE: Duration = Duration::from_millis(200);

fn webserver(settings: &Settings) -> PathBuf {
    settings.puppetserver_confd.value.join("webserver.conf")
}

/// Follows Puppet's files of `settings` (the daemon's, with the operator's word they came from)
/// until `stop`, each change said once: read again at each `reload` (SIGHUP) and each change
/// (`changed`: [`changes`]); webserver.conf also at each of the probe's `reports` that was
/// refused, to move the probe (`moves`) unless `--puppet-addr` was given.
pub async fn follow(
    settings: Settings,
    moves: watch::Sender<SocketAddr>,
    mut reports: watch::Receiver<Option<Arc<ProbeReport>>>,
    mut reload: watch::Receiver<()>,
    mut changed: watch::Receiver<()>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let webserver = webserver(&settings);
    // The address looked up at start: a name given is not looked up again at each read.
    let mut given = settings.given.clone();
    if let Some(addr) = &mut given.puppet.puppet_addr {
        *addr = settings.puppet_addr.value.to_string();
    }
    let mut said = Said::default();
    // A `--puppet-addr` given never moves: its probes' reports need no reading.
    let following = matches!(settings.puppet_addr.source, Source::Default(_));
    loop {
        let refused = tokio::select! {
            Ok(()) = reload.changed() => false,
            Ok(()) = changed.changed() => {
                tokio::time::sleep(SETTLE).await;
                changed.borrow_and_update();
                false
            }
            Ok(()) = reports.changed(), if following => {
                let report = reports.borrow_and_update();
                let outcome = report.as_deref().map(|r| &r.outcome);
                if !matches!(outcome, Some(ProbeOutcome::Unhealthy(ProbeError::Refused { .. }))) {
                    continue;
                }
                true
            }
            () = &mut stop => return,
            else => return,
        };
        // A refused probe reads where Puppet Server listens, not this host's identity: that
        // is read when the files change, without a lookup of the host's name at every probe.
        let (given, path) = (given.clone(), webserver.clone());
        let read = tokio::task::spawn_blocking(move || {
            let listener = read_confd_file(&path).map(|text| Webserver::parse(path, &text));
            (
                listener,
                (!refused).then(|| Settings::resolve(&given, &Host::REAL)),
            )
        });
        let Ok((web, resolved)) = read.await else {
            continue;
        };
        if following {
            listener(&moves, &webserver, web, refused, &mut said);
        }
        match resolved {
            Some(Ok(now)) => identity(&settings, &now, &mut said),
            Some(Err(e)) => said.once("resolve", e.to_string(), || {
                tracing::warn!(error = %e, "Puppet's files cannot be read as settings now; pmcheck keeps those it started with");
            }),
            None => {}
        }
    }
}

/// What was said last of each thing, so that a change is said once.
#[derive(Default)]
struct Said(Vec<(&'static str, String)>);

impl Said {
    /// Runs `say` unless `what` was last said as `now`.
    fn once(&mut self, what: &'static str, now: String, say: impl FnOnce()) {
        match self.0.iter_mut().find(|(w, _)| *w == what) {
            Some((_, last)) if *last == now => return,
            Some((_, last)) => *last = now,
            None => self.0.push((what, now)),
        }
        say();
    }

    /// Forgets what was said of `what`: it holds no more.
    fn clear(&mut self, what: &'static str) {
        self.0.retain(|(w, _)| *w != what);
    }
}

/// Moves the probe to the listener `web` names when the one probed `refused`; says where it
/// would move otherwise.
fn listener(
    moves: &watch::Sender<SocketAddr>,
    file: &Path,
    web: Option<Webserver>,
    refused: bool,
    said: &mut Said,
) {
    let probed = *moves.borrow();
    let file = file.display();
    let named = match web.map(|w| w.listener()) {
        Some(Some(named)) => named,
        Some(None) => {
            return said.once("listener", "none".into(), || {
                tracing::warn!(%file, probing = %probed, "Puppet Server's webserver.conf names no ssl-port; pmcheck keeps probing");
            });
        }
        None => {
            return said.once("listener", "unreadable".into(), || {
                tracing::warn!(%file, probing = %probed, "cannot read Puppet Server's webserver.conf; pmcheck keeps probing");
            });
        }
    };
    if named == probed {
        said.clear("listener");
    } else if refused {
        moves.send_replace(named);
        said.clear("listener");
        tracing::warn!(%file, from = %probed, to = %named, "Puppet Server's listener moved: the old one refuses and webserver.conf names the new one; probing the new one from now on");
    } else {
        said.once("listener", named.to_string(), || {
            tracing::warn!(%file, from = %probed, to = %named, "webserver.conf names another listener; pmcheck probes the old one, which still answers, and moves to the new one at the first probe the old one refuses (the restart of Puppet Server that applies the file)");
        });
    }
}

/// Says each setting of this host's identity that Puppet's files now resolve otherwise than
/// the daemon runs with, once, with the restart that takes it up.
fn identity(running: &Settings, now: &Settings, said: &mut Said) {
    let values = |s: &Settings| {
        let path = |p: &Setting<PathBuf>| p.value.display().to_string();
        [
            ("certname", s.certname.value.clone()),
            ("ssldir", path(&s.ssldir)),
            ("hostcert", path(&s.hostcert)),
            ("hostprivkey", path(&s.hostprivkey)),
            ("localcacert", path(&s.localcacert)),
            ("hostcrl", path(&s.hostcrl)),
        ]
    };
    said.clear("resolve");
    for ((setting, running), (_, now)) in values(running).into_iter().zip(values(now)) {
        if running == now {
            said.clear(setting);
            continue;
        }
        said.once(setting, now.clone(), || {
            tracing::warn!(setting, %running, %now, "Puppet's files now set this otherwise; pmcheck takes it up at its next start: systemctl restart pmcheck");
        });
    }
}

/// A wake-up at each change to Puppet's files of `settings` (written, replaced, removed), heard
/// from now on (before the daemon says it is ready) by inotify on their directories on a thread
/// of its own (as [`crate::drain::watch`] hears the state directory); none where inotify or the
/// thread cannot be had: reloads and refused probes still read the files.
pub fn changes(settings: &Settings) -> watch::Receiver<()> {
    let files: Vec<PathBuf> = (settings.puppet_conf.value.iter().cloned())
        .chain([webserver(settings)])
        .collect();
    let (wake, woken) = watch::channel(());
    let Ok(inotify) = Inotify::init(InitFlags::IN_CLOEXEC) else {
        return woken;
    };
    // Written, renamed over, or removed; not created, which comes before its bytes.
    let what =
        AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_DELETE;
    let names: Vec<_> = (files.iter())
        .filter_map(|f| Some(f.file_name()?.to_owned()))
        .collect();
    for dir in files.iter().filter_map(|f| f.parent()) {
        let _ = inotify.add_watch(dir, what);
    }
    let forward = move || {
        loop {
            match inotify.read_events() {
                Ok(events) => {
                    let ours =
                        |e: &InotifyEvent| e.name.as_ref().is_some_and(|n| names.contains(n));
                    if events.iter().any(ours) && wake.send(()).is_err() {
                        return;
                    }
                }
                Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    };
    let _ = std::thread::Builder::new()
        .name("puppet-files".into())
        .spawn(forward);
    woken
}
