//! Just enough BTF to find a kernel function's type id: what a program needs to call a kfunc
//! (`BPF_PSEUDO_KFUNC_CALL` takes the id of the function's `BTF_KIND_FUNC` in vmlinux BTF).
//! The format is `include/uapi/linux/btf.h`: a header, then the type section (records of a
//! fixed 12 bytes plus a kind-specific tail), then the string section.

use std::sync::OnceLock;

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// Where the running kernel publishes its own BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The type id of the kernel function `name` in the running kernel's BTF, or `None` when the
/// kernel has no BTF or no such function (an older kernel).
pub(crate) fn vmlinux_func_id(name: &str) -> Option<u32> {
    // Read once per process: the file is several MiB, and every port opened asks.
    static VMLINUX_BTF: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    func_id(VMLINUX_BTF.get_or_init(|| std::fs::read(VMLINUX).ok()).as_deref()?, name)
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off.checked_add(4)?)?.try_into().ok()?))
}

/// The id of the `BTF_KIND_FUNC` named `name` in the (little-endian) BTF blob `btf`. `None`
/// for a blob that is not BTF, is cut short, or has no such function.
pub(crate) fn func_id(btf: &[u8], name: &str) -> Option<u32> {
    if btf.get(0..2)? != MAGIC.to_le_bytes() {
        return None;
    }
    let hdr_len = u32_at(btf, 4)? as usize;
    let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
    let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
    let types = btf.get(hdr_len.checked_add(type_off)?..)?.get(..type_len)?;
    let strings = btf.get(hdr_len.checked_add(str_off)?..)?.get(..str_len)?;
    let name_at = |off: usize| -> Option<&[u8]> {
        let s = strings.get(off..)?;
        Some(&s[..s.iter().position(|&c| c == 0)?])
    };
    let mut at = 0;
    // Type ids start at 1 (0 is `void`).
    let mut id = 1u32;
    while at < types.len() {
        let (name_off, info) = (u32_at(types, at)? as usize, u32_at(types, at + 4)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        if kind == KIND_FUNC && name_at(name_off)? == name.as_bytes() {
            return Some(id);
        }
        // The tail after the 12-byte record, by kind (btf.h).
        let tail = match kind {
            1 | 14 | 17 => 4,   // INT, VAR, DECL_TAG
            3 => 12,            // ARRAY
            4 | 5 => 12 * vlen, // STRUCT, UNION: members
            6 => 8 * vlen,      // ENUM
            13 => 8 * vlen,     // FUNC_PROTO: params
            15 => 12 * vlen,    // DATASEC
            19 => 12 * vlen,    // ENUM64
            2 | 7..=12 | 16 | 18 => 0,
            _ => return None, // a kind this parser does not know: stop rather than misread
        };
        at += 12 + tail;
        id += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (kind, vlen, name) with made-up tails of the right length.
    fn blob(types: &[(u32, u32, &str)]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut t = Vec::new();
        for &(kind, vlen, name) in types {
            let off = u32::try_from(strings.len()).unwrap();
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            t.extend_from_slice(&off.to_le_bytes());
            t.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            t.extend_from_slice(&0u32.to_le_bytes());
            let tail = match kind {
                1 => 4,
                4 => 12 * vlen as usize,
                13 => 8 * vlen as usize,
                _ => 0,
            };
            t.extend(std::iter::repeat_n(0xee, tail));
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        let (t_len, s_len) = (u32::try_from(t.len()).unwrap(), u32::try_from(strings.len()).unwrap());
        for v in [24u32, 0, t_len, t_len, s_len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend(t);
        b.extend(strings);
        b
    }

    #[test]
    fn finds_a_function_past_types_with_tails() {
        let b = blob(&[(1, 0, "int"), (4, 3, "xdp_md"), (13, 3, ""), (12, 0, "other"), (12, 0, "wanted")]);
        assert_eq!(func_id(&b, "wanted"), Some(5));
        assert_eq!(func_id(&b, "other"), Some(4));
        // A struct of that name is not a function.
        assert_eq!(func_id(&b, "xdp_md"), None);
        assert_eq!(func_id(&b, "missing"), None);
    }

    #[test]
    fn refuses_what_is_not_btf_or_is_cut_short() {
        let b = blob(&[(12, 0, "f")]);
        assert_eq!(func_id(&b[..b.len() - 3], "f"), None, "string section cut");
        assert_eq!(func_id(&b[..30], "f"), None, "type section cut");
        assert_eq!(func_id(&[0u8; 32], "f"), None, "no magic");
        assert_eq!(func_id(&[], "f"), None);
        let unknown = blob(&[(31, 0, "x"), (12, 0, "f")]);
        assert_eq!(func_id(&unknown, "f"), None, "an unknown kind stops the walk");
    }

    #[test]
    fn the_running_kernel_has_the_vlan_kfunc_from_6_8() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let id = vmlinux_func_id("bpf_xdp_metadata_rx_vlan_tag");
        // Linux 6.8 added it; BTF is on in every distribution kernel of that age.
        if (major, minor) >= (6, 8) {
            assert!(id.is_some_and(|id| id > 0), "kernel {release}: no BTF id for the VLAN kfunc");
        }
        assert_eq!(vmlinux_func_id("wasmswitch_no_such_function"), None);
    }
}
