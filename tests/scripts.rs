//! The launcher scripts' command lines, on a machine with a fake GPU: `scripts/gpus` refuses
//! more PEs than GPUs unless asked to share them, and `scripts/nvshmrun --share-gpus` starts
//! a private CUDA MPS daemon, hands the launcher the MPS environment, and stops the daemon
//! after the job. The fake tools (nvidia-smi, nvidia-cuda-mps-control, mpiexec) are shell
//! scripts that record what they were asked.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A folder of fake tools, first on PATH, and a fake libcuda.so.1 so that the driver check
/// passes.
struct FakeMachine {
    dir: PathBuf,
}

impl FakeMachine {
    fn new(name: &str, gpus: usize, with_mps: bool) -> Self {
        let dir =
            std::env::temp_dir().join(format!("nvshmem-rs-scripts-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("libcuda.so.1"), "").unwrap();
        let list: String = (0..gpus)
            .map(|g| format!("echo 'GPU {g}: Fake H200 (UUID: GPU-{g})'\n"))
            .collect();
        script(&dir.join("bin/nvidia-smi"), &format!("#!/bin/sh\n{list}"));
        // The launcher prints what each PE would see.
        script(
            &dir.join("bin/mpiexec"),
            "#!/bin/sh\necho \"launch $* pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none} \
             pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}\"\n",
        );
        if with_mps {
            // A daemon is "running" while $dir/daemon exists; every request is logged.
            let log = dir.join("mps.log");
            let up = dir.join("daemon");
            script(
                &dir.join("bin/nvidia-cuda-mps-control"),
                &format!(
                    "#!/bin/sh\nif [ \"$1\" = -d ]; then echo \"daemon $CUDA_MPS_PIPE_DIRECTORY\" \
                     >> {log}; touch {up}; exit 0; fi\nread cmd\necho \"$cmd\" >> {log}\n\
                     [ -e {up} ] || exit 1\n[ \"$cmd\" = quit ] && rm -f {up}\nexit 0\n",
                    log = log.display(),
                    up = up.display()
                ),
            );
        }
        FakeMachine { dir }
    }

    fn run(&self, script: &str, args: &[&str]) -> Output {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = format!("{}:/usr/bin:/bin", self.dir.join("bin").display());
        Command::new(root.join(script))
            .args(args)
            .env("PATH", path)
            .env("LD_LIBRARY_PATH", &self.dir)
            .env("TMPDIR", &self.dir)
            .env("MPIEXEC", self.dir.join("bin/mpiexec"))
            .env_remove("CUDA_MPS_PIPE_DIRECTORY")
            .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .env_remove("NVSHMRUN_SHARE_GPUS")
            .output()
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    fn mps_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mps.log")).unwrap_or_default()
    }
}

impl Drop for FakeMachine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn more_pes_than_gpus_are_refused_unless_shared() {
    let m = FakeMachine::new("refuse", 1, true);
    let o = m.run("scripts/gpus", &["1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).trim(), "ok 1");

    let o = m.run("scripts/gpus", &["4"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("pass NP=1 or less") && t.contains("--share-gpus"),
        "{t}"
    );

    let o = m.run("scripts/gpus", &["--share", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).trim(), "ok 1");
}

#[test]
fn sharing_without_mps_says_what_is_missing() {
    // A real driver install may have the control program where the script also looks.
    if Path::new("/usr/local/nvidia/bin/nvidia-cuda-mps-control").exists()
        || Path::new("/usr/bin/nvidia-cuda-mps-control").exists()
    {
        return;
    }
    let m = FakeMachine::new("nomps", 1, false);
    let o = m.run("scripts/gpus", &["--share", "2"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("nvidia-cuda-mps-control"), "{}", text(&o));
}

#[test]
fn nvshmrun_shares_a_gpu_through_a_private_mps_daemon_and_stops_it() {
    let m = FakeMachine::new("share", 1, true);
    let o = m.run(
        "scripts/nvshmrun",
        &["-np", "4", "--share-gpus", "prog", "--x"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let pipe = m
        .dir
        .join(format!("nvshmem-rs-mps-{}", user_id()))
        .join("pipe");
    // Four PEs on one GPU: a quarter of the SMs each, the daemon's pipes private to this job.
    assert!(
        t.contains(&format!(
            "launch -np 4 prog --x pct=25 pipe={}",
            pipe.display()
        )),
        "{t}"
    );
    let log = m.mps_log();
    assert!(log.contains(&format!("daemon {}", pipe.display())), "{log}");
    // Stopped, and waited for: the last request finds no daemon.
    assert!(
        log.lines().any(|l| l == "quit"),
        "the daemon is stopped: {log}"
    );
    assert!(!m.dir.join("daemon").exists());

    // As many PEs as GPUs: no MPS at all.
    let m = FakeMachine::new("noshare", 2, true);
    let o = m.run("scripts/nvshmrun", &["-np", "2", "--share-gpus", "prog"]);
    assert!(
        text(&o).contains("launch -np 2 prog pct=none pipe=none"),
        "{}",
        text(&o)
    );
    assert_eq!(m.mps_log(), "");
}

/// This process's user id, as `id -u` prints it.
fn user_id() -> String {
    let o = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
