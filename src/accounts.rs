//! Users and groups by name, for the words of messages and records: the user database's
//! name, else the number (`uid 1234`), never an error.

use nix::unistd::{Gid, Group, Uid, User};

/// The user database's name for `uid`, else `uid N`.
pub fn user_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// The group database's name for `gid`, else `gid N`.
pub fn group_name(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(group)) => group.name,
        _ => format!("gid {gid}"),
    }
}
