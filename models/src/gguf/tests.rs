//! Unit tests of the header checks, on files built byte by byte here.

use super::*;

/// Builds a GGUF file: metadata given as (key, type id, encoded value).
struct Builder {
    version: u32,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data_len: usize,
}

fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

impl Builder {
    fn new() -> Self {
        Self {
            version: 3,
            kvs: vec![],
            tensors: vec![],
            data_len: 0,
        }
    }
    fn build(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, t, v) in &self.kvs {
            b.extend(gguf_str(k));
            b.extend(t.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, ty, off) in &self.tensors {
            b.extend(gguf_str(name));
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        let align = self
            .kvs
            .iter()
            .find(|(k, _, _)| k == "general.alignment")
            .map_or(32, |(_, _, v)| {
                u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize
            });
        b.resize(b.len().next_multiple_of(align) + self.data_len, 0);
        b
    }
}

fn two_f32_tensors(second_offset: u64) -> Builder {
    let mut b = Builder::new();
    b.tensors.push(("x".into(), vec![4], 0, 0));
    b.tensors.push(("y".into(), vec![8], 0, second_offset));
    b.data_len = 64;
    b
}

#[test]
fn well_formed_file_parses_with_data_aligned() {
    let mut b = two_f32_tensors(32);
    b.kvs.push(("general.name".into(), 8, gguf_str("tiny")));
    let f = GgufFile::parse(b.build()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_start % 32, 0);
    assert_eq!(
        f.metadata_value("general.name").unwrap().as_str(),
        Some("tiny")
    );
    assert_eq!(f.tensor_f32("y").unwrap(), vec![0.0; 8]);
    assert_eq!(f.tensor_f32("z"), Err(GgufError::MissingTensor("z".into())));
}

#[test]
fn magic_and_version_are_checked() {
    let mut bytes = two_f32_tensors(32).build();
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::parse(bytes),
        Err(GgufError::BadMagic {
            found: [b'X', b'G', b'U', b'F']
        })
    ));
    for (version, ok) in [(1, false), (2, true), (3, true), (4, false)] {
        let mut b = two_f32_tensors(32);
        b.version = version;
        let r = GgufFile::parse(b.build());
        assert_eq!(r.is_ok(), ok, "version {version}: {r:?}");
        if !ok {
            assert!(matches!(r, Err(GgufError::UnsupportedVersion(v)) if v == version));
        }
    }
}

#[test]
fn custom_alignment_is_honoured_and_validated() {
    let mut b = two_f32_tensors(64);
    b.kvs
        .push(("general.alignment".into(), 4, 64u32.to_le_bytes().to_vec()));
    b.data_len = 96;
    let f = GgufFile::parse(b.build()).unwrap();
    assert_eq!((f.alignment, f.data_start % 64), (64, 0));

    let mut b = two_f32_tensors(32);
    b.kvs
        .push(("general.alignment".into(), 4, 64u32.to_le_bytes().to_vec()));
    b.data_len = 96;
    assert!(matches!(
        GgufFile::parse(b.build()),
        Err(GgufError::Misaligned {
            offset: 32,
            alignment: 64,
            ..
        })
    ));

    let mut b = two_f32_tensors(32);
    b.kvs
        .push(("general.alignment".into(), 4, 48u32.to_le_bytes().to_vec()));
    assert!(matches!(
        GgufFile::parse(b.build()),
        Err(GgufError::InvalidAlignment(_))
    ));
}

#[test]
fn tensor_ranges_are_checked() {
    assert!(matches!(
        GgufFile::parse(two_f32_tensors(16).build()),
        Err(GgufError::Misaligned { .. })
    ));
    assert!(matches!(
        GgufFile::parse(two_f32_tensors(0).build()),
        Err(GgufError::OverlappingTensors { .. })
    ));
    assert!(matches!(
        GgufFile::parse(two_f32_tensors(64).build()),
        Err(GgufError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        GgufFile::parse(two_f32_tensors(u64::MAX - 31).build()),
        Err(GgufError::SizeOverflow { .. })
    ));
}

#[test]
fn empty_tensor_between_does_not_hide_an_overlap() {
    let mut b = Builder::new();
    b.tensors.push(("a".into(), vec![32], 0, 0)); // bytes [0, 128)
    b.tensors.push(("e".into(), vec![0], 0, 32)); // empty
    b.tensors.push(("b".into(), vec![8], 0, 64)); // inside a
    b.data_len = 128;
    assert!(matches!(
        GgufFile::parse(b.build()),
        Err(GgufError::OverlappingTensors { .. })
    ));
}

#[test]
fn tensor_infos_are_checked() {
    type Check = fn(&GgufError) -> bool;
    let cases: [(Vec<u64>, u32, Check); 4] = [
        (vec![32], 4, |e| {
            matches!(e, GgufError::UnknownGgmlType { type_id: 4, .. })
        }),
        (vec![1, 1, 1, 1, 1], 0, |e| {
            matches!(e, GgufError::TooManyDimensions { n_dims: 5, .. })
        }),
        (vec![16, 2], 8, |e| {
            matches!(
                e,
                GgufError::NotWholeBlocks {
                    value: 16,
                    block: 32,
                    ..
                }
            )
        }),
        (vec![u64::MAX, 2], 0, |e| {
            matches!(e, GgufError::SizeOverflow { .. })
        }),
    ];
    for (dims, ty, check) in cases {
        let mut b = Builder::new();
        b.tensors.push(("t".into(), dims.clone(), ty, 0));
        b.data_len = 64;
        let err = GgufFile::parse(b.build()).unwrap_err();
        assert!(check(&err), "{dims:?} type {ty}: {err}");
    }
}

#[test]
fn duplicates_are_rejected() {
    let mut b = two_f32_tensors(32);
    b.tensors[1].0 = "x".into();
    assert!(matches!(
        GgufFile::parse(b.build()),
        Err(GgufError::Duplicate { what: "tensor", .. })
    ));
    let mut b = two_f32_tensors(32);
    b.kvs.push(("k".into(), 0, vec![1]));
    b.kvs.push(("k".into(), 0, vec![2]));
    assert!(matches!(
        GgufFile::parse(b.build()),
        Err(GgufError::Duplicate {
            what: "metadata key",
            ..
        })
    ));
}

#[test]
fn absurd_counts_are_refused_before_allocation() {
    let mut bytes = two_f32_tensors(32).build();
    bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        GgufFile::parse(bytes.clone()),
        Err(GgufError::CountTooLarge { .. })
    ));
    bytes[8..16].copy_from_slice(&2u64.to_le_bytes());
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        GgufFile::parse(bytes),
        Err(GgufError::CountTooLarge { .. })
    ));
}

#[test]
fn every_truncation_is_a_typed_error() {
    let mut b = two_f32_tensors(32);
    b.kvs.push(("s".into(), 8, gguf_str("hello")));
    let bytes = b.build();
    for cut in 0..bytes.len() {
        assert!(GgufFile::parse(bytes[..cut].to_vec()).is_err(), "cut {cut}");
    }
}

/// A scratch file for `open`, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        let name = format!("privmix-gguf-{tag}-{}.gguf", std::process::id());
        TempFile(std::env::temp_dir().join(name))
    }
    fn write(&self, bytes: &[u8]) -> &std::path::Path {
        std::fs::write(&self.0, bytes).unwrap();
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn open_reads_what_parse_reads_one_tensor_at_a_time() {
    let mut b = two_f32_tensors(32);
    // A string longer than the first header prefix (64 bytes in tests): re-reads.
    b.kvs
        .push(("general.name".into(), 8, gguf_str(&"x".repeat(300))));
    let mut bytes = b.build();
    let n = bytes.len();
    for (i, byte) in bytes[n - 64..].iter_mut().enumerate() {
        *byte = i as u8;
    }
    let tmp = TempFile::new("open");
    let opened = GgufFile::open(tmp.write(&bytes)).unwrap();
    let parsed = GgufFile::parse(bytes.clone()).unwrap();
    assert_eq!(opened.metadata, parsed.metadata);
    assert_eq!(opened.tensors, parsed.tensors);
    assert_eq!(opened.data_start, parsed.data_start);
    for t in &parsed.tensors {
        assert_eq!(
            opened.tensor_bytes(&t.name).unwrap(),
            parsed.tensor_bytes(&t.name).unwrap()
        );
        let (a, b) = (opened.tensor_f32(&t.name), parsed.tensor_f32(&t.name));
        assert_eq!(
            a.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    // Every truncation gives `parse`'s error.
    for cut in 0..n {
        let got = GgufFile::open(tmp.write(&bytes[..cut])).err();
        assert_eq!(
            got,
            GgufFile::parse(bytes[..cut].to_vec()).err(),
            "cut {cut}"
        );
    }
    // A file cut short after it was opened: an I/O error naming the file.
    let f = GgufFile::open(tmp.write(&bytes)).unwrap();
    tmp.write(&bytes[..n - 8]);
    assert!(matches!(f.tensor_bytes("y"), Err(GgufError::Io { .. })));
    assert!(matches!(f.tensor_f32("y"), Err(GgufError::Io { .. })));
    assert!(matches!(
        GgufFile::open(tmp.0.with_extension("missing")),
        Err(GgufError::Io { .. })
    ));
}
