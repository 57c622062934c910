//! Writing Prometheus families by hand: one family, its help and its samples at a time (the
//! collector and every metrics source of the daemon, drivers' included, write theirs so).

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A sample's labels, in order.
pub type Labels = Vec<(&'static str, String)>;

/// Writes one counter family: `name` gets `_total` appended by the encoder.
pub fn counter_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, u64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes one gauge family.
pub fn gauge_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, i64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}
