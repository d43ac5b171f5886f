//! The host's last-level cache, as the kernel reports it, and the rule
//! that sizes the largest spliced message from it.

/// The largest spliced message is this fraction of the last-level cache
/// ([`default_splice_max_bytes`]).
pub const SPLICE_MAX_CACHE_SHARE: usize = 32;
/// The largest spliced message where the kernel reports no cache.
pub const SPLICE_MAX_FALLBACK: usize = 1 << 20;

/// The largest message sent spliced ([`crate::TcpOptions::splice_max_bytes`]
/// by default): 1/[`SPLICE_MAX_CACHE_SHARE`] of the last-level cache, no
/// less than [`crate::DEFAULT_SPLICE_MIN_BYTES`] ([`SPLICE_MAX_FALLBACK`]
/// where the kernel reports no cache). A spliced message makes the
/// receiver's copy read the sender's pages where it would otherwise read
/// socket buffers the sender has just written; that pays only while the
/// message is still in the cache the two cores share, next to the
/// sender's and the receiver's buffers. Larger messages are copied.
pub fn default_splice_max_bytes() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| splice_max_for(last_level_cache_bytes()))
}

/// [`default_splice_max_bytes`] for a last-level cache of `llc` bytes.
pub fn splice_max_for(llc: Option<usize>) -> usize {
    llc.map_or(SPLICE_MAX_FALLBACK, |c| {
        (c / SPLICE_MAX_CACHE_SHARE).max(crate::DEFAULT_SPLICE_MIN_BYTES)
    })
}

/// The size of the highest-level cache of CPU 0 as the kernel reports it
/// (`/sys/devices/system/cpu/cpu0/cache/index*/size`, such as `32768K`).
pub fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_cache_size(&size))
        else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, b)| b)
}

/// `32768K`, `1M`, `512` (bytes) as the kernel writes cache sizes.
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, unit) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("lots"), None);
    }

    #[test]
    fn the_splice_maximum_follows_the_cache() {
        assert_eq!(splice_max_for(Some(32 << 20)), 1 << 20);
        assert_eq!(splice_max_for(Some(64 << 20)), 2 << 20);
        assert_eq!(
            splice_max_for(Some(1 << 20)),
            crate::DEFAULT_SPLICE_MIN_BYTES,
            "never below the smallest spliced message"
        );
        assert_eq!(splice_max_for(None), SPLICE_MAX_FALLBACK);
        assert!(default_splice_max_bytes() >= crate::DEFAULT_SPLICE_MIN_BYTES);
    }
}
