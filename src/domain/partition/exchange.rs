//! The bucket RabbitMQ's consistent-hash exchange (`x-consistent-hash`, plugin
//! `rabbitmq_consistent_hash_exchange` 3.8 and later) picks for a routing key, computed
//! here so that a cluster's partitions can be the exchange's queues: a reading published
//! with its sensor id as routing key then lands in the queue of its own partition, and the
//! node consuming that queue owns it.
//!
//! The exchange hashes the key with `erlang:phash2` (Bob Jenkins' lookup2 over the bytes of
//! the binary, kept to 27 bits), then picks a bucket among `n` with jump consistent hashing
//! driven by Erlang's `exs1024` generator seeded from that hash. With every binding of
//! weight 1, bucket `i` is the `i`-th queue bound. Only the low 21 bits of the hash reach
//! the generator's seed, so 2²¹ inputs decide every answer; all of them, and thousands of
//! live messages, were checked against RabbitMQ 3.10.8 on Erlang/OTP 25. The tests compare
//! with vectors Erlang computed (`exchange_vectors.escript`).

/// `erlang:phash2(Binary)`: the portable hash of a binary term, the same on every Erlang
/// release and machine (its documented promise), in its default range of 2²⁷.
pub fn phash2(key: &[u8]) -> u32 {
    make_hash2(key) & ((1 << 27) - 1)
}

/// The whole 32 bits of `make_hash2` for a binary (`erlang:phash2(Binary, 1 bsl 32)`).
fn make_hash2(key: &[u8]) -> u32 {
    // HCONST * 13 (the tag of a binary) plus the running hash, which starts at 0.
    const BINARY_SEED: u32 = 0x08d1_2e65;
    if key.is_empty() {
        BINARY_SEED
    } else {
        lookup2(key, BINARY_SEED)
    }
}

/// The golden ratio constant lookup2 starts from.
const HCONST: u32 = 0x9e37_79b9;

/// Bob Jenkins' mix step, as `MIX` in `erts/emulator/beam/utils.c`.
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 13);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 8);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 13);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 12);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 16);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 5);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 3);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 10);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 15);
}

/// lookup2's hash of `key` from `initval`: 12 bytes a round as three little-endian words,
/// then the tail, whose bytes 8 and up go above the length in `c`'s low byte.
fn lookup2(key: &[u8], initval: u32) -> u32 {
    let (mut a, mut b, mut c) = (HCONST, HCONST, initval);
    let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let mut rounds = key.chunks_exact(12);
    for r in &mut rounds {
        a = a.wrapping_add(word(&r[0..4]));
        b = b.wrapping_add(word(&r[4..8]));
        c = c.wrapping_add(word(&r[8..12]));
        mix(&mut a, &mut b, &mut c);
    }
    c = c.wrapping_add(key.len() as u32);
    for (i, &byte) in rounds.remainder().iter().enumerate() {
        let v = u32::from(byte);
        match i {
            0..=3 => a = a.wrapping_add(v << (8 * i)),
            4..=7 => b = b.wrapping_add(v << (8 * (i - 4))),
            _ => c = c.wrapping_add(v << (8 * (i - 7))),
        }
    }
    mix(&mut a, &mut b, &mut c);
    c
}

/// Erlang's `exs1024` (xorshift1024*), as `rand:seed_s(exs1024, {K, K, K})` makes it.
struct Exs1024 {
    s: [u64; 16],
    p: usize,
}

impl Exs1024 {
    /// The seed of `{k, k, k}`: only each element's low 21 bits count.
    fn seed(k: u64) -> Self {
        const M21: u64 = (1 << 21) - 1;
        let part = |mult: u64| (((k & M21) + 1) * mult) & M21;
        let mut r = (part(2_097_131) << 43) | (part(2_097_133) << 22) | (part(2_097_143) << 1) | 1;
        // The sixteen words come from exs64 (xorshift64*), listed last first.
        let mut s = [0u64; 16];
        for w in s.iter_mut().rev() {
            r ^= r >> 12;
            r ^= r << 25;
            r ^= r >> 27;
            *w = r.wrapping_mul(2_685_821_657_736_338_717);
        }
        Self { s, p: 0 }
    }

    fn next(&mut self) -> u64 {
        let s0 = self.s[self.p];
        self.p = (self.p + 1) & 15;
        let mut s1 = self.s[self.p];
        s1 ^= s1 << 31;
        s1 ^= s1 >> 11;
        let next = s0 ^ (s0 >> 30) ^ s1;
        self.s[self.p] = next;
        next.wrapping_mul(1_181_783_497_276_652_981)
    }

    /// `rand:uniform_s/1` of this generator: the 64-bit draw over 2⁶⁴, as a float.
    fn uniform(&mut self) -> f64 {
        self.next() as f64 / 18_446_744_073_709_551_616.0
    }
}

/// The exchange's jump consistent hash of `key` among `n` buckets (`n >= 1`).
fn jump(key: u32, n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let mut rng = Exs1024::seed(u64::from(key));
    let (mut b, mut j) = (0i64, 0f64);
    while j < f64::from(n) {
        b = j as i64;
        // A draw of exactly 0 (one in 2⁶⁴) makes Erlang fail the division and drop the
        // message; here it ends the loop, keeping `b`.
        j = ((b + 1) as f64 / rng.uniform()).trunc();
    }
    b as u32
}

/// The bucket (0-based, in binding order when every binding has weight 1) the exchange
/// sends `routing_key` to when its bindings' weights add up to `buckets`.
pub fn bucket(routing_key: &[u8], buckets: u32) -> u32 {
    jump(phash2(routing_key), buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Erlang's answers: key, phash2, phash2 to 2³², buckets among these counts.
    const VECTORS: &str = include_str!("exchange_vectors.txt");
    const COUNTS: [u32; 5] = [2, 3, 8, 128, 4096];

    fn vectors() -> impl Iterator<Item = (String, Vec<u64>)> {
        VECTORS
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let mut f = l.split(' ');
                let key = f.next().unwrap().to_string();
                (key, f.map(|n| n.parse().unwrap()).collect())
            })
    }

    #[test]
    fn phash2_is_erlangs() {
        let mut n = 0;
        for (key, v) in vectors() {
            assert_eq!(u64::from(phash2(key.as_bytes())), v[0], "phash2({key})");
            assert_eq!(
                u64::from(make_hash2(key.as_bytes())),
                v[1],
                "32 bits of {key}"
            );
            n += 1;
        }
        assert_eq!(n, 400);
    }

    #[test]
    fn buckets_are_the_exchanges() {
        for (key, v) in vectors() {
            for (i, &count) in COUNTS.iter().enumerate() {
                assert_eq!(
                    u64::from(bucket(key.as_bytes(), count)),
                    v[2 + i],
                    "bucket of {key} among {count}"
                );
            }
            assert_eq!(bucket(key.as_bytes(), 1), 0);
        }
    }

    #[test]
    fn keys_of_every_tail_length_are_hashed() {
        // Lengths 1 to 16 end in every arm of the tail; the vectors hold each.
        let lengths: std::collections::BTreeSet<usize> = vectors().map(|(k, _)| k.len()).collect();
        assert!((1..=16).all(|l| lengths.contains(&l)), "{lengths:?}");
    }

    #[test]
    fn buckets_spread_evenly_and_stay_in_range() {
        let mut counts = [0u32; 16];
        for i in 0..32_000 {
            let b = bucket(format!("s{i}").as_bytes(), 16);
            counts[b as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (1700..2300).contains(&c)),
            "{counts:?}"
        );
    }
}
