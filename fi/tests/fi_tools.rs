//! Stock libfabric's own tools over the provider: `fi_info` lists it and
//! refuses what it cannot do; `fi_pingpong` runs between two processes
//! with data checks for every size it offers.
//!
//! The provider is the library cargo built for this test, named as
//! libfabric looks for it by `scripts/fi-build.sh --link`. Regions go to
//! a directory of this test's own under /dev/shm, removed at the end
//! whatever happens; every child runs under a timeout.

mod common;

use common::{text, tool, wait, ShmDir};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `fi_info` with `args`, at most 60 s.
fn fi_info(args: &[&str], shm: &ShmDir) -> Output {
    let c = tool("fi_info", shm)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fi_info (libfabric-bin: run scripts/deps.sh)");
    wait(c, Duration::from_secs(60), "fi_info")
}

#[test]
fn fi_info_lists_the_provider_and_its_attributes() {
    let shm = ShmDir::new("info");
    let o = fi_info(&["-l"], &shm);
    assert!(o.status.success() && text(&o).contains("shmfab:"), "fi_info -l:\n{}", text(&o));
    let o = fi_info(&["-p", "shmfab"], &shm);
    let t = text(&o);
    assert!(o.status.success(), "fi_info -p shmfab failed:\n{t}");
    for want in ["provider: shmfab", "fabric: shmfab", "type: FI_EP_RDM"] {
        assert!(t.contains(want), "no {want:?} in:\n{t}");
    }
    let o = fi_info(&["-p", "shmfab", "-v"], &shm);
    let t = text(&o);
    assert!(o.status.success(), "fi_info -v failed:\n{t}");
    for want in [
        "caps: [ FI_MSG, FI_RMA, FI_TAGGED, FI_ATOMIC, FI_READ, FI_WRITE, FI_RECV, FI_SEND, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_MULTI_RECV, FI_TRIGGER, FI_LOCAL_COMM, FI_RMA_EVENT, FI_SOURCE, FI_DIRECTED_RECV ]",
        "mr_mode: [ FI_MR_PROV_KEY ]",
        "inject_size: 4096",
        "iov_limit: 4",
        "max_ep_srx_ctx: 1",
        "threading: FI_THREAD_SAFE",
        "av_type: FI_AV_TABLE",
        "cq_data_size: 8",
        "addr_format: FI_FORMAT_UNSPEC",
    ] {
        assert!(t.contains(want), "no {want:?} in:\n{t}");
    }
    for never in ["FI_REMOTE_COMM", "FI_SHARED_AV", "FI_MR_VIRT_ADDR"] {
        assert!(!t.contains(never), "{never} advertised:\n{t}");
    }
}

#[test]
fn fi_info_hints_shmfab_cannot_meet_find_nothing() {
    let shm = ShmDir::new("hints");
    for ok in [
        &["-c", "FI_MSG|FI_TAGGED", "-t", "FI_EP_RDM"][..],
        &["-c", "FI_TAGGED|FI_DIRECTED_RECV"],
        &["-a", "FI_FORMAT_UNSPEC"],
        &["-c", "FI_RMA"],
        &["-c", "FI_ATOMIC"],
    ] {
        let o = fi_info(&[&["-p", "shmfab"], ok].concat(), &shm);
        assert!(o.status.success() && text(&o).contains("provider: shmfab"), "{ok:?} refused:\n{}", text(&o));
    }
    for refused in [
        &["-c", "FI_MSG|FI_REMOTE_COMM"][..],
        &["-t", "FI_EP_MSG"],
        &["-t", "FI_EP_DGRAM"],
        &["-a", "FI_SOCKADDR_IN"],
        &["-d", "not-shmfab"],
    ] {
        let o = fi_info(&[&["-p", "shmfab"], refused].concat(), &shm);
        // fi_info exits with fi_getinfo's error, FI_ENODATA (61), and says
        // so: not a crash, nor another failure that also lists nothing.
        assert!(
            o.status.code() == Some(61) && text(&o).contains("fi_getinfo: -61") && !text(&o).contains("provider:"),
            "{refused:?}: not -FI_ENODATA ({}):\n{}",
            o.status,
            text(&o)
        );
    }
}

/// Whether a TCP socket listens on `port` (from /proc/net/tcp: state 0A).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).any(|l| {
            l.split_whitespace().nth(1).is_some_and(|a| format!("{a} ").ends_with(&want))
                && l.split_whitespace().nth(3) == Some("0A")
        })
    })
}

/// A TCP port nobody listens on now (the kernel's choice).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("its address").port()
}

/// `fi_pingpong -p shmfab -e rdm -c -S all` between two processes: every
/// size from 0 to 6 MiB, each message checked.
#[test]
fn fi_pingpong_checks_every_size() {
    let shm = ShmDir::new("pingpong");
    let port = free_port().to_string();
    let args = ["-p", "shmfab", "-e", "rdm", "-c", "-S", "all"];
    let server = tool("fi_pingpong", &shm)
        .args(args)
        .args(["-B", &port])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fi_pingpong (libfabric-bin: run scripts/deps.sh)");
    let t = Instant::now();
    while !listening(port.parse().unwrap()) {
        assert!(t.elapsed() < Duration::from_secs(30), "the fi_pingpong server never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = tool("fi_pingpong", &shm)
        .args(args)
        .args(["-P", &port, "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fi_pingpong client");
    let c = wait(client, Duration::from_secs(300), "fi_pingpong client");
    let s = wait(server, Duration::from_secs(60), "fi_pingpong server");
    for (who, o) in [("client", &c), ("server", &s)] {
        let t = text(o);
        assert!(o.status.success(), "fi_pingpong {who} failed:\n{t}");
        // One line per size, 0 B to 6 MiB, with as many acks as sends.
        for size in ["0 ", "1 ", "8 ", "4k ", "64k ", "1m ", "6m "] {
            assert!(t.lines().any(|l| l.starts_with(size) && l.contains('=')), "{who}: no {size:?}line:\n{t}");
        }
        assert!(!t.contains("Error"), "{who} saw bad data:\n{t}");
    }
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}
