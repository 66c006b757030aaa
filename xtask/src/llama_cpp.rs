//! llama.cpp for the speed comparison of `cargo xtask bench`: PyPI
//! `llama-cpp-python` (which builds llama.cpp from its bundled sources with the
//! machine's compiler) and its dependencies, installed with pip into
//! `models-cache/pip/llama-cpp-python` — never into the system's Python — and put
//! on `PYTHONPATH` for `xtask/scripts/llama_cpp_speed.py`.
//!
//! The version is the one the llama.cpp fixtures of `privmix-models` were made
//! with. The install is skipped when pip's record of that version is there (a
//! folder installed before the build flags below were added is kept: delete it to
//! rebuild).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned package (as in `models/tests/fixtures/llama_cpp/make_llama_cpp.py`).
const SPEC: &str = "llama-cpp-python==0.3.36";
const DIST_INFO: &str = "llama_cpp_python-0.3.36.dist-info";

/// Installs llama-cpp-python under `cache/pip/llama-cpp-python` if needed and
/// returns that folder (for `PYTHONPATH`).
pub(crate) fn ensure(cache: &Path, python: &str) -> Result<PathBuf, String> {
    let target = cache.join("pip").join("llama-cpp-python");
    if target.join(DIST_INFO).is_dir() && target.join("numpy").is_dir() {
        return Ok(target);
    }
    eprintln!(
        "xtask: pip install --target {} {SPEC} (builds llama.cpp: several minutes)",
        target.display()
    );
    let status = Command::new(python)
        .args(["-m", "pip", "install", "--upgrade", "--target"])
        .arg(&target)
        .arg(SPEC)
        // llama.cpp's CPU backend only, built for this machine, with the flags that
        // keep its AMX tile configuration (as the llama-server build of
        // `serve_load.rs`; scikit-build-core splits CMAKE_ARGS as a shell would).
        .env(
            "CMAKE_ARGS",
            format!(
                "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS='{flags}' \
                 -DCMAKE_CXX_FLAGS='{flags}'",
                flags = crate::serve_load::BUILD_FLAGS
            ),
        )
        .status()
        .map_err(|e| format!("could not start `{python} -m pip`: {e}"))?;
    if status.success() && target.join(DIST_INFO).is_dir() {
        Ok(target)
    } else {
        Err(format!("`pip install {SPEC}` failed ({status})"))
    }
}
