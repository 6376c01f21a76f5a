"""TLS and mTLS on the gRPC port, as KEDA dials it (TLS >= 1.2, ALPN h2, server name = scalerAddress host)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.testing.scalerproc import running_scaler

HOST = "llm-scaler.keda.svc"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert(HOST, "127.0.0.1")
    client = ca.issue_cert("keda-operator")
    other_ca = trustme.CA()
    stranger = other_ca.issue_cert("stranger")
    files = {
        "ca": ca.cert_pem,
        "server_cert": server.cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "client_cert": client.cert_chain_pems[0],
        "client_key": client.private_key_pem,
        "stranger_cert": stranger.cert_chain_pems[0],
        "stranger_key": stranger.private_key_pem,
    }
    out = {}
    for name, blob in files.items():
        path = tmp_path / f"{name}.pem"
        blob.write_to_path(str(path))
        out[name] = path
    return out


def _creds(pki: dict[str, Path], who: str | None) -> grpc.ChannelCredentials:
    if who is None:
        return grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki[f"{who}_key"].read_bytes(),
        certificate_chain=pki[f"{who}_cert"].read_bytes(),
    )


async def _check(port: int, creds: grpc.ChannelCredentials) -> int:
    options = [("grpc.ssl_target_name_override", HOST)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        spec = await pb_grpc.ExternalScalerStub(ch).GetMetricSpec(
            pb.ScaledObjectRef(
                name="llm", namespace="serving", scalerMetadata={"endpoints": "http://127.0.0.1:9", "enableTLS": "true"}
            ),
            timeout=3,
        )
        assert spec.metricSpecs[0].metricName == "llm_composite"
        return resp.status


async def test_server_tls(pki: dict[str, Path]) -> None:
    async with running_scaler(tls_cert=pki["server_cert"], tls_key=pki["server_key"]) as server:
        assert await _check(server.grpc_port, _creds(pki, None)) == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as plain:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_cert_from_the_ca(pki: dict[str, Path]) -> None:
    async with running_scaler(
        tls_cert=pki["server_cert"], tls_key=pki["server_key"], tls_client_ca=pki["ca"]
    ) as server:
        assert await _check(server.grpc_port, _creds(pki, "client")) == health_pb2.HealthCheckResponse.SERVING
        for who in (None, "stranger"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _check(server.grpc_port, _creds(pki, who))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


KEDACLIENT = os.environ.get("KEDACLIENT", "")


@pytest.mark.kedaclient
@pytest.mark.skipif(not (KEDACLIENT and os.access(KEDACLIENT, os.X_OK)), reason="set KEDACLIENT=<path>")
async def test_grpc_go_client_mtls_like_keda(pki: dict[str, Path]) -> None:
    """grpc-go enforces ALPN h2 and verifies the name, exactly as KEDA's client does."""
    async with running_scaler(
        tls_cert=pki["server_cert"], tls_key=pki["server_key"], tls_client_ca=pki["ca"]
    ) as server:
        base = [
            KEDACLIENT,
            "-addr",
            f"127.0.0.1:{server.grpc_port}",
            "-op",
            "health",
            "-ca",
            str(pki["ca"]),
            "-server-name",
            HOST,
            "-timeout",
            "3s",
        ]
        import asyncio

        ok = await asyncio.to_thread(
            subprocess.run,
            [*base, "-cert", str(pki["client_cert"]), "-key", str(pki["client_key"])],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert '"status":"SERVING"' in ok.stdout, ok.stdout + ok.stderr
        refused = await asyncio.to_thread(subprocess.run, base, capture_output=True, text=True, timeout=30)
        assert refused.returncode != 0


async def test_rotated_certificate_is_served_without_a_restart(pki: dict[str, Path], tmp_path: Path) -> None:
    """cert-manager rewrites the Secret's files in place: new connections get the new certificate."""
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    cert.write_bytes(pki["server_cert"].read_bytes())
    key.write_bytes(pki["server_key"].read_bytes())
    async with running_scaler(tls_cert=cert, tls_key=key) as server:
        assert await _check(server.grpc_port, _creds(pki, None)) == health_pb2.HealthCheckResponse.SERVING
        new_ca = trustme.CA()
        rotated = new_ca.issue_cert(HOST, "127.0.0.1")
        rotated.cert_chain_pems[0].write_to_path(str(cert))
        rotated.private_key_pem.write_to_path(str(key))
        new_ca_file = tmp_path / "new-ca.pem"
        new_ca.cert_pem.write_to_path(str(new_ca_file))
        new_trust = grpc.ssl_channel_credentials(root_certificates=new_ca_file.read_bytes())
        assert await _check(server.grpc_port, new_trust) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):  # the old CA no longer verifies the served certificate
            await _check(server.grpc_port, _creds(pki, None))
