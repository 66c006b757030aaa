//! A member equals its merged weights: the base checkpoint with every adapted
//! `W` replaced by `W + scale · (A B)ᵀ` (built here in Rust, written as a new
//! safetensors checkpoint) gives the logits of the base + adapter, and those
//! of PEFT's own `merge_and_unload()` (fixtures/peft/*/logits.json).

use crate::lora_support;

use std::collections::HashMap;

use lora_support::*;
use privmix_ensemble::lora::{LoraAdapter, module_path};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_models::safetensors::SafetensorsFile;
use privmix_models::{LinearDelta, LoadOptions, Model};
use safetensors::{Dtype, tensor::TensorView};

/// Writes the base checkpoint merged with `adapter` into a fresh folder.
fn merge(adapter: &LoraAdapter<B>, name: &str) -> std::path::PathBuf {
    let src = SafetensorsFile::open(llama_dir().join("model.safetensors")).unwrap();
    let mut tensors: HashMap<String, (Vec<f32>, Vec<usize>)> = src
        .names()
        .into_iter()
        .map(|n| {
            let t = src.tensor_f32(&n).unwrap();
            (n, t)
        })
        .collect();
    for site in adapter.sites() {
        let key = format!("{}.weight", module_path(site).unwrap());
        let (w, shape) = tensors.get_mut(&key).expect("base weight");
        let (out, inp) = (shape[0], shape[1]);
        // delta_weight is [in, out] = scale · A B; the checkpoint's W is [out, in].
        let d = adapter
            .delta_weight(site)
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        for o in 0..out {
            for i in 0..inp {
                w[o * inp + i] += d[i * out + o];
            }
        }
    }
    let dir = temp_dir(name);
    std::fs::copy(llama_dir().join("config.json"), dir.join("config.json")).unwrap();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, (v, s))| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views = bytes.iter().map(|(n, s, b)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

fn check(name: &str) {
    let model = tiny_llama();
    let adapter = load_adapter(name, &base_of(&model));
    let dir = merge(&adapter, name);
    let merged = Model::<B>::load(LoadOptions::path(&dir, &dev())).unwrap();
    let doc = read_json(&peft_dir(name).join("logits.json"));
    let ids = input_ids(&doc);
    let with_adapter = logits_with(&model, &ids, Some(&adapter as &dyn LinearDelta<B>));
    let ours_merged = logits_with(&merged, &ids, None);
    let d = max_abs_diff(&with_adapter, &ours_merged);
    assert!(d < 1e-4, "{name}: adapter vs merged weights {d}");
    let d = max_abs_diff(&ours_merged, &flat3(&doc, "merged_logits"));
    assert!(d < 1e-4, "{name}: our merge vs PEFT's merge_and_unload {d}");
    // And as a row of the batched ensemble, next to the public model.
    let runner = EnsembleRunner::new(model.clone(), std::slice::from_ref(&adapter)).unwrap();
    let rows = runner
        .decoder(RowLayout::public_and_members(1))
        .unwrap()
        .prefill(&ids[0])
        .unwrap();
    let alone = merged.log_probs_last(&ids[0]).unwrap();
    assert!(max_abs_diff(rows.row(1), &alone) < 1e-4);
    assert!(max_abs_diff(rows.row(0), &alone) > 0.01);
    std::fs::remove_dir_all(&dir).unwrap();
}

use privmix_models::LanguageModel as _;

#[test]
fn member_equals_its_merged_weights() {
    check("full");
}

#[test]
fn rslora_member_equals_its_merged_weights() {
    check("rslora");
}
