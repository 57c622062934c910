//! Worker liveness and the mailbox: a worker stuck inside a round is reported by name, a command
//! sent through the mailbox is applied, a reload the stuck worker takes late says it was applied
//! late, and a stop waits for a reload that is changing the datapath.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmswitch_core::PortId;

use wasmswitch::api::{ChangeError, APPLIED_LATE};
use wasmswitch::config::Config;
use wasmswitch::dataplane::{Command, Dataplane, APPLY_BOUND, STALL_BOUND};
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};

/// A stage that blocks its worker for `stall` on its first call, then passes everything.
struct StallOnce {
    stall: Duration,
    calls: Arc<AtomicU32>,
}

impl VerdictStage for StallOnce {
    fn run(&mut self, _b: &BatchView<'_>, _v: &mut [Verdict]) {
        if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
            std::thread::sleep(self.stall);
        }
    }
}

const TWO_WORKERS: &str = "workers:\n  - idle: sleep\n  - idle: sleep\nports:\n  - name: p0\n    driver: sim\n    sim:\n      queues: 2\n      traffic:\n        rate_pps: 20000\n  - name: p1\n    driver: sim\n    sim:\n      queues: 2\n      traffic:\n        rate_pps: 20000\n";

#[test]
fn a_stalled_worker_is_named_and_recovers() {
    let cfg = Config::parse(TWO_WORKERS, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(dp.health(), Ok(()));
    let calls = Arc::new(AtomicU32::new(0));
    let stall = STALL_BOUND + Duration::from_millis(1500);
    // Only worker 1 gets the stalling stage.
    dp.workers[1]
        .control
        .send(Command::SetIngress(PortId(0), Some(Box::new(StallOnce { stall, calls: calls.clone() }))));
    let t = Instant::now();
    let mut seen = None;
    while t.elapsed() < stall + Duration::from_secs(2) {
        if let Err(why) = dp.health() {
            seen = Some(why);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let why = seen.expect("a worker stuck in one round for longer than the bound is reported");
    assert!(why.contains("worker 1 has not completed a round"), "{why}");
    assert!(!why.contains("worker 0"), "worker 0 keeps running: {why}");
    // Once the call returns the worker runs rounds again and health comes back.
    let t = Instant::now();
    while dp.health().is_err() && t.elapsed() < stall + Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dp.health(), Ok(()));
    assert!(calls.load(Ordering::Relaxed) > 1, "the stage ran again after its stall");
    dp.stop().expect("no frame leaked");
}

/// A stage that records the first call it gets.
struct Mark(Arc<AtomicU32>);

impl VerdictStage for Mark {
    fn run(&mut self, _b: &BatchView<'_>, _v: &mut [Verdict]) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_command_reaches_the_worker_through_the_generation_counter() {
    let cfg = Config::parse(TWO_WORKERS, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let calls = Arc::new(AtomicU32::new(0));
    let before = dp.workers[0].control.rounds();
    dp.workers[0].control.send(Command::SetIngress(PortId(0), Some(Box::new(Mark(calls.clone())))));
    // The worker sees the generation move and installs the stage; it then runs on p0's traffic.
    let t = Instant::now();
    while calls.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
        std::hint::spin_loop();
    }
    assert!(calls.load(Ordering::Relaxed) > 0, "the stage was installed");
    dp.stop().expect("no frame leaked");
    assert!(dp.workers[0].control.rounds() > before, "rounds are counted");
}

/// A reload that a worker stuck in a round cannot take in time is still applied (the others
/// took it, the stuck one takes it when its round ends) and says so: its error begins with
/// `APPLIED_LATE`, which the API answers 500, not the 422 of a refusal that changed nothing.
#[test]
fn a_reload_a_stuck_worker_takes_late_is_applied_and_says_so() {
    let dir = common::Scratch::new("late");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(TWO_WORKERS)).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let stall = APPLY_BOUND + Duration::from_secs(2);
    sw.dataplane.workers[1]
        .control
        .send(Command::SetIngress(PortId(0), Some(Box::new(StallOnce { stall, calls: calls.clone() }))));
    let t = Instant::now();
    while calls.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1, "worker 1 is inside its stalled call");
    // A change each worker takes itself.
    dir.write(&format!("switch:\n  batch: 32\n{TWO_WORKERS}"));
    let e = sw.reload().expect_err("worker 1 cannot take it in time");
    assert!(matches!(e, ChangeError::AppliedLate(_)), "applied, not refused: {e:?}");
    let e = e.to_string();
    assert!(e.starts_with(APPLIED_LATE) && e.contains("worker(s) [1]"), "{e}");
    assert!(e.contains("applied: switch.batch = 32"), "the summary of what was applied: {e}");
    assert_eq!(sw.config().switch.batch.value, 32, "the new config is the running one");
    sw.dataplane.stop_shared().expect("no frame leaked");
}

/// A stop that comes while a reload is changing the datapath (ports opened, frames taken from
/// the pool for them) waits for it instead of counting those frames as leaked; a reload that
/// comes after the stop is refused.
#[test]
fn a_stop_waits_for_a_change_under_way_and_refuses_one_after() {
    let cfg = Config::parse(TWO_WORKERS, Path::new("<test>")).unwrap();
    let dp = Arc::new(Dataplane::start(&cfg).unwrap());
    let stopped = {
        let change = dp.begin_change().unwrap();
        let stopper = {
            let dp = dp.clone();
            std::thread::spawn(move || dp.stop_shared())
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(!stopper.is_finished(), "the stop waits for the change under way");
        drop(change);
        stopper.join().unwrap()
    };
    stopped.expect("no frame leaked");
    let e = dp.begin_change().expect_err("no change after the stop");
    assert!(e.to_string().contains("the daemon is stopping"), "{e}");
}
