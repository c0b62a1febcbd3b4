//! HMAC-SHA256 (RFC 2104) as a secret computes it: the key's padded blocks absorbed once, the
//! hash driven block by block from them.

use sha2::{Digest, Sha256};

const BLOCK: usize = 64;

/// HMAC-SHA256 (RFC 2104) with the key's padded blocks absorbed once, so each MAC costs two
/// hash finalisations and no key schedule. The hash is driven block by block from the two
/// absorbed states: a MAC of a short message is exactly two compressions, with no buffering,
/// allocation or state copying beyond 32 bytes (keys, fingerprints and argument tags take a
/// dozen MACs per call).
#[derive(Clone)]
pub(crate) struct Hmac {
    inner: [u32; 8],
    outer: [u32; 8],
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_INIT: [u32; 8] =
    [0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19];

impl Hmac {
    pub(crate) fn new(key: &[u8]) -> Self {
        let mut block = [0u8; BLOCK];
        if key.len() > BLOCK {
            block[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let pad = |byte: u8| {
            let mut state = SHA256_INIT;
            sha2::block_api::compress256(&mut state, &[block.map(|b| b ^ byte)]);
            state
        };
        Self { inner: pad(0x36), outer: pad(0x5c) }
    }

    /// The MAC of the concatenation of `parts`.
    #[cfg(test)]
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.mac_after(&[], parts)
    }

    /// The MAC of the concatenation of `head` and `parts`.
    pub(super) fn mac_after(&self, head: &[&[u8]], parts: &[&[u8]]) -> [u8; 32] {
        let mut inner = Stream::new(self.inner);
        for part in head.iter().chain(parts) {
            inner.update(part);
        }
        // The outer hash's input is the inner digest: one block, padding and length known.
        let mut block = [0u8; BLOCK];
        block[..32].copy_from_slice(&inner.finish());
        block[32] = 0x80;
        block[BLOCK - 8..].copy_from_slice(&((BLOCK as u64 + 32) * 8).to_be_bytes());
        let mut state = self.outer;
        sha2::block_api::compress256(&mut state, &[block]);
        digest_of(state)
    }
}

/// A SHA-256 state as its digest: the words big-endian.
fn digest_of(state: [u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(state) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// SHA-256 continued from a state that has absorbed one block (the padded key).
struct Stream {
    state: [u32; 8],
    block: [u8; BLOCK],
    filled: usize,
    /// Bytes absorbed, the key's block included.
    length: u64,
}

impl Stream {
    const fn new(state: [u32; 8]) -> Self {
        Self { state, block: [0; BLOCK], filled: 0, length: BLOCK as u64 }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.length += data.len() as u64;
        if self.filled > 0 {
            let take = (BLOCK - self.filled).min(data.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled < BLOCK {
                return;
            }
            sha2::block_api::compress256(&mut self.state, &[self.block]);
            self.filled = 0;
        }
        // Whole blocks straight from the input, the rest kept for later.
        let (blocks, rest) = data.as_chunks::<BLOCK>();
        if !blocks.is_empty() {
            sha2::block_api::compress256(&mut self.state, blocks);
        }
        self.block[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }

    /// FIPS 180-4 padding: `0x80`, zeros, and the length in bits, big-endian.
    fn finish(mut self) -> [u8; 32] {
        self.block[self.filled] = 0x80;
        if self.filled + 1 > BLOCK - 8 {
            // No room for the length: it goes in a block of its own.
            self.block[self.filled + 1..].fill(0);
            sha2::block_api::compress256(&mut self.state, &[self.block]);
            self.block[..BLOCK - 8].fill(0);
        } else {
            self.block[self.filled + 1..BLOCK - 8].fill(0);
        }
        self.block[BLOCK - 8..].copy_from_slice(&(self.length * 8).to_be_bytes());
        sha2::block_api::compress256(&mut self.state, &[self.block]);
        digest_of(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{hex, hex_value};

    fn unhex(text: &str) -> Vec<u8> {
        text.as_bytes().chunks(2).map(|pair| (hex_value(pair[0]).unwrap() << 4) | hex_value(pair[1]).unwrap()).collect()
    }

    /// RFC 4231, test cases 1–4, 6 and 7 (case 5 truncates the output, which we never do).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let long_key = vec![0xaa; 131];
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (vec![0x0b; 20], b"Hi There".to_vec(), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (vec![0xaa; 20], vec![0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            (
                unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                long_key.clone(),
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                long_key,
                b"This is a test using a larger than block-size key and a larger than block-size data. The key \
                  needs to be hashed before being used by the HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (key, data, expected) in cases {
            assert_eq!(hex(&Hmac::new(&key).mac(&[&data])), expected);
            // Split input gives the same MAC.
            let (a, b) = data.split_at(data.len() / 2);
            assert_eq!(hex(&Hmac::new(&key).mac(&[a, b])), expected);
        }
    }

    /// Every message length around the padding and block boundaries, split anywhere, against
    /// HMAC written out with the `Digest` API.
    #[test]
    fn hmac_matches_the_digest_api_at_every_length() {
        let reference = |key: &[u8], data: &[u8]| {
            let mut block = [0u8; BLOCK];
            block[..key.len()].copy_from_slice(key);
            let inner = Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(data).finalize();
            Sha256::new().chain_update(block.map(|b| b ^ 0x5c)).chain_update(inner).finalize().to_vec()
        };
        let key = [0x0b_u8; 40];
        let hmac = Hmac::new(&key);
        let data: Vec<u8> = (0..300_u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in 0..data.len() {
            let message = &data[..len];
            let expected = reference(&key, message);
            assert_eq!(hmac.mac(&[message]).to_vec(), expected, "length {len}");
            let split = len / 3;
            assert_eq!(hmac.mac(&[&message[..split], &[], &message[split..]]).to_vec(), expected, "length {len}");
        }
        // Split at every point around the block boundaries: whole blocks are hashed straight
        // from the input, the rest buffered.
        for len in [55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 191, 192, 200, 300] {
            let message = &data[..len];
            let expected = reference(&key, message);
            for split in 0..=len {
                let (a, b) = message.split_at(split);
                assert_eq!(hmac.mac(&[a, b]).to_vec(), expected, "length {len} split at {split}");
            }
        }
    }
}
