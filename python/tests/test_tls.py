"""The Python package over a tls+tcp:// coordinator (issue 12): the same
libcohort client code, configured by COHORT_TLS_* in the environment."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import base_env, start_cohortd

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _certs(d):
    def sh(*a):
        subprocess.run(a, cwd=d, check=True, capture_output=True)

    (d / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    for name in ("ca", "ca2"):
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
           "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
       "-keyout", "srv.key", "-out", "srv.csr")
    sh("openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
       "-extfile", "san.ext", "-out", "srv.pem")


CODE = """
import cohort
try:
    with cohort.Client(job="tls", token="t", rank=0, world_size=1, op_timeout=20, join_timeout=20) as c:
        c.world.barrier("b", timeout=10)
        print("ok", c.rank, c.world_size)
except cohort.CohortError as e:
    print(e.status.name, e)
"""


def test_python_client_over_tls(built, tmp_path):
    _certs(tmp_path)
    # TLS on a port the kernel chose; url is what cohortd bound.
    d, url, _ = start_cohortd("--tls-cert", str(tmp_path / "srv.pem"), "--tls-key", str(tmp_path / "srv.key"),
                              listen="tls+tcp://127.0.0.1:0")
    try:
        for ca, want in (("ca.pem", "ok 0 1"), ("ca2.pem", "EAUTH")):
            env = base_env(COHORT_COORDINATOR=url, COHORT_TLS_CA=str(tmp_path / ca), COHORT_TLS_SERVER_NAME="localhost")
            r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
            assert r.stdout.startswith(want), (ca, r.stdout + r.stderr)
            if want == "EAUTH":
                assert "TLS connection to the coordinator" in r.stdout, r.stdout
    finally:
        d.terminate()
        d.wait(10)
