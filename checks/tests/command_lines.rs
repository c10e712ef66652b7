//! Every check program takes its options through clap: `--help` prints them and exits 0
//! (without a GPU: options are read before NVSHMEM starts), and an unknown option is an
//! error that exits 2.

use std::process::Command;

const PROGRAMS: [(&str, &str); 7] = [
    ("coll_check", env!("CARGO_BIN_EXE_coll_check")),
    ("gpu_check", env!("CARGO_BIN_EXE_gpu_check")),
    ("tp_mlp", env!("CARGO_BIN_EXE_tp_mlp")),
    ("pipeline", env!("CARGO_BIN_EXE_pipeline")),
    ("kv_pool", env!("CARGO_BIN_EXE_kv_pool")),
    ("fault_check", env!("CARGO_BIN_EXE_fault_check")),
    ("stress_check", env!("CARGO_BIN_EXE_stress_check")),
];

#[test]
fn help_exits_0_and_names_the_usage() {
    for (name, exe) in PROGRAMS {
        let out = Command::new(exe).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help: {:?}", out.status);
        assert!(text.contains("Usage:"), "{name} --help printed:\n{text}");
    }
}

#[test]
fn an_unknown_option_is_an_error() {
    for (name, exe) in PROGRAMS {
        let out = Command::new(exe).arg("--no-such-option").output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {text}");
        assert!(text.contains("--no-such-option"), "{name}: {text}");
    }
}
