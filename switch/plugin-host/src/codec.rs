//! Writing a batch in the WIT layout and reading verdicts back, shared by the Wasm stage and
//! the native comparison stage so both pay exactly the same encoding cost.

use wasmswitch_core::verdict::{BatchView, Verdict};
use wasmswitch_plugin_sdk::abi::{self, RecordMeta};

use crate::stats::PluginStats;

/// Encodes `batch` into `buf` (resized, never shrunk: no allocation once warm).
pub fn encode_batch(batch: &BatchView<'_>, header_bytes: usize, buf: &mut Vec<u8>) {
    let n = batch.descs.len().min(batch.meta.len());
    let stride = abi::stride(header_bytes);
    buf.resize(abi::batch_len(n, header_bytes), 0);
    abi::write_batch_header(buf, n as u16, header_bytes as u16, batch.in_port, batch.queue);
    let recs = &mut buf[abi::BATCH_HEADER_LEN..];
    for (i, (d, m)) in batch.descs.iter().zip(batch.meta).enumerate().take(n) {
        let cap = (d.len as usize).min(header_bytes);
        // SAFETY: the pipeline hands the stage frames this worker holds for the duration of
        // the call and nobody writes them meanwhile (`VerdictStage::run` contract); `bytes`
        // returns an empty slice for an out-of-range descriptor instead of reading wild.
        let frame = unsafe { batch.umem.bytes(d.addr, cap) };
        let meta = RecordMeta {
            len: m.len,
            flags: m.flags,
            vlan: m.vlan,
            ethertype: m.ethertype,
            l3_offset: m.l3_offset,
            l4_offset: m.l4_offset,
            ip_proto: m.ip_proto,
        };
        abi::write_record(&mut recs[i * stride..(i + 1) * stride], &meta, frame, header_bytes);
    }
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
                Verdict::Redirect(u16::from_le_bytes([r[2], r[3]]))
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

    pub fn stats(&self) -> &std::sync::Arc<PluginStats> {
        &self.stats
    }
}

impl<P: wasmswitch_plugin_sdk::Plugin + Send> wasmswitch_core::verdict::VerdictStage for NativeStage<P> {
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        encode_batch(batch, self.header_bytes, &mut self.buf);
        let n = batch.descs.len().min(verdicts.len());
        let ok = wasmswitch_plugin_sdk::rt::run_batch(&mut self.plugin, &self.buf, &mut self.out).is_ok();
        if !ok || decode_verdicts(&self.out, &mut verdicts[..n], &self.stats, None).is_err() {
            verdicts[..n].fill(Verdict::Pass);
        }
    }
}
