//! A sharded HF checkpoint (`model.safetensors.index.json` + two shards, the
//! layout `save_pretrained` writes for large models) loads to the same
//! logits as the single-file checkpoint it was split from.

use crate::runtime_support;

use privmix_models::Model;
use privmix_models::runtime::to_vec;
use privmix_models::safetensors::SafetensorsFile;
use privmix_models::{Batch, LanguageModel, LoadOptions};
use runtime_support::{B, fixture, load_hf, reference};
use safetensors::{Dtype, tensor::TensorView};

#[test]
fn sharded_checkpoint_equals_single_file() {
    let src = fixture("hf/llama");
    let dir = std::env::temp_dir().join(format!("privmix_sharded_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let file = SafetensorsFile::open(src.join("model.safetensors")).unwrap();
    let mut names = file.names();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (shard, chunk) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let shard_name = format!("model-0000{}-of-00002.safetensors", shard + 1);
        let tensors: Vec<(String, Vec<u8>, Vec<usize>)> = chunk
            .iter()
            .map(|n| {
                let (v, s) = file.tensor_f32(n).unwrap();
                (
                    n.clone(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    s,
                )
            })
            .collect();
        let views = tensors.iter().map(|(n, b, s)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        });
        std::fs::write(
            dir.join(&shard_name),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        for n in chunk {
            weight_map.insert(n.clone(), shard_name.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let sharded = Model::<B>::load(LoadOptions::path(&dir, &Default::default()));
    std::fs::remove_dir_all(&dir).unwrap();
    let batch = Batch::new(&reference("llama").input_ids).unwrap();
    let a = to_vec(sharded.unwrap().logits_all(&batch).unwrap()).unwrap();
    let b = to_vec(load_hf("llama").logits_all(&batch).unwrap()).unwrap();
    assert_eq!(a, b);
}
