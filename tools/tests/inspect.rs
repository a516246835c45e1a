//! `shmfab inspect` on a job that holds messages nobody takes (in one
//! process: two endpoints of one domain).

use shmfab::*;

struct Pair {
    ep0: Endpoint,
    ep1: Endpoint,
    _cq: CompletionQueue,
    _av: AddressVector,
    dom: Domain,
    a1: FiAddr,
}

fn pair() -> Pair {
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let ep0 = dom.endpoint().unwrap();
    let ep1 = dom.endpoint().unwrap();
    for ep in [&ep0, &ep1] {
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
    }
    let a1 = av.insert(&[ep1.getname()]).unwrap()[0];
    Pair { ep0, ep1, _cq: cq, _av: av, dom, a1 }
}

#[test]
fn inspect_shows_what_a_stuck_job_holds() {
    std::env::set_var("SHMFAB_JOB_ID", format!("tools-inspect-{}", std::process::id()));
    let jh = shmfab::internal::region::job_hash(&std::env::var("SHMFAB_JOB_ID").unwrap());
    let p = pair();
    // ep1 posts two receives that nothing matches and does not progress;
    // ep0 sends three 100-byte messages it never takes.
    let mut b = [0u8; 8];
    // SAFETY: b outlives the receives: they never complete, and the
    // endpoint (p) is closed before the function returns.
    unsafe {
        p.ep1.trecv(&mut b, FI_ADDR_UNSPEC, 77, 0, 1).unwrap();
        p.ep1.trecv(&mut b, FI_ADDR_UNSPEC, 78, 0, 2).unwrap();
    }
    for _ in 0..300 {
        p.dom.progress().unwrap(); // publishes the gauges now and then
    }
    // Sent after the last progress pass: they stay in the ring.
    for _ in 0..3 {
        p.ep0.inject(&[9u8; 100], p.a1).unwrap();
    }
    let c = p.dom.cntr_open().unwrap();
    c.add(42).unwrap();
    let report = shmfab_tools::inspect::inspect(Some(jh)).unwrap();
    assert!(report.contains(&format!("job {jh:08x}")), "{report}");
    assert!(report.contains(&format!("pid {} alive", std::process::id())), "{report}");
    assert!(report.contains("2 receives posted"), "{report}");
    // 3 messages of 100 bytes: 3 cells each.
    assert!(report.contains("9 of 1024 cells in flight"), "{report}");
    assert!(report.contains("counter 0: 42"), "{report}");
    assert_eq!(shmfab_tools::inspect::job_arg(&format!("{jh:08x}")), jh);
    drop(c);
}
