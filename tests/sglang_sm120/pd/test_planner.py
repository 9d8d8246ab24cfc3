"""The PD planner over a table of topologies, and its refusals of bad inputs."""

import json
import urllib.parse

import pytest

from sglang_sm120.pd.planner import (LAYOUT_ENV, PlanError, PlanRequest, SideRequest, dsv4_flash_weight_bytes,
                                     layout_fingerprint, make_plan, parse_gpu_list, weight_gib_per_gpu)
from sglang_sm120.pd.topology import TopologyError, load_topology, topology_from_dict


def one_box(model, count, p2p="model", nics=()):
    return topology_from_dict({"hosts": [{"name": "box0", "address": "10.0.0.1", "gpu_model": model,
                                          "gpu_count": count, "p2p": p2p, "nics": list(nics)}]})


def two_boxes(model, count, nics_a, nics_b):
    return topology_from_dict({"hosts": [
        {"name": "boxA", "address": "10.0.0.1", "gpu_model": model, "gpu_count": count, "nics": nics_a},
        {"name": "boxB", "address": "10.0.0.2", "gpu_model": model, "gpu_count": count, "nics": nics_b}]})


def request(topology, prefill, decode, ptp, dtp, phost=None, dhost=None, **kw):
    return PlanRequest(topology, "/models/DeepSeek-V4-Flash", SideRequest(phost, tuple(prefill), ptp),
                       SideRequest(dhost, tuple(decode), dtp), **kw)


def setting(plan, name, applies_to=None):
    values = [s for s in plan.settings if s.name == name and (applies_to is None or s.applies_to == applies_to)]
    assert len(values) == 1, (name, values)
    return values[0]


def argv_value(proc, flag):
    return proc.argv[proc.argv.index(flag) + 1]


RDMA_GDR = [{"name": "mlx5_0", "kind": "rdma", "gpudirect": True}, {"name": "eth0", "kind": "tcp"}]
RDMA_PLAIN = [{"name": "mlx5_1", "kind": "rdma"}, {"name": "eth0", "kind": "tcp"}]
TCP_ONLY_A = [{"name": "eth0", "kind": "tcp"}]
TCP_ONLY_B = [{"name": "enp1s0", "kind": "tcp"}]


# --- the table ------------------------------------------------------------------------------------

# (id, topology, request kwargs, expected UCX_TLS, expected UCX_NET_DEVICES per host or None, reason words)
TABLE = [
    ("1box-4+4-pro6000-p2p", one_box("RTX PRO 6000", 8), dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4),
     "cuda_ipc,cuda_copy,tcp,sm", None, ["P2P", "cuda_ipc"]),
    ("1box-4+4-5090-nop2p", one_box("RTX 5090", 8),
     dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, model_weights_gib=60.0),
     "cuda_copy,tcp,sm", None, ["no PCIe P2P between GPU 0 (prefill) and GPU 4 (decode)", "host memory"]),
    ("2box-rdma-gpudirect", two_boxes("RTX PRO 6000", 8, RDMA_GDR, RDMA_GDR),
     dict(prefill=range(8), decode=range(8), ptp=8, dtp=8, phost="boxA", dhost="boxB"),
     "rc,cuda_copy", {"boxA": "mlx5_0:1", "boxB": "mlx5_0:1"}, ["GPUDirect", "zero-copy"]),
    ("2box-rdma-no-gpudirect", two_boxes("RTX PRO 6000", 8, RDMA_GDR, RDMA_PLAIN),
     dict(prefill=range(8), decode=range(8), ptp=8, dtp=8, phost="boxA", dhost="boxB"),
     "rc,cuda_copy", {"boxA": "mlx5_0:1", "boxB": "mlx5_1:1"}, ["no NIC on boxB is marked gpudirect", "host memory"]),
    ("2box-rdma-5090", two_boxes("RTX 5090", 8, RDMA_GDR, RDMA_GDR),
     dict(prefill=range(8), decode=range(8), ptp=8, dtp=8, phost="boxA", dhost="boxB"),
     "rc,cuda_copy", {"boxA": "mlx5_0:1", "boxB": "mlx5_0:1"}, ["RTX 5090 has no GPUDirect RDMA"]),
    ("2box-tcp", two_boxes("RTX PRO 6000", 8, TCP_ONLY_A, TCP_ONLY_B),
     dict(prefill=range(8), decode=range(8), ptp=8, dtp=8, phost="boxA", dhost="boxB"),
     "tcp,cuda_copy", {"boxA": "eth0", "boxB": "enp1s0"}, ["no RDMA NIC on boxA, boxB", "TCP"]),
]


@pytest.mark.parametrize("name,topology,kw,tls,net_devices,reason_words", TABLE, ids=[t[0] for t in TABLE])
def test_plan_table(name, topology, kw, tls, net_devices, reason_words):
    plan = make_plan(request(topology, **kw))
    tls_setting = setting(plan, "UCX_TLS")
    assert tls_setting.value == tls
    for word in reason_words:
        assert word in tls_setting.reason, (word, tls_setting.reason)
    servers = plan.servers()
    assert [p.name for p in servers] == ["prefill-0", "decode-0"]
    prefill, decode = servers
    router = plan.router()
    # every server: the same layout-deciding env, its role, the NIXL backend and the chosen transport
    for proc in servers:
        assert proc.env["UCX_TLS"] == tls
        assert proc.env["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "UCX"
        assert json.loads(proc.env["SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS"]) == {"ucx_error_handling_mode": "peer"}
        assert proc.env["SGLANG_SM120_PD_ROLE"] == proc.role
        assert proc.env["SGLANG_SM120_PD_LAYOUT"] == plan.layout_fingerprint
        assert argv_value(proc, "--disaggregation-mode") == proc.role
        assert argv_value(proc, "--disaggregation-transfer-backend") == "nixl"
        assert argv_value(proc, "--model-path") == "/models/DeepSeek-V4-Flash"
        assert proc.argv[:3] == ["python3", "-m", "sglang.launch_server"]
        if net_devices is None:
            assert "UCX_NET_DEVICES" not in proc.env
        else:
            assert proc.env["UCX_NET_DEVICES"] == net_devices[proc.host]
    assert {k: prefill.env[k] for k in LAYOUT_ENV} == {k: decode.env[k] for k in LAYOUT_ENV}
    assert argv_value(prefill, "--tp") == str(kw["ptp"]) and argv_value(decode, "--tp") == str(kw["dtp"])
    assert argv_value(prefill, "--base-gpu-id") == str(kw["prefill"][0])
    assert argv_value(decode, "--base-gpu-id") == str(kw["decode"][0])
    assert argv_value(prefill, "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in decode.argv
    two_hosts = kw.get("phost") is not None
    bind = "0.0.0.0" if two_hosts else "127.0.0.1"
    assert argv_value(prefill, "--host") == argv_value(decode, "--host") == argv_value(router, "--host") == bind
    # ports: http ports count up per host, the router gets its own
    assert prefill.port == 30000 and decode.port == (30000 if two_hosts else 30001)
    assert router.argv[:4] == ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    i = router.argv.index("--prefill")
    assert router.argv[i + 1:i + 3] == [prefill.url, "8998"]
    assert router.argv[router.argv.index("--decode") + 1] == decode.url
    assert argv_value(router, "--port") == "8000" and router.host == prefill.host
    if two_hosts:
        assert prefill.url == "http://10.0.0.1:30000" and decode.url == "http://10.0.0.2:30000"
    # text and JSON forms carry the commands and a reason for every setting
    text = plan.to_text()
    assert prefill.shell_line() in text and router.shell_line() in text
    assert all(s.reason and f"{s.name}={s.value}" in text for s in plan.settings)
    data = json.loads(plan.to_json())
    assert [p["name"] for p in data["processes"]] == ["prefill-0", "decode-0", "router"]
    assert data["processes"][0]["health_url"] == prefill.url + "/health"


def test_several_servers_per_side_get_their_own_gpus_and_ports():
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 2, 2))
    names = [(p.name, p.gpus, p.port, p.bootstrap_port) for p in plan.processes]
    assert names == [("prefill-0", (0, 1), 30000, 8998), ("prefill-1", (2, 3), 30001, 8999),
                     ("decode-0", (4, 5), 30002, None), ("decode-1", (6, 7), 30003, None),
                     ("router", (), 8000, None)]
    router = plan.router().argv
    assert router.count("--prefill") == 2 and router.count("--decode") == 2
    # one host: the router reaches the servers on loopback, where they bind (not at the file's 10.0.0.1)
    assert router[router.index("--prefill") + 1:router.index("--prefill") + 3] == ["http://127.0.0.1:30000", "8998"]


def test_partial_p2p_matrix_falls_back_to_host_staging_and_names_the_pair():
    # P2P only inside {0,1} and {2,3}: prefill 0-1 and decode 2-3 cannot reach each other directly
    matrix = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    plan = make_plan(request(one_box("RTX PRO 6000", 4, p2p=matrix), [0, 1], [2, 3], 2, 2, model_weights_gib=100))
    tls = setting(plan, "UCX_TLS")
    assert tls.value == "cuda_copy,tcp,sm"
    assert "GPU 0 (prefill) and GPU 2 (decode) and 3 more pairs" in tls.reason
    # the same box split along its P2P islands would not have P2P either; a 0-1 / 1-... split inside one does
    plan = make_plan(request(one_box("RTX PRO 6000", 4, p2p=matrix), [0], [1], 1, 1, model_weights_gib=10))
    assert setting(plan, "UCX_TLS").value == "cuda_ipc,cuda_copy,tcp,sm"


def test_weight_estimate_matches_the_published_size():
    split, replicated = dsv4_flash_weight_bytes()
    # MXFP4 experts dominate: ~147 GiB for the whole model at TP1 (the Flash checkpoint is ~150 GB)
    assert 140 < (split + replicated) / 2**30 < 155
    assert weight_gib_per_gpu(8) < weight_gib_per_gpu(4) < weight_gib_per_gpu(2)
    assert weight_gib_per_gpu(4, model_weights_gib=100) == 25


def test_user_env_and_args_reach_both_sides_and_the_fingerprint():
    base = request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4)
    plain = make_plan(base)
    base.env = {"SGLANG_SM120_DISABLE": "moe"}
    base.server_args = ("--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.85")
    plan = make_plan(base)
    for proc in plan.servers():
        assert proc.env["SGLANG_SM120_DISABLE"] == "moe"
        assert proc.argv[-4:] == ["--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.85"]
    assert plan.layout_fingerprint != plain.layout_fingerprint
    assert plan.layout_fingerprint == layout_fingerprint(plan.servers()[1].env, tuple(plan.servers()[1].argv))


# --- refusals -------------------------------------------------------------------------------------

BAD = [
    ("more GPUs than exist", dict(prefill=range(4), decode=range(4, 9), ptp=4, dtp=1),
     "decode asks for GPU 8 but host box0 has 8 GPUs (0-7)"),
    ("overlapping sets", dict(prefill=range(4), decode=range(3, 7), ptp=4, dtp=4),
     "GPU 3 on host box0 is in both the prefill and the decode set"),
    ("duplicate GPU", dict(prefill=[0, 0, 1, 2], decode=range(4, 8), ptp=4, dtp=4),
     "prefill GPUs list GPU 0 more than once"),
    ("unsupported tp", dict(prefill=range(3), decode=range(4, 7), ptp=3, dtp=3), "--prefill-tp 3"),
    ("gpus not a multiple of tp", dict(prefill=range(3), decode=range(4, 8), ptp=2, dtp=4),
     "prefill has 3 GPUs, not a multiple of --prefill-tp 2"),
    ("non-consecutive server", dict(prefill=[0, 2, 4, 6], decode=[1, 3, 5, 7], ptp=4, dtp=4),
     "each server's GPUs must be consecutive"),
    ("port clash http/bootstrap", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, http_port=8997),
     "port clash on host box0: decode-0 http and prefill-0 bootstrap both use port 8998"),
    ("port clash router", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, router_port=30001),
     "port clash on host box0: router and decode-0 http both use port 30001"),
    ("port out of range", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, router_port=80),
     "--router-port 80 is outside 1024-65535"),
    ("planner-owned flag", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, server_args=("--tp", "2")),
     "--server-arg sets --tp"),  # SGLang 0.5.23 has no --tp: its parser reads it as --tp-size, also owned
    ("sides disagree on env", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4,
                                   prefill_env={"SGLANG_OPT_SM120_DIRECT_SWA_KV": "1"}),
     "env SGLANG_OPT_SM120_DIRECT_SWA_KV: prefill=1 decode=0"),
    ("sides disagree on kv dtype", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4,
                                        decode_args=("--kv-cache-dtype", "bf16")),
     "--kv-cache-dtype: prefill=(default) decode=bf16"),
    ("sides disagree on plugin", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4,
                                      decode_env={"SGLANG_SM120_DISABLE": "attention"}),
     "env SGLANG_SM120_DISABLE: prefill= decode=attention"),
    ("unknown host", dict(prefill=range(4), decode=range(4, 8), ptp=4, dtp=4, phost="nope"),
     "unknown host 'nope'"),
]


@pytest.mark.parametrize("what,kw,message", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_are_refused_with_a_clear_message(what, kw, message):
    with pytest.raises(PlanError) as info:
        make_plan(request(one_box("RTX PRO 6000", 8), **kw))
    assert message in str(info.value)


def test_layout_disagreement_explains_why():
    with pytest.raises(PlanError, match="prefill writes the pages decode reads"):
        make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                          prefill_env={"SGLANG_DSV4_KV_LAYOUT": "v41"}))


def test_a_server_whose_weights_do_not_fit_is_refused():
    with pytest.raises(PlanError) as info:
        make_plan(request(one_box("RTX 5090", 8), range(4), range(4, 8), 4, 4))
    assert "TP-4 server on RTX 5090" in str(info.value) and "larger TP" in str(info.value)


def test_two_boxes_without_any_nic_are_refused():
    topo = two_boxes("RTX PRO 6000", 8, TCP_ONLY_A, [])
    with pytest.raises(PlanError, match="host boxB has neither an RDMA NIC nor a TCP interface"):
        make_plan(request(topo, range(8), range(8), 8, 8, phost="boxA", dhost="boxB"))


@pytest.mark.parametrize("text,expected", [("0-3", (0, 1, 2, 3)), ("4,5,6,7", (4, 5, 6, 7)), ("0-1,4", (0, 1, 4))])
def test_gpu_lists(text, expected):
    assert parse_gpu_list(text, "--prefill-gpus") == expected


@pytest.mark.parametrize("text", ["", "a-b", "3-1", "x"])
def test_bad_gpu_lists(text):
    with pytest.raises(PlanError, match="--prefill-gpus"):
        parse_gpu_list(text, "--prefill-gpus")


BAD_TOPOLOGIES = [
    ({"hosts": []}, "at least one host"),
    ({"hosts": [{"gpu_model": "RTX PRO 6000"}]}, "missing 'gpu_count'"),
    ({"hosts": [{"gpu_model": "RTX PRO 6000", "gpu_count": 0}]}, "gpu_count must be >= 1"),
    ({"hosts": [{"gpu_model": "RTX PRO 6000", "gpu_count": 2, "p2p": [[1, 1]]}]}, "p2p matrix must be 2x2"),
    ({"hosts": [{"gpu_model": "RTX PRO 6000", "gpu_count": 2, "p2p": "sometimes"}]}, "p2p must be 'all', 'none'"),
    ({"hosts": [{"gpu_model": "Voodoo 5", "gpu_count": 2}]}, "unknown GPU model 'Voodoo 5'"),
    ({"hosts": [{"gpu_model": "RTX 5090", "gpu_count": 2, "nics": [{"name": "x", "kind": "carrier-pigeon"}]}]},
     "kind must be 'rdma' or 'tcp'"),
    ({"hosts": [{"name": "a", "gpu_model": "RTX 5090", "gpu_count": 1},
                {"name": "a", "gpu_model": "RTX 5090", "gpu_count": 1}]}, "repeated: a"),
    ({"hosts": [{"gpu_model": "RTX 5090", "gpu_count": 2, "colour": "red"}]}, "unknown fields ['colour']"),
    # bool("false") is True: a string there was once read as GPUDirect on
    ({"hosts": [{"gpu_model": "RTX 5090", "gpu_count": 2, "nics": [{"name": "x", "kind": "rdma",
                                                                     "gpudirect": "false"}]}]},
     "gpudirect must be true or false"),
    ({"hosts": [{"gpu_model": "RTX 5090", "gpu_count": 2, "gpu_memory_gib": "nan"}]}, "positive finite number"),
    ({"hosts": [{"gpu_model": "RTX 5090", "gpu_count": 2, "gpu_memory_gib": "abc"}]}, "must be a number"),
    # without 'address' both hosts were 127.0.0.1: the router and the peer would reach one machine for two
    ({"hosts": [{"name": "a", "gpu_model": "RTX 5090", "gpu_count": 1},
                {"name": "b", "gpu_model": "RTX 5090", "gpu_count": 1}]},
     "hosts a and b both have address 127.0.0.1"),
    ({"hosts": [{"name": "a", "gpu_model": "RTX 5090", "gpu_count": 1, "address": "localhost"},
                {"name": "b", "gpu_model": "RTX 5090", "gpu_count": 1, "address": "::1"}]},
     "two hosts cannot both be this machine"),
]


@pytest.mark.parametrize("data,message", BAD_TOPOLOGIES)
def test_bad_topologies_are_refused(data, message):
    with pytest.raises(TopologyError) as info:
        topology_from_dict(data)
    assert message in str(info.value)


def test_topology_file_round_trip_and_unknown_model_with_explicit_fields(tmp_path):
    topo = topology_from_dict({"hosts": [{"name": "lab", "gpu_model": "Voodoo 5", "gpu_count": 2, "p2p": "01;10",
                                          "gpu_memory_gib": 48}]})
    host = topo.hosts[0]
    assert host.gpu_model.memory_gib == 48 and host.p2p == ((True, True), (True, True))
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo.to_dict()))
    assert load_topology(path) == topo
    path.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load_topology(path)
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(tmp_path / "missing.json")


# --- user flags as SGLang's parser reads them -----------------------------------------------------

def refusal(**kw) -> str:
    with pytest.raises(PlanError) as info:
        make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4, **kw))
    return str(info.value)


@pytest.mark.parametrize("args,message", [
    (("--tp-s", "2"), "--server-arg sets --tp-s (SGLang reads it as --tp-size), which the planner owns"),
    (("--base-gpu", "4"), "--server-arg sets --base-gpu (SGLang reads it as --base-gpu-id), which the planner owns"),
    (("--tp-size=2",), "--server-arg sets --tp-size, which the planner owns"),
    (("--tensor-parallel-size", "2"), "sets --tensor-parallel-size (SGLang reads it as --tp-size)"),
    (("--model", "/other"), "sets --model (SGLang reads it as --model-path), which the planner owns"),
])
def test_abbreviated_and_aliased_owned_flags_are_refused(args, message):
    # SGLang's parser (allow_abbrev) reads --tp-s as --tp-size; an exact-name check let it through
    assert message in refusal(server_args=args)


@pytest.mark.parametrize("decode_args", [("--kv-cache-dt", "bf16"), ("--kv-cache-dt=bf16",), ("--kv-cache-dtype=bf16",)])
def test_abbreviated_layout_flags_count_as_the_full_flag(decode_args):
    assert "--kv-cache-dtype: prefill=(default) decode=bf16" in refusal(decode_args=decode_args)
    # the same abbreviation on both sides agrees, and fingerprints like the full flag
    abbreviated = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4, server_args=decode_args))
    full = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                             server_args=("--kv-cache-dtype", "bf16")))
    assert abbreviated.layout_fingerprint == full.layout_fingerprint


def test_an_ambiguous_abbreviation_names_the_candidates():
    message = refusal(server_args=("--pp", "2"))
    assert "--server-arg --pp is ambiguous" in message
    assert all(c in message for c in ("--pp-size", "--pp-max-micro-batch-size", "--pp-async-batch-depth"))


def test_without_sglang_abbreviations_of_checked_flags_are_refused(monkeypatch):
    from sglang_sm120.pd import planner

    monkeypatch.setattr(planner, "sglang_server_options", lambda: None, raising=False)
    message = refusal(server_args=("--kv-cache-dt", "bf16"))
    assert "--kv-cache-dt" in message and "--kv-cache-dtype" in message and "full flag name" in message
    assert "--tp-size" in refusal(prefill_args=("--tp-s=2",))
    # full names still work, other flags pass untouched
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                             server_args=("--kv-cache-dtype", "bf16", "--mem-frac", "0.8")))
    assert plan.servers()[0].argv[-4:] == ["--kv-cache-dtype", "bf16", "--mem-frac", "0.8"]


@pytest.mark.parametrize("args", [("--pp-size", "2"), ("--dp-size=2",), ("--dp", "2"), ("--data-parallel-size", "2"),
                                  ("--gpu-id-step", "2"), ("--nnodes", "2"), ("--pipeline-parallel-size", "4")])
def test_flags_that_widen_a_server_beyond_its_gpus_are_refused(args):
    message = refusal(decode_args=args)
    assert "--decode-arg sets" in message and "the plan owns GPU placement" in message


def test_footprint_flags_at_their_default_are_allowed():
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                             server_args=("--dp-size", "1", "--nnodes=1")))
    assert plan.servers()[0].argv[-3:] == ["--dp-size", "1", "--nnodes=1"]


def write_config(tmp_path, text, name="server.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_config_file_is_read_into_the_commands(tmp_path):
    """--config FILE is read with SGLang's own config reader and its keys written into both commands as flags, ahead
    of the command line's own (which still win); the hosts need no copy of the file."""
    config = write_config(tmp_path, "kv-cache-dtype: bf16\nmem-fraction-static: 0.8\nenable-metrics: true\n")
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                             server_args=("--config", config, "--mem-fraction-static", "0.7")))
    for proc in plan.servers():
        assert "--config" not in proc.argv and config not in proc.argv
        assert proc.argv[-7:] == ["--kv-cache-dtype", "bf16", "--mem-fraction-static", "0.8", "--enable-metrics",
                                  "--mem-fraction-static", "0.7"]
    assert any("--server-arg --config" in note and "3 flag(s)" in note for note in plan.notes)
    # the file's layout flag fingerprints like the same flag on the command line
    inline = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                               server_args=("--kv-cache-dtype", "bf16")))
    assert plan.layout_fingerprint == inline.layout_fingerprint


@pytest.mark.parametrize("text,kw,message", [
    ("port: 31000\n", "server_args", "--server-arg sets --port, which the planner owns"),
    ("tp-size: 2\n", "prefill_args", "--prefill-arg sets --tp-size, which the planner owns"),
    ("dp-size: 2\n", "decode_args", "the plan owns GPU placement"),
    ("page-size: 128\n", "decode_args", "--page-size: prefill=(default) decode=128"),
    ("config: other.yaml\n", "server_args", "inside a config file"),
])
def test_a_config_file_is_checked_like_the_command_line(tmp_path, text, kw, message):
    assert message in refusal(**{kw: ("--config", write_config(tmp_path, text))})


@pytest.mark.parametrize("args,message", [
    (("--config=server.yaml",), "never reads"),
    (("--conf", "server.yaml"), "never reads"),
    (("--config", "a.yaml", "--config", "b.yaml"), "gives --config 2 times"),
    (("--config", "missing.yaml"), "SGLang's config reader refuses it: Config file not found"),
    (("--config", "server.json"), "must be YAML"),
])
def test_config_files_sglang_would_not_read_are_refused(args, message):
    assert message in refusal(server_args=args)


def test_without_sglang_a_config_file_is_refused(tmp_path, monkeypatch):
    from sglang_sm120.pd import planner

    monkeypatch.setattr(planner, "sglang_server_parser", lambda: None)
    monkeypatch.setattr(planner, "sglang_server_options", lambda: None)
    message = refusal(server_args=("--config", write_config(tmp_path, "kv-cache-dtype: bf16\n")))
    assert "SGLang is not importable here" in message and "--server-arg" in message


def test_compress_state_dtype_is_a_layout_setting():
    plain = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4))
    assert all(p.env["SGLANG_DSV4_COMPRESS_STATE_DTYPE"] == "float32" for p in plain.servers())  # SGLang's default
    assert "env SGLANG_DSV4_COMPRESS_STATE_DTYPE: prefill=float32 decode=bf16" in refusal(
        decode_env={"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"})
    both = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4,
                             env={"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "bf16"}))
    assert both.layout_fingerprint != plain.layout_fingerprint


def test_a_user_ucx_net_devices_is_kept_with_a_note():
    topo = two_boxes("RTX PRO 6000", 8, TCP_ONLY_A, TCP_ONLY_B)
    plan = make_plan(request(topo, range(8), range(8), 8, 8, phost="boxA", dhost="boxB",
                             decode_env={"UCX_NET_DEVICES": "enp2s0"}))
    prefill, decode = plan.servers()
    assert prefill.env["UCX_NET_DEVICES"] == "eth0" and decode.env["UCX_NET_DEVICES"] == "enp2s0"
    assert any("UCX_NET_DEVICES=enp2s0" in n and "decode-0" in n and "enp1s0 was not applied" in n
               for n in plan.notes), plan.notes


def test_ipv6_addresses_are_bracketed_in_urls():
    topo = topology_from_dict({"hosts": [
        {"name": "boxA", "address": "fd00::1", "gpu_model": "RTX PRO 6000", "gpu_count": 8, "nics": TCP_ONLY_A},
        {"name": "boxB", "address": "fd00::2", "gpu_model": "RTX PRO 6000", "gpu_count": 8, "nics": TCP_ONLY_B}]})
    plan = make_plan(request(topo, range(8), range(8), 8, 8, phost="boxA", dhost="boxB"))
    prefill, decode = plan.servers()
    assert prefill.url == "http://[fd00::1]:30000" and decode.health_url == "http://[fd00::2]:30000/health"
    assert plan.router().url == "http://[fd00::1]:8000"
    assert "http://[fd00::2]:30000" in plan.router().argv


# --- every process is reachable at the URL the plan gives for it ----------------------------------

def test_a_one_host_plan_binds_where_its_urls_point():
    # the file gives box0 the address 10.0.0.1; a one-host plan bound 127.0.0.1 but named 10.0.0.1 in its health
    # URLs and router targets, where nothing listened
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 2, 2))
    for proc in plan.processes:
        assert urllib.parse.urlsplit(proc.url).hostname == argv_value(proc, "--host") == "127.0.0.1", proc.name
        assert proc.health_url == proc.url + "/health"
    router = plan.router().argv
    targets = [router[i + 1] for i, a in enumerate(router) if a in ("--prefill", "--decode")]
    assert targets == [p.url for p in plan.servers()]
    assert any("10.0.0.1" in n and "127.0.0.1" in n for n in plan.notes), plan.notes


def test_a_plan_spanning_hosts_binds_every_interface_and_names_each_host_by_its_address():
    plan = make_plan(request(two_boxes("RTX PRO 6000", 8, TCP_ONLY_A, TCP_ONLY_B), range(8), range(8), 8, 8,
                             phost="boxA", dhost="boxB"))
    for proc in plan.processes:
        assert argv_value(proc, "--host") == "0.0.0.0"  # the wildcard listens on the address the URL names
        assert urllib.parse.urlsplit(proc.url).hostname == {"boxA": "10.0.0.1", "boxB": "10.0.0.2"}[proc.host]


# --- NIXL/UCX settings the disagg seam would report as broken are refused up front ----------------

@pytest.mark.parametrize("env,message", [
    ({"UCX_TLS": "sm,cuda_copy"}, "UCX_TLS=sm,cuda_copy has no transport with a peer-failure handler"),
    ({"UCX_TLS": "cuda_ipc,cuda_copy,gdr_copy,self"}, "has no transport with a peer-failure handler"),
    ({"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": '{"num_threads": 8}'}, "is not a JSON object of strings"),
    ({"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": "peer"}, "is not a JSON object of strings"),
    ({"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": '["ucx_error_handling_mode"]'}, "is not a JSON object of strings"),
])
def test_nixl_settings_the_seam_would_report_are_refused(env, message):
    from sglang_sm120 import disagg

    text = refusal(env=env)
    assert message in text
    # the same words as the seam's report in a server started with them
    assert all(p in text for p in disagg.nixl_settings_problems(env))


# An exclusion list leaves what the host has: without an RDMA NIC only tcp has a peer-failure handler (measured by
# the NIXL loopback, tests/sglang_sm120/pd/test_nixl_transfer.py: '^tcp' fails on this RDMA-less machine)
@pytest.mark.parametrize("tls", ["^tcp", "^sm,tcp", "^\\tcp,cma"])
def test_an_exclusion_list_leaving_no_handler_on_a_host_without_rdma_is_refused(tls):
    text = refusal(env={"UCX_TLS": tls})
    assert f"UCX_TLS={tls} excludes tcp and host box0 has no RDMA NIC" in text
    assert "UCX_TLS=^all excludes every transport" in refusal(env={"UCX_TLS": "^all"})


def test_an_exclusion_of_tcp_is_judged_per_host():
    rdma_box = one_box("RTX PRO 6000", 8, nics=RDMA_GDR)
    plan = make_plan(request(rdma_box, range(4), range(4, 8), 4, 4, env={"UCX_TLS": "^tcp"}))
    assert all(p.env["UCX_TLS"] == "^tcp" for p in plan.servers())  # the rc/ud/dc family is left there
    with pytest.raises(PlanError) as info:  # prefill on an RDMA host, decode on a TCP-only one
        make_plan(request(two_boxes("RTX PRO 6000", 8, RDMA_GDR, TCP_ONLY_B), range(8), range(8), 8, 8,
                          phost="boxA", dhost="boxB", env={"UCX_TLS": "^tcp,sm"}))
    assert "the decode servers'" in str(info.value) and "host boxB has no RDMA NIC" in str(info.value)


@pytest.mark.parametrize("tls", ["^sm,cma", "^cuda_ipc", "^ib"])
def test_an_exclusion_list_keeping_tcp_is_planned(tls):
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4, env={"UCX_TLS": tls}))
    assert all(p.env["UCX_TLS"] == tls for p in plan.servers())


@pytest.mark.parametrize("tls", ["rc_mlx5,cuda_copy", "ib,cuda_copy", "dc_x,cuda_copy", "sm,ud_verbs,cuda_copy"])
def test_ucx_transport_names_with_a_peer_failure_handler_are_planned(tls):
    plan = make_plan(request(one_box("RTX PRO 6000", 8), range(4), range(4, 8), 4, 4, env={"UCX_TLS": tls}))
    assert all(p.env["UCX_TLS"] == tls for p in plan.servers())
