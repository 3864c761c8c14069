//! What the daemon last read of Puppet's files and status besides the probe: shared between
//! their readers ([`crate::reading::refresh`]) and whoever shows them.

use std::sync::Arc;

use crate::puppet::code;
use crate::puppet::expiry::Expiries;
use crate::reading;

/// The daemon's slow readings ([`crate::reading`]), as their readers last published them:
/// for the scrape and the operator's JSON, never for the verdict.
#[derive(Debug, Default)]
pub struct Readings {
    /// The certificates' and the CRL's dates.
    pub expiries: Arc<reading::Latest<Expiries>>,
    /// The deploy records of `--code-environment`, and file sync.
    pub code: Arc<reading::Latest<code::Reading>>,
}

impl Readings {
    /// The latest dates, if read.
    pub fn expiries(&self) -> Option<Arc<Expiries>> {
        self.expiries.read().ok()?.clone()
    }

    /// The latest deploy records, if read.
    pub fn code(&self) -> Option<Arc<code::Reading>> {
        self.code.read().ok()?.clone()
    }
}
