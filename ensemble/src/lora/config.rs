//! `LoraConfig`: the fields of PEFT's `adapter_config.json` that decide what
//! a LoRA adapter computes (Hu et al. 2022, "LoRA: Low-Rank Adaptation of
//! Large Language Models"; rsLoRA: Kalajdzievski 2023).

use serde_json::{Map, Value, json};

use super::error::LoraError;

/// The seven projections of a Llama/Gemma block, as PEFT names them: the
/// attention's `q_proj`, `k_proj`, `v_proj`, `o_proj` and the MLP's
/// `gate_proj`, `up_proj`, `down_proj` (every site a LoRA can adapt there).
pub const LLAMA_TARGET_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// GPT-2's projections a LoRA may target, as PEFT names them (`c_proj`
/// names both the attention's and the MLP's output projections).
const GPT2_TARGET_MODULES: [&str; 3] = ["c_attn", "c_proj", "c_fc"];

/// Module names (as PEFT matches them, by the last path component) of the
/// projections a LoRA may target: [`LLAMA_TARGET_MODULES`] (Llama/Gemma)
/// followed by GPT-2's `c_attn`, `c_proj` and `c_fc`.
pub const KNOWN_TARGET_MODULES: [&str; 10] = {
    let mut all = [""; 10];
    let mut i = 0;
    while i < all.len() {
        all[i] = if i < LLAMA_TARGET_MODULES.len() {
            LLAMA_TARGET_MODULES[i]
        } else {
            GPT2_TARGET_MODULES[i - LLAMA_TARGET_MODULES.len()]
        };
        i += 1;
    }
    all
};

/// A LoRA adapter's hyper-parameters, named as in PEFT's `LoraConfig`.
///
/// The adapter adds `scale · x A B` to a projection's output `x W`, with
/// `A: [in, r]`, `B: [r, out]` and `scale = lora_alpha / r`, or
/// `lora_alpha / √r` with rsLoRA (`use_rslora`) — PEFT's
/// `LoraLayer.update_layer`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of the update (≥ 1).
    pub r: usize,
    /// `lora_alpha` (finite).
    pub lora_alpha: f64,
    /// Dropout on the adapter's input during training (in `[0, 1)`; unused at inference).
    pub lora_dropout: f64,
    /// Targeted module names (see [`KNOWN_TARGET_MODULES`]).
    pub target_modules: Vec<String>,
    /// The base model the adapter was trained on, as PEFT records it.
    pub base_model_name_or_path: Option<String>,
    /// PEFT's `task_type` (e.g. `CAUSAL_LM`).
    pub task_type: Option<String>,
    /// GPT-2 `Conv1D` layout of the base weight (`[in, out]`); the LoRA
    /// factors are stored the same way either way.
    pub fan_in_fan_out: bool,
    /// rsLoRA scaling `lora_alpha / √r`.
    pub use_rslora: bool,
}

impl LoraConfig {
    /// A checked configuration with PEFT's defaults for the other fields
    /// (no dropout, task `CAUSAL_LM`, no rsLoRA).
    pub fn new(r: usize, lora_alpha: f64, target_modules: &[&str]) -> Result<Self, LoraError> {
        let c = Self {
            r,
            lora_alpha,
            lora_dropout: 0.0,
            target_modules: target_modules.iter().map(|s| (*s).to_string()).collect(),
            base_model_name_or_path: None,
            task_type: Some("CAUSAL_LM".into()),
            fan_in_fan_out: false,
            use_rslora: false,
        };
        c.validate()?;
        Ok(c)
    }

    /// The multiplier of `x A B`: `lora_alpha / r`, or `lora_alpha / √r` with rsLoRA.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }

    /// Whether `module` (a name of [`KNOWN_TARGET_MODULES`]) is targeted.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|m| m == module)
    }

    /// Checks the ranges of the fields.
    pub fn validate(&self) -> Result<(), LoraError> {
        if self.r == 0 {
            return Err(LoraError::bad_config("r", "rank must be at least 1"));
        }
        if !self.lora_alpha.is_finite() {
            return Err(LoraError::bad_config("lora_alpha", "not a finite number"));
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(LoraError::bad_config("lora_dropout", "must lie in [0, 1)"));
        }
        if self.target_modules.is_empty() {
            return Err(LoraError::bad_config("target_modules", "empty"));
        }
        if let Some(m) = self
            .target_modules
            .iter()
            .find(|m| !KNOWN_TARGET_MODULES.contains(&m.as_str()))
        {
            return Err(LoraError::unsupported(
                "target_modules",
                format!("module {m:?} is not a projection privmix adapts"),
            ));
        }
        Ok(())
    }

    /// Reads an `adapter_config.json` document (`path` names it in errors).
    /// Rejects, as [`LoraError::Unsupported`], every PEFT option that would
    /// change what the adapter computes beyond `scale · x A B`: another
    /// `peft_type`, trained biases, DoRA, per-module rank or alpha patterns,
    /// `modules_to_save`, regex `target_modules`, initialisations that rewrite
    /// the base weights (PiSSA, OLoRA, LoftQ, ...).
    pub fn from_json(doc: &Value, path: &str) -> Result<Self, LoraError> {
        let bad = |m: String| LoraError::ConfigJson {
            path: path.to_string(),
            message: m,
        };
        let obj = doc
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        match get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            Some(other) => return Err(LoraError::unsupported("peft_type", other)),
            None => return Err(bad("no string peft_type".into())),
        }
        match get("bias").and_then(Value::as_str) {
            None | Some("none") => {}
            Some(other) => return Err(LoraError::unsupported("bias", other)),
        }
        for flag in ["use_dora", "lora_bias", "use_qalora", "use_bdlora"] {
            if get(flag).is_some_and(|v| v != &Value::Bool(false)) {
                return Err(LoraError::unsupported(flag, "only plain LoRA is supported"));
            }
        }
        for field in [
            "rank_pattern",
            "alpha_pattern",
            "modules_to_save",
            "layer_replication",
            "target_parameters",
            "trainable_token_indices",
            "exclude_modules",
        ] {
            let empty = match get(field) {
                None => true,
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                Some(_) => false,
            };
            if !empty {
                return Err(LoraError::unsupported(field, "must be empty"));
            }
        }
        match get("init_lora_weights") {
            None | Some(Value::Bool(_)) => {}
            Some(Value::String(s)) if s == "gaussian" => {}
            Some(other) => {
                return Err(LoraError::unsupported(
                    "init_lora_weights",
                    format!("{other} rewrites the base weights"),
                ));
            }
        }
        let r = get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("r is not a non-negative integer".into()))?;
        let lora_alpha = get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("lora_alpha is not a number".into()))?;
        let lora_dropout = get("lora_dropout").map_or(Ok(0.0), |v| {
            v.as_f64()
                .ok_or_else(|| bad("lora_dropout is not a number".into()))
        })?;
        let target_modules = match get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad("target_modules holds a non-string".into()))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::String(s)) => {
                return Err(LoraError::unsupported(
                    "target_modules",
                    format!("a pattern ({s:?}); list the module names"),
                ));
            }
            _ => return Err(bad("no target_modules list".into())),
        };
        let flag = |k: &str| -> Result<bool, LoraError> {
            get(k).map_or(Ok(false), |v| {
                v.as_bool()
                    .ok_or_else(|| bad(format!("{k} is not a boolean")))
            })
        };
        let text = |k: &str| get(k).and_then(Value::as_str).map(str::to_string);
        let c = Self {
            r: usize::try_from(r).map_err(|_| bad("r too large".into()))?,
            lora_alpha,
            lora_dropout,
            target_modules,
            base_model_name_or_path: text("base_model_name_or_path"),
            task_type: text("task_type"),
            fan_in_fan_out: flag("fan_in_fan_out")?,
            use_rslora: flag("use_rslora")?,
        };
        c.validate()?;
        Ok(c)
    }

    /// The `adapter_config.json` document PEFT's `LoraConfig.from_pretrained` reads.
    pub fn to_json(&self) -> Value {
        let alpha = if self.lora_alpha.fract() == 0.0 && self.lora_alpha.abs() < 9.0e15 {
            json!(self.lora_alpha as i64)
        } else {
            json!(self.lora_alpha)
        };
        json!({
            "peft_type": "LORA",
            "task_type": self.task_type,
            "base_model_name_or_path": self.base_model_name_or_path,
            "r": self.r,
            "lora_alpha": alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": self.target_modules,
            "fan_in_fan_out": self.fan_in_fan_out,
            "bias": "none",
            "use_rslora": self.use_rslora,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": Value::Object(Map::new()),
            "alpha_pattern": Value::Object(Map::new()),
            "revision": null,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
               "target_modules": ["q_proj", "v_proj"], "bias": "none", "use_rslora": false,
               "rank_pattern": {}, "alpha_pattern": {}, "use_dora": false})
    }

    #[test]
    fn every_llama_projection_is_a_known_target() {
        for m in LLAMA_TARGET_MODULES {
            assert!(KNOWN_TARGET_MODULES.contains(&m), "{m}");
        }
        let c = LoraConfig::new(4, 8.0, &LLAMA_TARGET_MODULES).unwrap();
        assert!(LLAMA_TARGET_MODULES.iter().all(|m| c.targets(m)));
    }

    #[test]
    fn parses_and_round_trips() {
        let c = LoraConfig::from_json(&doc(), "x").unwrap();
        assert_eq!((c.r, c.lora_alpha, c.scale()), (4, 8.0, 2.0));
        assert!(c.targets("v_proj") && !c.targets("k_proj"));
        assert_eq!(LoraConfig::from_json(&c.to_json(), "x").unwrap(), c);
        let mut rs = c.clone();
        rs.use_rslora = true;
        assert_eq!(rs.scale(), 4.0);
    }

    #[test]
    fn rejects_what_it_does_not_implement() {
        let cases: [(&str, Value); 7] = [
            ("peft_type", json!("IA3")),
            ("bias", json!("all")),
            ("use_dora", json!(true)),
            ("rank_pattern", json!({"q_proj": 8})),
            ("modules_to_save", json!(["lm_head"])),
            ("target_modules", json!("all-linear")),
            ("init_lora_weights", json!("pissa")),
        ];
        for (field, value) in cases {
            let mut d = doc();
            d[field] = value;
            let e = LoraConfig::from_json(&d, "x").unwrap_err();
            assert!(
                matches!(&e, LoraError::Unsupported { field: f, .. } if f == field),
                "{field}: {e}"
            );
        }
    }

    #[test]
    fn rejects_bad_values() {
        let mut d = doc();
        d["r"] = json!(0);
        assert!(matches!(
            LoraConfig::from_json(&d, "x"),
            Err(LoraError::BadConfig { .. })
        ));
        let mut d = doc();
        d["target_modules"] = json!(["lm_head"]);
        assert!(matches!(
            LoraConfig::from_json(&d, "x"),
            Err(LoraError::Unsupported { .. })
        ));
        let mut d = doc();
        d.as_object_mut().unwrap().remove("r");
        assert!(matches!(
            LoraConfig::from_json(&d, "x"),
            Err(LoraError::ConfigJson { .. })
        ));
    }
}
