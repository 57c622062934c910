//! What makes the compile cache safe to load native code from: entries authenticated with
//! HMAC-SHA256 under a key only the daemon holds (read before it drops privileges, then kept in
//! memory), a key file and a directory that only the daemon's user owns, and counts of what
//! was loaded, compiled and discarded.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// The key's file, in the cache directory.
pub const KEY_FILE: &str = "cache.key";
/// A key is 32 random bytes (HMAC-SHA256's output size; RFC 2104 asks for at least that).
const KEY_BYTES: usize = 32;
/// SHA-256's block size.
const BLOCK: usize = 64;

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts` under `key`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.map(|x| x ^ b);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equality whose time does not depend on where the inputs differ.
pub(crate) fn same_mac(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The key cache entries are authenticated with. Never printed.
#[derive(Clone)]
pub struct CacheKey([u8; KEY_BYTES]);

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheKey(..)")
    }
}

impl CacheKey {
    /// A key of the given 32 bytes (instead of a random or stored one).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// A fresh key from the kernel's random source.
    pub fn random() -> io::Result<Self> {
        let mut k = [0u8; KEY_BYTES];
        let mut got = 0;
        while got < k.len() {
            // SAFETY: writes at most `k.len() - got` bytes into `k` from `got`.
            let n = unsafe { libc::getrandom(k[got..].as_mut_ptr().cast(), k.len() - got, 0) };
            match n {
                n if n > 0 => got += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(Self(k))
    }

    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        hmac_sha256(&self.0, parts)
    }

    /// Reads `dir/cache.key` as the process's effective user, or makes it if there is none.
    /// The file must be a regular file with one name, owned by that user and neither readable
    /// nor writable by group or others, of exactly 32 bytes; one that is not is refused, never
    /// replaced (what put it there is for the operator to see). A new one is written under a
    /// temporary name (`O_EXCL`, mode 0600, no symlink followed) and linked into place, so the
    /// key file is either absent or whole. Check the directory ([`check_dir`]) first.
    pub fn load_or_create(dir: &Path) -> Result<CacheKey, String> {
        let path = dir.join(KEY_FILE);
        match Self::read(&path)? {
            Some(k) => Ok(k),
            None => Self::create(&path),
        }
    }

    /// The key in `path`, `None` when there is no such file.
    fn read(path: &Path) -> Result<Option<CacheKey>, String> {
        let fix = || {
            format!("remove {} and restart to make a new key (each plugin is then compiled once more)", path.display())
        };
        let open = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        let mut file = match open {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // O_NOFOLLOW on a symlink.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(format!("plugin cache key {}: a symbolic link: refused; {}", path.display(), fix()))
            }
            Err(e) => return Err(format!("plugin cache key {}: {e}", path.display())),
        };
        let meta = file.metadata().map_err(|e| format!("plugin cache key {}: {e}", path.display()))?;
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        let problem = if !meta.file_type().is_file() {
            Some("not a regular file".to_string())
        } else if meta.uid() != euid {
            Some(format!("owned by uid {}, not by uid {euid} that reads it", meta.uid()))
        } else if meta.mode() & 0o077 != 0 {
            Some(format!("mode {:04o} lets group or others at it (it must be 0600)", meta.mode() & 0o7777))
        } else if meta.nlink() != 1 {
            Some(format!("{} names (hard links) for one file", meta.nlink()))
        } else if meta.len() != KEY_BYTES as u64 {
            Some(format!("{} bytes, not {KEY_BYTES}", meta.len()))
        } else {
            None
        };
        if let Some(p) = problem {
            return Err(format!("plugin cache key {}: {p}: refused; {}", path.display(), fix()));
        }
        let mut k = [0u8; KEY_BYTES];
        file.read_exact(&mut k).map_err(|e| format!("plugin cache key {}: {e}", path.display()))?;
        Ok(Some(Self(k)))
    }

    fn create(path: &Path) -> Result<CacheKey, String> {
        let key = Self::random().map_err(|e| format!("plugin cache key: getrandom: {e}"))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| format!("plugin cache key: cannot make {}: {e}", tmp.display()))?;
        // link(2) refuses to replace: a key another process made meanwhile stays, and is read.
        let written = f.write_all(&key.0).and_then(|_| f.sync_all()).and_then(|_| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => {
                log::info!("plugin cache key {}: made (32 random bytes, mode 0600)", path.display());
                Ok(key)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Self::read(path)?
                .ok_or_else(|| format!("plugin cache key {}: came and went while it was made", path.display())),
            Err(e) => Err(format!("plugin cache key {}: cannot make it: {e}", path.display())),
        }
    }
}

/// Refuses a cache directory that user `uid` does not own or that group or others may write:
/// whoever can write it can delete or replace entries and the key file. Only the directory
/// itself is checked, not its parents: what the entries run is held by the key (see
/// [`CacheKey::load_or_create`]), and a directory swapped in through a writable parent is
/// refused by these same checks, or holds no key file of this user's.
pub fn check_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("plugin cache {}: {e}", dir.display()))?;
    let mode = meta.mode() & 0o7777;
    if !meta.is_dir() {
        return Err(format!("plugin cache {}: not a directory", dir.display()));
    }
    if meta.uid() != uid || mode & 0o022 != 0 {
        return Err(format!(
            "plugin cache {}: owned by uid {} with mode {mode:04o}: refused, it must be owned by the daemon's user (uid {uid}) and writable by no one else (`chown {uid} {0} && chmod 0700 {0}`, or another WASMSWITCH_CACHE_DIR)",
            dir.display(),
            meta.uid(),
        ));
    }
    Ok(())
}

/// Why a cache entry was deleted and its component compiled instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Not a regular file, too large, or a read error.
    Unreadable,
    /// Not an entry of this format.
    Format,
    /// Written for another component or engine configuration (copied over another's name).
    OtherComponent,
    /// Its MAC does not match: forged, damaged, or written under another key.
    BadMac,
    /// Authentic, but wasmtime's own checks refused it.
    Wasmtime,
}

impl Discard {
    /// Every reason, in declaration order (the order of [`CacheStats`]'s counts).
    pub const ALL: [Discard; 5] =
        [Discard::Unreadable, Discard::Format, Discard::OtherComponent, Discard::BadMac, Discard::Wasmtime];

    /// The reason's label in metrics: snake_case, stable.
    pub fn as_str(self) -> &'static str {
        match self {
            Discard::Unreadable => "unreadable",
            Discard::Format => "format",
            Discard::OtherComponent => "other_component",
            Discard::BadMac => "bad_mac",
            Discard::Wasmtime => "wasmtime",
        }
    }
}

/// Compile cache counts (control plane only; one set per process in the daemon).
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Components loaded from a cache entry.
    pub hits: AtomicU64,
    /// Components compiled (no cache, no entry, or the entry discarded).
    pub compiled: AtomicU64,
    discarded: [AtomicU64; Discard::ALL.len()],
}

impl CacheStats {
    /// Entries discarded for `why` so far.
    pub fn discarded(&self, why: Discard) -> u64 {
        self.discarded[why as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn discard(&self, why: Discard) {
        self.discarded[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// A cache directory and the key its entries are authenticated with.
#[derive(Clone, Debug)]
pub struct CompileCache {
    /// The directory entries (`<hex cache key>.cwasm`) are read from and written to.
    pub dir: PathBuf,
    /// The key entries are written and checked under.
    pub key: CacheKey,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 4231's test cases 1, 2, 3, 4, 6 and 7 (5 is a truncated output).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (vec![0x0b; 20], b"Hi There".to_vec(), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (vec![0xaa; 20], vec![0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            (
                hex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                vec![0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.".to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (key, data, want) in cases {
            assert_eq!(hmac_sha256(&key, &[&data]).to_vec(), hex(want));
            // Split anywhere, the same MAC.
            let (a, b) = data.split_at(data.len() / 3);
            assert_eq!(hmac_sha256(&key, &[a, b]).to_vec(), hex(want));
        }
    }

    /// A fresh folder of mode 0700 under the temporary directory.
    fn scratch(tag: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("wasmswitch-cachekey-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn euid() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn the_key_file_is_made_once_owner_only_and_read_back() {
        let d = scratch("made");
        let k = CacheKey::load_or_create(&d).unwrap();
        let meta = std::fs::metadata(d.join(KEY_FILE)).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.len()), (0o600, euid(), 32));
        assert_eq!(CacheKey::load_or_create(&d).unwrap().0, k.0, "read back, not made again");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "no temporary file left");
        assert_eq!(format!("{k:?}"), "CacheKey(..)", "never printed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_key_file_others_may_read_or_that_is_not_plainly_ours_is_refused_not_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("bad");
        let path = d.join(KEY_FILE);
        let refused = |want: &str| {
            let e = CacheKey::load_or_create(&d).expect_err(want);
            assert!(e.contains(want) && e.contains("refused") && e.contains("remove"), "{want}: {e}");
        };
        std::fs::write(&path, [7u8; 32]).unwrap();
        for mode in [0o644, 0o640, 0o602, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            refused(&format!("mode {mode:04o}"));
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(CacheKey::load_or_create(&d).unwrap().0, [7u8; 32]);
        std::fs::hard_link(&path, d.join("other-name")).unwrap();
        refused("2 names");
        std::fs::remove_file(d.join("other-name")).unwrap();
        std::fs::write(&path, [7u8; 31]).unwrap();
        refused("31 bytes");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), &path).unwrap();
        refused("symbolic link");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        refused("not a regular file");
        std::fs::remove_dir(&path).unwrap();
        if euid() == 0 {
            // Another user's file (here nobody's), even with mode 0600: whoever owns it can
            // read the key.
            std::fs::write(&path, [7u8; 32]).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            refused("owned by uid 65534, not by uid 0");
            assert_eq!(std::fs::read(&path).unwrap(), [7u8; 32], "left as it was");
        } else {
            eprintln!("not root: the owner case is not tried");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_or_another_user_owns_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("dir");
        check_dir(&d, euid()).unwrap();
        for mode in [0o777, 0o1777, 0o770, 0o702] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_dir(&d, euid()).unwrap_err();
            assert!(
                e.contains(&format!("mode {mode:04o}"))
                    && e.contains("chmod 0700")
                    && e.contains(&d.display().to_string()),
                "{e}"
            );
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&d, euid()).unwrap();
        let e = check_dir(&d, euid() + 1).unwrap_err();
        assert!(e.contains(&format!("owned by uid {}", euid())) && e.contains("chown"), "{e}");
        assert!(check_dir(&d.join("absent"), euid()).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn macs_compare_whole() {
        assert!(same_mac(&[1, 2, 3], &[1, 2, 3]));
        assert!(!same_mac(&[1, 2, 3], &[1, 2, 4]) && !same_mac(&[1, 2], &[1, 2, 3]));
    }
}
