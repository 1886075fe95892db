//! Which partition a sensor belongs to. A cluster divides the fleet into a fixed number of
//! partitions, each served by one node at a time; a sensor's partition must be the same on
//! every node and in the database, forever. So it is a function of the id alone, fixed with
//! the database ([`Partitioning`]), never Rust's seeded hasher.
//!
//! In the database a partition is a range of the 32-bit `sensors.hash`, `p = hash · P /
//! 2³²`, so the sensors of one partition are one index range. Two functions fill it:
//! - [`Scheme::Md5`], databases made before the exchange's function: the hash is the MD5 of
//!   the id (PostgreSQL computed the same one, as a generated column, until schema 20).
//! - [`Scheme::Exchange`], new databases: the partition is the bucket RabbitMQ's
//!   consistent-hash exchange picks for the id ([`exchange::bucket`]), so each partition's
//!   queue of the exchange holds exactly its sensors; the stored hash is a value inside
//!   that partition's range ([`Partitioning::hash`]), written by latch with every sensor.

use md5::{Digest, Md5};

use super::SensorId;

pub mod exchange;

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

/// How a cluster maps sensors to partitions: chosen when its database is first used, and
/// never changed, since every stored `sensors.hash` and every queue of the exchange follows
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Ranges of the MD5 of the id.
    Md5,
    /// The consistent-hash exchange's bucket of the id.
    Exchange,
}

impl Scheme {
    /// The name the database keeps and `GET /v1/cluster` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Md5 => "md5",
            Scheme::Exchange => "exchange",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "md5" => Some(Scheme::Md5),
            "exchange" => Some(Scheme::Exchange),
            _ => None,
        }
    }
}

/// A fleet's partitions: how many, and by which function. One node on the embedded store
/// uses MD5 over any fixed count (nothing outside it depends on the partitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Partitioning {
    pub count: u32,
    pub scheme: Scheme,
}

impl Partitioning {
    /// `count` MD5 ranges.
    pub fn md5(count: u32) -> Self {
        Self {
            count,
            scheme: Scheme::Md5,
        }
    }

    /// `count` buckets of the consistent-hash exchange.
    pub fn exchange(count: u32) -> Self {
        Self {
            count,
            scheme: Scheme::Exchange,
        }
    }

    /// The partition of `id`.
    pub fn of(self, id: SensorId) -> u32 {
        match self.scheme {
            Scheme::Md5 => of_hash(hash32(id), self.count),
            Scheme::Exchange => {
                let mut buf = [0u8; crate::domain::sensor::MAX_ID_LEN];
                exchange::bucket(id.as_bytes(&mut buf), self.count)
            }
        }
    }

    /// The `sensors.hash` latch stores for `id`: one inside the range of its partition
    /// (`of_hash(hash(id)) == of(id)`), so the range queries find it where this function
    /// puts it. MD5: the MD5 hash itself. Exchange: the MD5 hash folded into the range of
    /// the exchange's bucket, which keeps a partition's sensors spread over its range.
    pub fn hash(self, id: SensorId) -> u32 {
        match self.scheme {
            Scheme::Md5 => hash32(id),
            Scheme::Exchange => {
                let (lo, hi) = hash_range(self.of(id), self.count);
                (lo + i64::from(hash32(id)) % (hi - lo)) as u32
            }
        }
    }
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
        for scheme in [Partitioning::md5(16), Partitioning::exchange(16)] {
            let mut counts = vec![0u32; 16];
            for i in 0..16_000 {
                counts[scheme.of(id(&format!("s{i}"))) as usize] += 1;
            }
            assert!(
                counts.iter().all(|&c| (800..1200).contains(&c)),
                "{scheme:?}: {counts:?}"
            );
        }
    }

    #[test]
    fn the_stored_hash_lies_in_the_range_of_the_sensors_partition() {
        for parts in [1, 3, 8, 128, 4096] {
            for scheme in [Partitioning::md5(parts), Partitioning::exchange(parts)] {
                for i in 0..2_000 {
                    let id = id(&format!("h{i}"));
                    let (lo, hi) = hash_range(scheme.of(id), parts);
                    let h = i64::from(scheme.hash(id));
                    assert!(lo <= h && h < hi, "{scheme:?} {id}");
                    assert_eq!(of_hash(scheme.hash(id), parts), scheme.of(id));
                }
            }
        }
    }

    #[test]
    fn md5_partitions_are_md5_ranges_and_exchange_partitions_the_exchanges_buckets() {
        let md5 = Partitioning::md5(128);
        let ex = Partitioning::exchange(128);
        // From exchange_vectors.txt: RabbitMQ sends "abc" to the 89th of 128 queues.
        assert_eq!(ex.of(id("abc")), 88);
        assert_eq!(md5.of(id("abc")), of_hash(2_416_005_272, 128));
        assert_eq!(md5.hash(id("abc")), 2_416_005_272);
        let differ = (0..1000)
            .filter(|i| md5.of(id(&format!("d{i}"))) != ex.of(id(&format!("d{i}"))))
            .count();
        assert!(differ > 900, "two functions, not one: {differ}");
    }

    #[test]
    fn schemes_are_named_for_the_database() {
        for s in [Scheme::Md5, Scheme::Exchange] {
            assert_eq!(Scheme::parse(s.as_str()), Some(s));
        }
        assert_eq!(Scheme::parse("sha1"), None);
    }
}
