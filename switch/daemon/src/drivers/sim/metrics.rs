//! A sim port's metrics: what its NIC queues could not receive.

use prometheus_client::encoding::DescriptorEncoder;

use crate::drivers::PortInfo;
use crate::prom::counter_family;

use super::SimInfo;

/// Writes the sim driver's families over its `ports`.
pub(crate) fn encode(e: &mut DescriptorEncoder, ports: &[(&PortInfo, &SimInfo)]) -> std::fmt::Result {
    let mut missed = Vec::new();
    for (info, sim) in ports {
        for q in 0..sim.stats.len() {
            missed.push((vec![("port", info.name.clone()), ("queue", q.to_string())], sim.missed(q)));
        }
    }
    counter_family(
        e,
        "wasmswitch_sim_rx_missed",
        "Packets a sim NIC queue could not receive (fill ring empty).",
        &missed,
    )?;
    Ok(())
}
