//! Which partition a sensor belongs to. A cluster divides the fleet into a fixed number of
//! partitions, each served by one node at a time; a sensor's partition must be the same on
//! every node and in the database, forever. So the hash is MD5 (stable, and PostgreSQL
//! computes the same one for the `sensors.hash` column), not Rust's seeded hasher.
//!
//! Partitions are ranges of the 32-bit hash, `p = hash · P / 2³²`, so the sensors of one
//! partition are one index range in the database.

use md5::{Digest, Md5};

use super::SensorId;

/// Partitions when the database is first used, unless `cluster_partitions` says otherwise.
pub const DEFAULT_PARTITIONS: u32 = 128;
/// Most partitions a cluster may have.
pub const MAX_PARTITIONS: u32 = 4096;

/// The first four bytes of the MD5 of the id's text, big-endian. PostgreSQL:
/// `('x' || substr(md5(id), 1, 8))::bit(32)::int8`.
pub fn hash32(id: SensorId) -> u32 {
    let mut buf = [0u8; crate::domain::sensor::MAX_ID_LEN];
    let digest = Md5::digest(id.as_bytes(&mut buf));
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The partition of a hash among `partitions`.
pub fn of_hash(hash: u32, partitions: u32) -> u32 {
    ((hash as u64 * partitions as u64) >> 32) as u32
}

/// The partition of `id` among `partitions`.
pub fn of(id: SensorId, partitions: u32) -> u32 {
    of_hash(hash32(id), partitions)
}

/// The hashes of partition `p`: `lo <= hash < hi`.
pub fn hash_range(p: u32, partitions: u32) -> (i64, i64) {
    let edge = |p: u64| (p << 32).div_ceil(partitions as u64) as i64;
    (edge(p as u64), edge(p as u64 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SensorId {
        SensorId::parse(s).unwrap()
    }

    #[test]
    fn hash_is_md5_as_postgresql_computes_it() {
        // SELECT ('x' || substr(md5('abc'), 1, 8))::bit(32)::int8 → 2416005272
        assert_eq!(hash32(id("abc")), 2_416_005_272);
        assert_eq!(hash32(id("zz")), 636_296_139);
    }

    #[test]
    fn ranges_cover_the_hash_space_and_agree_with_of_hash() {
        for parts in [1, 3, 128, 1000] {
            let mut next = 0i64;
            for p in 0..parts {
                let (lo, hi) = hash_range(p, parts);
                assert_eq!(lo, next, "ranges are contiguous");
                assert!(hi > lo);
                assert_eq!(of_hash(lo as u32, parts), p);
                assert_eq!(of_hash((hi - 1) as u32, parts), p);
                next = hi;
            }
            assert_eq!(next, 1 << 32);
        }
    }

    #[test]
    fn sensors_spread_over_partitions() {
        let mut counts = vec![0u32; 16];
        for i in 0..16_000 {
            counts[of(id(&format!("s{i}")), 16) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
