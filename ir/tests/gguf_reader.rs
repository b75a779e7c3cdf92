//! GGUF reader and writer: round trips, the shared fixtures and real models, and a corpus of
//! broken files generated here (truncated in every section, huge counts, bad alignment,
//! overlapping tensors, ...). Every broken file must give an error, never a panic.

use ir::ggml::GgmlType;
use ir::gguf::{Array, GgufError, GgufFile, GgufWriter, Value};

/// A small valid file with every metadata type, arrays and three tensors.
fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("llama".into()))
        .add_kv("u8", Value::U8(7))
        .add_kv("i8", Value::I8(-7))
        .add_kv("u16", Value::U16(700))
        .add_kv("i16", Value::I16(-700))
        .add_kv("u32", Value::U32(70000))
        .add_kv("i32", Value::I32(-70000))
        .add_kv("f32", Value::F32(1.5))
        .add_kv("bool", Value::Bool(true))
        .add_kv("u64", Value::U64(1 << 40))
        .add_kv("i64", Value::I64(-(1 << 40)))
        .add_kv("f64", Value::F64(2.25))
        .add_kv(
            "strs",
            Value::Array(Array::String(vec!["a".into(), "ü".into(), "".into()])),
        )
        .add_kv("i32s", Value::Array(Array::I32(vec![1, 2])))
        .add_kv("bools", Value::Array(Array::Bool(vec![true, false])));
    let f32s: Vec<u8> = (0..64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("a", &[32, 2], GgmlType::F32, f32s).unwrap();
    w.add_tensor("q", &[32], GgmlType::Q8_0, vec![1; 34])
        .unwrap();
    w.add_tensor("empty", &[0, 4], GgmlType::F16, vec![])
        .unwrap();
    w
}

#[test]
fn round_trip_every_value_type() {
    for version in [2, 3] {
        let w = sample().version(version);
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.version(), version);
        let md = f.metadata();
        assert_eq!(md.len(), 15);
        assert_eq!(md.get("i16"), Some(&Value::I16(-700)));
        assert_eq!(md.get_u32("u16").unwrap(), Some(700));
        assert_eq!(md.get_f32("f64").unwrap(), Some(2.25));
        assert!(
            md.get_u32("i32").is_err(),
            "negative value must not read as u32"
        );
        assert!(md.get_str("u8").is_err());
        assert_eq!(
            md.get_array("strs").unwrap().unwrap().as_strs().unwrap()[1],
            "ü"
        );
        assert_eq!(md.get("i32s"), Some(&Value::Array(Array::I32(vec![1, 2]))));
        assert_eq!(f.tensors().len(), 3);
        let a = f.tensor("a").unwrap();
        assert_eq!(a.ne, [32, 2, 1, 1]);
        assert_eq!(a.n_bytes, 256);
        assert_eq!(&f.tensor_data(a)[4..8], &1f32.to_le_bytes());
        assert_eq!(f.tensor_data(f.tensor("q").unwrap()), &[1u8; 34][..]);
        assert_eq!(f.tensor("empty").unwrap().n_elements(), 0);
        // Writing what was read gives the same bytes.
        let mut w2 = GgufWriter::new().version(version);
        for (k, v) in md.iter() {
            w2.add_kv(k, v.clone());
        }
        for t in f.tensors() {
            w2.add_tensor(&t.name, t.shape(), t.ggml_type, f.tensor_data(t).to_vec())
                .unwrap();
        }
        assert_eq!(
            w2.to_bytes().unwrap(),
            sample().version(version).to_bytes().unwrap()
        );
    }
}

#[test]
fn trailing_bytes_and_no_tensors_are_legal() {
    let mut bytes = sample().to_bytes().unwrap();
    bytes.extend_from_slice(&[0xAB; 100]);
    assert!(GgufFile::from_bytes(bytes).is_ok());
    let mut w = GgufWriter::new();
    w.add_kv("only", Value::U8(1));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert!(f.tensors().is_empty());
    assert!(GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap()).is_ok());
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", Value::U32(64));
    w.add_tensor("x", &[8], GgmlType::F32, vec![0; 32]).unwrap();
    w.add_tensor("y", &[8], GgmlType::F32, vec![0; 32]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.tensor("y").unwrap().offset, 64);
}

fn expect_err(bytes: Vec<u8>, needle: &str) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("expected an error containing '{needle}'"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(needle),
                "error '{msg}' does not mention '{needle}'"
            );
            assert!(!msg.contains('\n'), "error must be one line: {msg}");
            msg
        }
    }
}

#[test]
fn truncation_anywhere_is_an_error_never_a_panic() {
    let bytes = sample().to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    // Every prefix that cuts into the header or the tensor data must fail; prefixes that only
    // drop the padding after the last tensor with data may succeed.
    let last_end = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    let data_start = bytes.len() as u64
        - f.tensors()
            .iter()
            .map(|t| t.n_bytes.next_multiple_of(32))
            .sum::<u64>();
    for n in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..n].to_vec());
        if (n as u64) < data_start + last_end {
            let e = r.expect_err(&format!("prefix of {n} bytes must fail"));
            assert!(e.to_string().contains("byte"), "{e}");
        }
    }
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn push_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

#[test]
fn broken_headers() {
    expect_err(b"GGML\x03\0\0\0".to_vec(), "not a GGUF file");
    expect_err(b"GG".to_vec(), "magic");
    expect_err(header(1, 0, 0), "version 1");
    expect_err(header(7, 0, 0), "unsupported GGUF version 7");
    let mut be = b"GGUF".to_vec();
    be.extend_from_slice(&3u32.to_be_bytes());
    be.extend_from_slice(&[0; 16]);
    expect_err(be, "big-endian");
    expect_err(header(3, u64::MAX, 0), "tensor count");
    expect_err(header(3, 0, u64::MAX / 2), "key/value count");
}

#[test]
fn broken_metadata() {
    // Huge string length.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    expect_err(b, "metadata key #0");
    // Unknown value type.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend_from_slice(&99u32.to_le_bytes());
    b.push(0);
    expect_err(b, "unknown value type 99");
    // Invalid UTF-8 in a key and in a value.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k\xff");
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(0);
    expect_err(b, "not valid UTF-8");
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"key.s");
    b.extend_from_slice(&8u32.to_le_bytes());
    push_str(&mut b, b"\xc3\x28");
    expect_err(b, "key.s");
    // Duplicate key.
    let mut b = header(3, 0, 2);
    for _ in 0..2 {
        push_str(&mut b, b"dup");
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(1);
    }
    expect_err(b, "duplicate metadata key 'dup'");
    // Array with a huge count.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"arr");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&(u64::MAX / 4).to_le_bytes());
    expect_err(b, "element count of metadata key 'arr'");
    // Arrays of arrays (llama.cpp refuses them), even 100 deep.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"deep");
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    expect_err(b, "array of arrays");
    // A bool byte other than 0 and 1 is true, as llama.cpp reads it.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"flag");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.push(2);
    let f = GgufFile::from_bytes(b).unwrap();
    assert_eq!(f.metadata().get("flag"), Some(&Value::Bool(true)));
    // Bad alignment value.
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", Value::U16(32));
    expect_err(w.to_bytes().unwrap(), "general.alignment must be");
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", Value::U32(3));
    assert!(
        w.to_bytes().is_err(),
        "the writer refuses an alignment that is not a power of two"
    );
}

/// A file with one metadata pair and the given raw tensor infos, then `data_len` data bytes.
fn with_tensor_infos(infos: &[(&str, &[u64], u32, u64)], data_len: usize) -> Vec<u8> {
    let mut b = header(3, infos.len() as u64, 0);
    for (name, ne, ty, off) in infos {
        push_str(&mut b, name.as_bytes());
        b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in *ne {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
    }
    b.resize(b.len().next_multiple_of(32) + data_len, 0);
    b
}

#[test]
fn broken_tensor_infos() {
    assert!(GgufFile::from_bytes(with_tensor_infos(&[("t", &[8], 0, 0)], 32)).is_ok());
    expect_err(
        with_tensor_infos(&[("t", &[8], 4, 0)], 32),
        "unknown GGML type id 4",
    );
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 0)], 16),
        "but the file ends at byte",
    );
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 8)], 64),
        "not a multiple of the alignment",
    );
    expect_err(
        with_tensor_infos(&[("t", &[1, 1, 1, 1, 1], 0, 0)], 32),
        "5 dimensions",
    );
    expect_err(with_tensor_infos(&[("t", &[33], 2, 0)], 64), "block size");
    expect_err(
        with_tensor_infos(&[("t", &[u64::MAX], 0, 0)], 64),
        "out of range",
    );
    expect_err(
        with_tensor_infos(&[("t", &[1 << 40, 1 << 40], 0, 0)], 64),
        "overflows",
    );
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, u64::MAX - 31)], 64),
        "has data offset 18446744073709551584, expected 0",
    );
    expect_err(
        with_tensor_infos(&[("t", &[16], 0, 0), ("u", &[8], 0, 32)], 96),
        "tensor 'u' has data offset 32, expected 64",
    );
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 0), ("t", &[8], 0, 32)], 64),
        "duplicate tensor name 't'",
    );
    // A zero-element tensor takes no bytes, but still comes in order.
    assert!(GgufFile::from_bytes(with_tensor_infos(
        &[("t", &[8], 0, 0), ("z", &[0], 0, 32)],
        32
    ))
    .is_ok());
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 0), ("z", &[0], 0, 0)], 32),
        "tensor 'z' has data offset 0, expected 32",
    );
}

/// What llama.cpp's gguf reader (`gguf_init_from_file_impl`, 0c1e570) refuses, modelc
/// refuses, and the writer does not write: an empty key, a tensor name of 64 bytes or more,
/// a gap between tensors, tensors out of order; and what it accepts, modelc accepts.
#[test]
fn acceptance_equals_llama_cpp() {
    // Empty key.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"");
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(1);
    expect_err(b, "metadata key #0 is empty");
    // Tensor names: 63 bytes is the longest.
    let n63 = "n".repeat(63);
    assert!(GgufFile::from_bytes(with_tensor_infos(&[(&n63, &[8], 0, 0)], 32)).is_ok());
    let n64 = "n".repeat(64);
    expect_err(
        with_tensor_infos(&[(&n64, &[8], 0, 0)], 32),
        "must be shorter than 64 bytes",
    );
    // A gap: 't' takes 32 bytes, 'u' starts at 64.
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 0), ("u", &[8], 0, 64)], 96),
        "tensor 'u' has data offset 64, expected 32",
    );
    // Out of order: 'u' first in the data, second in the infos.
    expect_err(
        with_tensor_infos(&[("t", &[8], 0, 32), ("u", &[8], 0, 0)], 64),
        "tensor 't' has data offset 32, expected 0",
    );
    // Back to back, in order, each padded to the alignment: accepted.
    assert!(GgufFile::from_bytes(with_tensor_infos(
        &[("t", &[9], 24, 0), ("u", &[8], 0, 32)],
        64
    ))
    .is_ok());
    // A type llama.cpp reads that modelc does not: refused, saying so.
    expect_err(
        with_tensor_infos(&[("t", &[64], 40, 0)], 64),
        "which llama.cpp reads but modelc does not support",
    );
    // The writer refuses what the reader would refuse.
    let mut w = GgufWriter::new();
    w.add_kv("", Value::U8(1));
    assert!(w.to_bytes().is_err());
    let mut w = GgufWriter::new();
    w.add_kv("a", Value::Array(Array::Array(vec![Array::U8(vec![1])])));
    assert!(w.to_bytes().is_err());
    let mut w = GgufWriter::new();
    w.add_tensor(n64.as_str(), &[8], GgmlType::F32, vec![0; 32])
        .unwrap();
    assert!(w.to_bytes().is_err());
    let mut w = GgufWriter::new();
    w.add_tensor(n63.as_str(), &[8], GgmlType::F32, vec![0; 32])
        .unwrap();
    assert!(GgufFile::from_bytes(w.to_bytes().unwrap()).is_ok());
}

#[test]
fn corrupted_bytes_never_panic() {
    // Flip every byte of the header region to a few values: errors or successes, no panics,
    // and no error that is not one line.
    let bytes = sample().to_bytes().unwrap();
    let header_len = 600.min(bytes.len());
    for i in 0..header_len {
        for v in [0x00, 0xff, 0x7f, 0x80, bytes[i] ^ 1] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Err(e) = GgufFile::from_bytes(b) {
                assert!(!e.to_string().contains('\n'));
            }
        }
    }
}

#[test]
fn split_models_read_as_one() {
    let dir = std::env::temp_dir().join(format!("modelc-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shard = |no: u16, count: u16, names: &[&str]| {
        let mut w = GgufWriter::new();
        w.add_kv("split.no", Value::U16(no));
        w.add_kv("split.count", Value::U16(count));
        w.add_kv("split.tensors.count", Value::I32(3));
        for n in names {
            w.add_tensor(*n, &[8], GgmlType::F32, vec![no as u8; 32])
                .unwrap();
        }
        w.write_to_file(&dir.join(format!("m-{:05}-of-{count:05}.gguf", no + 1)))
            .unwrap();
    };
    shard(0, 3, &["a"]);
    shard(1, 3, &["b", "c"]);
    let first = dir.join("m-00001-of-00003.gguf");
    let e = GgufFile::open(&first).unwrap_err();
    assert!(
        matches!(e, GgufError::Split { .. }) && e.to_string().contains("shard 3 of 3 is missing"),
        "{e}"
    );
    shard(2, 3, &[]);
    let f = GgufFile::open(&first).unwrap();
    assert_eq!(f.n_shards(), 3);
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), &[1u8; 32][..]);
    let e = GgufFile::open(dir.join("m-00002-of-00003.gguf")).unwrap_err();
    assert!(e.to_string().contains("open the first shard"), "{e}");
    // A shard that repeats a tensor.
    shard(2, 3, &["a"]);
    let e = GgufFile::open(&first).unwrap_err();
    assert!(e.to_string().contains("also in an earlier shard"), "{e}");
    // A mismatched shard number.
    shard(1, 3, &["c"]);
    std::fs::rename(
        dir.join("m-00002-of-00003.gguf"),
        dir.join("m-00003-of-00003.gguf"),
    )
    .unwrap();
    shard(1, 3, &["b"]);
    let e = GgufFile::open(&first).unwrap_err();
    assert!(e.to_string().contains("expected split.no = 2"), "{e}");
    // An extra shard.
    shard(2, 3, &["c"]);
    shard(3, 4, &["d"]);
    let e = GgufFile::open(&first).unwrap_err();
    assert!(e.to_string().contains("extra shard"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_fixture_model_reads() {
    let (Some(models), Some(vocab)) = (
        modelc_tests::shared("fixtures/models"),
        modelc_tests::shared("vocab"),
    ) else {
        return;
    };
    let mut n = 0;
    for entry in std::fs::read_dir(models).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(f.tensors().len() >= 15, "{}", path.display());
            assert_eq!(
                f.metadata().get_u32("tokenizer.ggml.bos_token_id").unwrap(),
                Some(1)
            );
            n += 1;
        }
    }
    assert_eq!(n, 29);
    for entry in std::fs::read_dir(vocab).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(f.tensors().is_empty());
            assert!(f
                .metadata()
                .get_array("tokenizer.ggml.tokens")
                .unwrap()
                .is_some());
        }
    }
}

/// `read_into_memory` (`-lm none`) holds the same bytes as the mapping, for every shard of a split
/// model and for a file larger than one reader's range; releasing its pages is a no-op (they
/// hold the only copy), so the data stays intact.
#[test]
fn read_into_memory_matches_the_mapping() {
    let dir = std::env::temp_dir().join(format!("modelc-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 5 MiB of varied bytes: more than one 2 MiB piece, so every reader thread has a range.
    let big: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut w = sample();
    w.add_tensor("big", &[big.len() as u64], GgmlType::I8, big.clone())
        .unwrap();
    let path = dir.join("one.gguf");
    w.write_to_file(&path).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let mut read = GgufFile::open(&path).unwrap();
    read.read_into_memory().unwrap();
    assert_eq!(read.tensors().len(), mapped.tensors().len());
    for t in mapped.tensors() {
        let r = read.tensor(&t.name).unwrap();
        assert_eq!(read.tensor_data(r), mapped.tensor_data(t), "{}", t.name);
    }
    assert_eq!(read.release_all_pages().unwrap(), 0);
    assert_eq!(mapped.bytes_in_memory(), 0);
    assert_eq!(read.bytes_in_memory(), mapped.file_size());
    assert_eq!(read.tensor_data(read.tensor("big").unwrap()), &big[..]);
    // A split model: each shard read.
    for (no, names) in [(0u16, &["a"][..]), (1, &["b", "c"][..])] {
        let mut w = GgufWriter::new();
        w.add_kv("split.no", Value::U16(no));
        w.add_kv("split.count", Value::U16(2));
        for n in names {
            w.add_tensor(*n, &[8], GgmlType::F32, vec![no as u8 + 1; 32])
                .unwrap();
        }
        w.write_to_file(&dir.join(format!("s-{:05}-of-00002.gguf", no + 1)))
            .unwrap();
    }
    let mut f = GgufFile::open(dir.join("s-00001-of-00002.gguf")).unwrap();
    f.read_into_memory().unwrap();
    assert_eq!(f.n_shards(), 2);
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), &[2u8; 32][..]);
    // A file gone between the open and the read: a one-line error naming it.
    let gone = dir.join("gone.gguf");
    std::fs::copy(&path, &gone).unwrap();
    let mut g = GgufFile::open(&gone).unwrap();
    std::fs::remove_file(&gone).unwrap();
    let e = g.read_into_memory().unwrap_err();
    assert!(
        e.to_string().contains("gone.gguf") && !e.to_string().contains('\n'),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An atomic write lands where the path leads: through a symbolic link into the file it
/// names (the link stays a link), and never over a directory, a device or a FIFO (renaming
/// over one would replace it: `modelc quantize IN /dev/full Q4_0` once did).
#[cfg(unix)]
#[test]
fn atomic_writes_follow_links_and_refuse_special_files() {
    use ir::gguf::{GgufWriter, Value};
    let dir = std::env::temp_dir().join(format!("modelc-atomic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("llama".into()));
    // Through a link (relative), to a file that does not exist yet.
    let link = dir.join("link.gguf");
    std::os::unix::fs::symlink("real.gguf", &link).expect("symlink");
    w.write_to_file(&link).expect("writes through the link");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(dir.join("real.gguf").is_file());
    // A directory and a FIFO (a device is treated the same; a test that fails must not
    // replace one): refused, and left as they were.
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).expect("sub dir");
    let special = [sub, fifo];
    for p in &special {
        let before = std::fs::symlink_metadata(p).unwrap().file_type();
        let err = w.write_to_file(p).expect_err("not a regular file");
        assert!(
            err.to_string().contains("not a regular file"),
            "{}: {err}",
            p.display()
        );
        assert_eq!(std::fs::symlink_metadata(p).unwrap().file_type(), before);
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
