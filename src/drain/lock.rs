//! The lock every change of the drain record is made under: `STATE_DIR/lock`, a file that only
//! its owner and the state directory's group can open (0660), so that no other local user can
//! hold it. A lock of the directory itself could be taken by anyone who can open the
//! directory: on e5ddf73 a shared `flock` by user nobody blocked every drain, the emergency one
//! too. The wait for it is bounded and names who holds it.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use thiserror::Error;

use crate::safe_file::{Access, open_shared};
use crate::settings::duration::format_duration;

/// The lock file's name in the state directory.
pub const NAME: &str = "lock";
/// How long a change waits for another: a drain or a cycle step holds it for milliseconds.
pub const WAIT: Duration = Duration::from_secs(10);

/// Why the lock could not be taken.
#[derive(Debug, Error)]
pub enum LockError {
    /// The lock file cannot be opened or created.
    #[error("{0}")]
    Open(#[source] io::Error),
    /// Someone else held it for the whole wait.
    #[error(
        "{} is held by {holder} and was not released within {}; if that process is stuck, \
         stop it, then run the command again",
        path.display(), format_duration(*waited)
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, in words.
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// How often a waiting change tries the lock again.
const RETRY: Duration = Duration::from_millis(25);

/// Takes the exclusive lock of the state directory `dir`, waiting at most `wait` on this
/// thread: for code outside the runtime (the daemon's blocking pool, tests); released when
/// dropped.
pub fn acquire(dir: &Path, wait: Duration) -> Result<Flock<File>, LockError> {
    let mut trying = Trying::open(dir, wait)?;
    loop {
        match trying.once()? {
            Some(lock) => return Ok(lock),
            None => std::thread::sleep(RETRY),
        }
    }
}

/// [`acquire`] on the runtime's timer, for the commands: dropping the future (a cycle's
/// Ctrl-C) ends the wait at once, with nothing taken or changed.
pub async fn acquire_async(dir: &Path, wait: Duration) -> Result<Flock<File>, LockError> {
    let mut trying = Trying::open(dir, wait)?;
    loop {
        match trying.once()? {
            Some(lock) => return Ok(lock),
            None => tokio::time::sleep(RETRY).await,
        }
    }
}

/// The lock file, opened, and until when it is tried.
struct Trying {
    /// `None` only while `flock` has it.
    file: Option<File>,
    path: PathBuf,
    wait: Duration,
    deadline: Instant,
}

impl Trying {
    fn open(dir: &Path, wait: Duration) -> Result<Self, LockError> {
        let path = dir.join(NAME);
        let file = open(dir, &path).map_err(LockError::Open)?;
        Ok(Self {
            file: Some(file),
            path,
            wait,
            deadline: Instant::now() + wait,
        })
    }

    /// One try without blocking: the lock, `None` to try again, or the error once the wait
    /// is over.
    fn once(&mut self) -> Result<Option<Flock<File>>, LockError> {
        let Some(file) = self.file.take() else {
            return Err(LockError::Open(io::Error::other("the lock file was lost")));
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((back, Errno::EWOULDBLOCK)) if Instant::now() < self.deadline => {
                self.file = Some(back);
                Ok(None)
            }
            Err((back, Errno::EWOULDBLOCK)) => Err(LockError::Held {
                holder: holder(&back),
                path: self.path.clone(),
                waited: self.wait,
            }),
            Err((_, errno)) => Err(LockError::Open(errno.into())),
        }
    }
}

/// Opens the lock ([`open_shared`]: a FIFO or a device planted there is examined, never
/// opened), mode 0660 with the directory's group (whoever creates it, the other side can still
/// open it).
fn open(dir: &Path, path: &Path) -> io::Result<File> {
    let not_regular = |kind: &str| {
        io::Error::other(format!(
            "{} is {kind}, not a regular file: remove it",
            path.display()
        ))
    };
    let refused = |kind| match kind {
        "a directory" => io::Error::other(format!(
            "{} is a directory, not the lock: remove it (rmdir)",
            path.display()
        )),
        kind => not_regular(kind),
    };
    match open_shared(dir, path, Access::ReadWrite, refused) {
        Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => {
            Err(not_regular("a symbolic link"))
        }
        opened => opened,
    }
}

/// `PID 1234 (sleep, user nobody)`, from /proc/locks; `another process` when the system does
/// not say.
fn holder(file: &File) -> String {
    let found = file.metadata().ok().and_then(|meta| {
        let locks = fs::read_to_string("/proc/locks").ok()?;
        holder_pid(&locks, meta.dev(), meta.ino())
    });
    let Some(pid) = found else {
        return "another process (the system does not say which; `lsof` on the file may)".into();
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    match fs::metadata(format!("/proc/{pid}")) {
        Ok(m) => {
            let user = crate::accounts::user_name(m.uid());
            format!("PID {pid} ({}, user {user})", comm.trim())
        }
        Err(_) => format!("PID {pid}"),
    }
}

/// The PID holding a lock on the file with `dev` and `ino`, from /proc/locks' lines
/// (`1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`; waiters' lines carry `->`).
fn holder_pid(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev), ino);
    locks.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.get(1) == Some(&"->") {
            return None;
        }
        let pid = words.get(4)?.parse().ok()?;
        let mut id = words.get(5)?.split(':');
        let major = u64::from_str_radix(id.next()?, 16).ok()?;
        let minor = u64::from_str_radix(id.next()?, 16).ok()?;
        let inode = id.next()?.parse().ok()?;
        ((major, minor, inode) == want).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_0660_and_a_held_one_bounds_the_wait_and_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path(), WAIT).unwrap();
        let meta = fs::metadata(dir.path().join(NAME)).unwrap();
        assert_eq!(meta.mode() & 0o777, crate::safe_file::SHARED_MODE);
        let started = Instant::now();
        let e = acquire(dir.path(), Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(200));
        let text = e.to_string();
        assert!(
            text.contains(&format!("{} is held by ", dir.path().join(NAME).display()))
                && text.contains("was not released within 200ms"),
            "{text}"
        );
        // Where the system lists its locks, the holder is this process, named.
        if fs::read_to_string("/proc/locks").is_ok_and(|l| l.contains("FLOCK")) {
            assert!(
                text.contains(&format!("PID {} (", std::process::id())),
                "{text}"
            );
        }
        drop(first);
        acquire(dir.path(), Duration::ZERO).expect("free again");
    }

    #[tokio::test]
    async fn the_runtimes_wait_is_bounded_and_gets_the_lock_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path(), WAIT).unwrap();
        let e = acquire_async(dir.path(), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Held { .. }), "{e}");
        let waiting = acquire_async(dir.path(), WAIT);
        let releasing = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(first);
        };
        let (taken, ()) = tokio::join!(waiting, releasing);
        taken.expect("taken once released");
    }

    #[test]
    fn proc_locks_lines_give_the_holder_not_a_waiter() {
        let dev = nix::sys::stat::makedev(0xfd, 1);
        let locks = "1: FLOCK  ADVISORY  WRITE 77 fd:01:5678 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 88 fd:01:5678 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 99 08:02:5678 0 EOF\n";
        assert_eq!(holder_pid(locks, dev, 5678), Some(77));
        assert_eq!(
            holder_pid(locks, nix::sys::stat::makedev(8, 2), 5678),
            Some(99)
        );
        assert_eq!(holder_pid(locks, dev, 1), None);
    }

    #[test]
    fn a_lock_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(NAME)).unwrap();
        let e = acquire(dir.path(), WAIT).unwrap_err().to_string();
        assert!(
            e.contains(&dir.path().join(NAME).display().to_string()),
            "{e}"
        );
    }

    /// The c8a278e audit: a FIFO (or a device) at the lock had its `open()` run.
    #[test]
    fn a_fifo_or_a_link_at_the_lock_is_named_and_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o660)).unwrap();
        let opens = crate::safe_file::Opens::of(&path);
        let e = acquire(dir.path(), WAIT).unwrap_err().to_string();
        assert!(
            e.contains("is a FIFO (named pipe), not a regular file: remove it"),
            "{e}"
        );
        assert_eq!(opens.count(), 0, "the FIFO was opened");
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        let e = acquire(dir.path(), WAIT).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link, not a regular file"), "{e}");
    }
}
