"""A real NIXL transfer of DSv4-Flash KV pools between two processes, every byte checked.

The *decode* process allocates its pools (poisoned), registers them with a NIXL agent and, per
request, hands out scattered pages the way a decode allocator does; the *prefill* process fills
its pools with seeded bytes, registers them, and WRITEs each request's pages with descriptors
built as SGLang's NIXL connector builds them (``kvlayout``): the compressed KV and indexer caches
on the prepared path, the SWA pages on the flat path, the aux row in DRAM. Completion is polled
with ``check_xfer_state`` under a deadline; the decode side then checks every byte of every
buffer: written pages equal the source pages, all other bytes still hold the poison.

``mem_kind="DRAM"`` runs anywhere (CPU tests); ``"VRAM"`` puts the pools on ``src_gpu`` /
``dst_gpu`` (the device script). The UCX environment comes from the planner's settings.

Fault mode (``kill_receiver_after``): the parent SIGKILLs the decode process once the prefill
side has finished that many requests while it keeps transferring; the prefill side must report
the failure within ``timeout_s`` and exit, and nothing may hang.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback

import numpy as np

from .kvlayout import Dsv4Pools, aux_descs, dsv4_pools, flat_descs, nixl_device_id, prepared_indices, prepared_runs

POISON = 0xA5

EXIT_OK = 0
EXIT_TRANSFER_FAILED = 3
EXIT_ERROR = 4


@dataclasses.dataclass
class TransferSpec:
    layer_ids: tuple[int, ...] = (0, 1, 2, 3, 4, 5)  # ratios 0,0,4,128,4,128: every cache kind
    num_full_pages: int = 24
    num_swa_pages: int = 12
    requests: int = 4
    pages_per_request: int = 5
    swa_pages_per_request: int = 2  # the 128-token window straddles at most two 256-token pages
    mem_kind: str = "DRAM"
    src_gpu: int = 0
    dst_gpu: int = 0
    env: dict = dataclasses.field(default_factory=dict)  # UCX_TLS, UCX_NET_DEVICES... from the plan
    backend: str = "UCX"
    backend_params: dict = dataclasses.field(default_factory=lambda: {"ucx_error_handling_mode": "peer"})
    prefill_num_threads: int = 0  # SGLang uses 8 on prefill; 0 keeps the CPU test light
    timeout_s: float = 20.0  # per request: post -> every handle DONE
    seed: int = 1234
    kill_receiver_after: int | None = None  # fault mode
    fault_run_s: float = 30.0  # fault mode: keep transferring this long at most
    timed_repeats: int = 0  # extra passes over the requests, timed (device bandwidth)
    # "wrong_page": the prefill side writes each request's first KV page one slot off, to prove the
    # byte check catches a misplaced page (tests only)
    sabotage: str | None = None

    def pools(self) -> Dsv4Pools:
        return dsv4_pools(self.layer_ids, self.num_full_pages, self.num_swa_pages, max(self.requests, 1))


def _apply_env(spec: TransferSpec) -> None:
    for key, value in spec.env.items():
        os.environ[key] = str(value)


def _source_region(seed: int, index: int, nbytes: int):
    """The prefill side's content of region ``index``: seeded, so the decode side can recompute it."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def _alloc(spec: TransferSpec, pools: Dsv4Pools, gpu: int, fill):
    """One uint8 tensor per region: KV/SWA in ``mem_kind`` on ``gpu``, aux in DRAM."""
    import torch

    device = f"cuda:{gpu}" if spec.mem_kind == "VRAM" else "cpu"
    bufs = []
    for i, region in enumerate(pools.regions()):
        on = "cpu" if region in pools.aux else device
        bufs.append(fill(i, region).to(on) if callable(fill) else torch.full((region.nbytes,), fill, dtype=torch.uint8,
                                                                                device=on))
    return bufs


def _make_agent(name: str, spec: TransferSpec, num_threads: int, gpu: int):
    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

    if spec.mem_kind == "VRAM":
        import torch

        torch.cuda.set_device(gpu)  # SGLang sets the device before create_backend too
    agent = nixl_agent(name, nixl_agent_config(backends=[], num_threads=num_threads,
                                               sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
    params = {k: str(v) for k, v in spec.backend_params.items()}
    if num_threads > 0:
        params.setdefault("num_threads", str(num_threads))
    agent.create_backend(spec.backend, params)
    return agent


def _register(agent, spec: TransferSpec, pools: Dsv4Pools, bufs, gpu: int) -> None:
    n_dev = len(pools.kv) + len(pools.swa)
    dev_id = nixl_device_id(spec.mem_kind, gpu)
    dev = [(b.data_ptr(), b.numel(), dev_id, "") for b in bufs[:n_dev]]
    if not agent.register_memory(dev, spec.mem_kind):
        raise RuntimeError(f"NIXL registration of the {spec.mem_kind} KV pools failed")
    if not agent.register_memory([(b.data_ptr(), b.numel(), 0, "") for b in bufs[n_dev:]], "DRAM"):
        raise RuntimeError("NIXL registration of the aux buffers failed")


# --- decode side ----------------------------------------------------------------------------------

def decode_process(spec: TransferSpec, peer, parent) -> None:
    """Receiver. ``peer``: pipe to the prefill process; ``parent``: pipe to the test."""
    try:
        _apply_env(spec)
        import torch

        pools = spec.pools()
        bufs = _alloc(spec, pools, spec.dst_gpu, POISON)
        agent = _make_agent("decode", spec, 0, spec.dst_gpu)
        _register(agent, spec, pools, bufs, spec.dst_gpu)
        # a decode allocator hands out pages from a shuffled free list: scattered, never reused here
        rng = np.random.default_rng(spec.seed + 1)
        free_full = rng.permutation(pools.num_kv_slots).tolist()
        free_swa = rng.permutation(spec.num_swa_pages).tolist()
        allocs = []
        for k in range(spec.requests):
            kv_pages = [free_full.pop() for _ in range(spec.pages_per_request)]
            swa_pages = [free_swa.pop() for _ in range(spec.swa_pages_per_request)]
            allocs.append((np.array(kv_pages, dtype=np.int32), np.array(swa_pages, dtype=np.int32), k))
        peer.send({"metadata": agent.get_agent_metadata(), "bases": [b.data_ptr() for b in bufs],
                   "num_kv_slots": pools.num_kv_slots, "allocs": allocs})
        parent.send({"event": "ready", "pid": os.getpid()})
        done = peer.recv()  # the prefill side's source page ids per request, once every handle is DONE
        if done.get("failed"):
            parent.send({"event": "result", "ok": False, "error": "prefill side reported " + done["failed"]})
            return
        # expected content of every buffer: poison, with each request's pages copied from the source
        mismatched: dict[str, int] = {}
        checked = 0
        n_kv, n_swa = len(pools.kv), len(pools.swa)
        for i, region in enumerate(pools.regions()):
            src = _source_region(spec.seed, i, region.nbytes).view(region.num_slots, region.item_len)
            expected = torch.full((region.num_slots, region.item_len), POISON, dtype=torch.uint8)
            for (src_kv, src_swa, src_aux), (dst_kv, dst_swa, dst_aux) in zip(done["sources"], allocs):
                if i < n_kv:
                    pairs = zip(src_kv.tolist(), dst_kv.tolist())
                elif i < n_kv + n_swa:
                    pairs = zip(src_swa.tolist(), dst_swa.tolist())
                else:
                    pairs = [(src_aux, dst_aux)]
                for s, d in pairs:
                    expected[d] = src[s]
            got = bufs[i].view(region.num_slots, region.item_len).cpu()
            bad = int((got != expected).sum())
            checked += region.nbytes
            if bad:
                mismatched[region.name] = bad
        parent.send({"event": "result", "ok": not mismatched, "bytes_checked": checked, "mismatched": mismatched,
                     "requests": len(allocs)})
    except Exception:
        parent.send({"event": "result", "ok": False, "error": traceback.format_exc()})


# --- prefill side ---------------------------------------------------------------------------------

class TransferFailed(RuntimeError):
    pass


def _wait_all(agent, handles, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(handles)
    while pending:
        still = []
        for h in pending:
            try:
                state = agent.check_xfer_state(h)
            except Exception as exc:  # NIXL raises on a remote disconnect in some builds
                raise TransferFailed(f"check_xfer_state raised {type(exc).__name__}: {exc}") from None
            if state == "ERR":
                raise TransferFailed("a transfer ended in state ERR (peer gone or transport error)")
            if state != "DONE":
                still.append(h)
        pending = still
        if pending and time.monotonic() > deadline:
            raise TransferFailed(f"{len(pending)} transfer(s) not DONE after {timeout_s:g} s")
        if pending:
            time.sleep(0.0005)


def prefill_process(spec: TransferSpec, peer, parent) -> None:
    """Sender. Exits with EXIT_OK, EXIT_TRANSFER_FAILED (reported to ``parent``) or EXIT_ERROR."""
    code = EXIT_ERROR
    try:
        _apply_env(spec)
        pools = spec.pools()
        bufs = _alloc(spec, pools, spec.src_gpu, lambda i, r: _source_region(spec.seed, i, r.nbytes))
        agent = _make_agent("prefill", spec, spec.prefill_num_threads, spec.src_gpu)
        _register(agent, spec, pools, bufs, spec.src_gpu)
        info = peer.recv()
        peer_name = agent.add_remote_agent(info["metadata"])
        peer_name = peer_name.decode() if isinstance(peer_name, bytes) else peer_name
        n_kv, n_swa = len(pools.kv), len(pools.swa)
        src_bases = [b.data_ptr() for b in bufs]
        dst_bases = info["bases"]
        src_dev = nixl_device_id(spec.mem_kind, spec.src_gpu)
        dst_dev = nixl_device_id(spec.mem_kind, spec.dst_gpu)
        num_slots = pools.num_kv_slots
        src_prep = agent.prep_xfer_dlist("", prepared_runs(src_bases[:n_kv], pools.kv, num_slots, src_dev),
                                         spec.mem_kind)
        dst_prep = agent.prep_xfer_dlist(peer_name, prepared_runs(dst_bases[:n_kv], pools.kv, info["num_kv_slots"],
                                                                  dst_dev), spec.mem_kind)
        # a prefill allocator gives a fresh request consecutive pages; walk forward through the pool
        sources = []
        for k, (dst_kv, dst_swa, dst_aux) in enumerate(info["allocs"]):
            kv = np.arange(k * spec.pages_per_request, (k + 1) * spec.pages_per_request, dtype=np.int32) % num_slots
            swa = (np.arange(spec.swa_pages_per_request, dtype=np.int32) + k * spec.swa_pages_per_request
                   ) % spec.num_swa_pages
            sources.append((kv, swa, k % pools.aux[0].num_slots))

        def post(k: int) -> tuple[list, int]:
            (src_kv, src_swa, src_aux), (dst_kv, dst_swa, dst_aux) = sources[k], info["allocs"][k]
            if spec.sabotage == "wrong_page":
                dst_kv = dst_kv.copy()
                dst_kv[0] = (dst_kv[0] + 1) % info["num_kv_slots"]
            handles = []
            h = agent.make_prepped_xfer("WRITE", src_prep, prepared_indices(src_kv, n_kv, num_slots), dst_prep,
                                        prepared_indices(dst_kv, n_kv, info["num_kv_slots"]))
            handles.append(h)
            s, d = flat_descs(src_bases[n_kv:n_kv + n_swa], dst_bases[n_kv:n_kv + n_swa],
                              [r.item_len for r in pools.swa], src_swa, dst_swa, src_dev, dst_dev)
            handles.append(agent.initialize_xfer("WRITE", agent.get_xfer_descs(s, spec.mem_kind),
                                                 agent.get_xfer_descs(d, spec.mem_kind), peer_name))
            s, d = aux_descs(src_bases[n_kv + n_swa:], dst_bases[n_kv + n_swa:], [r.item_len for r in pools.aux],
                             src_aux, dst_aux)
            handles.append(agent.initialize_xfer("WRITE", agent.get_xfer_descs(s, "DRAM"),
                                                 agent.get_xfer_descs(d, "DRAM"), peer_name))
            for h in handles:
                if agent.transfer(h) == "ERR":
                    raise TransferFailed("posting a transfer returned ERR")
            nbytes = (len(src_kv) * sum(r.item_len for r in pools.kv) + len(src_swa) * sum(r.item_len for r in pools.swa)
                      + sum(r.item_len for r in pools.aux))
            return handles, nbytes

        def one(k: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            try:
                handles, nbytes = post(k)
            except TransferFailed:
                raise
            except Exception as exc:  # NIXL raises on a dead peer at post time in some builds
                raise TransferFailed(f"posting raised {type(exc).__name__}: {exc}") from None
            _wait_all(agent, handles, spec.timeout_s)
            elapsed = time.perf_counter() - t0
            for h in handles:
                agent.release_xfer_handle(h)
            return elapsed, nbytes

        timings = []
        try:
            if spec.kill_receiver_after is None:
                for k in range(spec.requests):
                    one(k)
                    parent.send({"event": "progress", "request": k})
                for _ in range(spec.timed_repeats):
                    timings += [one(k) for k in range(spec.requests)]
            else:
                started, k = time.monotonic(), 0
                while time.monotonic() - started < spec.fault_run_s:
                    one(k % spec.requests)
                    parent.send({"event": "progress", "request": k})
                    k += 1
                raise RuntimeError(f"no transfer failed in {spec.fault_run_s:g} s although the receiver was killed")
        except TransferFailed as exc:
            code = EXIT_TRANSFER_FAILED
            parent.send({"event": "failed", "reason": str(exc)})
            try:
                peer.send({"failed": str(exc)})
            except Exception:
                pass  # the peer is gone: that is the failure being reported
            return
        peer.send({"sources": sources})
        parent.send({"event": "sent", "timings": timings})
        code = EXIT_OK
    except Exception:
        parent.send({"event": "error", "error": traceback.format_exc()})
    finally:
        for conn in (peer, parent):
            try:
                conn.close()
            except Exception:
                pass
        # skip NIXL/UCX teardown: with a dead peer it can block, and the result is already reported
        os._exit(code)


# --- the parent -----------------------------------------------------------------------------------

def run_pair(spec: TransferSpec, wall_timeout_s: float = 120.0) -> dict:
    """Run decode and prefill as two spawned processes; return what each reported.

    Keys: ``decode`` (result dict or None), ``prefill`` (its last event), ``prefill_exitcode``,
    ``progress`` (requests the prefill side finished), ``elapsed_after_kill`` (fault mode),
    ``hung`` (names of processes still alive at the wall timeout, which were then killed).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    d_peer, p_peer = ctx.Pipe()
    d_parent_r, d_parent_w = ctx.Pipe(duplex=False)
    p_parent_r, p_parent_w = ctx.Pipe(duplex=False)
    decode = ctx.Process(target=decode_process, args=(spec, d_peer, d_parent_w), name="nixl-decode", daemon=True)
    prefill = ctx.Process(target=prefill_process, args=(spec, p_peer, p_parent_w), name="nixl-prefill", daemon=True)
    decode.start()
    prefill.start()
    for end in (d_peer, p_peer, d_parent_w, p_parent_w):
        end.close()
    out = {"decode": None, "prefill": None, "progress": 0, "prefill_exitcode": None, "elapsed_after_kill": None,
           "hung": []}
    deadline = time.monotonic() + wall_timeout_s
    killed_at = None
    prefill_open = decode_open = True
    try:
        while time.monotonic() < deadline and (prefill_open or (decode_open and killed_at is None)):
            if prefill_open and p_parent_r.poll(0.02):
                try:
                    msg = p_parent_r.recv()
                except EOFError:
                    prefill_open = False
                    continue
                if msg["event"] == "progress":
                    out["progress"] = msg["request"] + 1
                    if (spec.kill_receiver_after is not None and killed_at is None
                            and out["progress"] >= spec.kill_receiver_after):
                        decode.kill()
                        killed_at = time.monotonic()
                else:
                    out["prefill"] = msg
                    if killed_at is not None:
                        out["elapsed_after_kill"] = time.monotonic() - killed_at
            if decode_open and killed_at is None and d_parent_r.poll(0.02):
                try:
                    msg = d_parent_r.recv()
                except EOFError:
                    decode_open = False
                    continue
                if msg["event"] == "result":
                    out["decode"] = msg
                    decode_open = False
        prefill.join(max(0.0, deadline - time.monotonic()))
        decode.join(max(0.0, min(5.0, deadline - time.monotonic())) if killed_at is None else 1.0)
    finally:
        for proc in (prefill, decode):
            if proc.is_alive():
                if proc is not decode or killed_at is None:
                    out["hung"].append(proc.name)
                proc.kill()
                proc.join(5)
    out["prefill_exitcode"] = prefill.exitcode
    return out


def settings_from_plan(plan, role: str = "prefill") -> dict:
    """The NIXL/UCX part of a planned server's environment, as TransferSpec fields: ``env`` (UCX_*),
    ``backend`` and ``backend_params`` (from SGLANG_DISAGGREGATION_NIXL_BACKEND[_PARAMS])."""
    proc = next(p for p in plan.processes if p.role == role)
    return settings_from_environ(proc.env)


def settings_from_environ(environ) -> dict:
    """TransferSpec fields from an environment, read as SGLang's NIXL connector reads it: the backend
    (``SGLANG_DISAGGREGATION_NIXL_BACKEND``, default UCX), its parameters (``..._BACKEND_PARAMS``, a JSON object of
    strings, default ``{}``) and the ``UCX_*`` variables. ValueError for parameters SGLang would refuse."""
    from ..disagg import nixl_backend, nixl_backend_params

    return {"env": {k: v for k, v in environ.items() if k.startswith("UCX_")}, "backend": nixl_backend(environ),
            "backend_params": nixl_backend_params(environ)}


# SGLang's NIXL connector gives the prefill side's backend 8 threads and the decode side none
# (sglang/srt/disaggregation/nixl/conn.py, NixlKVManager: num_threads = 8 if prefill else 0)
SGLANG_PREFILL_NIXL_THREADS = 8
LOOPBACK_REQUESTS = 2
LOOPBACK_WALL_S = 45.0


def loopback(environ, wall_timeout_s: float = LOOPBACK_WALL_S) -> dict:
    """A small NIXL transfer of DSv4 pools between two processes of this machine (DRAM), with ``environ``'s NIXL/UCX
    settings and SGLang's thread counts, every byte checked: whether those settings move KV here at all (an
    exclusion list such as ``UCX_TLS=^tcp`` leaves what this machine has). ``{"ok", "detail", "seconds"}``."""
    started = time.monotonic()
    try:
        settings = settings_from_environ(environ)
    except ValueError as exc:
        return {"ok": False, "detail": f"not run: {exc}", "seconds": 0.0}
    spec = TransferSpec(**settings, requests=LOOPBACK_REQUESTS, prefill_num_threads=SGLANG_PREFILL_NIXL_THREADS,
                        timeout_s=10.0)
    out = run_pair(spec, wall_timeout_s=wall_timeout_s)
    seconds = round(time.monotonic() - started, 1)
    decode, prefill = out["decode"] or {}, out["prefill"] or {}
    if decode.get("ok"):
        detail = (f"{decode['requests']} requests, {decode['bytes_checked'] / 1e6:.1f} MB of pools checked byte for "
                  f"byte in {seconds:g} s")
        return {"ok": True, "detail": detail, "seconds": seconds}
    if out["hung"]:
        detail = f"{', '.join(out['hung'])} still running after {wall_timeout_s:g} s (killed)"
    elif prefill.get("event") == "failed":
        detail = f"transfer failed: {prefill.get('reason')}"
    elif decode.get("mismatched"):
        detail = f"bytes differ after the transfer in {', '.join(sorted(decode['mismatched']))}"
    else:  # an exception on either side: its last line is NIXL's or UCX's own words
        error = prefill.get("error") or decode.get("error") or f"prefill exit code {out['prefill_exitcode']}"
        detail = error.strip().splitlines()[-1]
    return {"ok": False, "detail": detail, "seconds": seconds}


if __name__ == "__main__":  # `python -m sglang_sm120.pd.nixl_check --loopback`: the doctor's probe, one JSON line
    import json
    import sys

    if sys.argv[1:] != ["--loopback"]:
        sys.exit("usage: python -m sglang_sm120.pd.nixl_check --loopback")
    print("LOOPBACK=" + json.dumps(loopback(os.environ)), flush=True)
