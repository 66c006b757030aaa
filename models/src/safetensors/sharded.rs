//! Sharded checkpoints: `model.safetensors.index.json` with a `weight_map`
//! from tensor name to shard file name, as written by Hugging Face
//! `transformers` (`save_pretrained` with `max_shard_size`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;

use super::{SafetensorsError, SafetensorsFile, check_shape};

#[derive(Deserialize)]
struct IndexJson {
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    weight_map: BTreeMap<String, String>,
}

/// A checkpoint split over several safetensors files. All shards are read into
/// memory and validated when it is opened; every tensor the index lists is
/// checked to be present in the shard the index names.
#[derive(Debug)]
pub struct ShardedSafetensors {
    shards: HashMap<String, SafetensorsFile>,
    weight_map: BTreeMap<String, String>,
    index_metadata: Option<serde_json::Value>,
}

impl ShardedSafetensors {
    /// Opens the index at `index_path`; shard names are resolved relative to
    /// its folder and must be plain file names.
    pub fn open(index_path: impl AsRef<Path>) -> Result<Self, SafetensorsError> {
        let index_path = index_path.as_ref();
        let shown = index_path.display().to_string();
        let text = std::fs::read_to_string(index_path).map_err(|e| SafetensorsError::Io {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let index: IndexJson =
            serde_json::from_str(&text).map_err(|e| SafetensorsError::Index {
                path: shown,
                message: e.to_string(),
            })?;
        let folder = index_path.parent().unwrap_or(Path::new("."));
        let mut shards = HashMap::new();
        for shard in index.weight_map.values() {
            if shards.contains_key(shard) {
                continue;
            }
            let plain = Path::new(shard)
                .file_name()
                .is_some_and(|f| f == shard.as_str());
            if !plain {
                return Err(SafetensorsError::BadShardName(shard.clone()));
            }
            let path = folder.join(shard);
            if !path.is_file() {
                return Err(SafetensorsError::MissingShard {
                    shard: shard.clone(),
                    path: path.display().to_string(),
                });
            }
            shards.insert(shard.clone(), SafetensorsFile::open(&path)?);
        }
        for (tensor, shard) in &index.weight_map {
            if shards[shard].info(tensor).is_err() {
                return Err(SafetensorsError::TensorNotInShard {
                    tensor: tensor.clone(),
                    shard: shard.clone(),
                });
            }
        }
        Ok(Self {
            shards,
            weight_map: index.weight_map,
            index_metadata: index.metadata,
        })
    }

    /// Tensor names listed by the index, sorted.
    pub fn names(&self) -> Vec<String> {
        self.weight_map.keys().cloned().collect()
    }

    /// The index's `metadata` object (e.g. `total_size`), if present.
    pub fn index_metadata(&self) -> Option<&serde_json::Value> {
        self.index_metadata.as_ref()
    }

    /// The shard holding tensor `name`.
    pub fn shard_of(&self, name: &str) -> Result<&SafetensorsFile, SafetensorsError> {
        let shard = self
            .weight_map
            .get(name)
            .ok_or_else(|| SafetensorsError::MissingTensor(name.to_string()))?;
        Ok(&self.shards[shard])
    }

    /// Tensor `name` as `f32` in row-major order, with its shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), SafetensorsError> {
        self.shard_of(name)?.tensor_f32(name)
    }

    /// Tensor `name` as `f32`, after checking it has exactly `shape`.
    pub fn tensor_f32_with_shape(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, SafetensorsError> {
        let file = self.shard_of(name)?;
        check_shape(name, shape, file.info(name)?.1)?;
        Ok(file.tensor_f32(name)?.0)
    }
}
