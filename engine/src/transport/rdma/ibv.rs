//! [`Verbs`] on a real RDMA device, through the `ibverbs` crate (feature `rdma`).
//!
//! One link is one reliable-connected (RC) queue pair with two registered regions, each cut into
//! `slots` slots of `slot_bytes`: a send region and a receive region, each registered once when
//! the link opens (`ProtectionDomain::allocate`) and never per message. A send copies the
//! message into its send slot and posts a SEND of it; a receive slot is posted as a RECV of the
//! whole slot. SEND/RECV rather than RDMA WRITE because the crate's `QueuePair` exposes only
//! those two (`post_send` is always a signaled `IBV_WR_SEND`, `post_receive` a RECV).
//!
//! What the crate fixes, and so this backend too:
//!
//! - Port 1 of the device (its `PORT_NUM`): the LID, the active MTU and the GID table are port
//!   1's, read once when the device's context opens (and kept while the process runs: a port
//!   that goes down and up again, or a GID that changes with its IP address, needs a restart).
//! - PSN 0: its handshake moves the queue pair to ready-to-send with send PSN 0, and the
//!   receive PSN is fixed when the queue pair is built, before the peer's is known; so each
//!   side announces PSN 0 and [`Verbs::connect`] refuses a peer that announces another.
//! - No completion channel: completions are found by polling the completion queue, so
//!   [`Verbs::poll`] busy-polls (spins, then yields, then naps; see [`IbvVerbs::poll_cq`]).
//! - A queue pair in its prepared (RESET) state cannot post: the receives the link posts before
//!   it connects are noted and posted right after the handshake, before `connect` returns (so
//!   before the link tells its peer it is connected).
//!
//! Lifetimes: the crate's protection domain, completion queue and queue pair borrow the device
//! context. The context and one protection domain per device are opened once per process and
//! leaked (`&'static`, cached by device name); each link leaks its completion queue (one for
//! both its sends and its receives). A rank's links live as long as its process, so what is
//! leaked is a context and a protection domain per device and a completion queue per link ever
//! opened. The queue pair and the two regions are the link's own and are freed with it: the
//! queue pair first (`ibv_destroy_qp`: the device lets go of every work request), then the
//! regions (`ibv_dereg_mr`, then the memory); see [`IbvVerbs`]'s field order.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ibverbs::{
    ibv_qp_type, ibv_wc, ibv_wc_status, CompletionQueue, Context, Device, DeviceList, Gid,
    MemoryRegion, PreparedQueuePair, ProtectionDomain, QueuePair, QueuePairEndpoint,
};

use super::verbs::{gather, gathered_len, Completion, QpInfo, RdmaConfig, Verbs};
use super::USE_TCP;
use crate::error::{Error, Result};

/// The port the crate uses (its private `PORT_NUM`), for messages.
const PORT: u8 = 1;
/// Set in a receive's work request id; the rest of the id is the slot.
const RECV_BIT: u64 = 1 << 63;
/// Completion queue entries beyond one per send slot and one per receive slot.
const CQ_MARGIN: usize = 16;
/// Completions taken from the queue per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;
/// [`IbvVerbs::poll_cq`]: spin this long, then yield until `YIELD_UNTIL`, then nap `NAP` at a time.
const SPIN_FOR: Duration = Duration::from_micros(20);
const YIELD_UNTIL: Duration = Duration::from_micros(200);
const NAP: Duration = Duration::from_micros(100);
/// Queue pair attributes (RC). The transport timeout is 4.096 µs × 2^14 ≈ 67 ms, retried 7
/// times: a peer that stops answering fails the queue pair within about half a second. An RNR
/// retry count of 7 means "retry forever": the link's credits keep a send from arriving before
/// its receive is posted, so receiver-not-ready is only ever a moment's race.
const TIMEOUT: u8 = 14;
const RETRY_COUNT: u8 = 7;
const RNR_RETRY: u8 = 7;

/// Opens the verbs of one link on the configured device: its queue pair (not yet connected)
/// and its two regions.
///
/// # Errors
///
/// No such device or no RDMA at all (one line naming `--transport tcp`), a port that is not
/// active, a GID index not in the port's table, or a device out of resources.
pub fn open(cfg: &RdmaConfig) -> Result<Box<dyn Verbs>> {
    let (slots, slot_bytes) = shape(cfg)?;
    let region_bytes = slots.checked_mul(slot_bytes).ok_or_else(|| {
        Error::Transport(format!(
            "RDMA regions of {slots} slots of {slot_bytes} bytes do not fit in memory"
        ))
    })?;
    let res = resources(cfg)?;
    let name = res.name;
    let fail = |what: &str, e: std::io::Error| {
        Error::Transport(format!("RDMA device {name:?}: {what}: {e}"))
    };
    let gid_index = match cfg.gid_index {
        Some(index) => {
            check_gid_index(name, res.ctx, index)?;
            Some(index)
        }
        None => roce_gid_index(res.ctx),
    };
    // Regions first: a failure there leaks nothing.
    let send = res
        .pd
        .allocate::<u8>(region_bytes)
        .map_err(|e| fail("registering the send region", e))?;
    let recv = res
        .pd
        .allocate::<u8>(region_bytes)
        .map_err(|e| fail("registering the receive region", e))?;
    let cq_entries = slots
        .checked_mul(2)
        .and_then(|n| n.checked_add(CQ_MARGIN))
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| Error::Transport(format!("{slots} RDMA slots are too many")))?;
    // Leaked: the queue pair borrows it for `'static` (see the module comment). Should the queue
    // pair fail to build below, this one completion queue stays leaked.
    let cq: &'static CompletionQueue<'static> = Box::leak(Box::new(
        res.ctx
            .create_cq(cq_entries, 0)
            .map_err(|e| fail("creating a completion queue", e))?,
    ));
    let mut builder = res.pd.create_qp(cq, cq, ibv_qp_type::IBV_QPT_RC);
    builder
        .set_max_send_wr(cfg.slots)
        .set_max_recv_wr(cfg.slots)
        .set_timeout(TIMEOUT)
        .set_retry_count(RETRY_COUNT)
        .set_rnr_retry(RNR_RETRY);
    if let Some(index) = gid_index {
        // `check_gid_index` or `roce_gid_index` made sure the crate's bounds assertion holds.
        builder.set_gid_index(index);
    }
    let prepared = builder
        .build()
        .map_err(|e| fail("creating a queue pair", e))?;
    let endpoint = prepared.endpoint();
    let local = QpInfo {
        lid: endpoint.lid,
        gid: endpoint.gid.map(|g| gid_hex(&g)),
        qpn: endpoint.num,
        // The crate's handshake always sends from PSN 0 (and receives from 0: the builder's
        // default receive PSN, which this side never changes).
        psn: 0,
        slots: cfg.slots,
        slot_bytes: cfg.slot_bytes,
    };
    tracing::debug!(device = name, qpn = local.qpn, lid = local.lid, gid_index = ?gid_index,
        gid = ?local.gid, slots, slot_bytes, "RDMA queue pair created");
    Ok(Box::new(IbvVerbs {
        qp: Mutex::new(Qp::Prepared {
            qp: prepared,
            pending: Vec::with_capacity(slots),
        }),
        send: Mutex::new(send),
        recv: Mutex::new(recv),
        cq,
        local,
        slots,
        slot_bytes,
        device: name,
    }))
}

/// Checks that the configured RDMA device exists; returns its name. Does not open it.
///
/// # Errors
///
/// One line: no RDMA at all (`ibverbs` cannot list devices: no kernel support, no
/// libibverbs provider), an empty list, or no device of the configured name; each ends with
/// `--transport tcp works`.
pub fn check_device(cfg: &RdmaConfig) -> Result<String> {
    let list = device_list()?;
    let (_, name) = pick(&list, cfg.device.as_deref())?;
    Ok(name)
}

/// The device list, or the one-line error for a machine without RDMA.
fn device_list() -> Result<DeviceList> {
    ibverbs::devices().map_err(|e| {
        Error::Transport(format!(
            "no RDMA device found (ibverbs: {}); {USE_TCP}",
            one_line(&e.to_string())
        ))
    })
}

/// The device named `want`, or the first one with a name.
fn pick<'l>(list: &'l DeviceList, want: Option<&str>) -> Result<(Device<'l>, String)> {
    if list.is_empty() {
        return Err(Error::Transport(format!(
            "no RDMA device found (ibverbs lists none); {USE_TCP}"
        )));
    }
    let mut names = Vec::new();
    for device in list.iter() {
        let Some(name) = device.name().map(|n| n.to_string_lossy().into_owned()) else {
            names.push("(unnamed)".to_owned());
            continue;
        };
        if want.is_none_or(|w| w == name) {
            return Ok((device, name));
        }
        names.push(name);
    }
    Err(Error::Transport(match want {
        Some(want) => format!(
            "RDMA device {want:?} not found (devices: {}); {USE_TCP}",
            names.join(", ")
        ),
        None => format!("no RDMA device found (ibverbs lists only unnamed ones); {USE_TCP}"),
    }))
}

/// A device's context and protection domain, opened once per process.
#[derive(Clone, Copy)]
struct Resources {
    name: &'static str,
    ctx: &'static Context,
    pd: &'static ProtectionDomain<'static>,
}

/// The configured device's context and protection domain: opened (and leaked) on first use,
/// then the same for every link of the process.
fn resources(cfg: &RdmaConfig) -> Result<Resources> {
    static OPEN: OnceLock<Mutex<HashMap<String, Resources>>> = OnceLock::new();
    let list = device_list()?;
    let (device, name) = pick(&list, cfg.device.as_deref())?;
    let mut open = lock(OPEN.get_or_init(Mutex::default));
    if let Some(res) = open.get(&name) {
        return Ok(*res);
    }
    let ctx = device.open().map_err(|e| {
        Error::Transport(format!(
            "RDMA device {name:?}: cannot open port {PORT}: {}",
            one_line(&e.to_string())
        ))
    })?;
    // Leaked (see the module comment). Should the protection domain fail below, the context
    // stays leaked and the next link opens another.
    let ctx: &'static Context = Box::leak(Box::new(ctx));
    let pd = ctx.alloc_pd().map_err(|e| {
        Error::Transport(format!(
            "RDMA device {name:?}: cannot allocate a protection domain: {e}"
        ))
    })?;
    let res = Resources {
        name: Box::leak(name.clone().into_boxed_str()),
        ctx,
        pd: Box::leak(Box::new(pd)),
    };
    tracing::info!(
        device = res.name,
        port = PORT,
        gids = ctx.gid_table().len(),
        "RDMA device opened"
    );
    open.insert(name, res);
    Ok(res)
}

/// The crate takes a GID index as a position in the port's table of valid GIDs (asserting it
/// is in bounds) and also as the index it hands the device, so the two must agree.
fn check_gid_index(device: &str, ctx: &Context, index: u32) -> Result<()> {
    let table = ctx.gid_table();
    let fits = usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .is_some_and(|entry| entry.gid_index == index && index <= u32::from(u8::MAX));
    if fits {
        return Ok(());
    }
    let mut valid = String::new();
    for (i, entry) in table.iter().enumerate() {
        if usize::try_from(entry.gid_index).is_ok_and(|g| g == i) {
            if !valid.is_empty() {
                valid.push_str(", ");
            }
            let kind = match entry.gid_type {
                0 => "IB",
                1 => "RoCE v1",
                2 => "RoCE v2",
                _ => "?",
            };
            let _ = write!(
                valid,
                "{} ({kind} {})",
                entry.gid_index,
                gid_hex(&entry.gid)
            );
        }
    }
    if valid.is_empty() {
        valid.push_str("none");
    }
    Err(Error::Transport(format!(
        "RDMA device {device:?}: GID index {index} is not in port {PORT}'s GID table (usable: {valid})"
    )))
}

/// The GID index to use on a RoCE port when none is configured: RoCE addresses every packet by
/// GID (a queue pair connected without one fails to reach ready-to-receive), InfiniBand by LID.
/// The port is RoCE when its GID table has RoCE entries; the choice is the first RoCE v2 entry
/// of an IPv4 address, else the first RoCE v2 one, else the first RoCE v1 one (`--rdma-gid-index`
/// overrides it, e.g. for another address of the port). `None` on InfiniBand.
fn roce_gid_index(ctx: &Context) -> Option<u32> {
    const ROCE_V1: u32 = 1;
    const ROCE_V2: u32 = 2;
    let usable = || {
        ctx.gid_table().iter().enumerate().filter(|(i, e)| {
            usize::try_from(e.gid_index).is_ok_and(|g| g == *i) && e.gid_index <= u32::from(u8::MAX)
        })
    };
    let ipv4 = |g: &Gid| g.subnet_prefix() == 0 && g.interface_id() >> 32 == 0xffff;
    let first = |kind: u32, want_ipv4: bool| {
        usable()
            .find(|(_, e)| e.gid_type == kind && (!want_ipv4 || ipv4(&e.gid)))
            .map(|(_, e)| e.gid_index)
    };
    let chosen = first(ROCE_V2, true)
        .or_else(|| first(ROCE_V2, false))
        .or_else(|| first(ROCE_V1, false));
    if let Some(index) = chosen {
        tracing::info!(
            gid_index = index,
            "RoCE port: using GID index {index} (--rdma-gid-index to choose another)"
        );
    }
    chosen
}

/// Slots and slot size as `usize`, both at least 1.
fn shape(cfg: &RdmaConfig) -> Result<(usize, usize)> {
    let slots = usize::try_from(cfg.slots).ok().filter(|&n| n > 0);
    let slot_bytes = usize::try_from(cfg.slot_bytes).ok().filter(|&n| n > 0);
    match (slots, slot_bytes) {
        (Some(slots), Some(slot_bytes)) => Ok((slots, slot_bytes)),
        _ => Err(Error::Transport(format!(
            "RDMA needs at least one slot of at least one byte (configured: {} slots of {} bytes)",
            cfg.slots, cfg.slot_bytes
        ))),
    }
}

/// The link's queue pair, from creation to its end.
enum Qp {
    /// Created, not yet connected (RESET): cannot post, so receives posted now wait here.
    Prepared {
        qp: PreparedQueuePair<'static>,
        pending: Vec<usize>,
    },
    Connected(QueuePair<'static>),
    /// The handshake or a post after it failed; the queue pair is destroyed.
    Broken(String),
}

/// One link's queue pair and regions.
///
/// Field order is drop order, and it matters: `qp` first (destroying the queue pair, after
/// which the device touches neither region), then `send` and `recv` (deregistered, then freed).
/// So a region is never freed while a work request on it can be in flight.
struct IbvVerbs {
    qp: Mutex<Qp>,
    send: Mutex<MemoryRegion<u8>>,
    recv: Mutex<MemoryRegion<u8>>,
    /// Leaked; shared by the queue pair's sends and receives.
    cq: &'static CompletionQueue<'static>,
    local: QpInfo,
    slots: usize,
    slot_bytes: usize,
    device: &'static str,
}

impl fmt::Debug for IbvVerbs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbvVerbs")
            .field("device", &self.device)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl IbvVerbs {
    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot < self.slots {
            Ok(())
        } else {
            Err(Error::Transport(format!(
                "RDMA slot {slot} out of range (the link has {})",
                self.slots
            )))
        }
    }

    fn not_ready(&self, state: &Qp) -> Error {
        Error::Transport(match state {
            Qp::Prepared { .. } => format!(
                "RDMA queue pair {} on {:?} is not connected yet",
                self.local.qpn, self.device
            ),
            Qp::Connected(_) => format!(
                "RDMA queue pair {} on {:?} is already connected",
                self.local.qpn, self.device
            ),
            Qp::Broken(why) => format!(
                "RDMA queue pair {} on {:?} is unusable: {why}",
                self.local.qpn, self.device
            ),
        })
    }

    /// Posts receive slot `slot` on a connected queue pair.
    fn post_recv_on(
        &self,
        qp: &mut QueuePair<'static>,
        region: &mut MemoryRegion<u8>,
        slot: usize,
    ) -> Result<()> {
        let start = slot * self.slot_bytes;
        // SAFETY: the range is inside the region (`slot < slots`, checked by the callers). The
        // region is owned by `self` and outlives the work request: it is freed only after the
        // queue pair is destroyed (field order of `IbvVerbs`), and destroying the queue pair
        // ends every work request on it. The slot is not written by this side while posted:
        // the link reads it (`read_recv`) only after its completion and posts it again after.
        unsafe {
            qp.post_receive(
                region,
                start..start + self.slot_bytes,
                RECV_BIT | slot as u64,
            )
        }
        .map_err(|e| {
            Error::Transport(format!(
                "RDMA queue pair {} on {:?}: posting receive slot {slot}: {e}",
                self.local.qpn, self.device
            ))
        })
    }

    /// Busy-polls the completion queue (the crate offers no completion channel to sleep on):
    /// spins for `SPIN_FOR`, then yields the core until `YIELD_UNTIL`, then naps `NAP` at a
    /// time until `wait` is over. Once something has completed it drains the queue and returns.
    fn poll_cq(&self, out: &mut Vec<Completion>, wait: Duration) -> Result<()> {
        let mut wcs = [ibv_wc::default(); POLL_BATCH];
        let start = Instant::now();
        let before = out.len();
        loop {
            let done = self.cq.poll(&mut wcs).map_err(|e| {
                Error::Transport(format!(
                    "RDMA device {:?}: polling the completion queue: {e}",
                    self.device
                ))
            })?;
            let full = done.len() == POLL_BATCH;
            out.extend(done.iter().map(|wc| completion(wc, self.slots)));
            if full {
                continue; // more may be waiting
            }
            if out.len() > before {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= wait {
                return Ok(());
            }
            if waited < SPIN_FOR {
                std::hint::spin_loop();
            } else if waited < YIELD_UNTIL {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP.min(wait - waited));
            }
        }
    }
}

impl Verbs for IbvVerbs {
    fn local(&self) -> QpInfo {
        self.local.clone()
    }

    fn connect(&self, remote: &QpInfo) -> Result<()> {
        if remote.psn != 0 {
            return Err(Error::Transport(format!(
                "the peer's queue pair {} starts at PSN {}, but the ibverbs crate's handshake \
                 always starts at PSN 0 and this side receives from 0",
                remote.qpn, remote.psn
            )));
        }
        let gid = remote.gid.as_deref().map(parse_gid).transpose()?;
        let endpoint = QueuePairEndpoint {
            num: remote.qpn,
            lid: remote.lid,
            gid,
        };
        // Lock order everywhere: region, then queue pair.
        let mut region = lock(&self.recv);
        let mut state = lock(&self.qp);
        let (prepared, pending) = match std::mem::replace(
            &mut *state,
            Qp::Broken("a connect did not finish".to_owned()),
        ) {
            Qp::Prepared { qp, pending } => (qp, pending),
            other => {
                let e = self.not_ready(&other);
                *state = other;
                return Err(e);
            }
        };
        let mut qp = match prepared.handshake(endpoint) {
            Ok(qp) => qp,
            Err(e) => {
                let why = format!(
                    "connecting to the peer's queue pair {} (lid {}, gid {}): {e}",
                    remote.qpn,
                    remote.lid,
                    remote.gid.as_deref().unwrap_or("none")
                );
                *state = Qp::Broken(why.clone());
                return Err(Error::Transport(format!(
                    "RDMA queue pair {} on {:?}: {why}",
                    self.local.qpn, self.device
                )));
            }
        };
        for slot in pending {
            if let Err(e) = self.post_recv_on(&mut qp, &mut region, slot) {
                *state = Qp::Broken(e.to_string());
                return Err(e);
            }
        }
        *state = Qp::Connected(qp);
        Ok(())
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        self.check_slot(slot)?;
        let mut region = lock(&self.recv);
        let mut state = lock(&self.qp);
        match &mut *state {
            Qp::Prepared { pending, .. } => {
                pending.push(slot);
                Ok(())
            }
            Qp::Connected(qp) => self.post_recv_on(qp, &mut region, slot),
            Qp::Broken(_) => Err(self.not_ready(&state)),
        }
    }

    fn post_send(&self, slot: usize, parts: &[&[u8]]) -> Result<()> {
        self.check_slot(slot)?;
        let len = gathered_len(parts);
        if len > self.slot_bytes {
            return Err(Error::Transport(format!(
                "RDMA send of {len} bytes does not fit a {}-byte slot",
                self.slot_bytes
            )));
        }
        let start = slot * self.slot_bytes;
        let range = start..start + len;
        let mut region = lock(&self.send);
        gather(&mut region[range.clone()], parts);
        let mut state = lock(&self.qp);
        let Qp::Connected(qp) = &mut *state else {
            return Err(self.not_ready(&state));
        };
        // SAFETY: the range is inside the region (checked above). The region is owned by `self`
        // and outlives the work request: it is freed only after the queue pair is destroyed
        // (field order of `IbvVerbs`), and destroying the queue pair ends every work request on
        // it. The link writes a send slot again only after its `Sent` completion; were it to
        // write one sooner, the device would send torn bytes, but touch no freed memory.
        unsafe { qp.post_send(&mut region, range, slot as u64) }.map_err(|e| {
            Error::Transport(format!(
                "RDMA queue pair {} on {:?}: posting send slot {slot}: {e}",
                self.local.qpn, self.device
            ))
        })
    }

    fn read_recv(&self, slot: usize, len: usize, out: &mut Vec<u8>) {
        // A completion's length never exceeds the slot (the device fails a longer receive), so
        // the clamp and the range check only guard against a caller's mistake. The device may be
        // writing other, posted slots meanwhile; this slot completed and is not posted again
        // until the link has read it, so the bytes read here hold still.
        let start = slot.saturating_mul(self.slot_bytes);
        let end = start.saturating_add(len.min(self.slot_bytes));
        if let Some(bytes) = lock(&self.recv).get(start..end) {
            out.extend_from_slice(bytes);
        }
    }

    fn poll(&self, out: &mut Vec<Completion>, wait: Duration) -> Result<()> {
        self.poll_cq(out, wait)
    }
}

/// A work completion as the link sees it.
fn completion(wc: &ibv_wc, slots: usize) -> Completion {
    completion_of(wc.wr_id(), wc.error(), wc.len(), slots)
}

/// A work completion from its work request id (which slot, and which way), its error status
/// and vendor error if it failed, and its length.
fn completion_of(
    id: u64,
    error: Option<(ibv_wc_status::Type, u32)>,
    len: usize,
    slots: usize,
) -> Completion {
    let (what, slot) = if id & RECV_BIT != 0 {
        ("receive", id & !RECV_BIT)
    } else {
        ("send", id)
    };
    let slot = usize::try_from(slot).unwrap_or(usize::MAX);
    if let Some((status, vendor_err)) = error {
        return Completion::Failed {
            reason: format!(
                "{what} in slot {slot}: {} (status {status}, vendor error {vendor_err:#x})",
                status_name(status)
            ),
        };
    }
    if slot >= slots {
        return Completion::Failed {
            reason: format!("a completion for {what} slot {slot}, but the link has {slots}"),
        };
    }
    if id & RECV_BIT != 0 {
        Completion::Received { slot, len }
    } else {
        Completion::Sent { slot }
    }
}

/// `ibv_wc_status_str`'s names, for the statuses rdma-core 55 knows.
fn status_name(status: ibv_wc_status::Type) -> &'static str {
    use ibv_wc_status::*;
    match status {
        IBV_WC_SUCCESS => "success",
        IBV_WC_LOC_LEN_ERR => "local length error",
        IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => "local EE context operation error",
        IBV_WC_LOC_PROT_ERR => "local protection error",
        IBV_WC_WR_FLUSH_ERR => "Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => "memory management operation error",
        IBV_WC_BAD_RESP_ERR => "bad response error",
        IBV_WC_LOC_ACCESS_ERR => "local access error",
        IBV_WC_REM_INV_REQ_ERR => "remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => "remote access error",
        IBV_WC_REM_OP_ERR => "remote operation error",
        IBV_WC_RETRY_EXC_ERR => "transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => "local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => "remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => "aborted error",
        IBV_WC_INV_EECN_ERR => "invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => "invalid EE context state",
        IBV_WC_FATAL_ERR => "fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => "response timeout error",
        IBV_WC_GENERAL_ERR => "general error",
        IBV_WC_TM_ERR => "TM error",
        IBV_WC_TM_RNDV_INCOMPLETE => "TM software rendezvous",
        _ => "unknown",
    }
}

/// A GID as 32 lowercase hex digits.
fn gid_hex(gid: &Gid) -> String {
    let mut hex = String::with_capacity(32);
    for b in gid
        .subnet_prefix()
        .to_be_bytes()
        .into_iter()
        .chain(gid.interface_id().to_be_bytes())
    {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// The peer's GID from its 32 hex digits.
fn parse_gid(hex: &str) -> Result<Gid> {
    let bad = || Error::Transport(format!("the peer's GID {hex:?} is not 32 hex digits"));
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut raw = [0u8; 16];
    for (i, byte) in raw.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    // The crate does not export its `ffi` module, so `ffi::ibv_gid` cannot be named; `Gid`
    // lends it out through `AsMut`, and the union's `raw` field can be written all the same.
    let mut gid = Gid::default();
    gid.as_mut().raw = raw;
    Ok(gid)
}

/// An OS error's text without a line break in it (errors here are one line).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error text when a machine has no RDMA (most, CI included): one line, naming TCP.
    fn assert_no_rdma_line(msg: &str) {
        assert!(!msg.contains('\n'), "more than one line: {msg:?}");
        assert!(
            msg.starts_with("transport: no RDMA device found (ibverbs")
                || msg.starts_with("transport: RDMA device "),
            "{msg:?}"
        );
        assert!(msg.ends_with("; --transport tcp works"), "{msg:?}");
    }

    #[test]
    fn the_default_device_is_found_or_said_missing_on_one_line() {
        let cfg = RdmaConfig::default();
        match check_device(&cfg) {
            Ok(name) => {
                // A machine with a device (e.g. Soft-RoCE, docs/transport.md): it opens, and
                // two queue pairs on it talk.
                assert!(!name.is_empty());
                two_queue_pairs_on_the_device_talk();
            }
            Err(e) => {
                let msg = e.to_string();
                assert_no_rdma_line(&msg);
                match open(&cfg) {
                    Ok(verbs) => panic!("opened {:?} where check_device found none", verbs.local()),
                    Err(e) => assert_eq!(e.to_string(), msg),
                }
            }
        }
    }

    /// On a host with a device: two links' verbs on it, connected to each other, carry a
    /// message each way, with the work request ids, lengths and regions as the link expects.
    fn two_queue_pairs_on_the_device_talk() {
        let cfg = RdmaConfig {
            slots: 4,
            slot_bytes: 4096,
            ..RdmaConfig::default()
        };
        let open_one = || match open(&cfg) {
            Ok(verbs) => verbs,
            Err(e) => panic!("the device is there but does not open: {e}"),
        };
        let (a, b) = (open_one(), open_one());
        for (verbs, info) in [(&a, a.local()), (&b, b.local())] {
            assert_eq!(
                (info.psn, info.slots, info.slot_bytes),
                (0, 4, 4096),
                "{info:?}"
            );
            assert!(
                verbs.post_send(0, &[b"early"]).is_err(),
                "a send before connect"
            );
            for slot in 0..4 {
                if let Err(e) = verbs.post_recv(slot) {
                    panic!("posting receive {slot} before connect: {e}");
                }
            }
        }
        let wrong_psn = QpInfo {
            psn: 7,
            ..b.local()
        };
        assert!(a.connect(&wrong_psn).is_err());
        for (verbs, remote) in [(&a, b.local()), (&b, a.local())] {
            if let Err(e) = verbs.connect(&remote) {
                panic!("connecting to {remote:?}: {e}");
            }
        }
        let big = vec![0x5a; 4096];
        for (from, to, slot, bytes) in [(&a, &b, 2, &b"hello"[..]), (&b, &a, 3, &big[..])] {
            if let Err(e) = from.post_send(slot, &[bytes]) {
                panic!("sending from slot {slot}: {e}");
            }
            let sent = wait_for(&**from, 1);
            assert_eq!(sent, [Completion::Sent { slot }]);
            // Receives complete in the order they were posted: slot 0 first.
            let received = wait_for(&**to, 1);
            assert_eq!(
                received,
                [Completion::Received {
                    slot: 0,
                    len: bytes.len()
                }]
            );
            let mut out = b"prefix".to_vec();
            to.read_recv(0, bytes.len(), &mut out);
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(&out[6..], bytes);
        }
        assert!(
            a.post_send(0, &[&vec![0; 4097]]).is_err(),
            "a send larger than a slot"
        );
    }

    /// Polls until `n` completions have come (at most five seconds).
    fn wait_for(verbs: &dyn Verbs, n: usize) -> Vec<Completion> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while out.len() < n && Instant::now() < deadline {
            if let Err(e) = verbs.poll(&mut out, Duration::from_millis(100)) {
                panic!("polling: {e}");
            }
        }
        out
    }

    #[test]
    fn a_missing_named_device_is_said_missing_on_one_line() {
        let cfg = RdmaConfig {
            device: Some("sluice_no_such_device0".to_owned()),
            ..RdmaConfig::default()
        };
        let Err(e) = check_device(&cfg) else {
            panic!("found a device named sluice_no_such_device0");
        };
        let msg = e.to_string();
        assert_no_rdma_line(&msg);
        if msg.starts_with("transport: RDMA device ") {
            assert!(
                msg.starts_with(
                    "transport: RDMA device \"sluice_no_such_device0\" not found (devices: "
                ),
                "{msg:?}"
            );
        }
        assert!(open(&cfg).is_err());
    }

    #[test]
    fn an_empty_shape_is_refused_before_any_device() {
        for (slots, slot_bytes) in [(0, 64), (4, 0)] {
            let cfg = RdmaConfig {
                slots,
                slot_bytes,
                ..RdmaConfig::default()
            };
            let Err(e) = open(&cfg) else {
                panic!("opened {slots} slots of {slot_bytes} bytes");
            };
            assert!(e.to_string().contains("at least one slot"), "{e}");
        }
    }

    #[test]
    fn gids_round_trip_through_hex() {
        let hex = "fe800000000000000002c903000e8d4f";
        let Ok(gid) = parse_gid(hex) else {
            panic!("{hex} did not parse");
        };
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x0002_c903_000e_8d4f);
        assert_eq!(gid_hex(&gid), hex);
        for bad in [
            "",
            "fe80",
            "+e800000000000000002c903000e8d4f",
            "ge800000000000000002c903000e8d4f",
            "fe800000000000000002c903000e8d4f00",
        ] {
            assert!(parse_gid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn work_request_ids_tell_sends_from_receives() {
        assert_eq!(
            completion_of(3, None, 100, 16),
            Completion::Sent { slot: 3 }
        );
        assert_eq!(
            completion_of(RECV_BIT | 15, None, 100, 16),
            Completion::Received { slot: 15, len: 100 }
        );
        let Completion::Failed { reason } = completion_of(RECV_BIT | 16, None, 1, 16) else {
            panic!("a receive in slot 16 of 16 completed");
        };
        assert!(reason.contains("receive slot 16"), "{reason}");
        let failed = completion_of(2, Some((ibv_wc_status::IBV_WC_RETRY_EXC_ERR, 0x81)), 0, 16);
        assert_eq!(
            failed,
            Completion::Failed {
                reason: "send in slot 2: transport retry counter exceeded (status 12, vendor \
                         error 0x81)"
                    .to_owned()
            }
        );
    }
}
