//! Writing a batch in the WIT layout and reading verdicts back, shared by the Wasm stage and
//! the native comparison stage so both pay exactly the same encoding cost.

use wasmswitch_core::verdict::{BatchView, Verdict};
use wasmswitch_core::PortId;
use wasmswitch_plugin_sdk::abi::{self, RecordMeta};

use crate::stats::PluginStats;

/// Encodes `batch` into `buf` (resized, never shrunk: no allocation once warm). Returns how
/// many of its frames have ports the plugin cannot see ([`ports_unseen`]).
pub fn encode_batch(batch: &BatchView<'_>, header_bytes: usize, buf: &mut Vec<u8>) -> usize {
    let n = batch.descs.len().min(batch.meta.len());
    let stride = abi::stride(header_bytes);
    buf.resize(abi::batch_len(n, header_bytes), 0);
    abi::write_batch_header(buf, n as u16, header_bytes as u16, batch.in_port.0, batch.queue);
    let recs = &mut buf[abi::BATCH_HEADER_LEN..];
    let mut unseen = 0;
    for (i, (d, m)) in batch.descs.iter().zip(batch.meta).enumerate().take(n) {
        unseen += ports_unseen(m, header_bytes) as usize;
        let cap = (d.len as usize).min(header_bytes);
        // SAFETY: the pipeline hands the stage frames this worker holds for the duration of
        // the call and nobody writes them meanwhile (`VerdictStage::run` contract); `bytes`
        // returns an empty slice for an out-of-range descriptor instead of reading wild.
        let frame = unsafe { batch.umem.bytes(d.addr, cap) };
        let meta = RecordMeta::from(m);
        abi::write_record(&mut recs[i * stride..(i + 1) * stride], &meta, frame, header_bytes);
    }
    unseen
}

/// Whether a plugin with a snapshot of `header_bytes` is shown a TCP/UDP frame's IP header but
/// not its ports: IPv6 extension headers or IPv4 options can push the ports past any snapshot,
/// and a plugin that judges by ports (an ACL) would then see a frame without them and let it
/// pass. Such a frame is dropped whatever the plugin answers ([`drop_ports_unseen`]). A
/// plugin whose snapshot stops before the IP header (one that reads MACs only) is not
/// concerned.
#[inline(always)]
pub fn ports_unseen(m: &wasmswitch_core::wire::PacketMeta, header_bytes: usize) -> bool {
    use wasmswitch_core::wire::{flags, ip};
    let ip_header = if m.flags & flags::IPV6 != 0 { ip::IPV6_HEADER_LEN } else { ip::IPV4_MIN_HEADER_LEN };
    m.flags & flags::L4_PORTS != 0
        && m.l3_offset as usize + ip_header <= header_bytes
        && m.l4_offset as usize + 4 > header_bytes
}

/// Turns the verdicts of the frames [`ports_unseen`] names into drops, counted in
/// `stats.ports_unseen`. Out of line: only a batch that holds such a frame pays for it.
#[cold]
#[inline(never)]
pub fn drop_ports_unseen(batch: &BatchView<'_>, header_bytes: usize, verdicts: &mut [Verdict], stats: &PluginStats) {
    let mut n = 0;
    for (v, m) in verdicts.iter_mut().zip(batch.meta) {
        if ports_unseen(m, header_bytes) {
            *v = Verdict::Drop;
            n += 1;
        }
    }
    stats.ports_unseen.add(n);
}

/// Decodes a `process` result for `out.len()` packets: the verdict records into `out`
/// (counting kinds once per batch), then the counter-delta trailer into the plugin's named
/// counters (`ids`: the instance's counter ids as `stats` numbers them, `None` when the same;
/// see [`PluginStats::absorb_staged`]). `Err` when a length is wrong or a kind is unknown: then
/// no counter is touched, but `out` may be partly written (the caller applies the plugin's
/// policy to all of it).
pub fn decode_verdicts(
    bytes: &[u8],
    out: &mut [Verdict],
    stats: &PluginStats,
    ids: Option<&[u32]>,
) -> Result<(), String> {
    let (bytes, trailer) = abi::split_result(bytes, out.len())?;
    // One pass, kinds counted in locals: a `counts[kind] += 1` table would chain every packet
    // through the same memory slot (store-to-load forwarding) when most verdicts agree.
    let (mut drop, mut redirect, mut host, mut host_copy) = (0u64, 0u64, 0u64, 0u64);
    for (o, r) in out.iter_mut().zip(bytes.chunks_exact(abi::VERDICT_LEN)) {
        *o = match r[0] {
            abi::kind::PASS => Verdict::Pass,
            abi::kind::DROP => {
                drop += 1;
                Verdict::Drop
            }
            abi::kind::REDIRECT => {
                redirect += 1;
                Verdict::Redirect(PortId(u16::from_le_bytes([r[2], r[3]])))
            }
            abi::kind::HOST => {
                host += 1;
                Verdict::Host
            }
            abi::kind::HOST_COPY => {
                host_copy += 1;
                Verdict::HostCopy
            }
            k => return Err(format!("unknown verdict kind {k}")),
        };
    }
    for (id, delta) in abi::counter_deltas(trailer) {
        stats.named.add(crate::stats::counter_id(ids, id), delta);
    }
    stats.verdict_pass.add(out.len() as u64 - drop - redirect - host - host_copy);
    stats.verdict_drop.add(drop);
    stats.verdict_redirect.add(redirect);
    stats.verdict_host.add(host);
    stats.verdict_host_copy.add(host_copy);
    Ok(())
}

/// A plugin's logic compiled natively and run as a [`wasmswitch_core::verdict::VerdictStage`]
/// through the same encode/decode as the Wasm stage: the baseline for "what does the Wasm
/// boundary cost" (`examples/plugin_bench.rs`, `wasmswitch bench --plugin`).
pub struct NativeStage<P: wasmswitch_plugin_sdk::Plugin> {
    plugin: P,
    header_bytes: usize,
    buf: Vec<u8>,
    out: Vec<u8>,
    stats: std::sync::Arc<PluginStats>,
}

impl<P: wasmswitch_plugin_sdk::Plugin> NativeStage<P> {
    /// Runs `P::init(config)` natively (host functions go to the SDK's per-thread recorder).
    pub fn new(config: &str, header_bytes: u16) -> Result<Self, String> {
        let plugin = P::init(config)?;
        Ok(Self {
            plugin,
            header_bytes: header_bytes as usize,
            buf: Vec::new(),
            out: Vec::new(),
            stats: Default::default(),
        })
    }

    /// Its verdict counts, kept as a Wasm stage keeps them.
    pub fn stats(&self) -> &std::sync::Arc<PluginStats> {
        &self.stats
    }
}

impl<P: wasmswitch_plugin_sdk::Plugin + Send> wasmswitch_core::verdict::VerdictStage for NativeStage<P> {
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        let unseen = encode_batch(batch, self.header_bytes, &mut self.buf);
        let n = batch.descs.len().min(verdicts.len());
        let ok = wasmswitch_plugin_sdk::rt::run_batch(&mut self.plugin, &self.buf, &mut self.out).is_ok();
        if !ok || decode_verdicts(&self.out, &mut verdicts[..n], &self.stats, None).is_err() {
            verdicts[..n].fill(Verdict::Pass);
        }
        if unseen > 0 {
            drop_ports_unseen(batch, self.header_bytes, &mut verdicts[..n], &self.stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use wasmswitch_core::wire::{flags, PacketMeta};

    use super::ports_unseen;

    #[test]
    fn ports_unseen_only_when_the_ip_header_is_shown_and_the_ports_are_not() {
        let tcp6 = |l4: u16| PacketMeta {
            flags: flags::IPV6 | flags::L4_PORTS,
            l3_offset: 14,
            l4_offset: l4,
            ..Default::default()
        };
        // Ports at 54..58, the whole of them inside 58 bytes, one short at 57.
        assert!(!ports_unseen(&tcp6(54), 58));
        assert!(ports_unseen(&tcp6(54), 57));
        // Behind 20 extension headers of 8 bytes: past the default snapshot.
        assert!(ports_unseen(&tcp6(214), 128) && !ports_unseen(&tcp6(214), 218));
        // A snapshot that stops before the end of the IP header (a MAC-only plugin) never.
        assert!(!ports_unseen(&tcp6(214), 53) && !ports_unseen(&tcp6(54), 12));
        // No ports parsed (ICMP, a later fragment): nothing to hide.
        let icmp = PacketMeta { flags: flags::IPV6, l3_offset: 14, l4_offset: 214, ..Default::default() };
        assert!(!ports_unseen(&icmp, 128));
        let v4 =
            PacketMeta { flags: flags::IPV4 | flags::L4_PORTS, l3_offset: 14, l4_offset: 74, ..Default::default() };
        assert!(ports_unseen(&v4, 64) && !ports_unseen(&v4, 78) && !ports_unseen(&v4, 33));
    }
}
