//! Records the compiler that builds the bench binaries (their reports name it).

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "rustc (version unknown)".into());
    println!("cargo:rustc-env=PRIVMIX_BENCH_RUSTC={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
