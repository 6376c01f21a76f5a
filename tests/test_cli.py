"""The command line: `inspect` on files and URLs, `serve` flags/env, `python -m keda_llm_scaler`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from keda_llm_scaler import __version__
from keda_llm_scaler.testing.payloads import EngineLoad, sglang, vllm_v1
from keda_llm_scaler.testing.replicas import dead_port, replicas, unused_port
from keda_llm_scaler.testing.serveproc import _wait_healthy, serve
from tests.conftest import METRICS

EXE = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, input=stdin, timeout=60)


def python_m(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m keda_llm_scaler ARGS``, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "keda_llm_scaler", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


# What must never reach a user's terminal: Python's and asyncio's noise, and gRPC C-core's own log lines
# ("E1203 14:11:16.747806   17935 add_port.cc:83] ...").
NOISE = ("Traceback", "Task was destroyed", "Event loop is closed", "never awaited")
C_CORE_LINE = re.compile(r"^[EWIF]\d{4} \d", re.M)


def one_line(stderr: str) -> str:
    """The single line a bad setting prints on stderr, after checking that nothing else came with it."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert not any(n in stderr for n in NOISE) and not C_CORE_LINE.search(stderr), stderr
    return lines[0]


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port somebody else listens on (plain bind, no SO_REUSEADDR: as most servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_inspect_file_json_with_data_parallel_engines() -> None:
    out = run("inspect", str(METRICS / "vllm_v1_reconstructed_v0.10_dp4.txt"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["engine"] == "vllm"
    assert report["signals"]["waiting"] == 21 and report["signals"]["running"] == 571
    assert report["signals"]["kv_usage"] == pytest.approx(0.565)
    assert report["signals"]["kv_usage_max"] == 0.97
    assert [(e["rank"], e["waiting"], e["running"], e["kv_usage"]) for e in report["engines"]] == [
        ("0", 0, 120, 0.41),
        ("1", 18, 251, 0.97),
        ("2", 3, 200, 0.88),
        ("3", 0, 0, 0.0),
    ]


@pytest.mark.parametrize(
    ("fixture", "sleeping", "faults"),
    [
        ("vllm_v0.34.0_sleeping-level2.txt", True, 0),
        ("ray-serve_v2.60.0-vllm_v0.34.0_capacity-and-deferred.txt", False, 2),
        ("sglang_v0.5.23_aborts-and-500s.txt", None, 3),
    ],
)
def test_inspect_json_says_asleep_faults_tokens_and_inter_token_latency(
    fixture: str, sleeping: bool | None, faults: float
) -> None:
    out = run("inspect", str(METRICS / fixture), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    sig = report["signals"]
    assert report["sleeping"] is sleeping  # SGLang does not say: null, never "awake"
    assert sig["faults_total"] == faults
    assert sig["prompt_tokens_total"] > 0 and sig["generation_tokens_total"] > 0
    assert 0.0 < sig["itl_p95_s_since_start"] < 1.0


def test_inspect_url_and_stdin() -> None:
    with replicas(sglang([EngineLoad(4, 9, 0.5), EngineLoad(1, 2, 0.1)])) as (r,):
        for target in (r.url, r.url + "/metrics"):
            out = run("inspect", target, "--json")
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            assert report["engine"] == "sglang" and report["signals"]["waiting"] == 5
            assert len(report["engines"]) == 2
    out = run("inspect", "-", "--json", stdin=vllm_v1([EngineLoad(1, 2, 0.3)]))
    assert out.returncode == 0
    assert json.loads(out.stdout)["signals"]["waiting"] == 1
    human = run("inspect", "-", stdin=vllm_v1([EngineLoad(1, 2, 0.3)]))
    assert "waiting=1 running=2 kv_usage=0.300" in human.stdout


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/no/such/file", "cannot read"),
        (str(METRICS / "tgi_v2-v3_datadog-payload_TRUNCATED.txt"), "no vLLM"),
        ("http://127.0.0.1:{port}", "connect_error"),
        ("ftp://example/metrics", "scheme"),
    ],
)
def test_inspect_unreadable_input_exits_non_zero(target: str, message: str) -> None:
    out = run("inspect", target.format(port=dead_port()), "--json")
    assert out.returncode == 2
    assert message in out.stderr and out.stdout == ""


def test_serve_reads_flags_and_environment() -> None:
    with serve("--log-level", "debug", env={"LLM_SCALER_MAX_TARGETS": "7"}) as s:
        body = urllib.request.urlopen(f"http://127.0.0.1:{s.metrics_port}/metrics", timeout=5).read().decode()
        assert "llm_scaler_build_info" in body
    log = s.log()
    assert '"max_targets": "7"' in log and '"log_level": "debug"' in log
    assert s.proc.returncode == 0  # SIGTERM is a clean shutdown
    assert "scaler_stopped" in log


def test_serve_rejects_bad_configuration() -> None:
    out = run("serve", "--tls-cert", "/tmp/x.pem")
    assert out.returncode == 2 and "--tls-key" in out.stderr
    env = {**os.environ, "LLM_SCALER_GRPC_PORT": "notaport"}
    out = subprocess.run([EXE, "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 2 and "LLM_SCALER_GRPC_PORT" in out.stderr


def test_python_dash_m_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "keda_llm_scaler", "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0
    for flag in ("--host", "--grpc-port", "--metrics-port", "--tls-cert", "--tls-key", "--tls-client-ca"):
        assert flag in out.stdout
    assert "LLM_SCALER_GRPC_PORT" in out.stdout


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--log-level", "bogus"], {}, "--log-level"),
        (["--host", "999.1.1.1"], {}, "--host"),
        (["--max-concurrent-scrapes", "-1"], {}, "--max-concurrent-scrapes"),
        ([], {"LLM_SCALER_TARGET_IDLE_TTL": "0"}, "--target-idle-ttl"),
        (["--tls-cert", "{junk}", "--tls-key", "{junk}"], {}, "--tls-cert"),
        (["--grpc-port", "70000"], {}, "--grpc-port"),
        (["--refuse-networks", "loopback,10.0.0.0/33"], {}, "--refuse-networks"),
        ([], {"LLM_SCALER_ALLOW_NETWORKS": "pods"}, "--allow-networks"),
    ],
)
def test_every_bad_setting_is_one_line_naming_it(
    tmp_path: Path, args: list[str], env: dict[str, str], names: str
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    full_env = {**os.environ, **env}
    out = subprocess.run([EXE, "serve", *(a.format(junk=junk) for a in args)], capture_output=True, text=True,
                         env=full_env, timeout=30)  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert "accepted" in lines[0] or "PEM" in lines[0]


def test_a_second_serve_on_a_busy_port_refuses_to_start() -> None:
    with serve() as first:
        out = subprocess.run(
            [EXE, "serve", "--grpc-port", str(first.grpc_port), "--metrics-port", "0", "--host", "127.0.0.1"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 2  # not a silent shared SO_REUSEPORT
    line = one_line(out.stderr)
    assert f"--grpc-port {first.grpc_port}" in line and "in use" in line


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"keda-llm-scaler {__version__}"


def test_inspect_refuses_a_zero_queue_depth() -> None:
    out = run("inspect", str(METRICS / "vllm_v1_reconstructed_latest_1engine.txt"), "--target-queue-depth", "0")
    assert out.returncode == 2 and "--target-queue-depth" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("flag", ["--grpc-port", "--metrics-port"])
def test_serve_on_a_port_in_use_is_one_line_naming_the_flag(listening: int, flag: str) -> None:
    ports = {"--grpc-port": "0", "--metrics-port": "0", flag: str(listening)}
    out = python_m("serve", "--host", "127.0.0.1", *(x for kv in ports.items() for x in kv))
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert line == (
        f"keda-llm-scaler serve: {flag} {listening}: 127.0.0.1:{listening} is already in use (another process "
        "listens there); stop it or choose another port"
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("- just\n- a list\n", "not a kubeconfig (a YAML mapping with clusters, contexts and users) but a YAML list"),
        ("a plain string\n", "but a YAML string"),
        ("clusters: [\n  {name: c,\n", "not valid YAML at line 3, column 1"),
        ("contexts: 5\ncurrent-context: x\n", "contexts is not a list"),
        (None, "No such file or directory"),
    ],
)
def test_serve_with_a_bad_kubeconfig_is_one_line_naming_the_file(
    tmp_path: Path, content: str | None, says: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    out = python_m("serve", "--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "0", "--kubeconfig",
                   str(kubeconfig))  # fmt: skip
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert line.startswith(f"keda-llm-scaler serve: --kubeconfig {kubeconfig}: ") and says in line, line


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, False),
        (["--allow-cross-namespace"], {}, True),
        (["--allow-cross-namespace", "--log-level", "debug"], {}, True),  # a bare flag takes no next option
        (["--no-allow-cross-namespace"], {"LLM_SCALER_ALLOW_CROSS_NAMESPACE": "true"}, False),  # flags win
        ([], {"LLM_SCALER_ALLOW_CROSS_NAMESPACE": "true"}, True),
        ([], {"LLM_SCALER_ALLOW_CROSS_NAMESPACE": "0"}, False),
        (["--allow-cross-namespace", "false"], {}, False),  # the value forms of earlier releases
        (["--allow-cross-namespace=true"], {}, True),
        (["--allow-cross-namespace=0"], {"LLM_SCALER_ALLOW_CROSS_NAMESPACE": "1"}, False),
    ],
)
def test_boolean_flags_bare_negated_with_a_value_and_from_the_environment(
    argv: list[str], env: dict[str, str], expected: bool
) -> None:
    from keda_llm_scaler.cli import _build_parser
    from keda_llm_scaler.config import settings_from

    args = _build_parser("serve").parse_args(["serve", *argv])
    assert settings_from(args, env).allow_cross_namespace is expected


def test_every_boolean_setting_has_a_bare_and_a_no_flag() -> None:
    from dataclasses import fields

    from keda_llm_scaler.cli import _build_parser
    from keda_llm_scaler.config import Settings, settings_from

    bools = [f.name for f in fields(Settings) if "bool" in str(f.type)]
    assert "allow_cross_namespace" in bools and "log_json" in bools
    parser = _build_parser("serve")
    for name in bools:
        flag = "--" + name.replace("_", "-")
        assert getattr(settings_from(parser.parse_args(["serve", flag]), {}), name) is True
        negated = parser.parse_args(["serve", "--no-" + flag.removeprefix("--")])
        assert getattr(settings_from(negated, {}), name) is False


def test_serve_takes_a_bare_boolean_flag_and_refuses_a_bad_value() -> None:
    with serve("--allow-cross-namespace", "--log-json") as s:
        pass
    assert s.proc.returncode == 0
    started = next(json.loads(ln) for ln in s.log().splitlines() if '"scaler_started"' in ln)  # --log-json: JSON
    assert started["settings"]["allow_cross_namespace"] == "True"
    out = python_m("serve", "--allow-cross-namespace", "maybe")
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert "--allow-cross-namespace" in line and "'maybe' is not a boolean" in line


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has its own handler for ``sig`` (Linux: SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


def _has_worker(pid: int) -> bool:
    """Whether ``pid`` has a child in a process group of its own: a scrape worker past its fork.

    (Between fork and setpgid, some microseconds, a worker still shares the terminal's group and a Ctrl-C
    then kills it: no process can close that window. The scaler logs it and no longer waits for its hello.)
    """
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and fields[2] != str(pid):
            return True
    return False


def _serve_stopped_by(
    sig: str, when: str, started_ignoring_sigint: bool
) -> tuple[subprocess.Popen[str], str, str] | None:
    """``serve`` sent ``sig`` at the moment ``when``: (the process, its stdout, its stderr), or None when it
    could not bind a port another test took in between."""
    grpc_port = unused_port()
    # SIGINT ignored is inherited through exec, as from a background job's shell
    ignoring = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"] if started_ignoring_sigint else []
    # its own session: the signal goes to the whole process group, as a Ctrl-C in a terminal does
    proc = subprocess.Popen(
        [
            *ignoring,
            EXE,
            "serve",
            "--host",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(unused_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        # both taken (main() takes SIGTERM, then SIGINT); a budget, not a measurement
        while not (_catches(proc.pid, signal.SIGTERM) and _catches(proc.pid, signal.SIGINT)):
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "serve never took over SIGTERM"
            time.sleep(0.001)
        if when == "main+0.3s":
            time.sleep(0.3)
        elif when == "workers":
            while not _has_worker(proc.pid):
                if proc.poll() is not None:
                    break
                assert time.monotonic() < deadline, "serve started no scrape worker"
                time.sleep(0.001)
        elif when == "ready":
            _wait_healthy(f"127.0.0.1:{grpc_port}", 30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.Signals[sig])
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # its pipes closed, whatever happened
    if proc.returncode == 2 and "already in use" in err:
        return None
    return proc, out, err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal dispositions from /proc")
@pytest.mark.parametrize(
    ("sig", "when", "started_ignoring_sigint"),
    [
        ("SIGINT", "main", False),  # as soon as serve's main() holds the signals: imports still to come
        ("SIGINT", "main+0.3s", False),  # importing grpc, binding, starting workers
        ("SIGINT", "workers", False),  # its scrape workers are starting (importing: the moment they are most fragile)
        ("SIGINT", "ready", False),
        ("SIGTERM", "main", False),
        ("SIGTERM", "main+0.3s", False),
        # started as a non-interactive shell's background job is: SIGINT ignored from its parent (a fresh
        # clone's CI run started that way lost the first two cases above and left serve running)
        ("SIGINT", "main", True),
        ("SIGINT", "main+0.3s", True),
    ],
)
def test_ctrl_c_and_sigterm_at_any_moment_of_serve_exit_0_quietly(
    sig: str, when: str, started_ignoring_sigint: bool
) -> None:
    # a port unused when picked can be taken by a parallel test before serve binds it (exit 2, "already in
    # use"): that run says nothing about signals, and is made again on other ports
    for _ in range(3):
        ran = _serve_stopped_by(sig, when, started_ignoring_sigint)
        if ran is not None:
            break
    assert ran is not None, "three port collisions in a row"
    proc, out, err = ran
    assert proc.returncode == 0, err
    assert err.strip() == "", err  # logs go to stdout; stderr has nothing to say
    assert '"level": "error"' not in out, out  # e.g. scrape workers hit by the Ctrl-C, then restarted
    if when == "main":
        assert "scaler_started" not in out  # a stop asked before the server started is not a start
    if when == "ready":
        assert "scaler_stopped" in out


# sys.meta_path's first finder refuses matplotlib: a Python without the `sim` extra's plotting stack
WITHOUT_MATPLOTLIB = """
import sys
class NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoMatplotlib())
from keda_llm_scaler.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_matplotlib(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *args], capture_output=True, text=True, timeout=120
    )


def test_demo_without_matplotlib_fails_before_it_simulates(tmp_path: Path) -> None:
    out = without_matplotlib("demo", "--no-live", "--out-dir", str(tmp_path / "demo"))
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert line == (
        "keda-llm-scaler demo: the demo's plot needs matplotlib, which is not installed: "
        "pip install 'keda-llm-scaler[sim]'"
    )
    assert out.stdout == "" and not (tmp_path / "demo").exists()  # no fleet ran, nothing was written


def test_replay_needs_matplotlib_only_to_plot(tmp_path: Path) -> None:
    short = ("replay", "--trace", "conv", "--hours", "0:0.05", "--quiet")
    out = without_matplotlib(*short, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["requests"] > 0
    for extra, needs in ((["--plot", str(tmp_path / "run.png")], "--plot"), (["--sweep"], "--sweep's Pareto plot")):
        out = without_matplotlib(*short, *extra, "--out-dir", str(tmp_path / "sweep"))
        assert out.returncode == 2
        assert one_line(out.stderr) == (
            f"keda-llm-scaler replay: {needs} needs matplotlib, which is not installed: "
            "pip install 'keda-llm-scaler[sim]'"
        )
        assert out.stdout == ""
    assert list(tmp_path.iterdir()) == []  # it failed before simulating anything


def test_inspect_reads_host_port_as_a_url_unless_such_a_file_exists(tmp_path: Path) -> None:
    port = dead_port()
    out = python_m("inspect", f"127.0.0.1:{port}")
    assert out.returncode == 2
    assert one_line(out.stderr).startswith(f"keda-llm-scaler inspect: http://127.0.0.1:{port}/metrics: connect_error")
    with replicas(vllm_v1([EngineLoad(3, 4, 0.5)])) as (r,):
        out = python_m("inspect", f"127.0.0.1:{r.port}", "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["source"] == f"http://127.0.0.1:{r.port}" and report["signals"]["waiting"] == 3
    (tmp_path / f"127.0.0.1:{port}").write_text(vllm_v1([EngineLoad(5, 1, 0.1)]))  # a file of that name wins
    out = python_m("inspect", f"127.0.0.1:{port}", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["signals"]["waiting"] == 5


@pytest.mark.parametrize("stdin", ["", "\n  \n"])
def test_inspect_of_empty_stdin_says_so(stdin: str) -> None:
    out = run("inspect", "-", stdin=stdin)
    assert out.returncode == 2
    assert one_line(out.stderr) == "keda-llm-scaler inspect: stdin: empty input"
