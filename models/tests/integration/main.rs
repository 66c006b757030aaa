//! The integration tests of this crate, one module per file, in one test
//! binary: each file under `tests/` would be its own crate linked on its own.

mod runtime_support;

mod autodiff_lora;
mod block_ops_routes;
mod chat_template;
mod dequant_props;
mod gemma_hf_logits;
mod gemma_real_weights;
mod gguf_corruption;
mod gguf_golden;
mod gpt2_errors;
mod gpt2_hf_logits;
mod gpt2_runtime;
mod kv_precision;
mod llama_cpp_agreement;
mod llama_hf_logits;
mod llama_host_step;
mod minilm_sentence;
mod real_weights;
mod runtime_batch_props;
mod runtime_kv_cache;
mod safetensors_corruption;
mod safetensors_golden;
mod smollm2_forward;
mod tokenizer_gguf;
mod tokenizer_gpt2_files;
mod weights_errors;
mod weights_gguf;
mod weights_sharded;
mod wgpu_backend;
