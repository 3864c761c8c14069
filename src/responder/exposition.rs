//! Prometheus's text exposition formats, written directly: the classic text format 0.0.4 (what
//! `promtool check metrics` and anyone but Prometheus reads) and OpenMetrics 1.0.0 (what
//! Prometheus asks for). The two differ only in how a family is declared: the classic format
//! names a counter's family `_total` and an info's `_info` (a gauge there), OpenMetrics adds
//! `# UNIT` lines and ends with `# EOF`. Samples, labels and their escaping are the same.
//!
//! One writer for both, instead of a metrics crate: pmcheck's series are values it already
//! holds (counters, the latest probe, the drain), read once per scrape, so a registry adds
//! nothing, and the crate it used wrote OpenMetrics only (prometheus/client_rust#51).

use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

/// What a family holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up; its samples are named `_total`.
    Counter,
    /// Any value.
    Gauge,
    /// Buckets, a sum and a count.
    Histogram,
    /// Labels worth knowing, with the value 1; its samples are named `_info`.
    Info,
}

/// A sample's value as the formats write it.
pub trait Value {
    /// Appends the value to `out`.
    fn write(&self, out: &mut String);
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_value!(u8, u32, u64, i64, usize);

impl Value for f64 {
    /// Shortest round-trip decimal, with a `.0` on whole numbers; `+Inf`, `-Inf`, `NaN`.
    fn write(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self:?}");
        }
    }
}

/// One scrape's text.
#[derive(Debug)]
pub struct Exposition {
    out: String,
    openmetrics: bool,
    /// The family being written, `prefix_name` with its unit, which every sample starts with.
    family: String,
}

impl Exposition {
    /// An empty scrape in OpenMetrics or the classic format, with room for `capacity` bytes.
    pub fn new(openmetrics: bool, capacity: usize) -> Self {
        Self {
            out: String::with_capacity(capacity),
            openmetrics,
            family: String::new(),
        }
    }

    /// Declares the family `name` (with `_unit` appended when it has a unit), whose samples
    /// follow.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind, unit: Option<&str>) {
        self.family.clear();
        self.family.push_str(name);
        if let Some(unit) = unit {
            self.family.push('_');
            self.family.push_str(unit);
        }
        let (suffix, kind_name) = match (kind, self.openmetrics) {
            (Kind::Counter, true) => ("", "counter"),
            (Kind::Counter, false) => ("_total", "counter"),
            (Kind::Gauge, _) => ("", "gauge"),
            (Kind::Histogram, _) => ("", "histogram"),
            (Kind::Info, true) => ("", "info"),
            (Kind::Info, false) => ("_info", "gauge"),
        };
        let name = &self.family;
        let _ = write!(self.out, "# HELP {name}{suffix} ");
        escape(&mut self.out, help, false);
        let _ = writeln!(self.out, "\n# TYPE {name}{suffix} {kind_name}");
        if let (Some(unit), true) = (unit, self.openmetrics) {
            let _ = writeln!(self.out, "# UNIT {name} {unit}");
        }
    }

    /// One sample of the family: its name with `suffix` (`_total`, `_info`, `_bucket`, ...),
    /// its labels, its value.
    pub fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: impl Value) {
        self.out.push_str(&self.family);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (name, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(name);
                self.out.push_str("=\"");
                escape(&mut self.out, value, true);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.write(&mut self.out);
        self.out.push('\n');
    }

    /// A family of one unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, unit: Option<&str>, value: impl Value) {
        self.family(name, help, Kind::Gauge, unit);
        self.sample("", &[], value);
    }

    /// The histogram family `name`: its sum, its count, its cumulative buckets.
    pub fn histogram(&mut self, name: &str, help: &str, unit: Option<&str>, h: &Histogram) {
        let counts = h
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.family(name, help, Kind::Histogram, unit);
        self.sample("_sum", &[], counts.sum);
        self.sample("_count", &[], counts.count);
        let mut below = 0;
        let mut le = String::new();
        for (bound, n) in h.bounds.iter().zip(counts.buckets) {
            below += n;
            le.clear();
            bound.write(&mut le);
            self.sample("_bucket", &[("le", &le)], below);
        }
        self.sample("_bucket", &[("le", "+Inf")], counts.count);
    }

    /// The scrape's text.
    pub fn finish(mut self) -> String {
        if self.openmetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

/// A histogram of fixed buckets, counted as observations land.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Mutex<Counts>,
}

#[derive(Debug, Clone)]
struct Counts {
    /// Observations per bucket, not cumulative: `bounds` in order.
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// No observation yet, in buckets up to each of `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        let counts = Counts {
            buckets: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        };
        Self {
            bounds,
            counts: Mutex::new(counts),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, value: f64) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = self.bounds.iter().position(|le| value <= *le) {
            counts.buckets[i] += 1;
        }
        counts.count += 1;
        counts.sum += value;
    }
}

/// Appends `text` with backslashes and newlines escaped, and double quotes in a label value.
fn escape(out: &mut String, text: &str, label: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(write: impl Fn(&mut Exposition)) -> (String, String) {
        let mut classic = Exposition::new(false, 0);
        let mut open = Exposition::new(true, 0);
        write(&mut classic);
        write(&mut open);
        (classic.finish(), open.finish())
    }

    #[test]
    fn the_formats_differ_only_in_how_a_family_is_declared() {
        let (classic, open) = both(|e| {
            e.family("pmcheck_polls", "Polls", Kind::Counter, None);
            e.sample("_total", &[("kind", "http"), ("verdict", "OK")], 3u64);
            e.family("pmcheck_build", "Version", Kind::Info, None);
            e.sample("_info", &[("version", "0.1.0")], 1u8);
            e.gauge("pmcheck_started", "When", Some("seconds"), 1.0);
        });
        assert_eq!(
            classic,
            "# HELP pmcheck_polls_total Polls\n# TYPE pmcheck_polls_total counter\n\
             pmcheck_polls_total{kind=\"http\",verdict=\"OK\"} 3\n\
             # HELP pmcheck_build_info Version\n# TYPE pmcheck_build_info gauge\n\
             pmcheck_build_info{version=\"0.1.0\"} 1\n\
             # HELP pmcheck_started_seconds When\n# TYPE pmcheck_started_seconds gauge\n\
             pmcheck_started_seconds 1.0\n"
        );
        assert_eq!(
            open,
            "# HELP pmcheck_polls Polls\n# TYPE pmcheck_polls counter\n\
             pmcheck_polls_total{kind=\"http\",verdict=\"OK\"} 3\n\
             # HELP pmcheck_build Version\n# TYPE pmcheck_build info\n\
             pmcheck_build_info{version=\"0.1.0\"} 1\n\
             # HELP pmcheck_started_seconds When\n# TYPE pmcheck_started_seconds gauge\n\
             # UNIT pmcheck_started_seconds seconds\npmcheck_started_seconds 1.0\n# EOF\n"
        );
    }

    #[test]
    fn a_histograms_buckets_are_cumulative_and_end_at_inf() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let (classic, _) = both(|e| e.histogram("d", "D", Some("seconds"), &h));
        assert_eq!(
            classic,
            "# HELP d_seconds D\n# TYPE d_seconds histogram\nd_seconds_sum 4.25\n\
             d_seconds_count 4\nd_seconds_bucket{le=\"0.1\"} 1\nd_seconds_bucket{le=\"1.0\"} 3\n\
             d_seconds_bucket{le=\"+Inf\"} 4\n"
        );
    }

    #[test]
    fn values_and_labels_are_written_as_prometheus_reads_them() {
        let (classic, _) = both(|e| {
            e.family("x", "a \\ b\nc", Kind::Gauge, None);
            e.sample("", &[("commit", "a\"b\\c\nd")], 0.1);
            e.sample("", &[], f64::INFINITY);
            e.sample("", &[], 1_795_639_948.371);
            e.sample("", &[], -3i64);
        });
        assert_eq!(
            classic,
            "# HELP x a \\\\ b\\nc\n# TYPE x gauge\nx{commit=\"a\\\"b\\\\c\\nd\"} 0.1\nx +Inf\n\
             x 1795639948.371\nx -3\n"
        );
    }
}
