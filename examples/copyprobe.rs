//! Probe (not a benchmark of shmfab's API): the ceilings large messages
//! meet here. A child process (fork) holds a SIZE-byte buffer of its own;
//! the parent reads it whole with `process_vm_readv` (the kernel's single
//! copy, what shmfab's large messages take) into 16 rotating buffers, as a
//! stream's receiver puts each message into its own buffer, and into one
//! buffer that stays in cache. Then, in one process, `memcpy` and a copy
//! with non-temporal stores (AVX, where the CPU has it) from one buffer
//! into 16 rotating ones: what a copy of our own could do where the
//! destinations outgrow the caches. Prints GB/s, the median of the
//! rounds (each round about 2 GB per line).
//!
//! Usage: `copyprobe [SIZE] [rounds]` (default 4194304 bytes, 5 rounds).

use std::io::{Read, Write};
use std::time::Instant;

/// Destinations a message rotates through (as `shmfab bench bw`'s
/// receiver, whose window of 1 MiB and larger messages is 16).
const ROTATE: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(4 << 20), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    if size == 0 || size > 1 << 30 || rounds == 0 {
        return Err("usage: copyprobe [SIZE (1 B to 1 GiB)] [rounds (1 or more)]".into());
    }
    let src = vec![1u8; size];
    let (mut ready_r, mut ready_w) = std::io::pipe()?;
    // SAFETY: fork in a process with one thread (nothing spawned yet).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        // The child: gone with its parent, whatever way the parent ends.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // SAFETY: getppid has no arguments.
        if unsafe { libc::getppid() } == 1 {
            std::process::exit(1); // the parent was already gone
        }
        // Pages of its own (writing breaks the sharing the fork made), then
        // hold them until killed.
        let mut own = src;
        own.fill(7);
        drop(ready_r);
        let _ = ready_w.write_all(&(own.as_ptr() as u64).to_le_bytes());
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            std::hint::black_box(&own);
        }
    }
    drop(ready_w);
    let mut at = [0u8; 8];
    let read = ready_r.read_exact(&mut at);
    let remote = u64::from_le_bytes(at) as usize;
    let result = read.map_err(Into::into).and_then(|_| probe(pid, remote, &src, rounds));
    // SAFETY: pid is our child; SIGKILL then reap it.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    result
}

fn probe(pid: i32, remote: usize, src: &[u8], rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let size = src.len();
    let mut dsts: Vec<Vec<u8>> = (0..ROTATE).map(|_| vec![0u8; size]).collect();
    let reps = (2_000_000_000 / size).max(ROTATE);
    let gbs = |f: &mut dyn FnMut(usize) -> Result<(), Box<dyn std::error::Error>>| {
        let mut v = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t0 = Instant::now();
            for r in 0..reps {
                f(r)?;
            }
            v.push((size * reps) as f64 / t0.elapsed().as_secs_f64() / 1e9);
        }
        v.sort_by(f64::total_cmp);
        Ok::<f64, Box<dyn std::error::Error>>(v[v.len() / 2])
    };
    let readv = |dst: &mut [u8]| -> Result<(), Box<dyn std::error::Error>> {
        let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
        let far = libc::iovec { iov_base: remote as *mut libc::c_void, iov_len: dst.len() };
        // SAFETY: `local` is our buffer of that length; `far` names the
        // child's memory, which the kernel checks.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &far, 1, 0) };
        if n != dst.len() as isize {
            return Err(format!("process_vm_readv: {} ({})", n, std::io::Error::last_os_error()).into());
        }
        Ok(())
    };
    println!("{size} B, median of {rounds} rounds of {reps} copies:");
    let v = gbs(&mut |r| readv(&mut dsts[r % ROTATE]))?;
    println!("  process_vm_readv into {ROTATE} rotating buffers     {v:6.2} GB/s");
    let v = gbs(&mut |_| readv(&mut dsts[0]))?;
    println!("  process_vm_readv into one buffer             {v:6.2} GB/s");
    let v = gbs(&mut |r| {
        dsts[r % ROTATE].copy_from_slice(src);
        Ok(())
    })?;
    println!("  memcpy into {ROTATE} rotating buffers               {v:6.2} GB/s");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        let v = gbs(&mut |r| {
            // SAFETY: AVX is there (checked); two live buffers of `size` bytes.
            unsafe { copy_nt(src, &mut dsts[r % ROTATE]) };
            Ok(())
        })?;
        println!("  non-temporal stores into {ROTATE} rotating buffers {v:6.2} GB/s");
    }
    if src.len() > 64 {
        assert!(dsts.iter().all(|d| d[size / 2] != 0), "every buffer was written");
    }
    Ok(())
}

/// Copies `src` into `dst` (one length) with 32-byte non-temporal stores
/// where `dst` is 32-byte aligned, plain copies for the ends.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_nt(src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    let n = src.len().min(dst.len());
    let head = dst.as_ptr().align_offset(32).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let body = (n - head) / 32 * 32;
    let mut off = head;
    while off < head + body {
        // SAFETY: off + 32 <= head + body <= n: inside both buffers; dst +
        // off is 32-byte aligned (head aligned it, steps of 32 keep it);
        // AVX is there (ours).
        unsafe {
            let v = _mm256_loadu_si256(src.as_ptr().add(off) as *const __m256i);
            _mm256_stream_si256(dst.as_mut_ptr().add(off) as *mut __m256i, v);
        }
        off += 32;
    }
    dst[off..n].copy_from_slice(&src[off..n]);
    // Orders the streamed stores before what follows.
    _mm_sfence();
}
