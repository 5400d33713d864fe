use super::*;
use crate::format::cursor::tests::walk_from;
use crate::format::segment::Damage;
use proptest::prelude::*;

const B: Binding = Binding {
    segment: 3,
    generation: 7,
    engine: 0xE1,
};

/// A segment buffer with one block of `records` at `off`, stored with `codec`.
fn block_bytes(records: &[&[u8]], codec: Codec, off: usize, bind: Binding) -> Vec<u8> {
    let mut raw = Vec::new();
    for r in records {
        raw.extend_from_slice(&record_frame(r.len()));
        raw.extend_from_slice(r);
    }
    let mut dst = vec![0u8; raw.len() + 64];
    let (codec, mut stored) = match compress(codec, &raw, &mut dst) {
        Some(n) => (codec, dst[..n].to_vec()),
        None => (Codec::Raw, raw.clone()),
    };
    let h = seal_in_place(
        None,
        bind,
        off as u64,
        codec,
        raw.len() as u64,
        records.len() as u32,
        0,
        false,
        &mut stored,
    );
    let mut v = vec![0u8; off];
    v.extend_from_slice(&h);
    v.extend_from_slice(&stored);
    v
}

/// The records of the block at `off` of `buf`, read as a reader reads them: checked and
/// decoded by the segment codec's walk.
fn decode(buf: &[u8], off: usize, bind: Binding) -> Result<Vec<Vec<u8>>, Damage> {
    walk_from(buf, off, buf.len(), bind, None)
}

#[test]
fn every_codec_round_trips_and_compressible_data_shrinks() {
    let text = b"lineitem|12345|0.04|N|O|1996-03-13|DELIVER IN PERSON|TRUCK|".repeat(200);
    for codec in [Codec::Raw, Codec::Lz4, Codec::Zstd(1), Codec::Zstd(9)] {
        let recs: Vec<&[u8]> = vec![&text[..], b"", b"x"];
        let buf = block_bytes(&recs, codec, 64, B);
        let h = parse_block_header(&buf[64..]).unwrap();
        if codec != Codec::Raw {
            assert!(h.stored * 4 < h.raw, "{codec:?}: {h:?}");
        }
        assert_eq!(
            decode(&buf, 64, B).unwrap(),
            vec![text.clone(), vec![], b"x".to_vec()]
        );
    }
}

#[test]
fn incompressible_data_is_not_compressed() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..8192)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut dst = vec![0u8; data.len()];
    assert_eq!(compress(Codec::Lz4, &data, &mut dst), None);
    assert_eq!(compress(Codec::Zstd(3), &data, &mut dst), None);
}

#[test]
fn a_block_of_another_segment_generation_engine_or_offset_is_damage() {
    let recs: Vec<&[u8]> = vec![b"hello", b"world"];
    for codec in [Codec::Raw, Codec::Lz4] {
        let buf = block_bytes(&recs, codec, 64, B);
        assert!(decode(&buf, 64, B).is_ok());
        for other in [
            Binding {
                segment: 4,
                generation: 7,
                engine: 0xE1,
            },
            Binding {
                segment: 3,
                generation: 8,
                engine: 0xE1,
            },
            Binding {
                segment: 3,
                generation: 7,
                engine: 0xE2,
            },
        ] {
            assert_eq!(
                decode(&buf, 64, other).unwrap_err(),
                Damage {
                    offset: 64,
                    detail: "block checksum mismatch"
                }
            );
        }
        // The same block moved 64 bytes further on.
        let mut moved = vec![0u8; 64];
        moved.extend_from_slice(&buf);
        assert_eq!(
            decode(&moved, 128, B).unwrap_err().detail,
            "block checksum mismatch"
        );
    }
}

#[test]
fn damage_is_found_and_located() {
    let recs: Vec<&[u8]> = vec![b"hello", b"world"];
    let buf = block_bytes(&recs, Codec::Raw, 64, B);
    // Every single flipped byte of header or stored bytes is caught.
    for i in 64..buf.len() {
        let mut bad = buf.clone();
        bad[i] ^= 0x10;
        let e = decode(&bad, 64, B).unwrap_err();
        assert_eq!(e.offset, 64, "byte {i}: {e:?}");
    }
    // Truncated: inside the header, inside the stored bytes.
    assert_eq!(
        walk_from(&buf[..100], 64, buf.len(), B, None)
            .unwrap_err()
            .detail,
        "segment truncated inside a block header"
    );
    assert_eq!(
        walk_from(&buf[..buf.len() - 1], 64, buf.len(), B, None)
            .unwrap_err()
            .detail,
        "segment truncated inside a block"
    );
    assert_eq!(
        walk_from(&buf, 64, buf.len() - 1, B, None)
            .unwrap_err()
            .detail,
        "block runs past the end of the segment"
    );
    // Zeros (direct-mode padding read as data) are never a block.
    let zeros = [0u8; 128];
    assert!(walk_from(&zeros, 0, 128, B, None).is_err());
}

proptest! {
    #[test]
    fn prop_round_trip(
        recs in proptest::collection::vec(proptest::collection::vec(0u8..4, 0..300), 0..20),
        codec in 0..3u8,
        level in 1..6i32,
    ) {
        let codec = match codec { 0 => Codec::Raw, 1 => Codec::Lz4, _ => Codec::Zstd(level) };
        let refs: Vec<&[u8]> = recs.iter().map(|r| &r[..]).collect();
        let buf = block_bytes(&refs, codec, 64, B);
        prop_assert_eq!(decode(&buf, 64, B).unwrap(), recs);
    }

    #[test]
    fn prop_damage_never_panics_nor_returns_other_bytes(
        recs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 1..8),
        codec in 0..3u8,
        at in any::<prop::sample::Index>(),
        flip in 1..=255u8,
    ) {
        let codec = match codec { 0 => Codec::Raw, 1 => Codec::Lz4, _ => Codec::Zstd(1) };
        let refs: Vec<&[u8]> = recs.iter().map(|r| &r[..]).collect();
        let mut buf = block_bytes(&refs, codec, 64, B);
        let i = 64 + at.index(buf.len() - 64);
        buf[i] ^= flip;
        prop_assert!(decode(&buf, 64, B).is_err());
    }
}

// ---- CRC-32C ----

#[test]
fn the_check_value_of_crc32c() {
    // The catalogue's check value of CRC-32/ISCSI.
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
    assert_eq!(crc32c(b""), 0);
    assert_eq!(crc32c_append(0x1234_5678, b""), 0x1234_5678);
}

#[test]
fn agrees_with_the_crc32c_crate_at_every_size_offset_and_split() {
    let data: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let lens = [
        0usize, 1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 4095, 4096, 65_537,
    ];
    let small = cfg!(miri);
    for &len in &lens {
        if small && len > 4096 {
            continue;
        }
        for start in [0usize, 1, 7] {
            let d = &data[start..start + len];
            assert_eq!(crc32c(d), crc32c::crc32c(d), "len {len} at {start}");
            for split in [0, len / 3, len] {
                let (a, b) = d.split_at(split);
                assert_eq!(
                    crc32c_append(crc32c(a), b),
                    crc32c::crc32c_append(crc32c::crc32c(a), b),
                    "len {len} at {start} split {split}"
                );
            }
        }
    }
}
