//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) through the targets' logic on
//! the stable toolchain: every input that the fuzzers kept, checked on every CI run. A quick
//! pass, not a fuzzing run (that is `cargo +nightly fuzz run <target>`, see `fuzz/README.md`).
//!
//! `DEVARENA_FUZZ_INPUT=<target>:<file>` runs one input alone (to debug a crash artifact);
//! `DEVARENA_FUZZ_TARGET=<target>` replays that target's corpus alone (under a sanitizer, say).

use std::path::{Path, PathBuf};

use devarena_tests::fuzz::TARGETS;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_passes() {
    if let Ok(one) = std::env::var("DEVARENA_FUZZ_INPUT") {
        let (target, file) = one
            .split_once(':')
            .expect("DEVARENA_FUZZ_INPUT=<target>:<file>");
        let (_, run) = TARGETS
            .iter()
            .find(|(name, _)| *name == target)
            .unwrap_or_else(|| panic!("no fuzz target `{target}`"));
        run(&std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}")));
        return;
    }
    let only = std::env::var("DEVARENA_FUZZ_TARGET").ok();
    if let Some(only) = &only {
        assert!(
            TARGETS.iter().any(|(name, _)| name == only),
            "no fuzz target `{only}`"
        );
    }
    for (target, run) in TARGETS {
        if only.as_deref().is_some_and(|only| only != target) {
            continue;
        }
        let files = inputs(&corpus_dir(target));
        assert!(!files.is_empty(), "fuzz/corpus/{target}/ is empty");
        for file in &files {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "fuzz target `{target}` fails on {}",
                file.display()
            );
        }
        println!("{target}: {} inputs passed", files.len());
    }
}
