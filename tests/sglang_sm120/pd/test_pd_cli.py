"""``pd plan`` through the argument parser, its errors, and the PD rows of ``doctor``."""

import argparse
import json
import random

import pytest

from sglang_sm120.pd import cli


def run(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def plan_json(capsys, *args):
    code, out, err = run(["pd", "plan", "--model-path", "/models/dsv4", "--json", *args], capsys)
    assert code == 0, err
    return json.loads(out)


def test_add_pd_parser_wires_plan_and_launch():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.add_pd_parser(sub)
    args = parser.parse_args(["pd", "plan", "--model-path", "m", "--split", "4+4"])
    assert args.func is cli.plan_command and args.split == "4+4"
    args = parser.parse_args(["pd", "launch", "--model-path", "m", "--local-host", "boxA"])
    assert args.func is cli.launch_command and args.local_host == "boxA" and args.health_timeout == 1800


def test_plan_from_flags(capsys):
    data = plan_json(capsys, "--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4")
    names = [p["name"] for p in data["processes"]]
    assert names == ["prefill-0", "decode-0", "router"]
    assert data["processes"][1]["gpus"] == [4, 5, 6, 7]
    assert {s["name"]: s["value"] for s in data["settings"]}["UCX_TLS"] == "cuda_ipc,cuda_copy,tcp,sm"
    assert all(s["reason"] for s in data["settings"])
    # --p2p none makes the same box stage through host memory
    data = plan_json(capsys, "--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--p2p", "none")
    assert {s["name"]: s["value"] for s in data["settings"]}["UCX_TLS"] == "cuda_copy,tcp,sm"


def test_plan_from_a_topology_file_with_two_hosts(tmp_path, capsys):
    topo = {"hosts": [
        {"name": "boxA", "address": "10.1.0.1", "gpu_model": "RTX PRO 6000", "gpu_count": 8,
         "nics": [{"name": "mlx5_0", "kind": "rdma", "gpudirect": True}]},
        {"name": "boxB", "address": "10.1.0.2", "gpu_model": "RTX PRO 6000", "gpu_count": 8,
         "nics": [{"name": "mlx5_3", "kind": "rdma", "gpudirect": True}]}]}
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo))
    data = plan_json(capsys, "--topology", str(path), "--prefill-host", "boxA", "--decode-host", "boxB",
                     "--prefill-tp", "4", "--decode-tp", "8", "--env", "SGLANG_SM120_DISABLE=moe",
                     "--server-arg", "--mem-fraction-static 0.85")
    procs = {p["name"]: p for p in data["processes"]}
    assert set(procs) == {"prefill-0", "prefill-1", "decode-0", "router"}
    assert procs["prefill-1"]["gpus"] == [4, 5, 6, 7] and procs["prefill-1"]["bootstrap_port"] == 8999
    assert procs["decode-0"]["env"]["UCX_NET_DEVICES"] == "mlx5_3:1"
    assert procs["prefill-0"]["env"]["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert procs["decode-0"]["env"]["SGLANG_SM120_DISABLE"] == "moe"
    assert procs["decode-0"]["argv"][-2:] == ["--mem-fraction-static", "0.85"]
    assert procs["router"]["url"] == "http://10.1.0.1:8000"


@pytest.mark.parametrize("args,message", [
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+6"], "decode asks for GPU 8, 9"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "four"], "--split expects P+D"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--prefill-gpus", "0-3", "--decode-gpus", "2-5"],
     "GPU 2, 3 on host local is in both"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--http-port", "8000"],
     "port clash"),
    (["--gpu-model", "RTX PRO 6000"], "--gpu-model and --gpu-count go together"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--nic", "eth0"], "--nic 'eth0'"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--env", "NOEQUALS"], "--env: expected NAME=VALUE"),
    ([], "cannot detect a topology here"),
    # NaN or negative memory once switched the fit refusal off; TP 0 once meant "all GPUs"
    (["--gpu-model", "RTX 5090", "--gpu-count", "8", "--split", "4+4", "--gpu-memory-gib", "nan"],
     "positive finite number"),
    (["--gpu-model", "RTX 5090", "--gpu-count", "8", "--split", "4+4", "--model-weights-gib", "-100"],
     "--model-weights-gib must be a positive finite number"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--prefill-tp", "0"], "--prefill-tp 0"),
    # SGLang's parser accepts unambiguous prefixes: these are read as it reads them
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--server-arg", "--base-gpu 4"],
     "--base-gpu (SGLang reads it as --base-gpu-id), which the planner owns"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--server-arg", "--pp 2"],
     "--server-arg --pp is ambiguous"),
    (["--gpu-model", "RTX PRO 6000", "--gpu-count", "8", "--split", "4+4", "--decode-arg=--dp-size=2"],
     "the plan owns GPU placement"),
])
def test_plan_errors_exit_2_with_the_reason(args, message, capsys):
    code, out, err = run(["pd", "plan", "--model-path", "/m", *args], capsys)
    assert code == 2
    assert message in err and err.startswith("pd: cannot plan:")
    code, out, err = run(["pd", "plan", "--model-path", "/m", "--json", *args], capsys)
    assert code == 2 and message in json.loads(out)["error"]


def test_launch_refuses_a_multi_host_plan_without_local_host(tmp_path, capsys):
    topo = {"hosts": [{"name": n, "address": a, "gpu_model": "RTX PRO 6000", "gpu_count": 2,
                       "nics": [{"name": "eth0", "kind": "tcp"}]} for n, a in (("a", "10.0.0.1"), ("b", "10.0.0.2"))]}
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo))
    base = ["pd", "launch", "--model-path", "/m", "--topology", str(path), "--prefill-host", "a", "--decode-host", "b",
            "--model-weights-gib", "1"]
    code, _out, err = run(base, capsys)
    assert code == 2 and "run it on each with --local-host NAME" in err
    code, _out, err = run(base + ["--local-host", "c"], capsys)
    assert code == 2 and "--local-host 'c' runs nothing" in err


def test_doctor_rows_on_this_machine():
    rows = cli.doctor_pd_report()
    labels = [label for label, _value, _ok in rows]
    assert labels[:3] == ["nixl", "NIXL backends", "UCX transports"] and labels[4] == "sglang-router"
    assert labels[3].startswith(f"{cli.LOOPBACK_LABEL} (this environment: UCX, UCX_TLS=")
    assert rows[3][2] and rows[3][1].startswith("ok: 2 requests,") and "checked byte for byte" in rows[3][1]
    values = {label: (value, ok) for label, value, ok in rows}
    assert values["nixl"] == ("1.5.1", True)
    assert "UCX" in values["NIXL backends"][0].split(", ")
    # UCX itself lists what it can use here: tcp and shared memory at least
    assert {"tcp", "sm"} <= set(values["UCX transports"][0].split(", "))
    assert "P2P matrix" in values and "planner here" in values


@pytest.mark.parametrize("tls,ok,words", [
    ("^sm,cma", True, "checked byte for byte"),
    # tcp is the only transport with a peer-failure handler on this RDMA-less machine
    ("^tcp", False, "no peer failure handler"),
    ("", False, "The TLs list is empty"),
])
def test_doctor_loopback_tries_this_environments_ucx_settings(monkeypatch, tls, ok, words):
    """An exclusion list leaves what the machine has; only a transfer with those settings tells. The failure ends
    with UCX's own error line."""
    monkeypatch.setenv("UCX_TLS", tls)
    got_ok, detail = cli._nixl_loopback()
    assert got_ok == ok, detail
    assert words in detail, detail


def test_doctor_loopback_does_not_run_with_backend_params_sglang_would_refuse(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", '{"num_threads": 8}')
    ok, detail = cli._nixl_loopback()
    assert not ok and detail.startswith("not run: SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS=")


@pytest.mark.parametrize("what", ["directory", "binary"])
def test_an_unreadable_topology_file_is_refused_with_the_reason(tmp_path, capsys, what):
    path = tmp_path / "topology.json"
    if what == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe\x00garbage")
    code, out, err = run(["pd", "plan", "--model-path", "/m", "--topology", str(path), "--split", "1+1"], capsys)
    assert code == 2 and "cannot be read" in err


@pytest.mark.parametrize("flag", ["--health-timeout", "--grace"])
def test_launch_refuses_timings_that_are_not_finite(flag, capsys):
    code, out, err = run(["pd", "launch", "--model-path", "/m", "--gpu-model", "RTX PRO 6000", "--gpu-count", "8",
                          "--split", "4+4", flag, "nan"], capsys)
    assert code == 2 and f"{flag} must be a finite number" in err


def random_plan_argv(seed: int, topology_dir) -> list[str]:
    """A `pd plan` command line: mostly valid choices (models, splits, hosts, NICs, TP, ports, env and server
    arguments), each field now and then replaced by a wrong value."""
    r = random.Random(seed)

    def maybe(good, bad):
        return r.choice(bad) if r.random() < 0.1 else good

    argv = ["pd", "plan", "--model-path", maybe("/m", [""])]
    count = r.choice([2, 4, 8])
    names = []
    if r.random() < 0.5:
        hosts = [{"name": f"h{i}", "address": maybe(f"10.0.0.{i + 1}", ["", "::1", "10.0.0.1"]),
                  "gpu_model": maybe(r.choice(["RTX PRO 6000", "RTX 5090"]), ["H200", ""]),
                  "gpu_count": maybe(count, [0, -1, "4"]),
                  "nics": [maybe(r.choice([{"name": "eth0", "kind": "tcp"}, {"name": "mlx5_0", "kind": "rdma"},
                                           {"name": "mlx5_1", "kind": "rdma", "gpudirect": True}]),
                                 [{"kind": "tcp"}, {"name": "x", "kind": "udp"}])],
                  "p2p": maybe(r.choice(["all", "none", "model"]), ["01;10", 3, [[True]]])}
                 for i in range(r.choice([1, 2, 3]))]
        path = topology_dir / f"topology-{seed}.json"
        path.write_text(json.dumps({"hosts": hosts}))
        argv += ["--topology", str(path)]
        names = [h["name"] for h in hosts]
    else:
        argv += ["--gpu-model", maybe(r.choice(["RTX PRO 6000", "RTX 5090"]), ["H200", ""]),
                 "--gpu-count", maybe(str(count), ["0", "x"]), "--nic", maybe("eth0:tcp", ["bad", ":tcp"])]
    if len(names) > 1 and r.random() < 0.6:
        prefill, decode = r.sample(names, 2)
        argv += ["--prefill-host", maybe(prefill, ["nope"]), "--decode-host", decode,
                 "--prefill-gpus", maybe(f"0-{r.choice([1, 2, 4, 8]) - 1}", ["a", "3-1", "0,0"]),
                 "--decode-gpus", f"0-{r.choice([1, 2, 4, 8]) - 1}"]
    else:
        argv += (["--prefill-host", names[0], "--decode-host", names[0]] if names else [])
        argv += ["--split", maybe(f"{count // 2}+{count // 2}", ["4+", "a+b", "0+4", "8+8"])]
    for flag in ("--prefill-tp", "--decode-tp"):
        if r.random() < 0.4:
            argv += [flag, maybe(r.choice(["1", "2", "4"]), ["0", "3", "x"])]
    for flag in ("--http-port", "--bootstrap-port", "--router-port"):
        if r.random() < 0.15:
            argv += [flag, maybe(r.choice(["30000", "8998", "9000"]), ["80", "70000"])]
    for _ in range(r.randint(0, 2)):
        argv.append(f"{r.choice(['--env', '--prefill-env', '--decode-env'])}="
                    + r.choice(["UCX_TLS=^tcp", "UCX_TLS=tcp", "UCX_TLS=", "FOO=bar", "NOEQ", "SGLANG_DSV4_KV_LAYOUT=v3"]))
    for _ in range(r.randint(0, 2)):
        argv.append(f"{r.choice(['--server-arg', '--prefill-arg', '--decode-arg'])}="
                    + r.choice(["--kv-cache-dtype fp8_e4m3", "--page-size 64", "--tp 2", "--dp 2", "--host 0.0.0.0",
                                "--config /nonexistent.yaml", "--context-length 1000000"]))
    if r.random() < 0.5:
        argv += ["--model-weights-gib", maybe(r.choice(["20", "100"]), ["nan", "-3", "0"])]
    if r.random() < 0.3:
        argv.append("--json")
    return argv


def test_random_plan_requests_get_a_plan_or_a_reason(tmp_path, capsys):
    """`pd plan` over random command lines, valid and not: exit 0 with a plan (JSON that parses, with --json) or
    exit 2 with the reason; never a traceback. A sweep of 1500 such command lines passed here too."""
    outcomes = set()
    for seed in range(150):
        argv = random_plan_argv(seed, tmp_path)
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own refusals of a malformed value
            code = exc.code
        captured = capsys.readouterr()
        assert code in (0, 2), (argv, captured.err[-500:])
        assert (captured.out + captured.err).strip(), argv
        if code == 0 and "--json" in argv:
            assert json.loads(captured.out)["processes"], argv
        outcomes.add(code)
    assert outcomes == {0, 2}  # both kinds of answer were exercised
