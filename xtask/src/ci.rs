//! The test runs of `cargo xtask test`: the workspace's tests with a pinned
//! proptest seed, then the backend checks beyond the default (flex) test run: the
//! models' tests on wgpu through Mesa's lavapipe, and a `cargo check` of the CUDA
//! backend, which cannot run without an NVIDIA GPU but must keep compiling.

use std::ffi::OsStr;
use std::path::Path;

/// The proptest seed CI uses when `PROPTEST_RNG_SEED` is not set: every property
/// test then draws the same cases on every run of a commit, so a failure seen once
/// is seen again (and its shrunk case is written to the test's regression file,
/// under the crate's `proptest-regressions/` or `tests/proptest-regressions/`,
/// which is committed).
const PROPTEST_SEED: u64 = 0x5052_4956_4d49_5845; // "PRIVMIXE"

/// Proptest's ChaCha generator: the algorithm is pinned with the seed, so that a
/// change of proptest's default cannot change the cases.
const PROPTEST_ALGORITHM: &str = "cc";

/// The seed for this run: `PROPTEST_RNG_SEED` from the environment when it is set
/// (to reproduce or widen a run), else [`PROPTEST_SEED`].
fn proptest_seed() -> Result<u64, String> {
    match std::env::var("PROPTEST_RNG_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("PROPTEST_RNG_SEED={s:?} is not a u64")),
        Err(std::env::VarError::NotPresent) => Ok(PROPTEST_SEED),
        Err(e) => Err(format!("PROPTEST_RNG_SEED: {e}")),
    }
}

/// `cargo test --workspace --no-fail-fast` with proptest's seed and algorithm
/// exported (`PROPTEST_RNG_SEED`, `PROPTEST_RNG_ALGORITHM`) and printed, so that
/// every property test is deterministic on a given commit and a failure can be
/// rerun with the printed command.
///
/// The models are built with their `wgpu` feature too, so that burn is compiled
/// once for the flex and wgpu tests alike (a separate wgpu run rebuilt burn and
/// everything above it with other features); the wgpu tests
/// (`privmix-models`' `wgpu_backend` module) run on Mesa's lavapipe, a CPU Vulkan
/// driver, which must be installed.
pub(crate) fn workspace_tests() -> Result<(), String> {
    let seed = proptest_seed()?.to_string();
    eprintln!(
        "xtask: proptest seed {seed}, algorithm {PROPTEST_ALGORITHM} (rerun a failing \
         property test with PROPTEST_RNG_SEED={seed} \
         PROPTEST_RNG_ALGORITHM={PROPTEST_ALGORITHM} cargo test -p <crate> <test>)"
    );
    let Some(icd) = lavapipe_icd() else {
        return Err(format!(
            "no lavapipe Vulkan driver in {LAVAPIPE_ICD_DIR}: install it with \
             `apt-get install mesa-vulkan-drivers` (the wgpu tests run on the CPU through it)"
        ));
    };
    // wgpu (through winit/xdg conventions) warns or fails without a runtime dir on
    // headless machines; give it a private one.
    let runtime_dir = std::env::temp_dir().join("privmix-xdg-runtime");
    std::fs::create_dir_all(&runtime_dir)
        .map_err(|e| format!("cannot create {}: {e}", runtime_dir.display()))?;
    crate::workspace::cargo_with_env(
        &WORKSPACE_TEST,
        &[
            ("PROPTEST_RNG_SEED", OsStr::new(&seed)),
            ("PROPTEST_RNG_ALGORITHM", OsStr::new(PROPTEST_ALGORITHM)),
            ("XDG_RUNTIME_DIR", runtime_dir.as_os_str()),
            // Pick lavapipe even where other Vulkan drivers are installed.
            ("VK_ICD_FILENAMES", OsStr::new(&icd)),
        ],
    )
}

/// The workspace's test command. The bench smoke runs the experiment binary this
/// run built (for the bench crate's integration tests), so nothing is compiled twice:
/// any other `cargo build` differs in profile or in the features that the
/// dev-dependencies unify, and would rebuild burn and everything above it.
pub(crate) const WORKSPACE_TEST: [&str; 6] = [
    "test",
    "--workspace",
    "--no-fail-fast",
    "--features",
    "privmix-models/wgpu",
    "--locked",
];

/// Where Debian's `mesa-vulkan-drivers` puts the lavapipe (CPU Vulkan) driver manifest.
const LAVAPIPE_ICD_DIR: &str = "/usr/share/vulkan/icd.d";

/// `cargo check`s the models with only the CUDA backend enabled, and the `privmix`
/// command line (generate, score, serve) and the privacy–utility experiment with
/// their `cuda` features (one invocation, so burn is checked once for both).
pub(crate) fn cuda_check() -> Result<(), String> {
    crate::workspace::cargo(&[
        "check",
        "-p",
        "privmix-models",
        "--no-default-features",
        "--features",
        "cuda",
    ])?;
    crate::workspace::cargo(&[
        "check",
        "-p",
        "privmix",
        "-p",
        "privmix-bench",
        "--features",
        "privmix/cuda,privmix-bench/cuda",
    ])
}

/// On CI (`CI` set in the environment), removes `target/debug` and
/// `target/package` once the last step that reads them has run: a CI machine's disk
/// can be small, and the fuzzers' build needs its own room. A developer's build cache is left alone.
pub(crate) fn free_debug_builds() -> Result<(), String> {
    if std::env::var_os("CI").is_none() {
        return Ok(());
    }
    let root = crate::workspace::workspace_root();
    for dir in ["target/debug", "target/package"] {
        let path = root.join(dir);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            eprintln!(
                "xtask: removed {} (CI: its builds are done with)",
                path.display()
            );
        }
    }
    // For the record, as `.ci/run` prints it at the start.
    let _ = std::process::Command::new("df").args(["-h", "."]).status();
    Ok(())
}

fn lavapipe_icd() -> Option<String> {
    let dir = Path::new(LAVAPIPE_ICD_DIR);
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        (name.starts_with("lvp_icd") && name.ends_with(".json"))
            .then(|| entry.path().to_string_lossy().into_owned())
    })
}

/// `cargo xtask bench --quick --experiment-only` end to end on the tiny Llama
/// fixture (vocabulary 256, byte tokenizer) with small settings, into
/// `target/ci-bench`: what a newcomer runs, minus SmolLM2's minutes and the
/// speed step (criterion and llama.cpp need the real model and a quiet
/// machine). Checks that the report came back with every contender.
pub(crate) fn bench_smoke() -> Result<(), String> {
    let root = crate::workspace::workspace_root();
    let path = |p: &str| root.join(p).to_string_lossy().into_owned();
    let out = root.join("target/ci-bench");
    let cache = path("target/ci-bench-cache");
    let args: Vec<String> = [
        "--model",
        &path("models/tests/fixtures/hf/llama"),
        "--tokenizer",
        &path("cli/tests/fixtures/tokenizer/tokenizer.json"),
        "--cache",
        &cache,
        "--members",
        "2",
        "--block",
        "24",
        "--max-records",
        "40",
        "--seeds",
        "2",
        "--eval-blocks",
        "2",
        "--validation-blocks",
        "2",
        "--epochs",
        "0.25",
        "--dp-sgd-batch",
        "8",
        "--dp-sgd-lrs",
        "0.01,0.03",
        "--dp-sgd-epochs",
        "0.5",
        "--user-unit",
        "speaker",
        "--epsilons",
        "1,8",
        "--icl-epsilons",
        "1,8",
        "--icl-private",
        "8",
        "--icl-test",
        "2",
        "--icl-public",
        "1",
        "--n-shots",
        "2",
        "--top-k",
        "20",
        "--icl-max-tokens",
        "4",
        "--canaries",
        "2",
        "--canary-repeats",
        "4",
        "--canary-epochs",
        "0.5",
        "--esa-shots",
        "2",
        "--esa-candidates",
        "3",
        "--mia-examples",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    crate::bench::run(
        &out,
        crate::bench::Options {
            quick: true,
            speed_only: false,
            experiment_only: true,
            serve_only: false,
            train_only: false,
            criterion_only: false,
            experiment_args: args,
            no_page: true,
            experiment_build: crate::bench::ExperimentBuild::Tests(&WORKSPACE_TEST),
        },
    )?;
    let report = std::fs::read_to_string(out.join("experiment.md"))
        .map_err(|e| format!("cargo xtask bench wrote no experiment.md: {e}"))?;
    for needle in [
        "| pmixed | 8 |",
        "| adapmixed | 8 |",
        "| submix | 8 |",
        "| dp-sgd | 8 |",
        "| dps-mozo+on | 8 |",
        "| wu-embedding-agg | 8 |",
        "| sa-laplace | 8 |",
        "| gnmax (B=1) | 8 |",
        "### Claims of the papers",
        "### Run",
        "privacy-utility/record_perplexity_vs_epsilon.svg",
        "privacy-utility/user_perplexity_vs_epsilon.svg",
    ] {
        if !report.contains(needle) {
            return Err(format!("the bench report lacks {needle:?}:\n{report}"));
        }
    }
    eprintln!(
        "xtask: cargo xtask bench --quick (tiny model) wrote {}",
        out.display()
    );
    Ok(())
}
