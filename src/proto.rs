//! Protocols by size, chosen in one place ([`choose`]), and the tunables
//! that steer them (read once from the environment by [`Config::from_env`]).
//!
//! | protocol | when | data moves |
//! | --- | --- | --- |
//! | [`Proto::Inline`] | up to `inline_max` (and below `cma_min`: 8 KiB, where single copy is usable; then also in the eager runs after the receiver picked the pool, and for a stream's messages, below); on the overflow queue up to one cell (72 B) | in the ring cells, one copy each side; from `pipe_min` piped (the receiver copies each 4 KiB piece as it lands) |
//! | [`Proto::Bounce`] | a stream's inline-sized messages from `stream_min` (below); above `inline_max`, below `cma_min` where single copy is usable (with the defaults, only in the runs and streams below), else below `rndv_min` (and on the overflow queue, or with more iovs than its RTS holds) | eagerly through the receiver's pool in fragments ([`frag_for`]: `frag_size` below 32 KiB, then a quarter of the message, at most `frag_max`, each a run of chunks back to back named by one ring message), pipelined: the sender fills fragment k+1 while the receiver drains fragment k |
//! | [`Proto::Rndv`] | from the lower of `cma_min` and `rndv_min` where single copy is usable, else from `rndv_min` | request to send first; when a receive matches, one copy: the receiver reads the sender's buffer with process_vm_readv (from `split_min`, both sides copy half each). Where CMA is off or the kernel refuses it (EPERM, ENOSYS; both sides then stop offering it to that peer) the receiver asks for the data through the pool |
//!
//! "Single copy usable" means: CMA not off, not refused by that peer, and the
//! payload not a provider-held copy (an inject queued behind other sends).
//! A rendezvous whose two buffers sit in the slow band of the kernel's copy
//! (the destination 1-63 bytes past the source modulo 4096: see
//! [`crate::copy`]) is fetched through the pool, for that message only.
//! From `cma_min` to 64x it (six octaves, below `split_min`) the receiver
//! picks single copy or the pool by what each has measured lately with
//! that peer ([`PathPick`]): on these VMs the faster one changes with
//! where the two vCPUs sit. When it picked the pool for a rendezvous of
//! the three lowest classes (8-64 KiB), its sender sends the next 7 of
//! that class the ordinary way (`engine::tx::EAGER_RUN`: what [`choose`]
//! gives without single copy, inline up to `inline_max`, else the pool;
//! an answer inline to `answer_max`, a stream's messages through the
//! pool; 31 when the pool measured 2x faster, `CTS_BOUNCE_SURE`), then
//! one by rendezvous so that the receiver picks again (not after the
//! pool was taken only to measure it again, one pick in 64, or in 512
//! while one path wins by 2x: `CTS_BOUNCE_EXPLORE`). Below 64 KiB a send while another to that peer
//! is under way (a stream's) is flagged, and picked for by a measure of
//! the stream's rate instead ([`StreamPick`]; `engine::tx::STREAM_MAX`,
//! `engine::tx::StreamWay`: the one-copy measure took single copy for near
//! streams the pool carries 1.6-2.8x faster). Not eager runs from 64 KiB
//! (`engine::tx::EAGER_MAX`: 64-128 KiB lost 2.2-3.5 us far and 0.16
//! near in session 18; 128-256 KiB lost 2 us on one far placement);
//! there the pick's fixes alone took 128 KiB from 9.5 to 8.0-8.2 us (raw
//! 0.13, the fast far placement) and 17.0 to 16.2-16.5 (raw 0.13, the
//! slow one).
//!
//! Single copy from 8 KiB (session 18, 2026-11-27; it started at 64 KiB
//! before). A process_vm_readv in one process costs 3,900-4,000 cycles
//! of 2.6 GHz at 4 KiB, 6,500 at 16 KiB, 15,400 at 64 KiB (against
//! `memcpy` 234, 780 and 2,964: the kernel's page walks; a C probe), so
//! near (raw 8 B 0.05 us) two copies through shared memory win from 8 to
//! 64 KiB. Far (raw 0.18-0.20) they lose badly: each line a copy writes
//! crosses to the other core, while single copy reads a send buffer that
//! both cores hold clean. `shmfab bench pingpong` far, the build before
//! against this one, paired (10 rounds): 16 KiB 8.59 -> 4.77 us (better in
//! 10 of 10), 32 KiB 16.2 -> 6.5 (7 of 10); single runs 8 KiB 4.6 -> 3.5.
//! Near, paired: 8 KiB +0.07 us (0 of 10), 16 KiB +0.04 (1 of 10), 32
//! KiB +0.08 (3 of 10), 64 KiB -0.07 (5 of 10): the rendezvous every 8th
//! message, where the receiver picks again, and the exploration of
//! single copy every 64th pick. Streams unchanged near (16 KiB +0.73
//! GB/s, 7 of 8; 64 KiB -0.14, 2 of 8; 32 KiB +0.03, 4 of 8), where the
//! pick alone (without the stream rule) took single copy for 8 and 16
//! KiB streams at 3.5 and 5.4 GB/s against 9.7 and 8.7. An eager run of
//! 31 instead of 7 cost 64 KiB 0.7 us near (0 of 12) and 5 us far (1 of
//! 10): a wrong pick then lasts four times as long. Sends of 8-64 KiB
//! may now need the receiver to complete (a rendezvous): the eager limit
//! is 8 KiB where single copy is usable (Open MPI's vader has 4 KiB by
//! default), except in the runs and streams above.
//!
//! Inline up to 16 KiB (a quarter of the default ring's bytes), the pool
//! above (2026-11-27, paired `scripts/ab.sh` rounds, `SHMFAB_INLINE_MAX`
//! against the 4 KiB limit of before): one copy into the ring and one out,
//! with nothing else per message, beat the pool's pipelined fragments and
//! their BOUNCE_HDR, CHUNK messages, chunk allocation and release. Near
//! (raw 8 B 0.03-0.06 us): 5000 B -0.12 us (8 of 10), 8 KiB -0.23 (20 of
//! 20), 12 KiB -0.25 (9 of 10) and -0.08 (9 of 10), 16000 B -0.10 (12 of
//! 20), 16 KiB -0.12 (8 of 10); streaming 8 KiB +1.1 GB/s (8 of 10) and
//! 16000 B +1.6 (10 of 10). Far (raw 0.25 before and after): 8 KiB
//! -0.34 us (9 of 10). 32 KiB inline (a 2048-cell ring) lost 0.36 us
//! (5 of 14): the pool's pipelining wins there. Session 13 had measured
//! 16 KiB inline 3.4 us against 2.6 through the pool (2026-11-23): the
//! band's copy and the ring's cuts since changed that.
//!
//! From `pipe_min` (8 KiB) an inline message goes piped (`crate::ring`:
//! published before its payload, which the receiver copies 4 KiB piece by
//! piece while the sender writes the next), so that the two copies overlap
//! instead of following each other (2026-11-27, paired `scripts/ab.sh`
//! rounds near, raw 8 B 0.03-0.06 us, against the same build with
//! `SHMFAB_PIPE_MIN=0`): 16 KiB -0.21 us (better in 19 of 24), -0.35 (23
//! of 24), -0.28 (15 of 16), -0.37 (17 of 20); 8 KiB -0.10 (20 of 24),
//! -0.07 (15 of 24), +0.00 (7 of 16 and 10 of 20); 6 KiB with a 4 KiB
//! threshold -0.04 (17 of 24) and -0.09 (14 of 24); 4 KiB piped (one
//! piece: nothing to overlap) +0.03 (8 of 24), so the default starts at 8
//! KiB. The message rate (8 B) and 8 B ping-pong unchanged (+0.26 Mmsg/s,
//! 13 of 24; 8 B tied, 9 of 20).
//!
//! An answer (`answer_max`, [`answer_inline`]: a message from the peer
//! arrived since our last send to it, nothing is queued to it) goes inline
//! and piped up to half the ring's bytes, 32 KiB by default, where it
//! would take the pool: paired, near, 24 KiB -0.34 us (16 of 16), 32 KiB
//! -0.17 (13 of 16) and -0.21 to -0.24 with every such message inline;
//! streams keep the pool (their messages answer nothing), as every
//! message up to half the ring inline lost 3.9 GB/s at 32 KiB (0 of 12).
//!
//! A stream of inline-sized messages takes the pool ([`stream_to_pool`],
//! `stream_min`, 8 KiB by default; session 18): a message of at least
//! `stream_min` bytes that would go inline goes through the pool when it
//! answers nothing and the last large message we sent that peer (inline,
//! or a chunk of one through the pool: `RingTx::note_large`) is still in
//! its ring, or when the ring has no room for it at its turn (when sent,
//! or queued behind others). The ring's 64 KiB hold three 16 KiB
//! messages, the pool's 2 MiB a window of them; ping-pong turns (answers)
//! and a lone message keep the ring. Measured 2026-11-27 (`scripts/ab.sh`
//! paired rounds against the build before, near, raw 8 B 0.05 us): the
//! one-way stream (`shmfab bench bw`) 8 KiB 7.65 -> 9.61 GB/s (better in 12
//! of 12), 16 KiB 7.57 -> 8.52 (12 of 12), 32 KiB tied (the pool already:
//! -0.01, 5 of 12); ping-pong unchanged (16 KiB -0.017 us, 10 of 16; 8 KiB
//! -0.004, 10 of 16). Both ways at once (`examples/bibw.rs`, osu_bibw's
//! pattern, against `SHMFAB_STREAM_MIN` off, alternating): near 8 KiB
//! 6.8-7.9 -> 13.2-13.6 GB/s, 16 KiB 7.3-7.4 -> 18.6; far (raw 0.19) 8 KiB
//! 2.41-2.49 -> 3.06-3.27, 16 KiB 2.25-2.30 -> 3.39-3.64; 24 KiB (the pool
//! both ways) tied, so answers inline to 32 KiB do not hurt a stream both
//! ways. A stream's messages alternated between the ring and the pool
//! when the test was the ring's emptiness (the consumer takes a pool
//! message's header at once) and stayed at the ring's figure (7.6 GB/s
//! one way); counting the last chunk of a pool message as the message
//! fixed that. Below 8 KiB the ring streams as well as the pool or better
//! (4 KiB: 7.7 against 6.3-7.1 one way, 10.1-10.4 against 7.6-9.5 both
//! ways; 6 KiB mixed), so `stream_min` starts at 8 KiB.
//!
//! Fragments carried in the ring's own cells instead of pool chunks (a
//! PART message per fragment after the BOUNCE_HDR: no chunk to take or
//! give back; branch `ring-parts-experiment`), measured again without
//! knowing it had been (session 11's 1.2-1.4x slower at 8-32 KiB:
//! ARCHITECTURE.md, "1-64 KiB and the placements"), lost to the pool as it
//! did then: near, 16
//! KiB in 4 KiB parts +0.21 us (1 of 10), in 2 KiB parts +0.37, 8 KiB in
//! two parts +0.24 (2 of 10); one 16 KiB part tied (+0.04, 3 of 10). The
//! more parts, the worse: the consumer, polling the next part's first cell
//! right after reading the part before, most likely pulls the lines the
//! producer is writing next to it (not confirmed: no hardware counters
//! here). Writing a multi-cell message's first cell last (its payload
//! just before the header and the publishing store) did not help a 4 KiB
//! inline message either (+0.04 us, 6 of 16).
//!
//! Fragment sizes, measured again (2026-11-26, `scripts/ab.sh` paired
//! rounds, near placement, raw 8 B 0.043-0.09 us before and after each
//! run): at 16 KiB, 2 x 8 KiB (`SHMFAB_FRAG_PARTS=2`) tied with the 4 x 4
//! KiB default (paired difference median -0.02 us, better in 6 of 12), one
//! 16 KiB run (`SHMFAB_FRAG_PARTS=1`: no pipelining) lost 0.38 us (better
//! in 3 of 12), 8 x 2 KiB (`SHMFAB_FRAG_SIZE=2048`) lost 0.20 (3 of 12);
//! at 64 KiB (eagerly after the pool's pick: 4 runs of 16 KiB) 8 KiB
//! fragments lost 0.41 us (0 of 12) and 2 x 32 KiB
//! (`SHMFAB_FRAG_MAX=32768`) 0.19 (2 of 12). So the defaults stay. While
//! another process loaded the VM (16 KiB took 5-7 us instead of 1.4),
//! 2 x 8 KiB was 1.0 us faster (9 of 12): fewer hand-overs to miss while
//! descheduled; not taken, as the quiet near placement shows no gain.
//! The software of the eager pool path, counted by callgrind on
//! `examples/pooltrip.rs` (one process, both sides, without the copies'
//! `memcpy`): 16 KiB 4,424 instructions per half trip (5,160 before the
//! cuts of the same day: `Chunk` encode and decode inlined across the
//! crates, the ring's push inlined into the fragment loop, one look-up of
//! the message per chunk, the stash's division only per batch), 8 KiB
//! 3,296, 32 KiB 5,031: about 560 per 4 KiB fragment, the rest per
//! message (matching, the receive order, completions). Paired, 16 KiB
//! took 1.358 us against 1.417 (better in 13 of 16, raw 0.043-0.09).
//!
//! Session 13 (2026-11-26 evening, raw 8 B 0.11-0.23 us around each run):
//! with the receiver's copy out of the pool 10-20% faster in the band (the
//! bench's buffers sit 16 bytes past a page: [`crate::copy`]) and the
//! receive order skipped for the oldest message, 16 KiB went from 1.35 to
//! 1.27 us and 1.82 to 1.47 (paired, 12 of 12 and 9 of 10 better). The
//! fragment sizes measured again after it: at 16 KiB 2 x 8 KiB tied (+0.02
//! us, 4 of 12 better), 8 x 2 KiB lost 0.13 (2 of 12); at 64 KiB 2 x 32
//! KiB lost 0.19 (4 of 12), 8 KiB fragments 0.15 (3 of 12): the defaults
//! stay. A split single copy from 256 KiB (`SHMFAB_SPLIT_MIN=256k`) lost
//! 1.6 us at 256 KiB (15.0 against 18.2, 1 of 8 better).
//!
//! Session 15 (2026-11-27), where 16 KiB's time goes. Timed with `lfence;
//! rdtsc` marks in both processes (a probe build, not kept; about 40
//! cycles of 2.45 GHz a mark), medians over 10,000 half trips of `shmfab
//! bench pingpong --sizes 16384`, cycles from the send's `post_tx`:
//! - raw 8 B 0.05 us: the sender starts its first copy at 343 (header
//!   pushed at 172), copies each 4 KiB in 564-662 and starts the next 73
//!   after; the receiver sees fragment 0 330 after its publishing, copies
//!   each in 489-589, and takes 269-294 from the end of one copy to the
//!   start of the next (the next fragment already published): it is the
//!   bound, falling further behind at each fragment. From the last copy
//!   to the completion 147, from there to the answer's `post_tx` 465.
//!   Half trip 4,813 (1.97 us with the marks).
//! - raw 0.07 us: the sender's copies took 686-880 and the receiver, its
//!   copies 420-540, waited for every fragment (seen 238-277 after its
//!   publishing): the sender is the bound.
//!
//! So which side bounds the pipeline changes with the placement (a
//! 0.1 us spin per fragment added 0.33 us on the sender, 0.28 on the
//! receiver, at raw 0.05; 0.41 us added 1.3 and 0.9 far), and what the
//! C probe of the data movement alone does not pay is mostly per message,
//! about 1,000 cycles with the marks: before the first copy (the general
//! send path, the header, the pool's free list), the first hand-over, and
//! after the last copy (completion, the pass's end with the flush of the
//! freed chunks, the CQ read, the answer's send path).
//!
//! Tried and dropped (paired `scripts/ab.sh` rounds at 16 KiB):
//! PREFETCHW of the pool's head line before `Pool::alloc_many` and
//! `free_many` (its load then CAS take the line twice), also early at the
//! BOUNCE_HDR push, and the `in_use` counter's two atomic adds skipped:
//! each within noise (150 rounds at raw 0.044: +0.007, +0.0005, +0.017 us
//! median, better in 69-74 of 150; 40-round blocks at raw 0.045-0.14:
//! -0.12 to +0.07). The receiver holding freed chunks until 5 or 17
//! (fewer CAS on the head, which the sender then finds in its own cache):
//! -0.02 and -0.06 us, 23 of 40, at raw 0.036-0.048 (it needs the pass's
//! flush changed; not taken). The band's copy ([`crate::copy`]) front to
//! back: +0.004 to +0.02 us, better in 2-15 of 30, at raw 0.031-0.055.
//! Placing a fragment's bytes in its chunk at its source's offset modulo
//! 64 (a skew in the CHUNK message), so that the receiver's copy into a
//! buffer placed like the sender's is `rep movsb` with both at one offset
//! instead of our loop in the band: a C probe (4 KiB fragments, 16 bytes
//! past a page) made 16 KiB 1.28-1.34 us with `memcpy` at one offset
//! against 1.75-1.81 with the band's loop (64 KiB 3.6 against 4.3; far
//! 4.8 against 5.8), but shmfab lost: fragments of 4080 bytes (a fifth of
//! 64) +0.09 us (7 of 40) near and +0.35 far; two-chunk runs, four
//! fragments, +0.12 (5 of 30) near and tied far (+0.06, 14 of 30). `perf`
//! found the copies' share of the run unchanged (23.5% `memcpy` against
//! 11.4% band loop + 11.1% `memcpy`): what the probe gains there, shmfab's
//! receiver, between its copies, does not.
//!
//! Session 16 (2026-11-27), where 64 KiB's time goes (eagerly through
//! the pool after the receiver's pick: a BOUNCE_HDR, then 4 runs of 16
//! KiB). `rdtsc` marks in both processes (a probe build, not kept),
//! medians over ~2,300 half trips per direction of `shmfab bench
//! pingpong --sizes 65536`, cycles of 2.45 GHz from the send's `post_tx`,
//! raw 8 B 0.031 us: the half trip took 9,400-9,700; the sender started
//! its first copy at 370-420, copied each 16 KiB run in about 1,800 and
//! pushed the next ~100 after; the receiver saw each run 200-400 after
//! its push, copied it in about 1,400 (into the bench's buffer 16 bytes
//! past a page: the band's loop, [`crate::copy`]) and was ready for the
//! next 250-300 after; from the last copy to the completion 245-295,
//! from there to the answer's `post_tx` 120-220. A C probe of the data
//! movement alone (two processes, 16 KiB fragments with a flag each,
//! buffers on page boundaries, same hour) made 7,000 cycles, its sender
//! copying 64 KiB in 5,900. So of the ~2,600 cycles shmfab adds, about
//! 1,300 are its sender's slower copies (from the application's buffer,
//! 16 or 272 bytes past a page, into the chunks), 400 its receiver's
//! slower last copy, 400 before the first copy (the general send path,
//! the header, the pool's alloc) and 400-500 after the last one. On a
//! loaded hour the sender's copies took 2,500-2,800 per 16 KiB in one
//! direction and 1,450 in the other: which side bounds moves with the
//! placement, as at 16 KiB.
//!
//! Cut: the sort of the chunks a sender takes from the pool ran on every
//! message (440-490 cycles before the first copy, both directions: after
//! a message in runs the receiver's list holds the runs, the last freed
//! first, so the indices come unsorted); now only when a run is broken
//! (50-150 cycles with the test). Paired `scripts/ab.sh` (raw 0.03-0.06
//! before and after each block, a loaded hour): 32 KiB -0.10 us (better
//! in 16 of 20) and -0.15 (13 of 20); 64 KiB -0.12 (17 of 30), -0.02
//! (16 of 30), +0.02 (10 of 20), -0.12 (11 of 20): within the noise there.
//! The marks builds before and after, alternated (4 pairs, raw
//! 0.048-0.051): first copy at 590-1,240 cycles against 370-1,000, the
//! alloc to the copy 150-530 against 70-120; in the quietest pair the
//! half trip 9,820 and 9,880 cycles against 9,330 and 9,320 (the bench
//! 4.58 us against 4.31).
//!
//! Tried and dropped the same day (64 KiB, same conditions): the last
//! run cut in halves down to one chunk (16, 16, 16, 8, 4, 4 KiB, so that
//! less is left to copy after the sender's last push): -0.12 and -0.14
//! us paired (17 and 16 of 30), but in the one quiet alternation of
//! the marks builds the half trip grew (11,700 and 13,800 cycles against
//! 9,700 and 9,400 in the run beside it): each
//! fragment costs the receiver 250-300 cycles, which the shorter tail
//! does not repay. PREFETCHW of the pool's head by the receiver before
//! each fragment's copy (so that the pass's return of the chunks, after
//! the copy, finds the line the sender's alloc took already back):
//! -0.08 us (15 of 30) and -0.08 (21 of 40), the marks' completion to
//! answer unchanged (120-470 cycles either way). The bench's receive
//! buffers moved to a page boundary (a throwaway bench, to price the
//! band's copy end to end): +0.35 (7 of 16) and +0.02 (14 of 30), no
//! gain seen. `SHMFAB_CMA=off` (every 64 KiB message eagerly, no
//! rendezvous every 8th): -0.09 us (7 of 12): the rendezvous after each
//! eager run costs little. The sender's copies by the band's AVX loop
//! instead of `memcpy` (a probe build of [`crate::copy`]): its 64 KiB of
//! copies took 9,600-12,000 cycles against 7,100-7,400 by `memcpy` in
//! the runs beside them (3 alternations, raw 0.044-0.053), the half trip
//! 6.1-6.7 us against 4.6.
//!
//! Measured for 4 MiB streams and not taken (the figure, 11.5-12.6 GB/s,
//! is the kernel's copy on both cores: a bandwidth run keeps both busy,
//! 1.9 CPUs for 1 of wall time): huge pages for the buffers of a split
//! copy (`madvise(MADV_COLLAPSE)` of the 2 MiB blocks of each side's own
//! buffer) took it to 13-20 GB/s in 5 alternating runs, but a collapse
//! costs 0.6-6 ms per 2 MiB block on this VM (the bench's 10 windows then
//! lost 0.9 GB/s paired, 6 of 20), so only a buffer reused many times
//! would gain. Through the pool (`SHMFAB_CMA=off`) 4 MiB streams at 6
//! GB/s, with non-temporal stores in the receiver's copy the same: the
//! hand-over between the cores is the limit there, though a C probe on
//! one core streams 4 MiB into 16 rotating buffers at 23-24 GB/s with
//! them against 11-12 by `memcpy`.
//!
//! A rendezvous ends with a FIN from its receiver when the receiver read
//! the sender's buffer (single copy; a split copy after its WDONE), dropped
//! the message (FI_DISCARD) or failed. One whose data the receiver asked
//! for through the pool (CTS_BOUNCE) ends at the sender's last chunk, and
//! gets a FIN only when its RTS asked for one (`rts_flags::FIN`, set by
//! FI_DELIVERY_COMPLETE sends, which complete at it; the flag stays with
//! an RTS queued as unexpected).
//!
//! Headers leave in send order (so matching follows send order); the data
//! of several messages to one peer may be in flight at once, and
//! completions are still written in send order per peer. An unexpected
//! rendezvous costs the receiver one small entry; an unexpected bounce
//! message is copied out of the pool (counted against `SHMFAB_UNEXP_MAX`),
//! so pool chunks are always given back promptly.
//!
//! Environment variables (all optional; each is checked against its range
//! by [`parse_env`], and a bad value makes [`Config::from_env`] fail with one
//! line naming it: the README's "Settings" table gives every range):
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `SHMFAB_INLINE_MAX` | largest message sent inline in a ring (with single copy usable, also below `SHMFAB_CMA_MIN`; at most a quarter of the ring's bytes) | 16384 |
//! | `SHMFAB_ANSWER_MAX` | largest message sent inline (piped) when it answers its peer (a message from it arrived since our last send to it, nothing queued to it): a ping-pong's turn, where the pool's fragments lose; a stream takes the pool. At most half the ring's bytes; 0: none | 32768 |
//! | `SHMFAB_STREAM_MIN` | smallest inline-sized message that goes through the pool when part of a stream: not an answer, and the last large message to that peer still in its ring (or no room in the ring for it). 0: every message of more than one cell; above `SHMFAB_INLINE_MAX` and `SHMFAB_ANSWER_MAX`: never | 8192 |
//! | `SHMFAB_PIPE_MIN` | smallest inline message sent piped: published before its payload, which the receiver copies piece by piece while the sender writes it (0: none) | 8192 |
//! | `SHMFAB_CMA_MIN` | smallest message sent by rendezvous with single copy, when usable (the receiver then picks single copy or the pool by measure, up to 64x it) | 8192 |
//! | `SHMFAB_FRAG_SIZE` | bytes per fragment of a message sent through the pool (multiple of 64, at most the chunk size) | 4096 |
//! | `SHMFAB_FRAG_PARTS` | fragments a larger message through the pool is cut into ([`frag_for`]: each a whole number of chunks, from `SHMFAB_FRAG_SIZE` to `SHMFAB_FRAG_MAX`; no runs when `SHMFAB_FRAG_SIZE` is below the chunk size) | 4 |
//! | `SHMFAB_FRAG_MAX` | most bytes per fragment (multiple of 64; at most 16 chunks) | 16384 |
//! | `SHMFAB_RNDV_MIN` | smallest message sent by rendezvous when single copy is not usable (data through the pool on demand) | 131072 |
//! | `SHMFAB_CMA` | `auto` (or `on`, `1`), `off` (or `0`: never offer CMA), `fail` (act as if the kernel refused it: tests the fallback), `nowrite` (refuse only the sender's writes of a split copy: tests that fallback) | `auto` |
//! | `SHMFAB_SPLIT_MIN` | smallest single-copy message whose copy both sides share (receiver reads the first half, sender writes the second with process_vm_writev), once single copy has worked with that peer | 524288 |
//! | `SHMFAB_RING_SLOTS` | SPSC rings per endpoint (more senders use the overflow queue) | 16 |
//! | `SHMFAB_RING_CELLS` | 64-byte cells per ring | 1024 |
//! | `SHMFAB_RING_LAP` | ring cell from which a message that answers its peer, finding the ring empty, takes the rest of the lap (`crate::ring`, "Lap ends"); 0 (or the ring's cells less one and more): never | 64 |
//! | `SHMFAB_OVF_CELLS` | entries of the overflow queue | 256 |
//! | `SHMFAB_POOL_CHUNKS`, `SHMFAB_CHUNK_SIZE` | bounce pool (a fragment per chunk) | 512, 4096 |
//! | `SHMFAB_UNEXP_MAX` | bytes of unexpected inline messages an endpoint holds before it stops draining (back-pressure) | 8 MiB |
//! | `SHMFAB_TX_SIZE`, `SHMFAB_RX_SIZE` | outstanding sends / posted receives per endpoint | 4096 |
//! | `SHMFAB_PEER_CHECK_MS` | how often a peer with pending operations is checked for life; a dead peer's operations fail within about this time | 100 |
//! | `SHMFAB_MAX_EPS` | endpoint sections per domain | 64 |
//! | `SHMFAB_REGIONS` | `anonymous` (regions have no name: nothing is left behind by a crash) or `named` (for ranks in different PID namespaces; a crash leaves them until the next start or `shmfab clean`) | `anonymous` |
//! | `SHMFAB_BOOT_TIMEOUT` | seconds [`crate::World::init`] waits for every rank | 120 |
//! | `SHMFAB_THREADING` | `domain` or `safe`: the threading model of `Fabric::domain` | `domain` |
//! | `SHMFAB_HEAP_SIZE` | bytes of shared heap per domain (read when its RMA file is made: `crate::mr`) | 256 MiB |

pub use crate::engine::request::OpKind;
use crate::error::{Error, ErrorKind, Result};
use shm_layout::{EpGeometry, OVF_PAYLOAD};

/// How a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// Payload inline in ring (or overflow) cells.
    Inline,
    /// Pipelined through the receiver's pool chunks.
    Bounce,
    /// Rendezvous: a request to send; on match the receiver reads the data
    /// by single copy (process_vm_readv) if offered and allowed, else asks
    /// for it through the pool.
    Rndv,
}

/// Size classes of [`PathPick`]: six octaves from `[cma_min, 2 cma_min)`
/// to `[32 cma_min, 64 cma_min)` (8 KiB to 512 KiB by default; below
/// `split_min`). From 8 KiB since session 18 (64 KiB before: the proto
/// notes above). 256-512 KiB joined when the measure stopped misleading
/// (see [`PathPick`]): at 256 KiB the pool took 13.5 us near
/// against 27.6 by single copy, 17.3 against 33 far. With it, 256 KiB
/// went from 27.5 to 14.5 us near (raw 8 B 0.047) and from 29.0-29.4 to
/// 14.7-15.0 far (raw 0.135-0.158), 16 paired rounds each (2026-11-26).
/// One near placement (raw 0.032) had the pool at 46 us against 31 by
/// single copy: there the pick keeps single copy.
pub const PICK_CLASSES: usize = 6;

/// One decision in this many takes the path not preferred, to measure it
/// again. The preferred path is measured with every message, so a path
/// that slows down is left at once; the other is found faster again
/// within this many messages. 16 cost 6% at 64 KiB far (every 16th
/// message through the 2x slower pool); 64 costs under 2%.
const PICK_EXPLORE: u32 = 64;

/// [`PICK_EXPLORE`] while one path is measured at least [`PICK_SURE`]
/// times as fast as the other: a placement change shows in the preferred
/// path's own samples or within this many messages (about a millisecond
/// at 16 KiB), and far, where a 16 KiB exploration of the pool costs 4
/// us, one in 64 cost 0.04-0.06 us a message (session 20, paired).
const PICK_EXPLORE_WIDE: u32 = 512;

/// The class of a `len`-byte rendezvous in the band where the receiver
/// picks between single copy and the pool by measure (the
/// [`PICK_CLASSES`] octaves from `cma_min`, below `split_min`); None
/// outside it.
///
/// Why by measure: on these VMs the two vCPUs move between placements
/// within minutes, and the winner at 64 KiB moves with them (the pool 2x
/// faster near, single copy 1.6x faster far: ARCHITECTURE.md).
pub fn pick_class(cfg: &Config, len: usize) -> Option<usize> {
    if cfg.cma_min == 0 || len < cfg.cma_min || len >= cfg.split_min {
        return None;
    }
    let c = (len / cfg.cma_min).ilog2() as usize;
    (c < PICK_CLASSES).then_some(c)
}

/// How many times faster than single copy the pool must be measured for
/// the receiver's pick of it to start a long run of eager messages at
/// the sender (`CTS_BOUNCE_SURE`, `engine::tx::EAGER_RUN_SURE`).
pub const PICK_SURE: f32 = 2.0;

/// Samples of each path taken before the faster is picked; the first is
/// dropped (see [`PathPick`]).
const PICK_WARM: u8 = 2;

/// Most a sample may exceed a path's measure by, as a factor: a sample
/// above it counts as this much.
const PICK_SAMPLE_MAX: f32 = 2.0;

/// A receiver's measure, for one peer and size class, of single copy
/// against the pool for rendezvous messages: the time of each per byte,
/// averaged (the last four samples weigh most). Single copy is measured
/// first (it is the default), twice, then the pool twice; after that the
/// faster one is taken, and every [`PICK_EXPLORE`]th decision the other.
///
/// Two things made the measure pick the slower path (the pool at 256 KiB,
/// 50 us against 33 by single copy, session 11), both seen in a trace of
/// every sample (2026-11-26, loaded VM, 256 KiB ping-pong):
/// - The first sample of a path pays for first touches: the first single
///   copy into a fresh receive buffer faults its pages in (203 us against
///   27-34 us after), the first pool transfer maps the pool's pages (126 us
///   against 44). Single copy went first, so the pool looked faster and
///   kept being picked until explorations, one message in 64 with a weight
///   of a quarter each, wore the bad first figure down (hundreds of
///   messages). So the first sample of each path is dropped: the second
///   replaces it.
/// - A descheduled process (the 2 vCPUs are shared) makes one sample 30-250x
///   too long (1.2-11 ms among 27-44 us). Averaged in, it pushed a path out
///   for hundreds of messages. So a sample counts as at most
///   [`PICK_SAMPLE_MAX`] times the path's measure: a path that really
///   slows down still loses within a few messages (its measure grows by a
///   quarter per sample), a lone outlier moves it by a quarter at most.
///   Noise only lengthens samples, so a sample under half the measure
///   replaces it: a path measured while its process was descheduled
///   (the pool's second sample at 1990 us, then 40-90: a trace of the
///   same day) is not left for hundreds of messages.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PathPick {
    /// Single copy: ns per byte (the process_vm_readv call); 0 unmeasured.
    cma: f32,
    /// The pool: ns per byte, from asking for the data (CTS_BOUNCE) to its
    /// last chunk copied; 0 unmeasured.
    pool: f32,
    /// Samples of single copy taken, up to [`PICK_WARM`].
    cma_n: u8,
    /// Samples of the pool taken, up to [`PICK_WARM`].
    pool_n: u8,
    /// Decisions made.
    n: u32,
    /// Always explores every [`PICK_EXPLORE`]th decision (a stream's:
    /// [`StreamPick`], whose decisions come once a window while it goes
    /// through the pool, so that 512 of them could be seconds).
    narrow: bool,
}

impl PathPick {
    /// A measure that never widens its explorations (see `narrow`).
    pub fn narrow() -> PathPick {
        PathPick { narrow: true, ..PathPick::default() }
    }

    /// Whether the last decision of [`PathPick::use_pool`] took the path
    /// not preferred, to measure it again (every [`PICK_EXPLORE`]th, once
    /// both are measured).
    pub fn explored(&self) -> bool {
        self.cma_n >= PICK_WARM && self.pool_n >= PICK_WARM && self.n.is_multiple_of(self.explore_every())
    }

    /// Decisions per exploration: [`PICK_EXPLORE`], or
    /// [`PICK_EXPLORE_WIDE`] while one path wins by [`PICK_SURE`] or more.
    fn explore_every(&self) -> u32 {
        let (lo, hi) = if self.pool < self.cma { (self.pool, self.cma) } else { (self.cma, self.pool) };
        if !self.narrow && hi >= lo * PICK_SURE {
            PICK_EXPLORE_WIDE
        } else {
            PICK_EXPLORE
        }
    }

    /// Whether the pool is measured at least [`PICK_SURE`] times as fast
    /// as single copy (both measured).
    pub fn pool_sure(&self) -> bool {
        self.cma_n >= PICK_WARM && self.pool_n >= PICK_WARM && self.cma >= self.pool * PICK_SURE
    }

    /// Whether the next message of this class goes through the pool.
    pub fn use_pool(&mut self) -> bool {
        self.n = self.n.wrapping_add(1);
        if self.cma_n < PICK_WARM {
            return false;
        }
        if self.pool_n < PICK_WARM {
            return true;
        }
        let pool_faster = self.pool < self.cma;
        if self.n.is_multiple_of(self.explore_every()) {
            !pool_faster
        } else {
            pool_faster
        }
    }

    /// Records one message of `bytes` that took `t` through the pool
    /// (`pool`) or by single copy.
    pub fn record(&mut self, pool: bool, t: std::time::Duration, bytes: usize) {
        let r = (t.as_nanos() as f64 / bytes.max(1) as f64).max(1e-6) as f32;
        let (e, n) = if pool { (&mut self.pool, &mut self.pool_n) } else { (&mut self.cma, &mut self.cma_n) };
        *e = if *n < PICK_WARM {
            // The first sample (first touches) is replaced by the second.
            *n += 1;
            r
        } else if r < *e * 0.5 {
            // Noise here only makes samples longer: one this fast is the
            // path's speed (a bad sample taken while warming up, or the
            // CPUs moving closer, is forgotten at once).
            r
        } else {
            *e + (r.min(*e * PICK_SAMPLE_MAX) - *e) * 0.25
        };
    }
}

/// A receiver's measure, per size class, of one peer's streams (messages
/// its sender flags `hdr_flags::STREAM`: sent while another to us was
/// under way) by single copy against the pool. A [`PathPick`] each, fed
/// not with the time of one copy but with the time between the
/// completions of two stream messages of the class in a row: a stream's
/// rate is what matters, and the two paths get it differently. By single
/// copy the receiver alone copies, one message after the other; through
/// the pool both sides copy at once. A pool message's own time (from the
/// request to the last chunk) waits on a sender busy with the messages
/// before it, and made the one-copy measure pick single copy for near
/// streams that the pool carries 1.6-2.8x faster (session 18).
#[derive(Debug)]
pub struct StreamPick {
    /// Per class of [`pick_class`] (the sender flags only the lowest
    /// `engine::tx::EAGER_CLASSES`).
    pub pick: [PathPick; PICK_CLASSES],
    /// When the last stream message from this peer completed ([`ticks`]),
    /// and its class; None after any other message of a pick class.
    prev: Option<(u64, usize)>,
    /// Intervals summed since the last sample recorded, all of one path
    /// and class: (single copy, ticks, messages, bytes).
    batch: (bool, u64, u32, usize),
}

/// Stream messages of one path in a row whose intervals make one sample
/// of [`StreamPick`]. Single intervals mislead: messages whose data had
/// all landed complete in bursts a fraction of the stream's pace apart,
/// and a [`PathPick`] takes a sample under half its measure as the path's
/// speed. A far compare run (session 20) kept 16 KiB streams in the pool
/// at 2.54 GB/s that way, where single copy streams at 4.3.
const STREAM_BATCH: u32 = 8;

/// A clock for [`StreamPick`]'s samples, read at every stream message's
/// completion: the time-stamp counter on x86-64 (9.5 ns a read here
/// against 23.6 for `clock_gettime`), elsewhere nanoseconds of `Instant`.
/// Its unit does not matter: both paths' samples of a [`StreamPick`] are
/// in it, and only compared with each other (the counter is constant-rate
/// on CPUs that say `constant_tsc`, as these VMs do).
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU and reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

impl Default for StreamPick {
    fn default() -> StreamPick {
        StreamPick { pick: [PathPick::narrow(); PICK_CLASSES], prev: None, batch: Default::default() }
    }
}

impl StreamPick {
    /// A stream message of `class`, `bytes` long, completed at `now`
    /// ([`ticks`]), by single copy (`single`) or through the pool (or
    /// inline: the two copies either way); a sample of its path when the
    /// one before from this peer was a stream message of the same class.
    pub fn sample(&mut self, class: usize, single: bool, bytes: usize, now: u64) {
        if class >= PICK_CLASSES {
            return;
        }
        match self.prev {
            Some((t, c)) if c == class => {
                if self.batch.2 > 0 && (self.batch.0 != single || self.batch.2 >= STREAM_BATCH) {
                    self.flush(class);
                }
                let b = &mut self.batch;
                *b = (single, b.1 + now.saturating_sub(t), b.2 + 1, b.3 + bytes);
            }
            Some((_, c)) => {
                self.flush(c);
            }
            None => {}
        }
        self.prev = Some((now, class));
    }

    /// A message of a pick class that is not part of a stream completed:
    /// the next stream message's time from the last would include it.
    pub fn interrupt(&mut self) {
        if let Some((_, c)) = self.prev.take() {
            self.flush(c);
        }
    }

    /// Records the batch of intervals (of class `class`) as one sample.
    fn flush(&mut self, class: usize) {
        let (single, t, n, bytes) = std::mem::take(&mut self.batch);
        if n > 0 && class < PICK_CLASSES {
            // Ticks as nanoseconds: a unit of its own, the same for both.
            self.pick[class].record(!single, std::time::Duration::from_nanos(t), bytes);
        }
    }
}

/// CMA policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaMode {
    /// Use it where the kernel allows.
    Auto,
    /// Never offer it.
    Off,
    /// Offer it but act as if the kernel refused (tests the fallback).
    Fail,
    /// Reads work, writes are refused (tests the split copy's fallback).
    NoWrite,
}

/// Tunables in force for a domain.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest inline message (ring path) when single copy is not usable.
    pub inline_max: usize,
    /// Largest message sent inline (piped) when it answers its peer: a
    /// message from that peer arrived since our last send to it, and
    /// nothing is queued to it (a ping-pong's turn, not a stream, which
    /// the pool serves better). At most half the ring's bytes; only
    /// messages that go piped (`pipe_min` on and reached); 0: none beyond
    /// `inline_max`.
    pub answer_max: usize,
    /// Smallest inline message that goes through the pool instead when it
    /// is part of a stream ([`stream_to_pool`]): not an answer, and the
    /// peer's ring still holds messages we sent (or has no room for it).
    /// The pool's 2 MiB carry a stream further than the ring's 64 KiB.
    /// 0: every inline message of more than one cell may; above
    /// `answer_max`: none.
    pub stream_min: usize,
    /// Smallest inline message sent piped (published before its payload,
    /// which the receiver copies while the sender writes it: see
    /// `crate::ring`); 0: none.
    pub pipe_min: usize,
    /// Cell of a peer's ring from which a message that answers the peer
    /// takes the rest of the lap when the ring is empty, so that the next
    /// starts at the first cell again (`crate::ring::RingTx::lap_from`):
    /// a ping-pong reuses this many cells and a few instead of moving
    /// through the whole ring. 0: never.
    pub ring_lap: usize,
    /// Smallest rendezvous (single copy) message when single copy is usable.
    pub cma_min: usize,
    /// Smallest rendezvous message when single copy is not usable.
    pub rndv_min: usize,
    /// CMA policy.
    pub cma: CmaMode,
    /// Smallest single-copy message split between both sides (the
    /// receiver reads the first half while the sender writes the second).
    pub split_min: usize,
    /// Bytes per fragment of a message sent through the pool (at most the
    /// pool's chunk size): the sender fills one while the receiver empties
    /// the one before.
    pub frag_size: usize,
    /// Most bytes per fragment of a large message through the pool: a run
    /// of chunks back to back named by one ring message ([`frag_for`]).
    pub frag_max: usize,
    /// Fragments a message is cut into, each of at least `frag_size` and
    /// at most `frag_max` bytes ([`frag_for`]).
    pub frag_parts: usize,
    /// Longest message whose fragments are all of `frag_size` (derived by
    /// [`Config::clamp`]: `frag_parts` fragments of `frag_size`).
    pub frag_runs_from: usize,
    /// Longest message [`inline_on_ring`] sends inline whether or not
    /// single copy is offered: below `cma_min` and within `inline_max`
    /// (derived by [`Config::clamp`]; one compare on the send fast path).
    pub inline_ring_max: usize,
    /// Geometry of each endpoint section.
    pub geometry: EpGeometry,
    /// Endpoint sections per domain region (`SHMFAB_MAX_EPS`, 1 to 256,
    /// default 64: enough for an endpoint per peer up to 63 peers). A
    /// section's memory is reserved only when an endpoint opens on it, so
    /// unused sections cost address space, not memory.
    pub max_eps: u32,
    /// Counters per domain region.
    pub max_counters: u32,
    /// Unexpected inline bytes held per endpoint.
    pub unexp_max: usize,
    /// Outstanding transmit operations per endpoint.
    pub tx_size: usize,
    /// Posted receives per endpoint.
    pub rx_size: usize,
    /// How often a peer with pending operations is checked for life.
    pub peer_check: std::time::Duration,
    /// How domains keep their regions (`SHMFAB_REGIONS`).
    pub regions: crate::region::Backing,
    /// How long [`crate::World::init`] waits for every rank to arrive.
    pub boot_timeout: std::time::Duration,
}

/// Largest payload an inject accepts (buffer reusable on return).
pub const INJECT_SIZE: usize = 4096;
/// Largest message.
pub const MAX_MSG_SIZE: usize = 1 << 40;

/// Largest value of a byte threshold (`SHMFAB_INLINE_MAX`, `SHMFAB_CMA_MIN`,
/// `SHMFAB_RNDV_MIN`, `SHMFAB_SPLIT_MIN`, `SHMFAB_UNEXP_MAX`): 1 TiB.
pub const MAX_THRESHOLD: u64 = 1 << 40;
/// Largest `SHMFAB_TX_SIZE` and `SHMFAB_RX_SIZE`.
pub const MAX_QUEUE: u64 = 1 << 20;
/// Largest `SHMFAB_BOOT_TIMEOUT`, in seconds: one day.
pub const MAX_BOOT_TIMEOUT: u64 = 86_400;

/// What a number must be besides lying in its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Any integer in the range.
    Any,
    /// A power of two.
    PowerOfTwo,
    /// A multiple of this.
    MultipleOf(u64),
}

/// A raw value as it appears in an error line: escaped (one line whatever
/// it holds) and cut after 64 characters.
fn shown(raw: &str) -> String {
    let mut s: String = raw.chars().take(64).collect::<String>().escape_debug().collect();
    if raw.chars().count() > 64 {
        s.push_str("...");
    }
    s
}

/// Parses `raw`, the value of variable `name`: decimal digits, optionally
/// followed by `k`, `m` or `g` (KiB, MiB, GiB), surrounding blanks ignored;
/// the result must lie in `lo..=hi` and follow `rule`. Anything else
/// (empty, a sign, garbage, a value that overflows or lies outside) is one
/// line naming the variable and what it must be:
/// `SHMFAB_RX_SIZE=0: must be an integer from 1 to 1048576`.
pub fn parse_value(name: &str, raw: &str, lo: u64, hi: u64, rule: Rule) -> std::result::Result<u64, String> {
    let what = match rule {
        Rule::Any => format!("an integer from {lo} to {hi}"),
        Rule::PowerOfTwo => format!("a power of two from {lo} to {hi}"),
        Rule::MultipleOf(m) => format!("a multiple of {m} from {lo} to {hi}"),
    };
    let err = || format!("{name}={}: must be {what}", shown(raw));
    let t = raw.trim();
    let (digits, unit) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let v = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)).ok_or_else(err)?;
    let ok = (lo..=hi).contains(&v)
        && match rule {
            Rule::Any => true,
            Rule::PowerOfTwo => v.is_power_of_two(),
            Rule::MultipleOf(m) => v.is_multiple_of(m),
        };
    if ok {
        Ok(v)
    } else {
        Err(err())
    }
}

/// Reads variable `name` through `get` (None when unset) and checks it with
/// [`parse_value`]: `Ok(None)` when unset, `Err(ErrorKind::Inval)` with the
/// one-line message when it is set to anything but a valid value. Every
/// numeric `SHMFAB_*` variable goes through here.
pub fn parse_env<T: TryFrom<u64>>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &str,
    lo: u64,
    hi: u64,
    rule: Rule,
) -> Result<Option<T>> {
    let Some(raw) = get(name) else { return Ok(None) };
    let v = parse_value(name, &raw, lo, hi, rule).map_err(|m| Error::with(ErrorKind::Inval, m))?;
    let t = T::try_from(v)
        .map_err(|_| Error::with(ErrorKind::Inval, format!("{name}={}: does not fit this machine", shown(&raw))))?;
    Ok(Some(t))
}

/// Reads variable `name` through `get`, which must be one of `choices`
/// (`Ok(None)` when unset).
pub fn parse_choice<'a>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &str,
    choices: &[&'a str],
) -> Result<Option<&'a str>> {
    let Some(raw) = get(name) else { return Ok(None) };
    match choices.iter().find(|c| **c == raw.trim()) {
        Some(c) => Ok(Some(c)),
        None => {
            Err(Error::with(ErrorKind::Inval, format!("{name}={}: must be one of {}", shown(&raw), choices.join(", "))))
        }
    }
}

/// The process environment as [`Config::from_env_with`] reads it (a value
/// that is not UTF-8 comes through lossily, and so is refused).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            inline_max: 16384,
            answer_max: 32768,
            stream_min: 8192,
            pipe_min: 8192,
            ring_lap: 64,
            cma_min: 8 * 1024,
            rndv_min: 128 * 1024,
            cma: CmaMode::Auto,
            split_min: 512 * 1024,
            frag_size: 4096,
            frag_max: 16384,
            frag_parts: 4,
            frag_runs_from: (4096 + 4096) * 4 - 1,
            inline_ring_max: 8 * 1024 - 1,
            geometry: EpGeometry {
                n_slots: 16,
                ring_cells: 1024,
                ovf_cells: 256,
                pool_chunks: 512,
                chunk_size: 4096,
                reserved: 0,
            },
            max_eps: 64,
            max_counters: 64,
            unexp_max: 8 << 20,
            tx_size: 4096,
            rx_size: 4096,
            peer_check: std::time::Duration::from_millis(100),
            regions: crate::region::Backing::Anonymous,
            boot_timeout: std::time::Duration::from_secs(120),
        }
    }
}

impl Config {
    /// Defaults overridden by the `SHMFAB_*` environment variables, then
    /// clamped to what the geometry allows. A variable set to anything but
    /// a valid value is an error (`Inval`, one line naming the variable and
    /// its valid range); nothing is silently replaced by its default.
    pub fn from_env() -> Result<Config> {
        Self::from_env_with(process_env)
    }

    /// As [`Config::from_env`], reading each variable through `get` (None
    /// when unset): tests and tools pass their own.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get: &dyn Fn(&str) -> Option<String> = &get;
        let d = Config::default();
        let dg = d.geometry;
        let g = EpGeometry {
            n_slots: parse_env(get, "SHMFAB_RING_SLOTS", 1, shm_layout::MAX_SLOTS as u64, Rule::Any)?
                .unwrap_or(dg.n_slots),
            ring_cells: parse_env(get, "SHMFAB_RING_CELLS", 128, 1 << 20, Rule::PowerOfTwo)?.unwrap_or(dg.ring_cells),
            ovf_cells: parse_env(get, "SHMFAB_OVF_CELLS", 2, 1 << 16, Rule::PowerOfTwo)?.unwrap_or(dg.ovf_cells),
            pool_chunks: parse_env(get, "SHMFAB_POOL_CHUNKS", 1, 1 << 16, Rule::Any)?.unwrap_or(dg.pool_chunks),
            chunk_size: parse_env(get, "SHMFAB_CHUNK_SIZE", 4096, 1 << 24, Rule::MultipleOf(4096))?
                .unwrap_or(dg.chunk_size),
            reserved: 0,
        };
        // Each variable's rule above is the geometry's own; this cannot fail.
        g.validate().map_err(|m| Error::with(ErrorKind::Inval, format!("bad geometry: {m}")))?;
        let cma = match parse_choice(get, "SHMFAB_CMA", &["auto", "on", "1", "off", "0", "fail", "nowrite"])? {
            Some("off" | "0") => CmaMode::Off,
            Some("fail") => CmaMode::Fail,
            Some("nowrite") => CmaMode::NoWrite,
            _ => CmaMode::Auto,
        };
        let regions = match parse_choice(get, "SHMFAB_REGIONS", &["anonymous", "named"])? {
            Some("named") => crate::region::Backing::Named,
            _ => crate::region::Backing::Anonymous,
        };
        // Read by `Fabric::domain`; checked here so that a typo is an error.
        parse_choice(get, "SHMFAB_THREADING", &["domain", "safe"])?;
        let bytes = |name: &str, lo: u64, default: usize| -> Result<usize> {
            Ok(parse_env(get, name, lo, MAX_THRESHOLD, Rule::Any)?.unwrap_or(default))
        };
        let queue = |name: &str, default: usize| -> Result<usize> {
            Ok(parse_env(get, name, 1, MAX_QUEUE, Rule::Any)?.unwrap_or(default))
        };
        let ms: u64 = parse_env(get, "SHMFAB_PEER_CHECK_MS", 1, 60_000, Rule::Any)?.unwrap_or(100);
        let boot: u64 =
            parse_env(get, "SHMFAB_BOOT_TIMEOUT", 1, MAX_BOOT_TIMEOUT, Rule::Any)?.unwrap_or(d.boot_timeout.as_secs());
        let mut c = Config {
            inline_max: bytes("SHMFAB_INLINE_MAX", 0, d.inline_max)?,
            pipe_min: bytes("SHMFAB_PIPE_MIN", 0, d.pipe_min)?,
            ring_lap: parse_env(get, "SHMFAB_RING_LAP", 0, 1 << 20, Rule::Any)?.unwrap_or(d.ring_lap),
            answer_max: bytes("SHMFAB_ANSWER_MAX", 0, d.answer_max)?,
            stream_min: bytes("SHMFAB_STREAM_MIN", 0, d.stream_min)?,
            cma_min: bytes("SHMFAB_CMA_MIN", 1, d.cma_min)?,
            rndv_min: bytes("SHMFAB_RNDV_MIN", 1, d.rndv_min)?,
            cma,
            split_min: bytes("SHMFAB_SPLIT_MIN", 1, d.split_min)?,
            frag_size: parse_env(get, "SHMFAB_FRAG_SIZE", 1024, 1 << 24, Rule::MultipleOf(64))?.unwrap_or(d.frag_size),
            frag_max: parse_env(get, "SHMFAB_FRAG_MAX", 1024, 1 << 28, Rule::MultipleOf(64))?.unwrap_or(d.frag_max),
            frag_parts: parse_env(get, "SHMFAB_FRAG_PARTS", 1, 1 << 20, Rule::Any)?.unwrap_or(d.frag_parts),
            frag_runs_from: 0,
            inline_ring_max: 0,
            geometry: g,
            max_eps: parse_env(get, "SHMFAB_MAX_EPS", 1, 256, Rule::Any)?.unwrap_or(d.max_eps),
            max_counters: d.max_counters,
            unexp_max: bytes("SHMFAB_UNEXP_MAX", 0, d.unexp_max)?,
            tx_size: queue("SHMFAB_TX_SIZE", d.tx_size)?,
            rx_size: queue("SHMFAB_RX_SIZE", d.rx_size)?,
            peer_check: std::time::Duration::from_millis(ms),
            regions,
            boot_timeout: std::time::Duration::from_secs(boot),
        };
        c.clamp();
        Ok(c)
    }

    /// Keeps the thresholds inside what the geometry can carry: an inline
    /// message's payload may take at most a quarter of a ring's bytes (its
    /// cells then a quarter of the ring and one: 16 KiB in 257 of 1024),
    /// and a fragment at most a pool chunk.
    pub fn clamp(&mut self) {
        let ring_max = self.geometry.ring_cells as usize / 4 * std::mem::size_of::<shm_layout::Cell>();
        self.inline_max = self.inline_max.min(ring_max);
        // Half the ring: a piped message of that many bytes takes half
        // the cells and one (its first), and the guard one more.
        self.answer_max = self.answer_max.min(2 * ring_max);
        self.cma_min = self.cma_min.max(1);
        self.rndv_min = self.rndv_min.max(self.inline_max + 1);
        let chunk = self.geometry.chunk_size as usize;
        self.frag_size = self.frag_size.clamp(1, chunk);
        let run_max = chunk * shm_layout::wire::Chunk::MAX_RUN as usize;
        self.frag_max = self.frag_max.clamp(self.frag_size, run_max);
        self.frag_parts = self.frag_parts.max(1);
        self.inline_ring_max = self.inline_max.min(self.cma_min - 1);
        // A fragment grows past frag_size once a part is a chunk longer.
        self.frag_runs_from = if self.frag_size < chunk {
            usize::MAX // fragments shorter than a chunk: no runs
        } else {
            (self.frag_size + chunk) * self.frag_parts - 1
        };
    }
}

/// Bytes per fragment of a `len`-byte message through the pool: a
/// `frag_parts`th of it in whole chunks, from `frag_size` to `frag_max`.
/// A fragment longer than a chunk takes a run of chunks back to back,
/// named by one ring message, if the sender's free chunks hold such a run
/// (else it is cut shorter): fewer messages, headers and hand-overs per
/// byte, while a message still crosses in a few fragments that the
/// receiver empties while the sender fills the next.
#[inline]
pub fn frag_for(cfg: &Config, len: usize) -> usize {
    if len <= cfg.frag_runs_from {
        return cfg.frag_size; // no division on the common path
    }
    let chunk = cfg.geometry.chunk_size as usize;
    (len / cfg.frag_parts.max(1) / chunk * chunk).clamp(cfg.frag_size, cfg.frag_max)
}

/// What travels how: the one place that decides, by operation kind and
/// size. Messages (untagged and tagged) take the protocols below; the
/// other kinds are not carried yet (submission refuses them first) and
/// would go by rendezvous.
///
/// `on_ring`: the sender has an SPSC ring to this peer (else it uses the
/// overflow queue, whose cells carry at most [`OVF_PAYLOAD`] bytes and an RTS
/// with at most 3 iovs). `cma_ok`: single copy is usable ([`offer_cma`]).
pub fn choose(cfg: &Config, kind: OpKind, len: usize, niov: usize, on_ring: bool, cma_ok: bool) -> Proto {
    if !matches!(kind, OpKind::Msg | OpKind::Tagged) {
        return Proto::Rndv;
    }
    let (inline_max, rndv_min) = match (on_ring, cma_ok) {
        (true, true) => (cfg.inline_max.min(cfg.cma_min - 1), cfg.cma_min.min(cfg.rndv_min)),
        (true, false) => (cfg.inline_max, cfg.rndv_min),
        (false, true) => (OVF_PAYLOAD, cfg.cma_min.max(OVF_PAYLOAD + 1)),
        (false, false) => (OVF_PAYLOAD, cfg.rndv_min),
    };
    if len <= inline_max {
        Proto::Inline
    } else if len >= rndv_min && (on_ring || niov <= 3) {
        Proto::Rndv
    } else {
        Proto::Bounce
    }
}

/// Whether a message that [`choose`] sends through the pool goes inline
/// instead because it answers its peer (`Config::answer_max`): `answering`
/// (a message from the peer arrived since our last send to it), a ring to
/// it with nothing queued, and a length that goes piped, above
/// `inline_max` and within `answer_max`.
pub fn answer_inline(cfg: &Config, proto: Proto, len: usize, on_ring: bool, answering: bool) -> bool {
    proto == Proto::Bounce && answering && on_ring && len <= cfg.answer_max && cfg.pipe_min != 0 && len >= cfg.pipe_min
}

/// Whether an inline message of `len` bytes may go through the pool
/// instead when it is part of a stream (`Config::stream_min`): the caller
/// asks this first, then whether the message is not an answer and the
/// peer's ring still holds messages we sent, or whether the ring has no
/// room for it now. Only on a ring (the overflow queue's messages are one
/// cell), and only messages of more than one cell (the send fast path's
/// one-cell case asks nothing).
#[inline]
pub fn stream_to_pool(cfg: &Config, len: usize, on_ring: bool) -> bool {
    on_ring && len > shm_layout::CELL_PAYLOAD && len >= cfg.stream_min
}

/// Whether [`choose`] picks [`Proto::Inline`] for a one-segment message of
/// `len` bytes on a ring whether or not single copy is offered: the send
/// fast path's check, without the single-copy question.
#[inline(always)]
pub fn inline_on_ring(cfg: &Config, len: usize) -> bool {
    len <= cfg.inline_ring_max
}

/// Whether a rendezvous offers single copy: CMA not off, not known refused
/// by this peer, and the payload not a provider-owned copy (inject).
pub fn offer_cma(cfg: &Config, peer_refused: bool, owned: bool) -> bool {
    cfg.cma != CmaMode::Off && !peer_refused && !owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_class_covers_six_octaves_above_cma_min_below_split_min() {
        let c = Config::default();
        let k = c.cma_min;
        for (len, want) in [
            (k - 1, None),
            (k, Some(0)),
            (2 * k - 1, Some(0)),
            (2 * k, Some(1)),
            (4 * k - 1, Some(1)),
            (4 * k, Some(2)),
            (8 * k, Some(3)),
            (32 * k, Some(5)),
            (64 * k - 1, Some(5)),
        ] {
            assert_eq!(pick_class(&c, len), want, "len {len}");
        }
        assert_eq!(pick_class(&c, 64 * k), None);
        assert_eq!(c.split_min, 64 * k, "the band ends where split copies start");
        let low_split = Config { split_min: 2 * k, ..Config::default() };
        assert_eq!(pick_class(&low_split, 2 * k), None, "split copies are never picked against");
        let high = Config { cma_min: 64 << 10, split_min: 1 << 30, ..Config::default() };
        assert_eq!(pick_class(&high, (64 << 10) * 64), None, "six octaves at most");
    }

    #[test]
    fn path_pick_measures_both_then_keeps_the_faster_and_explores() {
        use std::time::Duration;
        let k64 = 65536;
        let mut p = PathPick::default();
        // Single copy twice (its first sample dropped), then the pool twice.
        assert!(!p.use_pool(), "single copy is measured first");
        p.record(false, Duration::from_micros(500), k64);
        assert!(!p.use_pool(), "and again: its first sample paid first touches");
        p.record(false, Duration::from_micros(10), k64);
        assert!(p.use_pool(), "then the pool");
        p.record(true, Duration::from_micros(400), k64);
        assert!(p.use_pool(), "twice");
        p.record(true, Duration::from_micros(8), k64);
        // The pool is faster, not by much: taken, but for every 64th
        // decision.
        let picks: Vec<bool> = (0..128).map(|_| p.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| !b).count(), 2, "{picks:?}");
        // The pool slows down (the CPUs moved): within a few samples
        // single copy wins, by more than PICK_SURE: explored every 512th.
        for _ in 0..6 {
            p.record(true, Duration::from_micros(30), k64);
        }
        assert!(!p.pool_sure());
        let picks: Vec<(bool, bool)> = (0..1024)
            .map(|_| {
                let pool = p.use_pool();
                (pool, p.explored())
            })
            .collect();
        assert_eq!(picks.iter().filter(|&&(b, _)| b).count(), 2, "{picks:?}");
        // Those two are the explorations, and only they say so (the
        // receiver's CTS_BOUNCE_EXPLORE: no eager run after them).
        assert!(picks.iter().all(|&(pool, explored)| pool == explored), "{picks:?}");
        assert!(!PathPick::default().explored(), "nothing explored before both are measured");
        // The pool 2.5x as fast: sure (a long eager run at the sender),
        // explored every 512th.
        let mut s = PathPick::default();
        for (pool, t) in [(false, 10), (false, 10), (true, 4), (true, 4)] {
            assert_eq!(s.use_pool(), pool);
            s.record(pool, Duration::from_micros(t), k64);
        }
        assert!(s.pool_sure());
        let picks: Vec<bool> = (0..1024).map(|_| s.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| !b).count(), 2, "{picks:?}");
        // A stream's measure explores every 64th however wide the margin.
        let mut t = PathPick::narrow();
        for (pool, us) in [(false, 10), (false, 10), (true, 4), (true, 4)] {
            assert_eq!(t.use_pool(), pool);
            t.record(pool, Duration::from_micros(us), k64);
        }
        let picks: Vec<bool> = (0..1024).map(|_| t.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| !b).count(), 16, "{picks:?}");
        assert!(StreamPick::default().pick.iter().all(|k| *k == PathPick::narrow()));
        // Zero-time samples still count as samples.
        let mut q = PathPick::default();
        q.record(false, Duration::ZERO, 0);
        q.record(false, Duration::ZERO, 0);
        assert!(q.use_pool(), "single copy counts as measured");
    }

    /// A stream is measured by the time between the completions of two of
    /// its messages of one class in a row, by the path of the second.
    #[test]
    fn stream_pick_samples_the_time_between_completions() {
        let at = |us: u64| 1_000_000 + us * 1000;
        let k16 = 16 << 10;
        let per_byte = |us: u64| (us * 1000) as f32 / k16 as f32;
        let mut s = StreamPick::default();
        s.sample(1, true, k16, at(0));
        s.sample(1, true, k16, at(4));
        assert_eq!(s.pick[1], PathPick::narrow(), "a batch is recorded when it ends");
        // Single copy 4 us apart, then the pool: the batch of one path
        // ends at a message of the other.
        s.sample(1, true, k16, at(8));
        s.sample(1, false, k16, at(10));
        assert_eq!((s.pick[1].cma_n, s.pick[1].pool_n), (1, 0));
        assert!((s.pick[1].cma - per_byte(4)).abs() < 1e-3, "{:?}", s.pick[1]);
        // Through the pool in bursts: 0.5 us, 0.5, 7: one sample of their
        // mean, not a burst taken for the pool's speed.
        for t in [10_500, 11_000, 18_000] {
            s.sample(1, false, k16, 1_000_000 + t);
        }
        s.sample(1, true, k16, at(30));
        assert_eq!(s.pick[1].pool_n, 1);
        let mean = (2.0 + 0.5 + 0.5 + 7.0) / 4.0 * 1000.0 / k16 as f32;
        assert!((s.pick[1].pool - mean).abs() < 1e-3, "{:?} against {mean}", s.pick[1]);
        // A batch ends after STREAM_BATCH messages.
        let mut u = StreamPick::default();
        for k in 0..=STREAM_BATCH as u64 + 1 {
            u.sample(0, true, 8 << 10, at(3 * k));
        }
        assert_eq!(u.pick[0].cma_n, 1, "{:?}", u.pick[0]);
        // Another class between: no interval spans it (the batch so far,
        // 12 us by single copy, is recorded at the change).
        s.interrupt();
        let before = s.pick;
        s.sample(0, false, 8 << 10, at(100));
        s.sample(1, false, k16, at(200));
        assert_eq!(s.pick[1], before[1], "a class change is no interval");
        // A message of the band that is not the stream's: none either.
        s.interrupt();
        s.sample(1, true, k16, at(300));
        s.interrupt();
        assert_eq!(s.pick[1], before[1]);
        s.sample(1, true, k16, at(400));
        s.sample(1, true, k16, at(402));
        s.interrupt();
        assert_ne!(s.pick[1], before[1], "the stream goes on");
        // A class out of range (a peer's lie) is ignored.
        s.sample(PICK_CLASSES, true, k16, at(500));
    }

    #[test]
    fn path_pick_is_not_misled_by_first_touches_or_a_descheduled_sample() {
        use std::time::Duration;
        let us = Duration::from_micros;
        let k256 = 256 << 10;
        // Session 11's 256 KiB case, from a trace of each sample: single
        // copy's first sample faulted the receive buffer in (203 us, then
        // 27-34), the pool's first mapped its pages (126 us, then 44).
        let mut p = PathPick::default();
        for t in [203, 30] {
            assert!(!p.use_pool());
            p.record(false, us(t), k256);
        }
        for t in [126, 44] {
            assert!(p.use_pool());
            p.record(true, us(t), k256);
        }
        let picks: Vec<bool> = (0..64).map(|_| p.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| b).count(), 1, "single copy, but for one exploration: {picks:?}");
        // A descheduled single copy (6.5 ms) moves its measure by a
        // quarter at most: it stays picked.
        p.record(false, us(6500), k256);
        p.record(false, us(30), k256);
        let picks: Vec<bool> = (0..64).map(|_| p.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| b).count(), 1, "{picks:?}");
        // A warm-up sample taken while descheduled (the pool's second at
        // 1990 us) is forgotten at the first fast one (an exploration).
        let mut q = PathPick::default();
        for (pool, t) in [(false, 203), (false, 30), (true, 126), (true, 1990)] {
            assert_eq!(q.use_pool(), pool);
            q.record(pool, us(t), k256);
        }
        assert!(!q.use_pool(), "the pool looks slow");
        q.record(true, us(20), k256);
        let picks: Vec<bool> = (0..64).map(|_| q.use_pool()).collect();
        assert_eq!(picks.iter().filter(|&&b| !b).count(), 1, "the pool, but for one exploration: {picks:?}");
    }

    #[test]
    fn thresholds_pick_each_protocol() {
        let c = Config::default();
        // Single copy usable: the ring below cma_min (8 KiB), then a
        // rendezvous whose receiver picks single copy or the pool (and
        // after a pick of the pool, eager runs: engine::tx).
        assert_eq!((c.cma_min, c.inline_ring_max), (8192, 8191));
        assert_eq!(choose(&c, OpKind::Msg, 0, 1, true, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min - 1, 1, true, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min, 1, true, true), Proto::Rndv);
        assert_eq!(choose(&c, OpKind::Msg, c.inline_max, 1, true, true), Proto::Rndv);
        // A single-copy threshold above the inline limit: the pool's
        // fragments between.
        let mid = Config { cma_min: 64 << 10, ..Config::default() };
        assert_eq!(choose(&mid, OpKind::Msg, mid.inline_max, 1, true, true), Proto::Inline);
        assert_eq!(choose(&mid, OpKind::Msg, mid.inline_max + 1, 1, true, true), Proto::Bounce);
        assert_eq!(choose(&mid, OpKind::Msg, mid.cma_min - 1, 1, true, true), Proto::Bounce);
        assert_eq!(choose(&mid, OpKind::Msg, mid.cma_min, 1, true, true), Proto::Rndv);
        // A single-copy threshold below the inline limit caps it.
        let low = Config { cma_min: 2048, ..Config::default() };
        assert!(low.cma_min <= low.inline_max);
        assert_eq!(choose(&low, OpKind::Msg, 2047, 1, true, true), Proto::Inline);
        assert_eq!(choose(&low, OpKind::Msg, 2048, 1, true, true), Proto::Rndv);
        assert_eq!(choose(&low, OpKind::Msg, 2048, 1, true, false), Proto::Inline);
        // A single-copy threshold above the rendezvous one: rendezvous
        // from the lower (single copy offered), never eager above it.
        let high = Config { cma_min: 1 << 40, ..Config::default() };
        assert_eq!(choose(&high, OpKind::Msg, high.rndv_min - 1, 1, true, true), Proto::Bounce);
        assert_eq!(choose(&high, OpKind::Msg, high.rndv_min, 1, true, true), Proto::Rndv);
        assert_eq!(choose(&high, OpKind::Msg, 1 << 30, 1, true, true), Proto::Rndv);
        // Not usable: ring, then eager pool, then rendezvous through the pool.
        assert_eq!(choose(&c, OpKind::Msg, c.inline_max, 1, true, false), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.inline_max + 1, 1, true, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min - 1, 1, true, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min, 1, true, false), Proto::Rndv);
        // Overflow queue: one cell inline, RTS holds 3 iovs.
        assert_eq!(choose(&c, OpKind::Msg, OVF_PAYLOAD, 1, false, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, OVF_PAYLOAD + 1, 1, false, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min.max(OVF_PAYLOAD + 1), 3, false, true), Proto::Rndv);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min, 4, false, false), Proto::Bounce);
        assert!(offer_cma(&c, false, false));
        // The fast check agrees with choose() wherever it answers yes.
        for len in [0, 8, c.inline_max.min(c.cma_min - 1), c.inline_max, c.cma_min - 1, c.cma_min, c.inline_max + 1] {
            if inline_on_ring(&c, len) {
                assert_eq!(choose(&c, OpKind::Msg, len, 1, true, true), Proto::Inline, "len {len}");
                assert_eq!(choose(&c, OpKind::Msg, len, 1, true, false), Proto::Inline, "len {len}");
            }
        }
        assert!(inline_on_ring(&c, 8));
        assert!(!offer_cma(&c, true, false), "refused peer");
        assert!(!offer_cma(&c, false, true), "inject copy");
        let off = Config { cma: CmaMode::Off, ..Config::default() };
        assert!(!offer_cma(&off, false, false));
    }

    #[test]
    fn answers_go_inline_up_to_half_the_ring_when_piped() {
        let mut c = Config::default();
        c.clamp();
        assert_eq!(c.answer_max, 32768, "half the default ring's bytes");
        let b = Proto::Bounce;
        assert!(answer_inline(&c, b, 24 << 10, true, true));
        assert!(answer_inline(&c, b, 32 << 10, true, true));
        assert!(!answer_inline(&c, b, (32 << 10) + 1, true, true), "past answer_max");
        assert!(!answer_inline(&c, b, 24 << 10, true, false), "not an answer: a stream");
        assert!(!answer_inline(&c, b, 24 << 10, false, true), "no ring");
        assert!(!answer_inline(&c, Proto::Rndv, 24 << 10, true, true), "only instead of the pool");
        let unpiped = Config { pipe_min: 0, ..c.clone() };
        assert!(!answer_inline(&unpiped, b, 24 << 10, true, true), "only piped");
        let late = Config { pipe_min: 20 << 10, ..c.clone() };
        assert!(!answer_inline(&late, b, 18 << 10, true, true), "below pipe_min: not piped");
        assert!(answer_inline(&late, b, 20 << 10, true, true));
        let mut huge = Config { answer_max: 1 << 30, ..Config::default() };
        huge.clamp();
        assert_eq!(huge.answer_max, 32768);
        assert!(crate::ring::piped_cells(huge.answer_max) < huge.geometry.ring_cells as usize, "and its guard");
    }

    #[test]
    fn streams_take_the_pool_from_stream_min_on_rings_only() {
        let c = Config::default();
        assert_eq!(c.stream_min, 8192);
        assert!(!stream_to_pool(&c, 8191, true), "below: waits for the ring");
        assert!(stream_to_pool(&c, 8192, true));
        assert!(stream_to_pool(&c, 16384, true));
        assert!(!stream_to_pool(&c, 16384, false), "the overflow queue's messages are one cell");
        let all = Config { stream_min: 0, ..Config::default() };
        assert!(stream_to_pool(&all, shm_layout::CELL_PAYLOAD + 1, true));
        assert!(!stream_to_pool(&all, shm_layout::CELL_PAYLOAD, true), "one cell: never");
    }

    #[test]
    fn clamp_keeps_inline_within_a_quarter_ring_and_a_cell() {
        let mut c = Config { inline_max: 1 << 30, cma_min: 1 << 30, frag_size: 1 << 30, ..Config::default() };
        c.clamp();
        assert_eq!(c.inline_max, 16384, "a quarter of the default ring's bytes");
        assert_eq!(crate::ring::cells_for(c.inline_max), c.geometry.ring_cells as usize / 4 + 1);
        // The smallest ring: a quarter of it and one cell.
        let mut small = Config { inline_max: 1 << 30, ..Config::default() };
        small.geometry.ring_cells = 128;
        small.clamp();
        assert_eq!((small.inline_max, crate::ring::cells_for(small.inline_max)), (2048, 33));
        // Single copy or not, nothing larger goes inline.
        for cma in [true, false] {
            assert_eq!(choose(&c, OpKind::Msg, c.inline_max, 1, true, cma), Proto::Inline);
            assert_eq!(choose(&c, OpKind::Msg, c.inline_max + 1, 1, true, cma), Proto::Bounce);
        }
        assert!(c.rndv_min > c.inline_max);
        assert_eq!(c.frag_size, c.geometry.chunk_size as usize, "a fragment fits a pool chunk");
    }

    #[test]
    fn fragments_grow_in_whole_chunks_from_frag_runs_from() {
        let mut c = Config::default();
        c.clamp();
        assert_eq!(c.frag_runs_from, Config::default().frag_runs_from, "the default is clamp's");
        assert_eq!(c.inline_ring_max, Config::default().inline_ring_max, "the default is clamp's");
        // Up to four fragments of a chunk, then a quarter of the message in
        // whole chunks, up to frag_max.
        assert_eq!(frag_for(&c, 5000), 4096);
        assert_eq!(frag_for(&c, 16 << 10), 4096);
        assert_eq!(frag_for(&c, c.frag_runs_from), 4096);
        assert_eq!(frag_for(&c, c.frag_runs_from + 1), 8192);
        assert_eq!(frag_for(&c, 48 << 10), 12288);
        assert_eq!(frag_for(&c, 50_000), 12288);
        assert_eq!(frag_for(&c, 64 << 10), 16384);
        assert_eq!(frag_for(&c, 1 << 20), c.frag_max);
        // Fragments shorter than a chunk never make runs.
        let mut small = Config { frag_size: 1024, ..Config::default() };
        small.clamp();
        assert_eq!(frag_for(&small, 1 << 20), 1024);
        // frag_max stays within a run of MAX_RUN chunks and above frag_size.
        let mut big = Config { frag_max: 1 << 28, frag_parts: 1, ..Config::default() };
        big.clamp();
        assert_eq!(big.frag_max, 4096 * shm_layout::wire::Chunk::MAX_RUN as usize);
        assert_eq!(frag_for(&big, 1 << 20), big.frag_max);
        let mut low = Config { frag_max: 1024, ..Config::default() };
        low.clamp();
        assert_eq!(low.frag_max, low.frag_size);
        assert_eq!(frag_for(&low, 1 << 20), 4096);
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
    }

    fn refused(vars: &[(&str, &str)]) -> String {
        let e = Config::from_env_with(env(vars)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval, "{e}");
        e.detail().unwrap().to_string()
    }

    #[test]
    fn the_parser_takes_digits_and_suffixes_in_range() {
        let p = |raw: &str| parse_value("SHMFAB_X", raw, 1, 1 << 20, Rule::Any);
        assert_eq!(p("8"), Ok(8));
        assert_eq!(p(" 64k "), Ok(64 << 10));
        assert_eq!(p("1M"), Ok(1 << 20));
        assert_eq!(parse_value("SHMFAB_X", "2g", 0, 1 << 40, Rule::Any), Ok(2 << 30));
        assert_eq!(parse_value("SHMFAB_X", "0", 0, 5, Rule::Any), Ok(0));
        assert_eq!(parse_value("SHMFAB_X", "256", 128, 1024, Rule::PowerOfTwo), Ok(256));
        assert_eq!(parse_value("SHMFAB_X", "8k", 4096, 1 << 24, Rule::MultipleOf(4096)), Ok(8192));
    }

    #[test]
    fn the_parser_refuses_garbage_empty_negative_overflow_and_out_of_range() {
        let msg = "SHMFAB_RX_SIZE=0: must be an integer from 1 to 65536";
        assert_eq!(parse_value("SHMFAB_RX_SIZE", "0", 1, 65536, Rule::Any).unwrap_err(), msg);
        for bad in ["", " ", "abc", "-1", "+8", "1.5", "0x10", "8kk", "k", "1 2", "65537", "1m"] {
            let e = parse_value("SHMFAB_RX_SIZE", bad, 1, 65536, Rule::Any).unwrap_err();
            assert!(e.ends_with(": must be an integer from 1 to 65536"), "{bad:?}: {e}");
            assert!(e.starts_with("SHMFAB_RX_SIZE="), "{bad:?}: {e}");
        }
        // Overflow: of u64 itself, and through the suffix.
        for bad in ["18446744073709551616", "99999999999999999999999", "18014398509481984k", "17179869184g"] {
            let e = parse_value("SHMFAB_X", bad, 0, u64::MAX, Rule::Any).unwrap_err();
            assert_eq!(e, format!("SHMFAB_X={bad}: must be an integer from 0 to {}", u64::MAX));
        }
        assert_eq!(
            parse_value("SHMFAB_RING_CELLS", "1000", 128, 1 << 20, Rule::PowerOfTwo).unwrap_err(),
            "SHMFAB_RING_CELLS=1000: must be a power of two from 128 to 1048576"
        );
        assert_eq!(
            parse_value("SHMFAB_CHUNK_SIZE", "5000", 4096, 1 << 24, Rule::MultipleOf(4096)).unwrap_err(),
            "SHMFAB_CHUNK_SIZE=5000: must be a multiple of 4096 from 4096 to 16777216"
        );
        // One line, bounded, whatever the value holds.
        let e = parse_value("SHMFAB_X", &format!("a\nb{}", "9".repeat(10_000)), 0, 9, Rule::Any).unwrap_err();
        assert!(!e.contains('\n') && e.len() < 200, "{e}");
    }

    #[test]
    fn no_variable_gives_the_defaults() {
        let c = Config::from_env_with(|_| None).unwrap();
        let mut d = Config::default();
        d.clamp();
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
        assert_eq!((c.rx_size, c.tx_size, c.max_eps, c.boot_timeout.as_secs()), (4096, 4096, 64, 120));
    }

    #[test]
    fn every_variable_is_read_and_checked() {
        let vars = [
            ("SHMFAB_RING_SLOTS", "2"),
            ("SHMFAB_RING_CELLS", "256"),
            ("SHMFAB_OVF_CELLS", "64"),
            ("SHMFAB_POOL_CHUNKS", "8"),
            ("SHMFAB_CHUNK_SIZE", "8k"),
            ("SHMFAB_INLINE_MAX", "1024"),
            ("SHMFAB_PIPE_MIN", "6k"),
            ("SHMFAB_ANSWER_MAX", "20k"),
            ("SHMFAB_STREAM_MIN", "12k"),
            ("SHMFAB_RING_LAP", "100"),
            ("SHMFAB_CMA_MIN", "2048"),
            ("SHMFAB_RNDV_MIN", "64k"),
            ("SHMFAB_SPLIT_MIN", "1m"),
            ("SHMFAB_CMA", "nowrite"),
            ("SHMFAB_MAX_EPS", "8"),
            ("SHMFAB_UNEXP_MAX", "64k"),
            ("SHMFAB_TX_SIZE", "512"),
            ("SHMFAB_RX_SIZE", "256"),
            ("SHMFAB_PEER_CHECK_MS", "50"),
            ("SHMFAB_BOOT_TIMEOUT", "30"),
            ("SHMFAB_THREADING", "safe"),
        ];
        let c = Config::from_env_with(env(&vars)).unwrap();
        let g = c.geometry;
        assert_eq!((g.n_slots, g.ring_cells, g.ovf_cells, g.pool_chunks, g.chunk_size), (2, 256, 64, 8, 8192));
        assert_eq!((c.inline_max, c.cma_min, c.rndv_min, c.split_min), (1024, 2048, 64 << 10, 1 << 20));
        assert_eq!((c.cma, c.max_eps, c.unexp_max, c.tx_size, c.rx_size), (CmaMode::NoWrite, 8, 64 << 10, 512, 256));
        assert_eq!((c.peer_check.as_millis(), c.boot_timeout.as_secs()), (50, 30));
        assert_eq!((c.pipe_min, c.answer_max), (6144, 8192), "answer_max clamped to half the 256-cell ring");
        assert_eq!((c.stream_min, c.ring_lap), (12288, 100));
        // Each of them, set to garbage, is an error naming it.
        for (name, _) in vars {
            let m = refused(&[(name, "x")]);
            assert!(m.starts_with(&format!("{name}=x: must be ")), "{m}");
        }
    }

    #[test]
    fn the_reported_values_are_refused() {
        // Was: clamped to 1, an all-to-all hung silently.
        assert_eq!(refused(&[("SHMFAB_RX_SIZE", "0")]), "SHMFAB_RX_SIZE=0: must be an integer from 1 to 1048576");
        // Was: a panic (Instant + Duration overflowed) in World::init.
        assert_eq!(
            refused(&[("SHMFAB_BOOT_TIMEOUT", "18446744073709551615")]),
            "SHMFAB_BOOT_TIMEOUT=18446744073709551615: must be an integer from 1 to 86400"
        );
        assert!(refused(&[("SHMFAB_MAX_EPS", "0")]).contains("from 1 to 256"));
        assert!(refused(&[("SHMFAB_MAX_EPS", "100000")]).contains("from 1 to 256"));
        assert!(refused(&[("SHMFAB_PEER_CHECK_MS", "0")]).contains("from 1 to 60000"));
        assert!(refused(&[("SHMFAB_CMA", "of")]).contains("must be one of auto, on, 1, off, 0, fail, nowrite"));
        let on = Config::from_env_with(env(&[("SHMFAB_CMA", "on")])).unwrap();
        assert_eq!(on.cma, CmaMode::Auto, "on and 1 are auto, as tests/srq.rs sets it");
        assert!(refused(&[("SHMFAB_THREADING", "")]).contains("must be one of domain, safe"));
        assert!(refused(&[("SHMFAB_UNEXP_MAX", "2000g")]).contains("from 0 to 1099511627776"));
        assert_eq!(refused(&[("SHMFAB_RING_LAP", "2m")]), "SHMFAB_RING_LAP=2m: must be an integer from 0 to 1048576");
    }

    #[test]
    fn one_bad_geometry_variable_does_not_reset_the_others() {
        // Was: the whole geometry silently fell back to the defaults, so
        // SHMFAB_RING_SLOTS=1 was dropped because of SHMFAB_RING_CELLS.
        let m = refused(&[("SHMFAB_RING_SLOTS", "1"), ("SHMFAB_RING_CELLS", "100")]);
        assert_eq!(m, "SHMFAB_RING_CELLS=100: must be a power of two from 128 to 1048576");
        assert!(refused(&[("SHMFAB_RING_SLOTS", "65")]).contains("from 1 to 64"));
        assert!(refused(&[("SHMFAB_OVF_CELLS", "3")]).contains("power of two from 2 to 65536"));
        assert!(refused(&[("SHMFAB_POOL_CHUNKS", "0")]).contains("from 1 to 65536"));
        assert!(refused(&[("SHMFAB_CHUNK_SIZE", "32m")]).contains("multiple of 4096 from 4096 to 16777216"));
        let c = Config::from_env_with(env(&[("SHMFAB_RING_SLOTS", "1")])).unwrap();
        assert_eq!((c.geometry.n_slots, c.geometry.ring_cells), (1, 1024));
    }
}
