//! Every file pmcheck reads besides the drain record (which has stricter rules of its own) is
//! read here, one way: examined before it is opened ([`Examined`]: a FIFO would block, a
//! device may be endless or act on `open()` itself), and read up to a limit that says what such
//! a file may be. The e5ddf73 audit froze the daemon with a FIFO at a deploy record and at the
//! CRL, and fed `check` a 59 MB CRL; the c8a278e audit saw root's `check` open a link to a
//! device (`/dev/watchdog` arms on open).
//!
//! Links are followed: Puppet's certificates and Code Manager's environments may be links.
//! Errors keep the system's kind (a missing file is still `NotFound`), so callers that tell
//! "missing" from "unreadable" keep doing so.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{
    FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::Path;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// Puppet's and pmcheck's own settings files: puppet.conf, conf.d, the environment file, a unit.
pub const CONFIG_LIMIT: u64 = 1024 * 1024;
/// A PEM file of certificates or a key: a CA bundle with a long chain is a few hundred KiB.
pub const PEM_LIMIT: u64 = 4 * 1024 * 1024;
/// A CRL in PEM: about 16 MiB holds half a million revocations, far more than a Puppet CA
/// revokes; pmcheck reads only its dates, and parsing a larger one costs hundreds of MB.
pub const CRL_LIMIT: u64 = 16 * 1024 * 1024;
/// The mode of the lock and the event log: their owner and group open them, nobody else.
pub const SHARED_MODE: u32 = 0o660;

/// Reads `path` whole, if it is a regular file of at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_linked(path, limit, Links::Follow)
}

/// [`read`] as text (invalid UTF-8 is an error, as `std::fs::read_to_string` has it).
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`read`] for pmcheck's own state (a roll's mark, the ramp under way): a link there was
/// planted, and is refused (`ELOOP`).
pub fn read_state(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_linked(path, limit, Links::Refuse)
}

fn read_linked(path: &Path, limit: u64, links: Links) -> io::Result<Vec<u8>> {
    let examined = Examined::at(path, links)?;
    // What is not a regular file, `open` refuses whatever its size.
    if examined.meta.is_file() && examined.meta.len() > limit {
        return Err(too_large(examined.meta.len(), limit));
    }
    let mut file = examined.open(path, Access::Read)?;
    let mut bytes = Vec::with_capacity(usize::try_from(examined.meta.len()).unwrap_or(0));
    (&mut file).take(limit + 1).read_to_end(&mut bytes)?;
    // It grew while read.
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// Whether a link at the path itself is followed, or refused as `ELOOP` (`O_NOFOLLOW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Puppet's files may be links.
    Follow,
    /// pmcheck's own state: a link there is planted.
    Refuse,
}

/// What the file is opened for, once examined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// To read.
    Read,
    /// To read and write (a lock).
    ReadWrite,
    /// To append (a log).
    Append,
}

/// A path looked at through a descriptor that opens nothing (`O_PATH`: the file's own
/// `open()` does not run, so a FIFO does not block and a device does not act), with what it
/// is. [`Examined::open`] then opens that very file, not whatever the path names by then.
#[derive(Debug)]
pub struct Examined {
    handle: File,
    links: Links,
    /// What the path names: its type, size and owner.
    pub meta: Metadata,
}

impl Examined {
    /// Looks at `path`; with [`Links::Refuse`] a link there is `ELOOP`, as `O_NOFOLLOW` has it.
    pub fn at(path: &Path, links: Links) -> io::Result<Self> {
        let nofollow = match links {
            Links::Follow => OFlag::empty(),
            Links::Refuse => OFlag::O_NOFOLLOW,
        };
        let handle = OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_PATH | OFlag::O_CLOEXEC | nofollow).bits())
            .open(path)?;
        let meta = handle.metadata()?;
        if meta.file_type().is_symlink() {
            return Err(io::Error::from_raw_os_error(
                nix::errno::Errno::ELOOP as i32,
            ));
        }
        Ok(Self {
            handle,
            links,
            meta,
        })
    }

    /// Opens the file examined, without blocking, if it is a regular file: through its
    /// descriptor (`/proc/self/fd`), or where /proc is not mounted by its path again, which
    /// must still name the same file.
    pub fn open(&self, path: &Path, access: Access) -> io::Result<File> {
        if let Some(kind) = not_regular(&self.meta) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("it is {kind}, not a regular file"),
            ));
        }
        let through = format!("/proc/self/fd/{}", self.handle.as_raw_fd());
        match options(access, OFlag::empty()).open(&through) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.by_path(path, access),
            opened => self.the_one_examined(opened?, path),
        }
    }

    /// Where /proc is not mounted: `path` opened again without following a link at it (a link
    /// [`Links::Follow`] allows is resolved first), and what is there must be the file
    /// examined: a FIFO swapped in meanwhile is opened without blocking, then refused.
    fn by_path(&self, path: &Path, access: Access) -> io::Result<File> {
        let target = match self.links {
            Links::Follow => std::fs::canonicalize(path)?,
            Links::Refuse => path.to_owned(),
        };
        let file = options(access, OFlag::O_NOFOLLOW).open(target)?;
        self.the_one_examined(file, path)
    }

    /// `file` if it is the regular file examined, blocking again (opened `O_NONBLOCK` so that a
    /// FIFO in its place could not block).
    fn the_one_examined(&self, file: File, path: &Path) -> io::Result<File> {
        let now = file.metadata()?;
        if !now.is_file() || (now.dev(), now.ino()) != (self.meta.dev(), self.meta.ino()) {
            return Err(io::Error::other(format!(
                "{} was replaced while it was opened; try again",
                path.display()
            )));
        }
        let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
        fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
        Ok(file)
    }
}

/// How a file examined is opened: never blocking, never inherited, with `more` flags.
fn options(access: Access, more: OFlag) -> OpenOptions {
    let mut options = OpenOptions::new();
    match access {
        Access::Read => options.read(true),
        Access::ReadWrite => options.read(true).write(true),
        Access::Append => options.append(true),
    };
    options.custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | more).bits());
    options
}

/// Opens `path`, a file of the state directory `dir` that root's commands and the daemon both
/// open (the lock, the event log), for `access`: without following a link at it or opening
/// anything but a regular file (what else stands there is `refused` by what it is). A missing
/// file is made first ([`create_shared`]); one of this user's gets [`SHARED_MODE`] and the
/// directory's group back, whoever made it. Only the owner (or root) may change its group: the
/// lock's ([`Access::ReadWrite`]) must change; the log's ([`Access::Append`]) is best effort,
/// and the other side still opens it through the group when it made the file.
pub(crate) fn open_shared(
    dir: &Path,
    path: &Path,
    access: Access,
    refused: impl Fn(&'static str) -> io::Error,
) -> io::Result<File> {
    let open = || {
        let examined = Examined::at(path, Links::Refuse)?;
        match not_regular(&examined.meta) {
            Some(kind) => Err(refused(kind)),
            None => examined.open(path, access),
        }
    };
    let file = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_shared(dir, path).and_then(|()| open())?
        }
        opened => opened?,
    };
    let meta = file.metadata()?;
    let mine = meta.uid() == nix::unistd::geteuid().as_raw();
    let dir_gid = std::fs::metadata(dir)?.gid();
    if mine && meta.gid() != dir_gid {
        let regrouped = std::os::unix::fs::fchown(&file, None, Some(dir_gid));
        if access == Access::ReadWrite {
            regrouped?;
        }
    }
    if mine && meta.mode() & 0o777 != SHARED_MODE {
        file.set_permissions(std::fs::Permissions::from_mode(SHARED_MODE))?;
    }
    Ok(file)
}

/// Makes `path` with [`SHARED_MODE`] and the directory's group before it has its name: one that
/// appeared with its creator's group (root) refused the daemon until the creator changed it.
/// When another process made it first, theirs stays.
fn create_shared(dir: &Path, path: &Path) -> io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let aside = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&aside);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(SHARED_MODE)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(&aside)?;
    let _ = std::os::unix::fs::fchown(&file, None, Some(std::fs::metadata(dir)?.gid()));
    // The umask took bits off.
    file.set_permissions(std::fs::Permissions::from_mode(SHARED_MODE))?;
    let linked = std::fs::hard_link(&aside, path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        linked => linked,
    }
}

/// What a file is when it is not a regular file (`a FIFO (named pipe)`), in words.
pub(crate) fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    Some(match () {
        () if t.is_file() => return None,
        () if t.is_dir() => "a directory",
        () if t.is_symlink() => "a symbolic link",
        () if t.is_fifo() => "a FIFO (named pipe)",
        () if t.is_socket() => "a socket",
        () if t.is_char_device() => "a character device",
        () if t.is_block_device() => "a block device",
        () => "not a regular file",
    })
}

fn too_large(len: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "it is {} KiB, more than the {} KiB such a file may be",
            len.div_ceil(1024),
            limit / 1024
        ),
    )
}

/// Counts the opens of a file (inotify's `IN_OPEN`), for the tests that prove a FIFO or a
/// device standing in for a file pmcheck reads is never opened.
#[cfg(test)]
pub(crate) struct Opens(nix::sys::inotify::Inotify);

#[cfg(test)]
impl Opens {
    pub(crate) fn of(path: &Path) -> Self {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let opens = Inotify::init(InitFlags::IN_NONBLOCK).expect("inotify");
        opens
            .add_watch(path, AddWatchFlags::IN_OPEN)
            .expect("watch");
        Self(opens)
    }

    /// The opens since the last call.
    pub(crate) fn count(&self) -> usize {
        match self.0.read_events() {
            Ok(events) => events.len(),
            Err(nix::errno::Errno::EAGAIN) => 0,
            Err(e) => panic!("inotify: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_fifo_is_refused_at_once_and_a_device_too() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = Instant::now();
        let e = read(&fifo, CONFIG_LIMIT).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "it is a FIFO (named pipe), not a regular file"
        );
        let e = read(Path::new("/dev/zero"), CONFIG_LIMIT).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let e = read(dir.path(), CONFIG_LIMIT).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    /// The c8a278e audit: a link to a device at a read path had the device's `open()` run. A
    /// FIFO stands in for the device: inotify reports each time it is opened.
    #[test]
    fn what_is_not_a_regular_file_is_never_opened_even_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let link = dir.path().join("hostcrl.pem");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let opens = Opens::of(&fifo);
        for path in [&fifo, &link] {
            let e = read(path, CRL_LIMIT).unwrap_err();
            assert_eq!(
                e.to_string(),
                "it is a FIFO (named pipe), not a regular file"
            );
            let e = Examined::at(path, Links::Follow)
                .unwrap()
                .open(path, Access::ReadWrite)
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
        assert_eq!(opens.count(), 0, "the FIFO was opened");
        let e = Examined::at(&link, Links::Refuse).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::ELOOP as i32));
        // The count works: an open of the FIFO is seen.
        let mine = OpenOptions::new()
            .read(true)
            .custom_flags(OFlag::O_NONBLOCK.bits())
            .open(&fifo)
            .unwrap();
        assert_eq!(opens.count(), 1);
        drop(mine);
    }

    #[test]
    fn an_examined_file_is_opened_as_asked_and_is_the_one_examined() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "one\n").unwrap();
        let examined = Examined::at(&path, Links::Refuse).unwrap();
        // Replaced after the look: the file examined is the one opened.
        std::fs::rename(&path, dir.path().join("old")).unwrap();
        std::fs::write(&path, "two\n").unwrap();
        let mut file = examined.open(&path, Access::Append).unwrap();
        std::io::Write::write_all(&mut file, b"three\n").unwrap();
        let old = std::fs::read_to_string(dir.path().join("old")).unwrap();
        assert_eq!(old, "one\nthree\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
    }

    /// The audit: where /proc is not mounted, the path is opened again, and what was swapped in
    /// meanwhile (a FIFO, a link to one) must neither block nor be taken for the file examined.
    #[test]
    fn without_proc_a_fifo_or_a_link_swapped_in_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let fifo = dir.path().join("fifo");
        let mkfifo = |at: &Path| {
            nix::unistd::mkfifo(at, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
        };
        mkfifo(&fifo);
        let opens = Opens::of(&fifo);
        for links in [Links::Refuse, Links::Follow] {
            for access in [Access::Read, Access::ReadWrite, Access::Append] {
                for swapped in ["fifo", "link"] {
                    std::fs::write(&path, "one\n").unwrap();
                    let examined = Examined::at(&path, links).unwrap();
                    std::fs::remove_file(&path).unwrap();
                    match swapped {
                        "fifo" => mkfifo(&path),
                        _ => std::os::unix::fs::symlink(&fifo, &path).unwrap(),
                    }
                    let (done, said) = std::sync::mpsc::channel();
                    let at = path.clone();
                    std::thread::spawn(move || done.send(examined.by_path(&at, access).err()));
                    let e = said
                        .recv_timeout(Duration::from_secs(5))
                        .unwrap_or_else(|_| panic!("{links:?} {access:?} {swapped}: blocked"))
                        .unwrap_or_else(|| panic!("{links:?} {access:?} {swapped}: opened"));
                    // Else the system refused it: a link not followed (ELOOP), a FIFO opened
                    // to write without a reader (ENXIO).
                    let refused = [nix::errno::Errno::ELOOP, nix::errno::Errno::ENXIO];
                    if !refused.iter().any(|&n| e.raw_os_error() == Some(n as i32)) {
                        assert!(
                            e.to_string().contains(&path.display().to_string()),
                            "{links:?} {access:?} {swapped}: {e}"
                        );
                    }
                    if links == Links::Refuse {
                        assert_eq!(opens.count(), 0, "{access:?}: the link was followed");
                    }
                    std::fs::remove_file(&path).unwrap();
                }
            }
        }
        // The file itself is opened (through a link where links are followed), blocking again.
        std::fs::write(fifo.with_file_name("target"), "one\n").unwrap();
        std::os::unix::fs::symlink("target", &path).unwrap();
        let examined = Examined::at(&path, Links::Follow).unwrap();
        let file = examined.by_path(&path, Access::Append).unwrap();
        let flags = fcntl(&file, FcntlArg::F_GETFL).unwrap();
        assert!(!OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK));
    }

    #[test]
    fn a_file_over_its_limit_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        assert_eq!(read(&path, 4096).unwrap().len(), 4096);
        let e = read(&path, 2048).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            e.to_string(),
            "it is 4 KiB, more than the 2 KiB such a file may be"
        );
    }

    #[test]
    fn a_missing_file_keeps_its_kind_and_links_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(&dir.path().join("none"), CONFIG_LIMIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let target = dir.path().join("target");
        std::fs::write(&target, "x = 1\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read_to_string(&link, CONFIG_LIMIT).unwrap(), "x = 1\n");
    }
}
