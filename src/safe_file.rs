//! Every file pmcheck reads besides the drain record (which has stricter rules of its own) is
//! read here, one way: opened without blocking (opening a FIFO with no writer would wait
//! forever), checked to be a regular file once open (the path may change between a look and
//! the open), and read up to a limit that says what such a file may be. The e5ddf73 audit
//! froze the daemon with a FIFO at a deploy record and at the CRL, and fed `check` a 59 MB CRL.
//!
//! Links are followed: Puppet's certificates and Code Manager's environments may be links.
//! Errors keep the system's kind (a missing file is still `NotFound`), so callers that tell
//! "missing" from "unreadable" keep doing so.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

use nix::fcntl::OFlag;

use crate::file_stamp::FileStamp;

/// Puppet's and pmcheck's own settings files: puppet.conf, conf.d, the environment file, a unit.
pub const CONFIG_LIMIT: u64 = 1024 * 1024;
/// A PEM file of certificates or a key: a CA bundle with a long chain is a few hundred KiB.
pub const PEM_LIMIT: u64 = 4 * 1024 * 1024;
/// A CRL in PEM: about 16 MiB holds half a million revocations, far more than a Puppet CA
/// revokes; pmcheck reads only its dates, and parsing a larger one costs hundreds of MB.
pub const CRL_LIMIT: u64 = 16 * 1024 * 1024;

/// Reads `path` whole, if it is a regular file of at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_stamped(path, limit).map(|(_, bytes)| bytes)
}

/// [`read`] as text (invalid UTF-8 is an error, as `std::fs::read_to_string` has it).
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`read`], with the stamp of what was read: a caller that keeps it reads again only when
/// the file changed ([`FileStamp::of`]).
pub fn read_stamped(path: &Path, limit: u64) -> io::Result<(FileStamp, Vec<u8>)> {
    let mut file = open(path)?;
    let meta = file.metadata()?;
    if let Some(kind) = not_regular(&meta) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {kind}, not a regular file"),
        ));
    }
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&mut file).take(limit + 1).read_to_end(&mut bytes)?;
    // It grew while read.
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok((FileStamp::from_metadata(&meta), bytes))
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
}

/// What a file is when it is not a regular file (`a FIFO (named pipe)`), in words.
pub(crate) fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    Some(match () {
        () if t.is_file() => return None,
        () if t.is_dir() => "a directory",
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
        let (stamp, _) = read_stamped(&link, CONFIG_LIMIT).unwrap();
        assert_eq!(Some(stamp), FileStamp::of(&target));
    }
}
