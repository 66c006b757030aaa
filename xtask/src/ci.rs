//! The backend checks of `cargo xtask test` beyond the default (flex) test run:
//! the models' tests on wgpu through Mesa's lavapipe, and a `cargo check` of the
//! CUDA backend, which cannot run without an NVIDIA GPU but must keep compiling.

use std::path::Path;
use std::process::Command;

/// Where Debian's `mesa-vulkan-drivers` puts the lavapipe (CPU Vulkan) driver manifest.
const LAVAPIPE_ICD_DIR: &str = "/usr/share/vulkan/icd.d";

/// Runs the wgpu test target of `privmix-models` on lavapipe.
///
/// wgpu needs a Vulkan driver; on a machine without a GPU that is lavapipe. Without
/// it the tests would fail deep inside wgpu, so say what to install instead.
pub(crate) fn wgpu_tests() -> Result<(), String> {
    if !lavapipe_present() {
        return Err(format!(
            "no lavapipe Vulkan driver in {LAVAPIPE_ICD_DIR}: install it with \
             `apt-get install mesa-vulkan-drivers` (the wgpu tests run on the CPU through it)"
        ));
    }
    // wgpu (through winit/xdg conventions) warns or fails without a runtime dir on
    // headless machines; give it a private one.
    let runtime_dir = std::env::temp_dir().join("privmix-xdg-runtime");
    std::fs::create_dir_all(&runtime_dir)
        .map_err(|e| format!("cannot create {}: {e}", runtime_dir.display()))?;
    let args = [
        "test",
        "-p",
        "privmix-models",
        "--features",
        "wgpu",
        "--test",
        "wgpu_backend",
    ];
    eprintln!("xtask: cargo {} (lavapipe)", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(args)
        .current_dir(crate::workspace_root())
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        // Pick lavapipe even where other Vulkan drivers are installed.
        .env("VK_ICD_FILENAMES", lavapipe_icd().unwrap_or_default())
        .status()
        .map_err(|e| format!("could not start cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// `cargo check`s the models with only the CUDA backend enabled.
pub(crate) fn cuda_check() -> Result<(), String> {
    crate::cargo(&[
        "check",
        "-p",
        "privmix-models",
        "--no-default-features",
        "--features",
        "cuda",
    ])
}

fn lavapipe_present() -> bool {
    lavapipe_icd().is_some()
}

fn lavapipe_icd() -> Option<String> {
    let dir = Path::new(LAVAPIPE_ICD_DIR);
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        (name.starts_with("lvp_icd") && name.ends_with(".json"))
            .then(|| entry.path().to_string_lossy().into_owned())
    })
}
