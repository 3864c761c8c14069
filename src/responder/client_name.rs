//! The client a poll names in `User-Agent` (`curl`), kept inline in the poller table: HAProxy's
//! checks name none, so a named client is a person or a script, listed apart by `status`.

/// A client's name, the product token of its `User-Agent` (`curl`), kept without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientName {
    bytes: [u8; 15],
    len: u8,
}

impl ClientName {
    /// The product token of `user_agent`: up to `/` or a space, printable ASCII, at most 15
    /// bytes; `None` when there is none.
    pub fn of(user_agent: &[u8]) -> Option<Self> {
        let token = user_agent
            .iter()
            .take_while(|&&b| b != b'/' && b.is_ascii_graphic())
            .take(15);
        let mut name = Self {
            bytes: [0; 15],
            len: 0,
        };
        for (slot, &b) in name.bytes.iter_mut().zip(token) {
            *slot = b;
            name.len += 1;
        }
        (name.len > 0).then_some(name)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("?")
    }
}
