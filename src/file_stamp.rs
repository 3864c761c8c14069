//! A file's identity and change stamp, for noticing a change without re-reading the file.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a file looked like on disk, so a replaced file (Puppet renews atomically: new inode) or
/// one edited in place is noticed without re-reading it at every probe. The change time is what
/// catches an in-place rewrite whose size and mtime were kept (`touch -r`, `cp -p`) and a
/// `chmod`: no user can set it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl FileStamp {
    /// `None` when the file cannot be examined; that too counts as a change when it heals.
    pub fn of(path: &Path) -> Option<Self> {
        std::fs::metadata(path)
            .ok()
            .map(|m| Self::from_metadata(&m))
    }

    /// The stamp of metadata already at hand.
    pub fn from_metadata(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        }
    }
}
