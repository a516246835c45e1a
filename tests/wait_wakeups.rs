//! Waiting that cannot hang (issue 13): a counter changed by another thread
//! wakes whoever waits on it, directly or through a wait set; an sread
//! whose threshold the CQ can never hold is refused instead of spinning.

use shmfab::{Domain, ErrorKind, Fabric, Threading};
use std::time::{Duration, Instant};

fn domain(name: &str) -> Domain {
    std::env::set_var("SHMFAB_JOB_ID", format!("wait-wakeups-{name}-{}", std::process::id()));
    Fabric::open().unwrap().domain_with(Threading::Safe).unwrap()
}

/// Runs `wait` in this thread while another thread calls `change` after
/// 100 ms; returns what `wait` returned and how long it took.
fn woken_by<R: Send>(wait: impl FnOnce() -> R, change: impl FnOnce() + Send) -> (R, Duration) {
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            change();
        });
        let t0 = Instant::now();
        let r = wait();
        (r, t0.elapsed())
    })
}

#[test]
fn counter_changes_from_another_thread_wake_its_waiter() {
    let dom = domain("cntr");
    let c = dom.cntr_open().unwrap();
    // add
    let (r, el) = woken_by(|| c.wait(1, 3000), || c.add(1).unwrap());
    r.unwrap();
    assert!(el >= Duration::from_millis(90) && el < Duration::from_millis(1500), "add: {el:?}");
    // set
    let (r, el) = woken_by(|| c.wait(5, 3000), || c.set(5).unwrap());
    r.unwrap();
    assert!(el < Duration::from_millis(1500), "set: {el:?}");
    // adderr and seterr: the wait returns -FI_EAVAIL.
    let (r, el) = woken_by(|| c.wait(6, 3000), || c.adderr(1).unwrap());
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Avail);
    assert!(el < Duration::from_millis(1500), "adderr: {el:?}");
    let (r, el) = woken_by(|| c.wait(6, 3000), || c.seterr(7).unwrap());
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Avail);
    assert!(el < Duration::from_millis(1500), "seterr: {el:?}");
    assert_eq!((c.read().unwrap(), c.readerr().unwrap()), (5, 7));
}

#[test]
fn counter_changes_from_another_thread_wake_a_wait_set() {
    let dom = domain("wset");
    let c = dom.cntr_open().unwrap();
    let ws = dom.wait_open().unwrap();
    ws.add_cntr(&c).unwrap();
    let (r, el) = woken_by(|| ws.wait(3000), || c.add(1).unwrap());
    r.unwrap();
    assert!(el >= Duration::from_millis(90) && el < Duration::from_millis(1500), "add: {el:?}");
    let (r, el) = woken_by(|| ws.wait(3000), || c.seterr(2).unwrap());
    r.unwrap();
    assert!(el < Duration::from_millis(1500), "seterr: {el:?}");
    // Nothing changed since: the set times out.
    assert_eq!(ws.wait(50).unwrap_err().kind(), ErrorKind::TimedOut);
    drop(ws);
}
