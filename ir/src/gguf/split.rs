//! Split models: `NAME-00001-of-0000N.gguf` files carrying `split.no`, `split.count` and
//! `split.tensors.count` (llama.cpp's `gguf-split` tool and `llama_split_path`), read as one model.
//!
//! Rules: the first shard is the one opened and holds the model's metadata; shard `i` (0-based)
//! is named `PREFIX-{i+1:05}-of-{count:05}.gguf` and has `split.no = i` and the same
//! `split.count`; tensor names are unique across shards; the total number of tensors equals
//! `split.tensors.count` when present; no other file of the same prefix claims to be a shard.

use super::error::GgufError;
use super::GgufFile;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn split_err(path: &Path, msg: impl Into<String>) -> GgufError {
    GgufError::Split {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Splits `NAME-00001-of-00003.gguf` into (`NAME`, 1, 3).
fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix.to_owned(), no.parse().ok()?, count.parse().ok()?))
}

fn shard_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// Completes `first` (already opened from `path`) with its other shards, if it is split.
pub(crate) fn gather_shards(path: &Path, mut first: GgufFile) -> Result<GgufFile, GgufError> {
    let md = first.metadata();
    let count = md.get_u32("split.count")?.unwrap_or(1);
    let no = md.get_u32("split.no")?.unwrap_or(0);
    if count <= 1 {
        if no != 0 {
            return Err(split_err(
                path,
                format!("split.no is {no} but split.count is {count}"),
            ));
        }
        return Ok(first);
    }
    if no != 0 {
        return Err(split_err(
            path,
            format!(
                "this is shard {} of {count}; open the first shard (…-00001-of-{count:05}.gguf)",
                no + 1
            ),
        ));
    }
    let Some((prefix, file_no, file_count)) = parse_split_name(path) else {
        return Err(split_err(
            path,
            format!("split.count is {count} but the file name does not follow NAME-00001-of-{count:05}.gguf"),
        ));
    };
    if file_no != 1 || file_count != count {
        return Err(split_err(
            path,
            format!("the file name says shard {file_no} of {file_count}, the metadata says shard 1 of {count}"),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut names: HashSet<String> = first.tensors.iter().map(|t| t.name.clone()).collect();
    for i in 1..count {
        let p = shard_path(dir, &prefix, i + 1, count);
        if !p.exists() {
            return Err(split_err(
                &p,
                format!("shard {} of {count} is missing", i + 1),
            ));
        }
        let mut shard = GgufFile::open_one(&p)?;
        let s_no = shard.metadata.get_u32("split.no")?;
        let s_count = shard.metadata.get_u32("split.count")?;
        if s_no != Some(i) || s_count != Some(count) {
            return Err(split_err(
                &p,
                format!("expected split.no = {i} and split.count = {count}, found {s_no:?} and {s_count:?}"),
            ));
        }
        let shard_index = first.shards.len();
        for mut t in std::mem::take(&mut shard.tensors) {
            if !names.insert(t.name.clone()) {
                return Err(split_err(
                    &p,
                    format!("tensor '{}' is also in an earlier shard", t.name),
                ));
            }
            t.shard = shard_index;
            first.tensors.push(t);
        }
        first.shards.append(&mut shard.shards);
    }
    check_no_extra_shards(dir, &prefix, count)?;
    if let Some(total) = first
        .metadata
        .get("split.tensors.count")
        .and_then(|v| v.as_u64())
    {
        if total != first.tensors.len() as u64 {
            return Err(split_err(
                path,
                format!(
                    "split.tensors.count is {total} but the shards hold {} tensors",
                    first.tensors.len()
                ),
            ));
        }
    }
    Ok(first)
}

/// Refuses another shard file of the same prefix that is not part of this split.
fn check_no_extra_shards(dir: &Path, prefix: &str, count: u32) -> Result<(), GgufError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let p = entry.path();
        if let Some((pre, no, c)) = parse_split_name(&p) {
            if pre == prefix && (c != count || no == 0 || no > count) {
                return Err(split_err(
                    &p,
                    format!("extra shard: the model has {count} shards, this file claims shard {no} of {c}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        assert_eq!(
            parse_split_name(Path::new("/a/m-00002-of-00003.gguf")),
            Some(("m".into(), 2, 3))
        );
        assert_eq!(parse_split_name(Path::new("m.gguf")), None);
        assert_eq!(parse_split_name(Path::new("m-2-of-3.gguf")), None);
    }
}
